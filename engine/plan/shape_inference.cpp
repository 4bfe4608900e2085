#include "engine/plan/shape_inference.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <unordered_map>
#include <utility>

#include "ops/common.h"

namespace kiln::plan {

namespace {

// Thrown (and caught per node) when a node's outputs cannot be inferred.
struct Unknown {
  std::string why;
};

[[noreturn]] void unknown(std::string why) {
  throw Unknown{std::move(why)};
}

bool small_int(DataType t, int64_t n) {
  return (is_integer_type(t) || t == DataType::Bool) && n <= kMaxInferredData;
}

int64_t numel_or_unknown(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) unknown("negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) unknown("size overflows");
    n *= d;
  }
  return n;
}

// The flat index into a tensor of shape `in` read for flat index `flat` of the broadcast
// shape `out`.
int64_t broadcast_index(const Shape& in, const Shape& out, int64_t flat) {
  int64_t index = 0, stride = 1;
  for (size_t k = out.size(); k-- > 0;) {
    const int64_t coord = flat % out[k];
    flat /= out[k];
    const size_t lead = out.size() - in.size();
    if (k >= lead) {
      const int64_t d = in[k - lead];
      index += (d == 1 ? 0 : coord) * stride;
      stride *= d;
    }
  }
  return index;
}

int64_t normalize_axis(int64_t axis, size_t rank) {
  return ops::normalize_axis(axis, static_cast<int64_t>(rank));
}

class Ctx {
 public:
  Ctx(const ir::Graph& g, const ir::Node& node, std::vector<InferredValue>& values)
      : g_(g), node(node), values_(values) {}

  const ir::Graph& g_;
  const ir::Node& node;

  bool has(size_t i) const { return i < node.inputs.size() && node.inputs[i] != ir::kNoValue; }
  size_t num_inputs() const { return node.inputs.size(); }
  const InferredValue& in(size_t i) const {
    if (!has(i)) unknown("input " + std::to_string(i) + " is missing");
    const InferredValue& v = values_[static_cast<size_t>(node.inputs[i])];
    if (!v.known) unknown("input '" + g_.value(node.inputs[i]).name + "' is unknown");
    return v;
  }
  const Shape& shape(size_t i) const { return in(i).shape; }
  const std::vector<int64_t>& data(size_t i) const {
    const InferredValue& v = in(i);
    if (!v.has_data) {
      unknown("the values of input '" + g_.value(node.inputs[i]).name +
              "' are only known when run");
    }
    return v.data;
  }
  bool has_out(size_t i) const {
    return i < node.outputs.size() && node.outputs[i] != ir::kNoValue;
  }
  void set(size_t i, DataType dtype, Shape shape, const std::vector<int64_t>* data = nullptr) {
    if (!has_out(i)) return;
    InferredValue v;
    const int64_t n = numel_or_unknown(shape);
    v.known = true;
    v.dtype = dtype;
    v.shape = std::move(shape);
    if (data && small_int(dtype, n) && static_cast<int64_t>(data->size()) == n) {
      v.has_data = true;
      v.data = *data;
    }
    values_[static_cast<size_t>(node.outputs[i])] = std::move(v);
  }
  void same(size_t out, size_t in_index) {
    const InferredValue& v = in(in_index);
    set(out, v.dtype, v.shape, v.has_data ? &v.data : nullptr);
  }

  int64_t attr_i(const char* name, int64_t def) const {
    const ir::Attribute* a = node.attr(name);
    return a ? a->i : def;
  }
  std::vector<int64_t> attr_ints(const char* name) const {
    const ir::Attribute* a = node.attr(name);
    return a ? a->ints : std::vector<int64_t>{};
  }
  bool has_attr(const char* name) const { return node.attr(name) != nullptr; }
  std::string attr_s(const char* name, const char* def) const {
    const ir::Attribute* a = node.attr(name);
    return a ? a->s : def;
  }

  // Integers from attribute `name` below opset `input_since`, else from input `input`
  // (empty when the input is omitted).
  std::vector<int64_t> ints_from(const char* name, int64_t input_since, size_t input) const {
    if (node.opset < input_since) return attr_ints(name);
    return has(input) ? data(input) : std::vector<int64_t>{};
  }

