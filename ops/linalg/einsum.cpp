// Einsum: numpy-style equations with ellipsis broadcasting, repeated labels (diagonals),
// implicit output and any number of operands.
//
// Every operand becomes a strided view with one stride per distinct label (a repeated label
// gets the sum of its strides, which walks the diagonal). Labels used by one operand only
// are summed out first; then operands are contracted left to right as batched matrix
// products [batch, M, K] x [batch, K, N] in the GEMM layer (ops/math/gemm.h), read in place
// when the labels lie in memory as a row- or column-major matrix and gathered otherwise.
// The last operand is permuted and reduced into the output. Integers compute on their
// unsigned counterparts (same bits, wrapping without UB) in plain loops; half types compute
// in float.
//
// The widened operands, the summed-out and gathered operands, the batch offsets and the
// intermediate products are the op's workspace. One walk of the evaluation (steps) lays
// them out from the shapes alone: the workspace rule runs it to size the workspace and the
// kernel runs it twice, once to size and once to carve and compute, so the bytes the
// contract declares are the bytes the kernel takes. Whether an operand read from an input
// is used in place depends on its strides, which the shapes do not tell: such an operand
// always has room for its gathered copy.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/workspace.h"
#include "ops/math/gemm.h"
#include "ops/math/threading.h"

namespace kiln::ops {
namespace {

constexpr int kLetters = 52;  // 'A'-'Z' are 0-25, 'a'-'z' 26-51, so ids sort like ASCII
constexpr int kEllipsis = -1;

// An operand as its distinct labels and the element stride of each.
struct View {
  std::vector<int> labels;
  Shape strides;
  int64_t stride_of(int label) const {
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] == label) return strides[i];
    }
    return 0;
  }
  bool has(int label) const {
    return std::find(labels.begin(), labels.end(), label) != labels.end();
  }
};

View contiguous_view(const std::vector<int>& labels, const std::vector<int64_t>& size) {
  View v{labels, Shape(labels.size())};
  int64_t s = 1;
  for (size_t i = labels.size(); i-- > 0;) {
    v.strides[i] = s;
    s *= size[labels[i]];
  }
  return v;
}

// Walks a multi-index over `sizes`, keeping the element offset for `strides`.
struct Odometer {
  std::vector<int64_t> sizes, strides, index;
  int64_t offset = 0;
  void seek(int64_t flat) {
    index.assign(sizes.size(), 0);
    offset = 0;
    for (size_t d = sizes.size(); d-- > 0;) {
      index[d] = flat % sizes[d];
      flat /= sizes[d];
      offset += index[d] * strides[d];
    }
  }
  void next() {
    for (size_t d = sizes.size(); d-- > 0;) {
      offset += strides[d];
      if (++index[d] < sizes[d]) return;
      offset -= strides[d] * sizes[d];
      index[d] = 0;
    }
  }
};

// dst (contiguous, labels `out`) = src summed over its labels not in `out`.
template <typename C>
void reduce_into(const C* src, const View& v, const std::vector<int>& out,
                 const std::vector<int64_t>& size, C* dst) {
  Odometer outer, inner;
  int64_t total = 1, count = 1;
  for (int l : out) {
    outer.sizes.push_back(size[l]);
    outer.strides.push_back(v.stride_of(l));
    total *= size[l];
  }
  // Summed labels, largest stride first: the last one runs as a plain inner loop.
  std::vector<std::pair<int64_t, int64_t>> summed;  // (stride, size)
  for (size_t i = 0; i < v.labels.size(); ++i) {
    if (std::find(out.begin(), out.end(), v.labels[i]) != out.end()) continue;
    summed.emplace_back(v.strides[i], size[v.labels[i]]);
    count *= size[v.labels[i]];
  }
  std::sort(summed.begin(), summed.end(),
            [](const auto& x, const auto& y) { return std::abs(x.first) > std::abs(y.first); });
  int64_t inner_n = 1, inner_s = 0;
  if (!summed.empty()) {
    std::tie(inner_s, inner_n) = summed.back();
    summed.pop_back();
  }
  for (const auto& [stride, n] : summed) {
    inner.sizes.push_back(n);
    inner.strides.push_back(stride);
  }
  const int64_t outer_count = count > 0 ? count / inner_n : 0;
  parallel_for(total, grain_for(count + 1), [&](int64_t b0, int64_t b1) {
    Odometer o = outer, r = inner;
    o.seek(b0);
    for (int64_t i = b0; i < b1; ++i, o.next()) {
      C acc = C(0);
      r.seek(0);
      for (int64_t j = 0; j < outer_count; ++j, r.next()) {
        const C* p = src + o.offset + r.offset;
        for (int64_t q = 0; q < inner_n; ++q) acc += p[q * inner_s];
      }
      dst[i] = acc;
    }
  });
}

