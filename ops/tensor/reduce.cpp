// ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceLogSum,
// ReduceLogSumExp and ReduceSumSquare.
//
// The input shape is collapsed into alternating groups of kept and reduced dimensions. Every
// output reduces a set of contiguous runs: the innermost reduced group, or single elements
// when the innermost group is kept. Outputs are processed in batches along the innermost
// kept group, so a reduction over leading axes becomes a vectorised accumulation of rows and
// a reduction over the last axis a multi-lane sum over each row. When there are too few
// outputs to keep every thread busy, the reduced range itself is split and the partial
// results merged. The iteration is shared code; only the accumulation of runs and the final
// conversion are instantiated per op and element type.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <tbb/task_arena.h>
#include <Eigen/Core>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// ---- accumulators ----

// Integer sums and products wrap around (as onnxruntime's do) without signed overflow.
template <typename T>
using IntAcc = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
template <typename T>
using SumAcc = std::conditional_t<std::is_integral_v<T>, IntAcc<T>, compute_t<T>>;

template <typename A>
A wrap_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  } else {
    return a + b;
  }
}

template <typename A>
A wrap_mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  } else {
    return a * b;
  }
}

enum class Pre { Id, Abs, Square };

template <typename T, Pre P>
struct SumR {
  using A = SumAcc<T>;
  static A identity() { return A(0); }
  static A load(T x, A) {
    const A v = static_cast<A>(static_cast<compute_t<T>>(x));
    if constexpr (P == Pre::Abs) {
      if constexpr (std::is_integral_v<A>) {
        return v < A(0) ? static_cast<A>(uint64_t{0} - static_cast<uint64_t>(v)) : v;
      } else {
        return std::abs(v);
      }
    } else if constexpr (P == Pre::Square) {
      return wrap_mul(v, v);
    } else {
      return v;
    }
  }
  static A combine(A a, A b) { return wrap_add(a, b); }
};

template <typename T>
struct ProdR {
  using A = SumAcc<T>;
  static A identity() { return A(1); }
  static A load(T x, A) { return static_cast<A>(static_cast<compute_t<T>>(x)); }
  static A combine(A a, A b) { return wrap_mul(a, b); }
};

// Max and Min propagate NaN like numpy's maximum/minimum.
template <typename T>
constexpr bool kEigenFloat = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <typename T>
using ConstArr = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

template <typename T, bool kMax>
struct ExtremumR {
  using A = compute_t<T>;
  // A whole run (n >= 1) with Eigen's vectorised NaN-propagating max/min.
  static A run(const T* p, int64_t n, A) requires kEigenFloat<T> {
    ConstArr<T> m(p, n);
    return kMax ? m.template maxCoeff<Eigen::PropagateNaN>()
                : m.template minCoeff<Eigen::PropagateNaN>();
  }
  static A identity() {
    if constexpr (std::is_same_v<A, bool>) {
      return !kMax;
    } else if constexpr (std::is_floating_point_v<A>) {
      return kMax ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::infinity();
    } else {
      return kMax ? std::numeric_limits<A>::lowest() : std::numeric_limits<A>::max();
    }
  }
  static A load(T x, A) { return static_cast<A>(x); }
  static A combine(A a, A b) {
    if constexpr (std::is_same_v<A, bool>) {
      return kMax ? (a || b) : (a && b);
    } else if constexpr (std::is_floating_point_v<A>) {
      return ((kMax ? b > a : b < a) || b != b) ? b : a;
    } else {
      return (kMax ? b > a : b < a) ? b : a;
    }
  }
};

// exp(x - shift) summed; the shift is the per-output maximum found by a first pass.
template <typename T>
struct SumExpR {
  using A = std::conditional_t<std::is_integral_v<T>, double, compute_t<T>>;
  static constexpr bool kShift = true;
  static A identity() { return A(0); }
  static A load(T x, A shift) {
    return std::exp(static_cast<A>(static_cast<compute_t<T>>(x)) - shift);
  }
  static A combine(A a, A b) { return a + b; }
  // Eigen's vectorised exp over a run and over a row of outputs.
  static A run(const T* p, int64_t n, A shift) requires kEigenFloat<T> {
    return (ConstArr<T>(p, n) - shift).exp().sum();
  }
  static void rows(A* acc, const T* src, int64_t n, const A* shift) requires kEigenFloat<T> {
    Eigen::Map<Eigen::Array<A, Eigen::Dynamic, 1>>(acc, n) +=
        (ConstArr<T>(src, n) - ConstArr<A>(shift, n)).exp();
  }
};