 private:
  std::vector<InferredValue>& values_;
};

using ShapeFn = std::function<void(Ctx&)>;

void unary(Ctx& c) {
  c.set(0, c.in(0).dtype, c.shape(0));
}

// Elementwise ops over broadcast inputs; `f` computes small integer data when every input
// has it.
void elementwise(Ctx& c, DataType out_type, size_t type_from,
                 int64_t (*f)(const std::vector<int64_t>&)) {
  Shape shape;
  bool first = true;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.has(i)) continue;
    shape = first ? c.shape(i) : ops::broadcast_shapes(shape, c.shape(i));
    first = false;
  }
  if (first) unknown("no inputs");
  const DataType dtype = out_type == DataType::Undefined ? c.in(type_from).dtype : out_type;
  const int64_t n = numel_or_unknown(shape);
  bool all_data = f != nullptr && small_int(dtype, n);
  for (size_t i = 0; all_data && i < c.num_inputs(); ++i) all_data = c.has(i) && c.in(i).has_data;
  if (!all_data) {
    c.set(0, dtype, shape);
    return;
  }
  std::vector<int64_t> out(static_cast<size_t>(n)), args(c.num_inputs());
  for (int64_t k = 0; k < n; ++k) {
    for (size_t i = 0; i < c.num_inputs(); ++i) {
      args[i] = c.in(i).data[static_cast<size_t>(broadcast_index(c.shape(i), shape, k))];
    }
    out[static_cast<size_t>(k)] = f(args);
  }
  c.set(0, dtype, shape, &out);
}

// Integer arithmetic on inferred values; an overflow leaves the value unknown.
int64_t add(const std::vector<int64_t>& a) {
  int64_t r = 0;
  if (__builtin_add_overflow(a[0], a[1], &r)) unknown("overflow");
  return r;
}

int64_t subtract(const std::vector<int64_t>& a) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a[0], a[1], &r)) unknown("overflow");
  return r;
}

int64_t multiply(const std::vector<int64_t>& a) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a[0], a[1], &r)) unknown("overflow");
  return r;
}

int64_t negate(const std::vector<int64_t>& a) {
  return subtract({0, a[0]});
}

int64_t absolute(const std::vector<int64_t>& a) {
  return a[0] < 0 ? negate(a) : a[0];
}

int64_t divide(const std::vector<int64_t>& a) {
  if (a[1] == 0) unknown("division by zero");
  if (a[1] == -1) return negate(a);
  return a[0] / a[1];
}

// Conv and pooling output sizes along the spatial dimensions of `x`.
Shape windowed(Ctx& c, const Shape& x, const std::vector<int64_t>& kernel, bool ceil_mode) {
  const size_t spatial = x.size() < 2 ? 0 : x.size() - 2;
  if (kernel.size() != spatial) unknown("kernel rank does not match the input");
  std::vector<int64_t> strides = c.attr_ints("strides"), dilations = c.attr_ints("dilations"),
                       pads = c.attr_ints("pads");
  strides.resize(spatial, 1);
  dilations.resize(spatial, 1);
  pads.resize(2 * spatial, 0);
  const std::string auto_pad = c.attr_s("auto_pad", "NOTSET");
  Shape out;
  for (size_t d = 0; d < spatial; ++d) {
    const int64_t in = x[d + 2], s = strides[d], dk = (kernel[d] - 1) * dilations[d] + 1;
    if (s <= 0 || dk <= 0) unknown("bad strides or kernel");
    int64_t o = 0;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      o = (in + s - 1) / s;
    } else if (auto_pad == "VALID") {
      o = in < dk ? 0 : (in - dk) / s + 1;
    } else {
      const int64_t span = in + pads[d] + pads[d + spatial] - dk;
      if (span < 0) unknown("window larger than the padded input");
      o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
      // The last window must start inside the input or its left padding.
      if (ceil_mode && (o - 1) * s >= in + pads[d]) --o;
    }
    out.push_back(o);
  }
  return out;
}

Shape conv_shape(Ctx& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  if (x.size() < 3 || w.size() != x.size()) unknown("ranks of X and W");
  std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) kernel.assign(w.begin() + 2, w.end());
  Shape out{x[0], w[0]};
  for (int64_t d : windowed(c, x, kernel, false)) out.push_back(d);
  return out;
}

void conv(Ctx& c) {
  c.set(0, c.in(0).dtype, conv_shape(c));
}

// kiln.FusedConv: the convolution plus Z, which may broadcast.
void fused_conv(Ctx& c) {
  const Shape out = conv_shape(c);
  c.set(0, c.in(0).dtype, c.has(3) ? ops::broadcast_shapes(out, c.shape(3)) : out);
}