// The single stride that walks `labels` as one flattened dimension, kAny when they hold
// at most one element, or kNone when they do not lie evenly in memory.
constexpr int64_t kAny = INT64_MIN, kNone = INT64_MIN + 1;
int64_t merged_stride(const std::vector<int>& labels, const View& v,
                      const std::vector<int64_t>& size) {
  int64_t stride = kAny, span = 1;
  for (size_t i = labels.size(); i-- > 0;) {
    const int64_t n = size[labels[i]];
    if (n == 1) continue;
    const int64_t s = v.stride_of(labels[i]);
    if (stride == kAny) {
      stride = s;
    } else if (s != stride * span) {
      return kNone;
    }
    span *= n;
  }
  return stride;
}

// The scratch of one evaluation, taken in order from the workspace: when sizing, only the
// bytes are counted (every pointer is null); when running, the parts are carved from `base`
// at the same offsets.
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(uint8_t* base) : base_(base), running_(true) {}
  bool running() const { return running_; }
  uint64_t used() const { return used_; }
  template <typename T>
  T* take(int64_t n) {
    const uint64_t offset =
        (used_ + WorkspaceLayout::kAlign - 1) / WorkspaceLayout::kAlign * WorkspaceLayout::kAlign;
    const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(T);
    if (n < 0 || bytes / sizeof(T) != static_cast<uint64_t>(n) || bytes > UINT64_MAX / 2 - offset) {
      throw Error(ErrorKind::Runtime, "Einsum workspace too large");
    }
    used_ = offset + bytes;
    return running_ && n > 0 ? reinterpret_cast<T*>(base_ + offset) : nullptr;
  }

 private:
  uint8_t* base_ = nullptr;
  bool running_ = false;
  uint64_t used_ = 0;
};

// `known`: the view's strides follow from the shapes (a contiguous part of the workspace),
// not from an input's layout.
template <typename C>
struct Operand {
  const C* data;
  View view;
  bool known;
};

// Element count of `labels`; throws kiln::Error when too large to allocate.
int64_t product(const std::vector<int>& labels, const std::vector<int64_t>& size) {
  Shape shape;
  for (int l : labels) shape.push_back(size[l]);
  return checked_numel(shape);
}

// a * b for work estimates, saturating instead of overflowing.
int64_t work(int64_t a, int64_t b) {
  return b != 0 && a > INT64_MAX / b ? INT64_MAX : a * b;
}

// An operand's [batch, rows, cols] matrices: used in place when possible, else gathered.
// The batch offsets and the gathered copy (when one may be needed) come from `scratch`.
template <typename C>
struct MatrixSide {
  const C* data = nullptr;
  const int64_t* batch_offset = nullptr;
  int64_t row_stride = 0, col_stride = 0;  // one of them is 1