template <typename R>
constexpr bool uses_shift() {
  if constexpr (requires { R::kShift; }) {
    return R::kShift;
  } else {
    return false;
  }
}

// Reduces one contiguous run into `acc` with 8 independent lanes so that it vectorises.
template <typename R, typename T>
typename R::A reduce_run(const T* p, int64_t n, typename R::A acc, typename R::A shift) {
  using A = typename R::A;
  constexpr int kLanes = 8;
  if constexpr (requires { R::run(p, n, shift); }) {
    return R::combine(acc, R::run(p, n, shift));
  }
  if (n >= kLanes) {
    A lane[kLanes];
    for (int j = 0; j < kLanes; ++j) lane[j] = R::identity();
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) lane[j] = R::combine(lane[j], R::load(p[i + j], shift));
    }
    for (; i < n; ++i) lane[0] = R::combine(lane[0], R::load(p[i], shift));
    for (int w = kLanes / 2; w > 0; w /= 2) {
      for (int j = 0; j < w; ++j) lane[j] = R::combine(lane[j], lane[j + w]);
    }
    return R::combine(acc, lane[0]);
  }
  for (int64_t i = 0; i < n; ++i) acc = R::combine(acc, R::load(p[i], shift));
  return acc;
}

// ---- type-erased functions the shared driver calls ----

struct Finish {
  std::byte* out;          // output elements (or shift values for the first LogSumExp pass)
  int64_t count;           // elements reduced into each output
  const std::byte* shift;  // per-output shift, or null
};

struct ReduceFns {
  size_t acc_bytes;
  void (*init)(std::byte* acc, int64_t n);
  // acc[c] <- combine(acc[c], run at src + c * stride of `len` elements), c < n.
  void (*runs)(std::byte* acc, const std::byte* src, int64_t len, int64_t n, int64_t stride,
               const std::byte* shift);
  void (*merge)(std::byte* acc, const std::byte* other, int64_t n);
  // Writes outputs [first, first + n) from their accumulators.
  void (*finish)(const Finish& f, const std::byte* acc, int64_t first, int64_t n);
};

template <typename R>
void init_acc(std::byte* accv, int64_t n) {
  auto* acc = reinterpret_cast<typename R::A*>(accv);
  std::fill(acc, acc + n, R::identity());
}

template <typename R, typename T>
void runs_acc(std::byte* accv, const std::byte* srcv, int64_t len, int64_t n, int64_t stride,
              const std::byte* shiftv) {
  using A = typename R::A;
  auto* acc = reinterpret_cast<A*>(accv);
  const T* src = reinterpret_cast<const T*>(srcv);
  const A* shift = reinterpret_cast<const A*>(shiftv);
  auto shift_at = [&](int64_t c) {
    if constexpr (uses_shift<R>()) {
      return shift[c];
    } else {
      return A{};
    }
  };
  if constexpr (requires { R::rows(acc, src, n, shift); }) {
    if (len == 1 && stride == 1) {
      R::rows(acc, src, n, shift);
      return;
    }
  }
  if (len == 1 && stride == 1) {
    for (int64_t c = 0; c < n; ++c) acc[c] = R::combine(acc[c], R::load(src[c], shift_at(c)));
  } else if (len == 1) {
    for (int64_t c = 0; c < n; ++c) {
      acc[c] = R::combine(acc[c], R::load(src[c * stride], shift_at(c)));
    }
  } else {
    for (int64_t c = 0; c < n; ++c) {
      acc[c] = reduce_run<R, T>(src + c * stride, len, acc[c], shift_at(c));
    }
  }
}

template <typename R>
void merge_acc(std::byte* accv, const std::byte* otherv, int64_t n) {
  auto* acc = reinterpret_cast<typename R::A*>(accv);
  const auto* other = reinterpret_cast<const typename R::A*>(otherv);
  for (int64_t c = 0; c < n; ++c) acc[c] = R::combine(acc[c], other[c]);
}

// Integer results of float math (log, sqrt) saturate instead of converting out of range.
template <typename T>
T to_output(double v) {
  if constexpr (std::is_integral_v<T>) {
    if (std::isnan(v)) return T(0);
    if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) {
      return std::numeric_limits<T>::lowest();
    }
    if (v >= static_cast<double>(std::numeric_limits<T>::max())) {
      return std::numeric_limits<T>::max();
    }
    return static_cast<T>(v);
  } else {
    return from_compute<T>(static_cast<compute_t<T>>(v));
  }
}