void conv_transpose(Ctx& c) {
  const Shape& x = c.shape(0);
  const Shape& w = c.shape(1);
  if (x.size() < 3 || w.size() != x.size()) unknown("ranks of X and W");
  const size_t spatial = x.size() - 2;
  std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  if (kernel.empty()) kernel.assign(w.begin() + 2, w.end());
  std::vector<int64_t> strides = c.attr_ints("strides"), dilations = c.attr_ints("dilations"),
                       pads = c.attr_ints("pads"), extra = c.attr_ints("output_padding"),
                       wanted = c.attr_ints("output_shape");
  strides.resize(spatial, 1);
  dilations.resize(spatial, 1);
  pads.resize(2 * spatial, 0);
  extra.resize(spatial, 0);
  if (kernel.size() != spatial) unknown("kernel rank does not match the input");
  Shape out{x[0], w[1] * c.attr_i("group", 1)};
  for (size_t d = 0; d < spatial; ++d) {
    if (!wanted.empty()) {
      out.push_back(wanted[wanted.size() - spatial + d]);
      continue;
    }
    const int64_t full =
        strides[d] * (x[d + 2] - 1) + extra[d] + (kernel[d] - 1) * dilations[d] + 1;
    const std::string auto_pad = c.attr_s("auto_pad", "NOTSET");
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out.push_back(x[d + 2] * strides[d]);
    } else {
      out.push_back(full - pads[d] - pads[d + spatial]);
    }
  }
  c.set(0, c.in(0).dtype, out);
}

void pool(Ctx& c) {
  const Shape& x = c.shape(0);
  const std::vector<int64_t> kernel = c.attr_ints("kernel_shape");
  Shape out{x.at(0), x.at(1)};
  for (int64_t d : windowed(c, x, kernel, c.attr_i("ceil_mode", 0) != 0)) out.push_back(d);
  c.set(0, c.in(0).dtype, out);
  c.set(1, DataType::Int64, out);  // MaxPool's indices
}

void global_pool(Ctx& c) {
  Shape out = c.shape(0);
  if (out.size() < 2) unknown("rank below 2");
  std::fill(out.begin() + 2, out.end(), 1);
  c.set(0, c.in(0).dtype, out);
}

// MatMul, and the fused products whose transA / transB swap an operand's last two axes.
void matmul(Ctx& c) {
  Shape a = c.shape(0), b = c.shape(1);
  if (a.empty() || b.empty()) unknown("scalar operand");
  if (a.size() >= 2 && c.attr_i("transA", 0) != 0) std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (b.size() >= 2 && c.attr_i("transB", 0) != 0) std::swap(b[b.size() - 1], b[b.size() - 2]);
  const bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a.insert(a.begin(), 1);
  if (b1) b.push_back(1);
  if (a.back() != b[b.size() - 2]) unknown("inner dimensions differ");
  Shape batch = ops::broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  if (!a1) batch.push_back(a[a.size() - 2]);
  if (!b1) batch.push_back(b.back());
  c.set(0, c.in(0).dtype, batch);
}

// Attention (opset 23) on 4-D inputs with only its first output: Q's shape with V's head
// size.
void attention(Ctx& c) {
  const Shape& q = c.shape(0);
  const Shape& v = c.shape(2);
  if (q.size() != 4 || v.size() != 4) unknown("only 4-D attention is inferred");
  if (c.node.outputs.size() > 1) {
    for (size_t i = 1; i < c.node.outputs.size(); ++i) {
      if (c.node.outputs[i] != ir::kNoValue) unknown("present outputs are not inferred");
    }
  }
  c.set(0, c.in(0).dtype, {q[0], q[1], q[2], v[3]});
}

void gemm(Ctx& c) {
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(1);
  if (a.size() != 2 || b.size() != 2) unknown("Gemm takes matrices");
  const int64_t m = c.attr_i("transA", 0) ? a[1] : a[0];
  const int64_t n = c.attr_i("transB", 0) ? b[0] : b[1];
  c.set(0, c.in(0).dtype, {m, n});
}

void reshape(Ctx& c) {
  const Shape& in = c.shape(0);
  const std::vector<int64_t>& req = c.data(1);
  const bool allowzero = c.attr_i("allowzero", 0) != 0;
  Shape out(req.size());
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < req.size(); ++i) {
    int64_t d = req[i];
    if (d == 0 && !allowzero) {
      if (i >= in.size()) unknown("0 beyond the input rank");
      d = in[i];
    }
    if (d == -1) {
      if (infer >= 0) unknown("two -1 dimensions");
      infer = static_cast<int64_t>(i);
      continue;
    }
    if (d < 0) unknown("negative dimension");
    out[i] = d;
    known *= d;
  }
  const int64_t n = numel_or_unknown(in);
  if (infer >= 0) {
    if (known == 0 || n % known != 0) unknown("cannot infer -1");
    out[static_cast<size_t>(infer)] = n / known;
  } else if (known != n) {
    unknown("element counts differ");
  }
  const InferredValue& x = c.in(0);
  c.set(0, x.dtype, out, x.has_data ? &x.data : nullptr);
}

void flatten(Ctx& c) {
  const Shape& in = c.shape(0);
  int64_t axis = c.attr_i("axis", 1);
  if (axis < 0) axis += static_cast<int64_t>(in.size());
  if (axis < 0 || axis > static_cast<int64_t>(in.size())) unknown("axis out of range");
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < in.size(); ++d) (static_cast<int64_t>(d) < axis ? outer : inner) *= in[d];
  const InferredValue& x = c.in(0);
  c.set(0, x.dtype, {outer, inner}, x.has_data ? &x.data : nullptr);
}