  void prepare(const Operand<C>& op, const std::vector<int>& batch, const std::vector<int>& rows,
               const std::vector<int>& cols, const std::vector<int64_t>& size, Scratch& scratch) {
    const int64_t nb = product(batch, size), nr = product(rows, size), nc = product(cols, size);
    int64_t* offsets = scratch.take<int64_t>(nb);
    int64_t rs = merged_stride(rows, op.view, size), cs = merged_stride(cols, op.view, size);
    if (cs == kAny) cs = 1;
    if (rs == kAny) rs = cs == 1 ? std::max<int64_t>(nc, 1) : 1;
    const bool in_place =
        rs != kNone && cs != kNone && ((cs == 1 && rs >= 1) || (rs == 1 && cs >= 1));
    C* gathered = op.known && in_place ? nullptr : scratch.take<C>(checked_numel({nb, nr, nc}));
    if (!scratch.running()) return;
    batch_offset = offsets;
    if (in_place) {
      data = op.data;
      row_stride = rs;
      col_stride = cs;
      Odometer o;
      for (int l : batch) {
        o.sizes.push_back(size[l]);
        o.strides.push_back(op.view.stride_of(l));
      }
      o.seek(0);
      for (int64_t b = 0; b < nb; ++b, o.next()) offsets[b] = o.offset;
      return;
    }
    std::vector<int> order = batch;
    order.insert(order.end(), rows.begin(), rows.end());
    order.insert(order.end(), cols.begin(), cols.end());
    reduce_into(op.data, op.view, order, size, gathered);
    data = gathered;
    row_stride = nc;
    col_stride = 1;
    for (int64_t b = 0; b < nb; ++b) offsets[b] = b * nr * nc;
  }
};

// out[b] (M x N, row-major) = A[b] (M x K) * B[b] (K x N) for every batch. Float and double
// products run in the GEMM layer, which reads the strided operands in place: one
// single-threaded product per batch when there are enough batches for every task, else one
// product after another, each split across the threads. Integers (unsigned: wrapping) run
// plain loops.
template <typename C>
void batched_matmul(const MatrixSide<C>& a, const MatrixSide<C>& b, int64_t nb, int64_t m,
                    int64_t k, int64_t n, C* out) {
  if (k == 0) {
    std::fill(out, out + nb * m * n, C(0));
    return;
  }
  if constexpr (std::is_floating_point_v<C>) {
    // A right operand shared by every batch (broadcast) with the left operand's batches
    // stacked along its rows is one taller product.
    int64_t rows = m, batches = nb, ars = a.row_stride;
    if (nb > 1 && std::all_of(b.batch_offset, b.batch_offset + nb,
                              [&](int64_t o) { return o == b.batch_offset[0]; })) {
      const int64_t step = a.batch_offset[1] - a.batch_offset[0];
      bool even = step >= 0 && (m == 1 || step == m * a.row_stride);
      for (int64_t i = 2; i < nb && even; ++i) {
        even = a.batch_offset[i] - a.batch_offset[i - 1] == step;
      }
      if (even) {
        rows = m * nb;
        batches = 1;
        if (m == 1) ars = step;
      }
    }
    const double macs = static_cast<double>(nb) * static_cast<double>(m) * static_cast<double>(n) *
                        static_cast<double>(k);
    const int tasks = math::task_count(macs);
    const bool by_batch = tasks > 1 && batches >= 2 * tasks;
    math::GemmOptions o;
    if (by_batch) o.max_threads = 1;
    auto product = [&](int64_t bi) {
      math::gemm<C>(a.data + a.batch_offset[bi], rows, k, ars, a.col_stride,
                    b.data + b.batch_offset[bi], n, b.row_stride, b.col_stride, out + bi * rows * n,
                    n, o);
    };
    if (by_batch) {
      parallel_for(batches, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t bi = lo; bi < hi; ++bi) product(bi);
      });
    } else {
      for (int64_t bi = 0; bi < batches; ++bi) product(bi);
    }
  } else {
    parallel_for(nb * m, grain_for(work(n, k) + 1), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t bi = r / m, i = r % m;
        const C* pa = a.data + a.batch_offset[bi] + i * a.row_stride;
        const C* pb = b.data + b.batch_offset[bi];
        C* o = out + r * n;
        std::fill(o, o + n, C(0));
        for (int64_t p = 0; p < k; ++p) {
          const C av = pa[p * a.col_stride];
          const C* row = pb + p * b.row_stride;
          if (b.col_stride == 1) {
            for (int64_t j = 0; j < n; ++j) o[j] += static_cast<C>(av * row[j]);
          } else {
            for (int64_t j = 0; j < n; ++j) o[j] += static_cast<C>(av * row[j * b.col_stride]);
          }
        }
      }
    });
  }
}