enum class Post { Store, Mean, Sqrt, Log, LogShift, ToShift };

template <typename R, typename T, Post P>
void finish_acc(const Finish& f, const std::byte* accv, int64_t first, int64_t n) {
  using A = typename R::A;
  const A* acc = reinterpret_cast<const A*>(accv);
  if constexpr (P == Post::ToShift) {
    // The maximum becomes the shift of the exp pass; infinities and NaN shift by 0 so that
    // all -inf gives -inf and +inf or NaN propagate.
    using S = typename SumExpR<T>::A;
    S* out = reinterpret_cast<S*>(f.out) + first;
    for (int64_t c = 0; c < n; ++c) {
      const S v = static_cast<S>(acc[c]);
      out[c] = std::isfinite(v) ? v : S(0);
    }
  } else {
    T* out = reinterpret_cast<T*>(f.out) + first;
    for (int64_t c = 0; c < n; ++c) {
      const A a = acc[c];
      if constexpr (P == Post::Store) {
        if constexpr (std::is_integral_v<A>) {
          out[c] = static_cast<T>(a);
        } else {
          out[c] = from_compute<T>(a);
        }
      } else if constexpr (P == Post::Mean) {
        // The mean of nothing is 0, as onnxruntime gives.
        if (f.count == 0) {
          out[c] = T(0);
        } else if constexpr (std::is_integral_v<A>) {
          out[c] = static_cast<T>(a / static_cast<A>(f.count));
        } else {
          out[c] = from_compute<T>(a / static_cast<A>(f.count));
        }
      } else if constexpr (P == Post::Sqrt) {
        out[c] = to_output<T>(std::sqrt(static_cast<double>(a)));
      } else if constexpr (P == Post::Log) {
        out[c] = to_output<T>(std::log(static_cast<double>(a)));
      } else {
        const A* shift = reinterpret_cast<const A*>(f.shift) + first;
        out[c] = to_output<T>(static_cast<double>(std::log(a) + shift[c]));
      }
    }
  }
}

template <typename R, typename T, Post P>
const ReduceFns& fns() {
  static const ReduceFns f{sizeof(typename R::A), init_acc<R>, runs_acc<R, T>, merge_acc<R>,
                           finish_acc<R, T, P>};
  return f;
}

// ---- the shared driver ----

// The input seen as kept and reduced groups (contiguous, size-1 dims dropped, adjacent
// groups of the same kind merged). Strides are in elements.
struct Layout {
  std::vector<int64_t> kdims, kstrides;  // kept groups, outermost first
  std::vector<int64_t> rdims, rstrides;  // reduced groups except the innermost run
  int64_t run = 1;                       // the innermost group's size when it is reduced
  int64_t outputs = 1, outer_runs = 1;   // products of kdims and rdims
};

Layout make_layout(const Shape& shape, const std::vector<bool>& reduced) {
  std::vector<int64_t> dims;
  std::vector<bool> kinds;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!dims.empty() && kinds.back() == reduced[d]) {
      dims.back() *= shape[d];
    } else {
      dims.push_back(shape[d]);
      kinds.push_back(reduced[d]);
    }
  }
  Layout l;
  int64_t stride = 1;
  std::vector<int64_t> strides(dims.size());
  for (size_t g = dims.size(); g-- > 0;) {
    strides[g] = stride;
    stride *= dims[g];
  }
  size_t end = dims.size();
  if (end > 0 && kinds[end - 1]) {
    l.run = dims[end - 1];
    --end;
  }
  for (size_t g = 0; g < end; ++g) {
    (kinds[g] ? l.rdims : l.kdims).push_back(dims[g]);
    (kinds[g] ? l.rstrides : l.kstrides).push_back(strides[g]);
  }
  for (int64_t d : l.kdims) l.outputs *= d;
  for (int64_t d : l.rdims) l.outer_runs *= d;
  return l;
}

// Offset of position `index` (row-major over dims) as a sum of strides.
int64_t offset_of(int64_t index, const std::vector<int64_t>& dims,
                  const std::vector<int64_t>& strides, size_t ndims) {
  int64_t off = 0;
  for (size_t d = ndims; d-- > 0;) {
    off += (index % dims[d]) * strides[d];
    index /= dims[d];
  }
  return off;
}