void unsqueeze(Ctx& c) {
  const InferredValue& x = c.in(0);
  std::vector<int64_t> axes = c.ints_from("axes", 13, 1);
  const size_t rank = x.shape.size() + axes.size();
  std::vector<bool> inserted(rank, false);
  for (int64_t a : axes) {
    const auto k = static_cast<size_t>(normalize_axis(a, rank));
    if (inserted[k]) unknown("repeated axis");
    inserted[k] = true;
  }
  Shape out;
  size_t next = 0;
  for (size_t k = 0; k < rank; ++k) out.push_back(inserted[k] ? 1 : x.shape[next++]);
  c.set(0, x.dtype, out, x.has_data ? &x.data : nullptr);
}

void squeeze(Ctx& c) {
  const InferredValue& x = c.in(0);
  const std::vector<int64_t> axes = c.ints_from("axes", 13, 1);
  std::vector<bool> drop(x.shape.size(), false);
  if (axes.empty()) {
    for (size_t k = 0; k < x.shape.size(); ++k) drop[k] = x.shape[k] == 1;
  }
  for (int64_t a : axes) {
    const auto k = static_cast<size_t>(normalize_axis(a, x.shape.size()));
    if (x.shape[k] != 1) unknown("squeezed dimension is not 1");
    drop[k] = true;
  }
  Shape out;
  for (size_t k = 0; k < x.shape.size(); ++k)
    if (!drop[k]) out.push_back(x.shape[k]);
  c.set(0, x.dtype, out, x.has_data ? &x.data : nullptr);
}

void transpose(Ctx& c) {
  const InferredValue& x = c.in(0);
  std::vector<int64_t> perm = c.attr_ints("perm");
  const size_t rank = x.shape.size();
  if (perm.empty()) {
    for (size_t d = rank; d-- > 0;) perm.push_back(static_cast<int64_t>(d));
  }
  if (perm.size() != rank) unknown("perm does not match the rank");
  Shape out;
  for (int64_t p : perm) out.push_back(x.shape.at(static_cast<size_t>(normalize_axis(p, rank))));
  c.set(0, x.dtype, out);
}

void concat(Ctx& c) {
  const InferredValue& first = c.in(0);
  const auto axis = static_cast<size_t>(normalize_axis(c.attr_i("axis", 0), first.shape.size()));
  Shape out = first.shape;
  out[axis] = 0;
  bool all_data = true;
  std::vector<int64_t> data;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const InferredValue& v = c.in(i);
    if (v.shape.size() != out.size()) unknown("ranks differ");
    for (size_t d = 0; d < out.size(); ++d) {
      if (d != axis && v.shape[d] != out[d]) unknown("shapes differ outside the axis");
    }
    out[axis] += v.shape[axis];
    all_data = all_data && v.has_data;
    if (v.has_data) data.insert(data.end(), v.data.begin(), v.data.end());
  }
  // Flat concatenation is the concatenation along the outermost non-unit axis only.
  bool outer = true;
  for (size_t d = 0; d < axis; ++d) outer = outer && out[d] == 1;
  c.set(0, first.dtype, out, all_data && outer ? &data : nullptr);
}

void shape_op(Ctx& c) {
  const Shape& in = c.shape(0);
  const auto rank = static_cast<int64_t>(in.size());
  auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
  const int64_t start = clamp(c.attr_i("start", 0)), end = clamp(c.attr_i("end", rank));
  std::vector<int64_t> data;
  for (int64_t d = start; d < end; ++d) data.push_back(in[static_cast<size_t>(d)]);
  c.set(0, DataType::Int64, {static_cast<int64_t>(data.size())}, &data);
}

void size_op(Ctx& c) {
  const std::vector<int64_t> data{numel_or_unknown(c.shape(0))};
  c.set(0, DataType::Int64, {}, &data);
}

void gather(Ctx& c) {
  const InferredValue& x = c.in(0);
  const InferredValue& idx = c.in(1);
  const auto axis = static_cast<size_t>(normalize_axis(c.attr_i("axis", 0), x.shape.size()));
  Shape out(x.shape.begin(), x.shape.begin() + static_cast<std::ptrdiff_t>(axis));
  out.insert(out.end(), idx.shape.begin(), idx.shape.end());
  out.insert(out.end(), x.shape.begin() + static_cast<std::ptrdiff_t>(axis) + 1, x.shape.end());
  if (x.has_data && idx.has_data && x.shape.size() == 1) {
    std::vector<int64_t> data;
    for (int64_t i : idx.data) {
      const int64_t k = i < 0 ? i + x.shape[0] : i;
      if (k < 0 || k >= x.shape[0]) unknown("index out of range");
      data.push_back(x.data[static_cast<size_t>(k)]);
    }
    c.set(0, x.dtype, out, &data);
    return;
  }
  c.set(0, x.dtype, out);
}