// Evaluates the equation on compute-type operands into `out` (contiguous, labels `out_labels`),
// its intermediates taken from `scratch`; when sizing, only takes them.
template <typename C>
void evaluate(std::vector<Operand<C>> ops, const std::vector<int>& out_labels,
              const std::vector<int64_t>& size, C* out, Scratch& scratch) {
  const bool run = scratch.running();
  auto used_elsewhere = [&](int label, size_t self) {
    if (std::find(out_labels.begin(), out_labels.end(), label) != out_labels.end()) return true;
    for (size_t j = 0; j < ops.size(); ++j) {
      if (j != self && ops[j].view.has(label)) return true;
    }
    return false;
  };
  if (ops.size() > 1) {  // sum out labels only one operand has
    for (size_t i = 0; i < ops.size(); ++i) {
      std::vector<int> keep;
      for (int l : ops[i].view.labels) {
        if (used_elsewhere(l, i)) keep.push_back(l);
      }
      if (keep.size() == ops[i].view.labels.size()) continue;
      C* reduced = scratch.take<C>(product(keep, size));
      if (run) reduce_into(ops[i].data, ops[i].view, keep, size, reduced);
      ops[i] = {reduced, contiguous_view(keep, size), true};
    }
  }
  auto out_pos = [&](int l) {
    auto it = std::find(out_labels.begin(), out_labels.end(), l);
    return it == out_labels.end() ? 1000 + l : static_cast<int>(it - out_labels.begin());
  };
  while (ops.size() > 1) {
    const View& va = ops[0].view;
    const View& vb = ops[1].view;
    std::vector<int> batch, contracted, a_only, b_only, all = va.labels;
    for (int l : vb.labels) {
      if (!va.has(l)) all.push_back(l);
    }
    for (int l : all) {
      bool needed = std::find(out_labels.begin(), out_labels.end(), l) != out_labels.end();
      for (size_t j = 2; j < ops.size() && !needed; ++j) needed = ops[j].view.has(l);
      if (!needed) {
        contracted.push_back(l);  // labels of one side only are summed with a zero stride
      } else if (va.has(l) && vb.has(l)) {
        batch.push_back(l);
      } else {
        (va.has(l) ? a_only : b_only).push_back(l);
      }
    }
    auto by_output = [&](int x, int y) { return out_pos(x) < out_pos(y); };
    std::sort(batch.begin(), batch.end(), by_output);
    std::sort(a_only.begin(), a_only.end(), by_output);
    std::sort(b_only.begin(), b_only.end(), by_output);
    // When the output lists B's own labels first, B x A lands in output order.
    if (!a_only.empty() && !b_only.empty() && out_pos(b_only.back()) < out_pos(a_only.front())) {
      std::swap(ops[0], ops[1]);
      std::swap(a_only, b_only);
    }
    MatrixSide<C> ma, mb;
    ma.prepare(ops[0], batch, a_only, contracted, size, scratch);
    mb.prepare(ops[1], batch, contracted, b_only, size, scratch);
    std::vector<int> result = batch;
    result.insert(result.end(), a_only.begin(), a_only.end());
    result.insert(result.end(), b_only.begin(), b_only.end());
    const int64_t nb = product(batch, size), m = product(a_only, size),
                  k = product(contracted, size), n = product(b_only, size);
    if (ops.size() == 2 && result == out_labels) {
      if (run) batched_matmul(ma, mb, nb, m, k, n, out);
      return;
    }
    C* r = scratch.take<C>(checked_numel({nb, m, n}));
    if (run) batched_matmul(ma, mb, nb, m, k, n, r);
    ops.erase(ops.begin(), ops.begin() + 2);
    ops.insert(ops.begin(), Operand<C>{r, contiguous_view(result, size), true});
  }
  if (run) reduce_into(ops[0].data, ops[0].view, out_labels, size, out);
}