// Outputs accumulated together along the innermost kept group: whole rows (up to kRowChunk)
// when single elements are accumulated, so that memory is read in long contiguous stretches.
constexpr int64_t kChunk = 256;
constexpr int64_t kRowChunk = 4096;

void reduce_driver(const ReduceFns& fns, const Layout& l, const std::byte* src, size_t esize,
                   const Finish& fin) {
  if (l.outputs == 0) return;
  const int64_t klast = l.kdims.empty() ? 1 : l.kdims.back();
  const int64_t kstride = l.kdims.empty() ? 0 : l.kstrides.back();
  const size_t nk_outer = l.kdims.empty() ? 0 : l.kdims.size() - 1;
  const int64_t reduced = l.outer_runs * l.run;
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t outer = l.outputs / klast;
  const bool big = reduced * l.outputs >= (int64_t{1} << 17);
  int64_t chunk = std::min(klast, l.run == 1 ? kRowChunk : kChunk);
  int64_t nchunks = (klast + chunk - 1) / chunk;
  int64_t items = outer * nchunks;
  // Few outputs over a long reduction: split the reduced range (by runs or within the run)
  // among the threads and merge the partial results.
  int64_t split = 1;
  bool by_runs = false;
  if (items < threads && big) {
    if (l.outer_runs >= threads) {
      split = threads;
      by_runs = true;
    } else if (l.run >= threads * 1024) {
      split = threads;
    }
  }
  // Otherwise shorter batches, when that is what it takes to give every thread outputs.
  if (split == 1 && threads > 1 && items < threads * 2 && big && klast > 16) {
    const int64_t want = (threads * 2 + outer - 1) / outer;
    chunk = std::clamp<int64_t>(klast / want, 16, chunk);
    nchunks = (klast + chunk - 1) / chunk;
    items = outer * nchunks;
  }

  // Processes items [i0, i1), reduced runs [p0, p1) and elements [q0, q1) of each run;
  // results go to `dest` (per output index) or are finished when dest is null.
  auto work = [&](int64_t i0, int64_t i1, int64_t p0, int64_t p1, int64_t q0, int64_t q1,
                  std::byte* dest) {
    std::vector<std::byte> local(dest ? 0 : static_cast<size_t>(chunk) * fns.acc_bytes);
    const size_t nr = l.rdims.size();
    std::vector<int64_t> idx(nr);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t o = item / nchunks;
      const int64_t k0 = (item % nchunks) * chunk;
      const int64_t n = std::min(chunk, klast - k0);
      const int64_t first = o * klast + k0;
      const int64_t base = offset_of(o, l.kdims, l.kstrides, nk_outer) + k0 * kstride;
      std::byte* acc = dest ? dest + static_cast<size_t>(first) * fns.acc_bytes : local.data();
      fns.init(acc, n);
      if (p1 > p0 && q1 > q0) {
        int64_t r = p0;
        for (size_t d = nr; d-- > 0;) {
          idx[d] = r % l.rdims[d];
          r /= l.rdims[d];
        }
        int64_t roff = offset_of(p0, l.rdims, l.rstrides, nr);
        const std::byte* shift =
            fin.shift ? fin.shift + static_cast<size_t>(first) * fns.acc_bytes : nullptr;
        for (int64_t p = p0; p < p1; ++p) {
          fns.runs(acc, src + static_cast<size_t>(base + roff + q0) * esize, q1 - q0, n, kstride,
                   shift);
          for (size_t d = nr; d-- > 0;) {
            roff += l.rstrides[d];
            if (++idx[d] < l.rdims[d]) break;
            roff -= idx[d] * l.rstrides[d];
            idx[d] = 0;
          }
        }
      }
      if (!dest) fns.finish(fin, acc, first, n);
    }
  };

  if (split > 1) {
    std::vector<std::byte> partial(static_cast<size_t>(split * l.outputs) * fns.acc_bytes);
    parallel_for(split, 1, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        std::byte* dest = partial.data() + static_cast<size_t>(s * l.outputs) * fns.acc_bytes;
        if (by_runs) {
          work(0, items, l.outer_runs * s / split, l.outer_runs * (s + 1) / split, 0, l.run, dest);
        } else {
          work(0, items, 0, l.outer_runs, l.run * s / split, l.run * (s + 1) / split, dest);
        }
      }
    });
    for (int64_t s = 1; s < split; ++s) {
      fns.merge(partial.data(), partial.data() + static_cast<size_t>(s * l.outputs) * fns.acc_bytes,
                l.outputs);
    }
    fns.finish(fin, partial.data(), 0, l.outputs);
    return;
  }
  const int64_t per_item = std::max<int64_t>(1, reduced * std::min(chunk, klast));
  parallel_for(items, grain_for(per_item),
               [&](int64_t i0, int64_t i1) { work(i0, i1, 0, l.outer_runs, 0, l.run, nullptr); });
}