void slice(Ctx& c) {
  const InferredValue& x = c.in(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.node.opset < 10) {
    starts = c.attr_ints("starts");
    ends = c.attr_ints("ends");
    axes = c.attr_ints("axes");
  } else {
    starts = c.data(1);
    ends = c.data(2);
    if (c.has(3)) axes = c.data(3);
    if (c.has(4)) steps = c.data(4);
  }
  if (axes.empty()) {
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    unknown("starts, ends, axes and steps differ in length");
  Shape out = x.shape;
  std::vector<int64_t> first(out.size(), 0), step(out.size(), 1);
  for (size_t i = 0; i < starts.size(); ++i) {
    const auto a = static_cast<size_t>(normalize_axis(axes[i], out.size()));
    const int64_t d = x.shape[a], s = steps[i];
    if (s == 0) unknown("step 0");
    int64_t b = starts[i] < 0 ? starts[i] + d : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + d : ends[i];
    int64_t len = 0;
    if (s > 0) {
      b = std::clamp<int64_t>(b, 0, d);
      e = std::clamp<int64_t>(e, 0, d);
      len = e > b ? (e - b + s - 1) / s : 0;
    } else {
      b = std::clamp<int64_t>(b, 0, d - 1);
      e = std::clamp<int64_t>(e, -1, d - 1);
      len = b > e ? (b - e - s - 1) / -s : 0;
    }
    out[a] = len;
    first[a] = b;
    step[a] = s;
  }
  if (x.has_data && x.shape.size() == 1) {
    std::vector<int64_t> data;
    for (int64_t k = 0; k < out[0]; ++k)
      data.push_back(x.data[static_cast<size_t>(first[0] + k * step[0])]);
    c.set(0, x.dtype, out, &data);
    return;
  }
  c.set(0, x.dtype, out);
}

void cast(Ctx& c) {
  const InferredValue& x = c.in(0);
  const auto to = static_cast<DataType>(c.attr_i("to", 0));
  if (!is_known_data_type(static_cast<int32_t>(to))) unknown("bad 'to'");
  std::vector<int64_t> data = x.data;
  if (to == DataType::Bool)
    for (int64_t& v : data) v = v != 0;
  const bool keep = x.has_data && (is_integer_type(to) || to == DataType::Bool);
  c.set(0, to, x.shape, keep ? &data : nullptr);
}

void constant_of_shape(Ctx& c) {
  const std::vector<int64_t>& shape = c.data(0);
  const ir::Attribute* value = c.node.attr("value");
  DataType dtype = DataType::Float;
  int64_t fill = 0;
  if (value && value->t.defined()) {
    const InferredValue v = inferred_from(value->t);
    dtype = v.dtype;
    if (v.has_data && !v.data.empty()) fill = v.data[0];
  }
  const std::vector<int64_t> data(
      static_cast<size_t>(std::min<int64_t>(numel_or_unknown(shape), kMaxInferredData + 1)), fill);
  c.set(0, dtype, shape, &data);
}

void expand(Ctx& c) {
  const InferredValue& x = c.in(0);
  const Shape out = ops::broadcast_shapes(x.shape, c.data(1));
  const int64_t n = numel_or_unknown(out);
  if (x.has_data && n <= kMaxInferredData) {
    std::vector<int64_t> data;
    for (int64_t k = 0; k < n; ++k)
      data.push_back(x.data[static_cast<size_t>(broadcast_index(x.shape, out, k))]);
    c.set(0, x.dtype, out, &data);
    return;
  }
  c.set(0, x.dtype, out);
}

void range(Ctx& c) {
  const InferredValue& start = c.in(0);
  if (!is_integer_type(start.dtype)) unknown("a float Range's length is only known when run");
  const int64_t s = c.data(0).at(0), limit = c.data(1).at(0), delta = c.data(2).at(0);
  if (delta == 0) unknown("delta 0");
  const int64_t span = subtract({limit, s});
  const int64_t n =
      std::max<int64_t>(0, divide({add({span, delta - (delta > 0 ? 1 : -1)}), delta}));
  std::vector<int64_t> data;
  for (int64_t k = 0; k < n && k <= kMaxInferredData; ++k) data.push_back(s + k * delta);
  c.set(0, start.dtype, {n}, &data);
}

void reduce(Ctx& c) {
  const InferredValue& x = c.in(0);
  // ReduceSum takes axes as an input from opset 13, the others from 18.
  const int64_t since = c.node.op_type == "ReduceSum" ? 13 : 18;
  const std::vector<int64_t> axes = c.ints_from("axes", since, 1);
  const bool keepdims = c.attr_i("keepdims", 1) != 0;
  if (axes.empty() && c.attr_i("noop_with_empty_axes", 0) != 0) {
    c.set(0, x.dtype, x.shape);
    return;
  }
  std::vector<bool> reduced(x.shape.size(), axes.empty());
  for (int64_t a : axes) reduced[static_cast<size_t>(normalize_axis(a, x.shape.size()))] = true;
  Shape out;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    if (!reduced[d])
      out.push_back(x.shape[d]);
    else if (keepdims)
      out.push_back(1);
  }
  c.set(0, x.dtype, out);
}