// One stride per distinct label: a size-1 dimension reads its one element (stride 0, so
// it broadcasts), and a repeated label walks the diagonal (the sum of its strides).
View make_view(const std::vector<int>& dims, const Shape& shape, const Shape& strides) {
  View v;
  for (size_t d = 0; d < dims.size(); ++d) {
    const int64_t stride = shape[d] == 1 ? 0 : strides[d];
    auto it = std::find(v.labels.begin(), v.labels.end(), dims[d]);
    if (it == v.labels.end()) {
      v.labels.push_back(dims[d]);
      v.strides.push_back(stride);
    } else {
      v.strides[it - v.labels.begin()] += stride;
    }
  }
  return v;
}

// A malformed equation or operands that do not fit it; the kernel reports it as a node
// failure, the shape rule as unknown.
struct EquationError {
  std::string message;
};

std::vector<int> parse_term(const std::string& s) {
  std::vector<int> labels;
  bool ellipsis = false;
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '.') {
      if (s.compare(i, 3, "...") != 0 || ellipsis) {
        throw EquationError{"bad ellipsis in equation term '" + s + "'"};
      }
      ellipsis = true;
      labels.push_back(kEllipsis);
      i += 3;
      continue;
    }
    if (c >= 'A' && c <= 'Z') {
      labels.push_back(c - 'A');
    } else if (c >= 'a' && c <= 'z') {
      labels.push_back(c - 'a' + 26);
    } else {
      throw EquationError{std::string("unexpected character '") + c + "' in equation"};
    }
    ++i;
  }
  return labels;
}

// The operands' labels and the output's (kEllipsis where an ellipsis stands).
struct Equation {
  std::vector<std::vector<int>> terms;
  std::vector<int> output;
};