// ---- the kernel ----

enum class Kind { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

using ReduceTypes =
    TypeList<float, double, float16, bfloat16, int32_t, int64_t, uint32_t, uint64_t>;
using ExtremumTypes = TypeList<float, double, float16, bfloat16, int32_t, int64_t, uint32_t,
                               uint64_t, int8_t, uint8_t, bool>;

template <Kind K, typename T>
const ReduceFns& fns_for() {
  if constexpr (K == Kind::Sum) return fns<SumR<T, Pre::Id>, T, Post::Store>();
  if constexpr (K == Kind::Mean) return fns<SumR<T, Pre::Id>, T, Post::Mean>();
  if constexpr (K == Kind::Max) return fns<ExtremumR<T, true>, T, Post::Store>();
  if constexpr (K == Kind::Min) return fns<ExtremumR<T, false>, T, Post::Store>();
  if constexpr (K == Kind::Prod) return fns<ProdR<T>, T, Post::Store>();
  if constexpr (K == Kind::L1) return fns<SumR<T, Pre::Abs>, T, Post::Store>();
  if constexpr (K == Kind::L2) return fns<SumR<T, Pre::Square>, T, Post::Sqrt>();
  if constexpr (K == Kind::LogSum) return fns<SumR<T, Pre::Id>, T, Post::Log>();
  if constexpr (K == Kind::LogSumExp) return fns<SumExpR<T>, T, Post::LogShift>();
  if constexpr (K == Kind::SumSquare) return fns<SumR<T, Pre::Square>, T, Post::Store>();
}

// Which dims a reduction over `axes` reduces (all when there are none, unless `noop`), and
// the shape it leaves. Shared by the kernels and the shape rule; throw kiln::Error without a
// node.
std::vector<bool> reduced_dims(const Shape& x, const std::vector<int64_t>& axes, bool noop) {
  std::vector<bool> reduced(x.size(), axes.empty() && !noop);
  for (int64_t a : axes) {
    const auto d = static_cast<size_t>(normalize_axis(a, static_cast<int64_t>(x.size())));
    if (reduced[d])
      throw Error(ErrorKind::Runtime, "axis " + std::to_string(a) + " is listed twice");
    reduced[d] = true;
  }
  return reduced;
}

Shape reduced_shape(const Shape& x, const std::vector<bool>& reduced, bool keepdims) {
  Shape out;
  for (size_t d = 0; d < x.size(); ++d) {
    if (!reduced[d]) {
      out.push_back(x[d]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  return out;
}

template <Kind K>
class Reduce final : public Kernel {
 public:
  explicit Reduce(const NodeInfo& info)
      : axes_input_(info.opset() >= (K == Kind::Sum ? 13 : 18)),
        keepdims_(info.attr_int("keepdims", 1) != 0),
        noop_(info.attr_int("noop_with_empty_axes", 0) != 0) {
    if (axes_input_) {
      if (info.has_attr("axes")) info.fail("axes is an input from this opset, not an attribute");
      if (const Tensor* a = info.constant_input(1)) {
        const_axes_ = to_int64s(*a);
        have_const_axes_ = true;
      }
    } else {
      axes_ = info.attr_ints("axes");
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::vector<int64_t> axes =
        !axes_input_
            ? axes_
            : (have_const_axes_ ? const_axes_
                                : (ctx.has_input(1) ? std::vector<int64_t>(to_int64s(ctx.input(1)))
                                                    : std::vector<int64_t>{}));
    const std::vector<bool> reduced = reduced_dims(x.shape(), axes, noop_);
    const Shape out_shape = reduced_shape(x.shape(), reduced, keepdims_);
    bool any = false;
    int64_t count = 1;  // elements reduced into each output
    for (size_t d = 0; d < x.rank(); ++d) {
      if (!reduced[d]) continue;
      any = true;
      count *= x.dim(d);
    }
    using Types = std::conditional_t<K == Kind::Max || K == Kind::Min, ExtremumTypes, ReduceTypes>;
    if (!type_in(Types{}, x.dtype())) throw_unsupported_type(x.dtype(), "input");
    // Reducing nothing is the identity for these ops: share the input.
    if (!any && (K == Kind::Sum || K == Kind::Mean || K == Kind::Max || K == Kind::Min ||
                 K == Kind::Prod)) {
      ctx.set_output(0, ctx.input_value(0));
      return;
    }
    Tensor& y = ctx.output(0, x.dtype(), out_shape);
    const Layout layout = make_layout(x.shape(), reduced);
    dispatch(Types{}, x.dtype(), [&]<typename T>() {
      const auto* src = reinterpret_cast<const std::byte*>(x.data<const T>());
      Finish fin{reinterpret_cast<std::byte*>(y.data<T>()), count, nullptr};
      if constexpr (K == Kind::LogSumExp) {
        using S = typename SumExpR<T>::A;
        std::vector<S> shift(static_cast<size_t>(layout.outputs));
        Finish to_shift{reinterpret_cast<std::byte*>(shift.data()), count, nullptr};
        reduce_driver(fns<ExtremumR<T, true>, T, Post::ToShift>(), layout, src, sizeof(T),
                      to_shift);
        fin.shift = reinterpret_cast<const std::byte*>(shift.data());
        reduce_driver(fns_for<K, T>(), layout, src, sizeof(T), fin);
      } else {
        reduce_driver(fns_for<K, T>(), layout, src, sizeof(T), fin);
      }
    });
  }

 private:
  bool axes_input_;
  bool keepdims_;
  bool noop_;
  bool have_const_axes_ = false;
  std::vector<int64_t> axes_, const_axes_;
};

void reduce_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  // ReduceSum takes axes as an input from opset 13, the others from 18.
  const int64_t since = c.node().op_type == "ReduceSum" ? 13 : 18;
  const std::vector<int64_t> axes = c.ints_from("axes", since, 1);
  const bool keepdims = c.attr_int("keepdims", 1) != 0;
  if (axes.empty() && c.attr_int("noop_with_empty_axes", 0) != 0) {
    same_shape(c);
    return;
  }
  if (!x.ranked) {
    c.set(0, typed_facts(x.dtype));
    return;
  }
  // The kept dimensions (with their names), 1 for each reduced one when kept.
  const std::vector<bool> reduced = reduced_dims(x.shape, axes, false);
  ValueFacts out = typed_facts(x.dtype);
  out.ranked = true;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    if (!reduced[d]) {
      append_dim(out, x, d);
    } else if (keepdims) {
      append_dim(out, 1);
    }
  }
  c.set(0, std::move(out));
}

}  // namespace

#define KILN_REDUCE(op_name, kind, type_names) \
  KILN_REGISTER_OP({.op = op_name,             \
                    .since = 1,                \
                    .min_inputs = 1,           \
                    .max_inputs = 2,           \
                    .min_outputs = 1,          \
                    .max_outputs = 1,          \
                    .types = type_names,       \
                    .shape = reduce_shape,     \
                    .create = make<Reduce<kind>>})

constexpr const char* kReduceTypes =
    "float, double, float16, bfloat16, int32, int64, uint32, uint64";
KILN_REDUCE("ReduceSum", Kind::Sum, kReduceTypes);
KILN_REDUCE("ReduceMean", Kind::Mean, kReduceTypes);
KILN_REDUCE("ReduceMax", Kind::Max, "float types, int8-64, uint8-64, bool");
KILN_REDUCE("ReduceMin", Kind::Min, "float types, int8-64, uint8-64, bool");
KILN_REDUCE("ReduceProd", Kind::Prod, kReduceTypes);
KILN_REDUCE("ReduceL1", Kind::L1, kReduceTypes);
KILN_REDUCE("ReduceL2", Kind::L2, kReduceTypes);
KILN_REDUCE("ReduceLogSum", Kind::LogSum, kReduceTypes);
KILN_REDUCE("ReduceLogSumExp", Kind::LogSumExp, kReduceTypes);
KILN_REDUCE("ReduceSumSquare", Kind::SumSquare, kReduceTypes);
#undef KILN_REDUCE

}  // namespace kiln::ops