void arg_reduce(Ctx& c) {
  Shape out = c.shape(0);
  const auto axis = static_cast<size_t>(normalize_axis(c.attr_i("axis", 0), out.size()));
  if (c.attr_i("keepdims", 1) != 0)
    out[axis] = 1;
  else
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(axis));
  c.set(0, DataType::Int64, out);
}

void split(Ctx& c) {
  const InferredValue& x = c.in(0);
  const auto axis = static_cast<size_t>(normalize_axis(c.attr_i("axis", 0), x.shape.size()));
  std::vector<int64_t> sizes = c.ints_from("split", 13, 1);
  const size_t outputs = c.node.outputs.size();
  if (sizes.empty()) {
    const int64_t parts =
        c.has_attr("num_outputs") ? c.attr_i("num_outputs", 1) : static_cast<int64_t>(outputs);
    if (parts <= 0) unknown("no outputs");
    const int64_t d = x.shape[axis], each = (d + parts - 1) / parts;
    for (int64_t p = 0; p < parts; ++p) sizes.push_back(std::clamp<int64_t>(d - p * each, 0, each));
  }
  if (sizes.size() != outputs) unknown("split sizes do not match the outputs");
  for (size_t i = 0; i < outputs; ++i) {
    Shape s = x.shape;
    s[axis] = sizes[i];
    c.set(i, x.dtype, s);
  }
}

void pad(Ctx& c) {
  const InferredValue& x = c.in(0);
  const std::vector<int64_t> pads = c.ints_from("pads", 11, 1);
  std::vector<int64_t> axes;
  if (c.node.opset >= 18 && c.has(3)) axes = c.data(3);
  if (axes.empty()) {
    for (size_t d = 0; d < x.shape.size(); ++d) axes.push_back(static_cast<int64_t>(d));
  }
  if (pads.size() != 2 * axes.size()) unknown("pads do not match the axes");
  Shape out = x.shape;
  for (size_t i = 0; i < axes.size(); ++i) {
    const auto a = static_cast<size_t>(normalize_axis(axes[i], out.size()));
    out[a] += pads[i] + pads[i + axes.size()];
    if (out[a] < 0) unknown("negative padded size");
  }
  c.set(0, x.dtype, out);
}

void tile(Ctx& c) {
  const InferredValue& x = c.in(0);
  const std::vector<int64_t>& repeats = c.data(1);
  if (repeats.size() != x.shape.size()) unknown("repeats do not match the rank");
  Shape out = x.shape;
  for (size_t d = 0; d < out.size(); ++d) out[d] *= repeats[d];
  c.set(0, x.dtype, out);
}

void layer_norm(Ctx& c) {
  const InferredValue& x = c.in(0);
  c.set(0, x.dtype, x.shape);
  const auto axis = static_cast<size_t>(normalize_axis(c.attr_i("axis", -1), x.shape.size()));
  Shape stat = x.shape;
  std::fill(stat.begin() + static_cast<std::ptrdiff_t>(axis), stat.end(), 1);
  c.set(1, DataType::Float, stat);
  c.set(2, DataType::Float, stat);
}

// com.microsoft.SkipLayerNormalization: input + skip (broadcast), normalised over the last
// axis; the statistics keep it as 1, the fourth output is the sum.
void skip_layer_norm(Ctx& c) {
  const Shape out = ops::broadcast_shapes(c.shape(0), c.shape(1));
  if (out.empty()) unknown("a scalar input");
  Shape stat = out;
  stat.back() = 1;
  c.set(0, c.in(0).dtype, out);
  c.set(1, DataType::Float, stat);
  c.set(2, DataType::Float, stat);
  c.set(3, c.in(0).dtype, out);
}

void dropout(Ctx& c) {
  if (c.has(2)) {
    const std::vector<int64_t>& training = c.data(2);
    if (!training.empty() && training[0] != 0) unknown("training mode");
  }
  c.same(0, 0);
  c.set(1, DataType::Bool, c.shape(0));
}

void batch_norm(Ctx& c) {
  for (size_t i = 1; i < c.node.outputs.size(); ++i)
    if (c.has_out(i)) unknown("training-mode outputs");
  unary(c);
}