Equation parse_equation(const std::string& text, size_t num_inputs) {
  std::string eq;
  for (char c : text) {
    if (c != ' ' && c != '\t' && c != '\n') eq += c;
  }
  Equation r;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    r.terms.push_back(parse_term(lhs.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (r.terms.size() != num_inputs) {
    throw EquationError{"equation has " + std::to_string(r.terms.size()) + " operands, node has " +
                        std::to_string(num_inputs) + " inputs"};
  }
  if (arrow != std::string::npos) {
    r.output = parse_term(eq.substr(arrow + 2));
    std::vector<bool> seen(kLetters, false);
    for (int l : r.output) {
      if (l == kEllipsis) continue;
      if (seen[l]) throw EquationError{"output label repeated in equation '" + eq + "'"};
      seen[l] = true;
      bool found = false;
      for (const auto& t : r.terms) found = found || std::find(t.begin(), t.end(), l) != t.end();
      if (!found) throw EquationError{"output label not among the inputs in '" + eq + "'"};
    }
  } else {  // implicit: the ellipsis, then labels seen exactly once, in ASCII order
    std::vector<int> count(kLetters, 0);
    bool ellipsis = false;
    for (const auto& t : r.terms) {
      for (int l : t) (l == kEllipsis ? (void)(ellipsis = true) : (void)++count[l]);
    }
    if (ellipsis) r.output.push_back(kEllipsis);
    for (int l = 0; l < kLetters; ++l) {
      if (count[l] == 1) r.output.push_back(l);
    }
  }
  return r;
}

// The equation applied to operands of these shapes: the extent of every label (ellipsis
// dimensions are labels kLetters.. kLetters+E-1, right-aligned across operands), the label
// of each operand dimension, and the output's labels and shape.
struct LabelSizes {
  std::vector<int64_t> size;
  std::vector<std::vector<int>> dims;
  std::vector<int> out_labels;
  Shape out_shape;
};

LabelSizes label_sizes(const Equation& eq, const std::vector<Shape>& shapes) {
  const size_t n = eq.terms.size();
  int64_t e = 0;
  std::vector<int64_t> ell(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const auto& term = eq.terms[i];
    const auto letters = static_cast<int64_t>(
        std::count_if(term.begin(), term.end(), [](int l) { return l != kEllipsis; }));
    const bool has_ell = letters != static_cast<int64_t>(term.size());
    ell[i] = static_cast<int64_t>(shapes[i].size()) - letters;
    if (ell[i] < 0 || (!has_ell && ell[i] != 0)) {
      throw EquationError{"operand " + std::to_string(i) + " " + shape_to_string(shapes[i]) +
                          " does not match its " + std::to_string(letters) + " equation labels"};
    }
    e = std::max(e, ell[i]);
  }
  LabelSizes r;
  r.size.assign(static_cast<size_t>(kLetters + e), -1);
  r.dims.resize(n);
  for (size_t i = 0; i < n; ++i) {
    for (int l : eq.terms[i]) {
      if (l != kEllipsis) {
        r.dims[i].push_back(l);
        continue;
      }
      for (int64_t j = e - ell[i]; j < e; ++j) r.dims[i].push_back(kLetters + static_cast<int>(j));
    }
    for (size_t d = 0; d < r.dims[i].size(); ++d) {
      int64_t& s = r.size[static_cast<size_t>(r.dims[i][d])];
      const int64_t extent = shapes[i][d];
      if (s == -1 || s == 1) {
        s = extent;
      } else if (extent != 1 && extent != s) {
        throw EquationError{"label dimension " + std::to_string(extent) + " of operand " +
                            std::to_string(i) + " does not match " + std::to_string(s)};
      }
    }
  }
  for (int l : eq.output) {
    if (l != kEllipsis) {
      r.out_labels.push_back(l);
      continue;
    }
    for (int64_t j = 0; j < e; ++j) r.out_labels.push_back(kLetters + static_cast<int>(j));
  }
  for (int l : r.out_labels) r.out_shape.push_back(r.size[static_cast<size_t>(l)]);
  return r;
}

// Integers compute on the unsigned type of the same width; floats on compute_t.
template <typename T, bool = std::is_integral_v<T>>
struct EinsumCompute {
  using type = compute_t<T>;
};
template <typename T>
struct EinsumCompute<T, true> {
  using type = std::make_unsigned_t<T>;
};

using EinsumTypes =
    TypeList<float, double, float16, bfloat16, int32_t, int64_t, uint32_t, uint64_t>;

// Half-type `t` (any strides) widened into `dst` (contiguous, t's shape).
template <typename T, typename C>
void widen_into(const Tensor& t, C* dst) {
  const T* src = t.data<const T>();
  Odometer walk;
  walk.sizes.assign(t.shape().begin(), t.shape().end());
  walk.strides.assign(t.strides().begin(), t.strides().end());
  parallel_for(t.numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
    Odometer o = walk;
    o.seek(lo);
    for (int64_t i = lo; i < hi; ++i, o.next()) dst[i] = static_cast<C>(src[o.offset]);
  });
}

// The equation on operands of `shapes` (LabelSizes `ls`), its scratch from `scratch`. Sizing
// (`ctx` null) takes the scratch of the evaluation without computing; running reads the
// inputs from `ctx` and writes `y`. Half types take their widened operands and float result
// first.
template <typename T>
void steps(const LabelSizes& ls, const std::vector<Shape>& shapes, OpContext* ctx, Tensor* y,
           Scratch& scratch) {
  using C = typename EinsumCompute<T>::type;
  constexpr bool widen = !std::is_same_v<compute_t<T>, T>;
  // An empty label empties the output or every sum: the result is all zeros.
  if (std::find(ls.size.begin(), ls.size.end(), 0) != ls.size.end()) {
    if (y) std::fill(y->data<T>(), y->data<T>() + y->numel(), T(0));
    return;
  }
  const size_t n = shapes.size();
  std::vector<Operand<C>> ops(n);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (widen) {
      C* dst = scratch.take<C>(shape_numel(shapes[i]));
      if (ctx) widen_into<T>(ctx->input(i), dst);
      ops[i] = {dst, make_view(ls.dims[i], shapes[i], contiguous_strides(shapes[i])), true};
    } else if (ctx) {
      const Tensor& t = ctx->input(i);
      ops[i] = {reinterpret_cast<const C*>(t.data<const T>()),
                make_view(ls.dims[i], t.shape(), t.strides()), false};
    } else {
      ops[i] = {nullptr, make_view(ls.dims[i], shapes[i], contiguous_strides(shapes[i])), false};
    }
  }
  C* result = nullptr;
  if constexpr (widen) {
    result = scratch.take<C>(shape_numel(ls.out_shape));
  } else if (y) {
    result = reinterpret_cast<C*>(y->data<T>());
  }
  evaluate<C>(std::move(ops), ls.out_labels, ls.size, result, scratch);
  if constexpr (widen) {
    if (y) {
      T* dst = y->data<T>();
      parallel_for(y->numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) dst[i] = T(result[i]);
      });
    }
  }
}

// The workspace bytes of the equation on operands of these shapes (steps, sizing).
uint64_t workspace_bytes(DataType dtype, const LabelSizes& ls, const std::vector<Shape>& shapes) {
  uint64_t bytes = 0;
  dispatch(EinsumTypes{}, dtype, [&]<typename T>() {
    Scratch sizing;
    steps<T>(ls, shapes, nullptr, nullptr, sizing);
    bytes = sizing.used();
  });
  return bytes;
}

class Einsum final : public Kernel {
 public:
  explicit Einsum(const NodeInfo& info) {
    try {
      eq_ = parse_equation(info.attr_string("equation"), info.num_inputs());
    } catch (const EquationError& e) {
      info.fail(e.message);
    }
  }

  void run(OpContext& ctx) override {
    const size_t n = eq_.terms.size();
    if (ctx.num_inputs() != n) ctx.fail("wrong number of inputs");
    const DataType dtype = ctx.input(0).dtype();
    std::vector<Shape> shapes;
    for (size_t i = 0; i < n; ++i) {
      if (ctx.input(i).dtype() != dtype) ctx.fail("inputs have different element types");
      shapes.push_back(ctx.input(i).shape());
    }
    LabelSizes labels;
    try {
      labels = label_sizes(eq_, shapes);
    } catch (const EquationError& e) {
      ctx.fail(e.message);
    }
    Tensor& y = ctx.output(0, dtype, labels.out_shape);
    WorkspaceLayout layout;
    const int part =
        layout.add(DataType::UInt8, static_cast<int64_t>(workspace_bytes(dtype, labels, shapes)));
    const Workspace space(ctx, layout);
    dispatch(EinsumTypes{}, dtype, [&]<typename T>() {
      Scratch carve(space.data<uint8_t>(part));
      steps<T>(labels, shapes, &ctx, &y, carve);
      if (carve.used() != layout.bytes()) throw std::logic_error("Einsum workspace mislaid");
    });
  }

 private:
  Equation eq_;
};

void einsum_shape(ShapeContext& c) {
  std::vector<Shape> shapes;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (c.dtype(i) != c.dtype(0)) unknown("inputs have different element types");
    shapes.push_back(c.shape(i));
  }
  try {
    const Equation eq = parse_equation(c.attr_string("equation", ""), c.num_inputs());
    c.set(0, c.dtype(0), label_sizes(eq, shapes).out_shape);
  } catch (const EquationError& e) {
    unknown(e.message);
  }
}

// The kernel's workspace (steps, sizing) for these shapes.
uint64_t einsum_workspace(const ShapeContext& c) {
  std::vector<Shape> shapes;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (c.dtype(i) != c.dtype(0)) unknown("inputs have different element types");
    shapes.push_back(c.shape(i));
  }
  if (!type_in(EinsumTypes{}, c.dtype(0))) unknown("unsupported element type");
  try {
    const Equation eq = parse_equation(c.attr_string("equation", ""), c.num_inputs());
    return workspace_bytes(c.dtype(0), label_sizes(eq, shapes), shapes);
  } catch (const EquationError& e) {
    unknown(e.message);
  } catch (const Error& e) {  // operands too large: the kernel reports it
    unknown(e.what());
  }
}

}  // namespace

KILN_REGISTER_OP({.op = "Einsum",
                  .since = 12,
                  .min_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "float types, int32, int64, uint32, uint64",
                  .shape = einsum_shape,
                  .workspace = einsum_workspace,
                  .create = make<Einsum>});

}  // namespace kiln::ops