void constant(Ctx& c) {
  const ir::Attribute* a = c.node.attr("value");
  if (!a || !a->t.defined()) unknown("only tensor-valued Constant nodes are covered");
  const InferredValue v = inferred_from(a->t);
  c.set(0, v.dtype, v.shape, v.has_data ? &v.data : nullptr);
}

const std::unordered_map<std::string, ShapeFn>& shape_functions() {
  static const std::unordered_map<std::string, ShapeFn> table = [] {
    std::unordered_map<std::string, ShapeFn> t;
    for (const char* op : {"Relu",
                           "Sigmoid",
                           "Tanh",
                           "Exp",
                           "Log",
                           "Sqrt",
                           "Erf",
                           "LeakyRelu",
                           "Elu",
                           "Selu",
                           "Celu",
                           "Softplus",
                           "Softsign",
                           "HardSigmoid",
                           "HardSwish",
                           "Gelu",
                           "Reciprocal",
                           "Floor",
                           "Ceil",
                           "Round",
                           "Sin",
                           "Cos",
                           "Tan",
                           "Asin",
                           "Acos",
                           "Atan",
                           "Sinh",
                           "Cosh",
                           "Asinh",
                           "Acosh",
                           "Atanh",
                           "Clip",
                           "Sign",
                           "Mish",
                           "ThresholdedRelu",
                           "Softmax",
                           "LogSoftmax",
                           "Hardmax",
                           "LRN",
                           "Shrink",
                           "InstanceNormalization",
                           "MeanVarianceNormalization",
                           "LpNormalization",
                           "Not",
                           "CumSum",
                           "Trilu"}) {
      t[op] = unary;
    }
    t["Identity"] = [](Ctx& c) { c.same(0, 0); };
    t["Neg"] = [](Ctx& c) { elementwise(c, DataType::Undefined, 0, negate); };
    t["Abs"] = [](Ctx& c) { elementwise(c, DataType::Undefined, 0, absolute); };
    for (const char* op : {"IsNaN", "IsInf"}) {
      t[op] = [](Ctx& c) { c.set(0, DataType::Bool, c.shape(0)); };
    }
    t["Add"] = [](Ctx& c) { elementwise(c, DataType::Undefined, 0, add); };
    t["Sub"] = [](Ctx& c) { elementwise(c, DataType::Undefined, 0, subtract); };
    t["Mul"] = [](Ctx& c) { elementwise(c, DataType::Undefined, 0, multiply); };
    t["Div"] = [](Ctx& c) { elementwise(c, DataType::Undefined, 0, divide); };
    t["Max"] = [](Ctx& c) {
      elementwise(c, DataType::Undefined, 0, [](const std::vector<int64_t>& a) {
        return *std::max_element(a.begin(), a.end());
      });
    };
    t["Min"] = [](Ctx& c) {
      elementwise(c, DataType::Undefined, 0, [](const std::vector<int64_t>& a) {
        return *std::min_element(a.begin(), a.end());
      });
    };
    for (const char* op : {"Pow", "Sum", "Mean", "Mod", "BitShift", "And", "Or", "Xor",
                           "BitwiseAnd", "BitwiseOr", "BitwiseXor"}) {
      t[op] = [](Ctx& c) { elementwise(c, DataType::Undefined, 0, nullptr); };
    }
    t["PRelu"] = unary;  // the slope broadcasts to the input (per channel in older exports)
    t["Equal"] = [](Ctx& c) {
      elementwise(c, DataType::Bool, 0,
                  [](const std::vector<int64_t>& a) -> int64_t { return a[0] == a[1]; });
    };
    t["Less"] = [](Ctx& c) {
      elementwise(c, DataType::Bool, 0,
                  [](const std::vector<int64_t>& a) -> int64_t { return a[0] < a[1]; });
    };
    t["Greater"] = [](Ctx& c) {
      elementwise(c, DataType::Bool, 0,
                  [](const std::vector<int64_t>& a) -> int64_t { return a[0] > a[1]; });
    };
    for (const char* op : {"LessOrEqual", "GreaterOrEqual"}) {
      t[op] = [](Ctx& c) { elementwise(c, DataType::Bool, 0, nullptr); };
    }
    t["Where"] = [](Ctx& c) {
      elementwise(c, DataType::Undefined, 1,
                  [](const std::vector<int64_t>& a) { return a[0] ? a[1] : a[2]; });
    };
    t["MatMul"] = matmul;
    t["kiln.FusedMatMul"] = matmul;           // the optimizer's MatMul with bias and activation
    t["com.microsoft.FusedMatMul"] = matmul;  // alpha, transA, transB
    t["Attention"] = attention;
    t["Gemm"] = gemm;
    t["Conv"] = conv;
    t["kiln.FusedConv"] = fused_conv;  // the optimizer's Conv with Z and activation
    t["ConvTranspose"] = conv_transpose;
    for (const char* op : {"MaxPool", "AveragePool", "LpPool"}) t[op] = pool;
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
      t[op] = global_pool;
    t["BatchNormalization"] = batch_norm;
    t["LayerNormalization"] = layer_norm;
    t["com.microsoft.SkipLayerNormalization"] = skip_layer_norm;
    t["Dropout"] = dropout;
    t["Reshape"] = reshape;
    t["Flatten"] = flatten;
    t["Unsqueeze"] = unsqueeze;
    t["Squeeze"] = squeeze;
    t["Transpose"] = transpose;
    t["Concat"] = concat;
    t["Shape"] = shape_op;
    t["Size"] = size_op;
    t["Gather"] = gather;
    t["Slice"] = slice;
    t["Cast"] = cast;
    t["ConstantOfShape"] = constant_of_shape;
    t["Expand"] = expand;
    t["Range"] = range;
    for (const char* op :
         {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"}) {
      t[op] = reduce;
    }
    for (const char* op : {"ArgMax", "ArgMin"}) t[op] = arg_reduce;
    t["Split"] = split;
    t["Pad"] = pad;
    t["Tile"] = tile;
    t["Constant"] = constant;
    return t;
  }();
  return table;
}

InferredValue declared(const ir::ValueInfo& info) {
  InferredValue v;
  const ir::TypeInfo& type = info.type;
  if (type.kind != Value::Kind::Tensor || !type.shape || type.elem == DataType::Undefined) return v;
  for (const ir::Dim& d : *type.shape) {
    if (d.value < 0) return v;
    v.shape.push_back(d.value);
  }
  v.known = true;
  v.dtype = type.elem;
  return v;
}

}  // namespace

// The table's key for a node: its op type, or "domain.op" outside ai.onnx.
static std::string shape_key(const ir::Node& node) {
  return node.domain.empty() ? node.op_type : node.domain + "." + node.op_type;
}

bool shape_inference_covers(const ir::Node& node) {
  return node.graph_attributes().empty() && shape_functions().count(shape_key(node)) > 0;
}

InferredValue inferred_from(const Tensor& t) {
  InferredValue v;
  if (!t.defined()) return v;
  v.known = true;
  v.dtype = t.dtype();
  v.shape = t.shape();
  if (!small_int(t.dtype(), t.numel())) return v;
  v.has_data = true;
  const Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) {
    int64_t x = 0;
    switch (t.dtype()) {
      case DataType::Int64:
        x = c.data<int64_t>()[i];
        break;
      case DataType::Int32:
        x = c.data<int32_t>()[i];
        break;
      case DataType::Bool:
        x = c.data<bool>()[i] ? 1 : 0;
        break;
      default:
        v.has_data = false;
        v.data.clear();
        return v;
    }
    v.data.push_back(x);
  }
  return v;
}

ShapeInference infer_shapes(const ir::Graph& graph, const std::vector<int32_t>& order,
                            const std::vector<InferredValue>& inputs) {
  ShapeInference r;
  r.values.assign(graph.values.size(), InferredValue{});
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const ir::ValueInfo& info = graph.value(graph.inputs[i]);
    InferredValue v = i < inputs.size() && inputs[i].known ? inputs[i]
                      : info.constant.defined()            ? inferred_from(info.constant)
                                                           : declared(info);
    r.values[static_cast<size_t>(graph.inputs[i])] = std::move(v);
  }
  for (ir::ValueId id : graph.initializers) {
    const ir::ValueInfo& info = graph.value(id);
    r.values[static_cast<size_t>(id)] =
        info.constant.defined() ? inferred_from(info.constant) : declared(info);
  }
  const auto& table = shape_functions();
  for (int32_t index : order) {
    const ir::Node& node = graph.nodes[static_cast<size_t>(index)];
    std::string why;
    auto it = table.find(shape_key(node));
    if (it == table.end()) {
      why = "not covered by shape inference";
    } else if (!node.graph_attributes().empty()) {
      why = "has nested graphs";
    } else {
      Ctx c(graph, node, r.values);
      try {
        it->second(c);
        for (size_t i = 0; i < node.outputs.size() && why.empty(); ++i) {
          if (c.has_out(i) && !r.values[static_cast<size_t>(node.outputs[i])].known)
            why = "output " + std::to_string(i) + " not inferred";
        }
      } catch (const Unknown& u) {
        why = u.why;
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      for (ir::ValueId id : node.outputs)
        if (id != ir::kNoValue) r.values[static_cast<size_t>(id)] = InferredValue{};
      if (r.first_unknown.empty()) r.first_unknown = node.label() + ": " + why;
    }
  }
  return r;
}

}  // namespace kiln::plan
