#include "ops/contract.h"

#include <limits>
#include <stdexcept>
#include <utility>

#include "ops/common.h"

namespace kiln::ops {

namespace {

bool small_int(DataType t, int64_t n) {
  return (is_integer_type(t) || t == DataType::Bool) && n <= kMaxKnownData;
}

}  // namespace

void unknown(std::string why) {
  throw UnknownFacts{std::move(why)};
}

ValueFacts facts_of(const Tensor& t) {
  ValueFacts v;
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

int64_t numel_or_unknown(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) unknown("negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) unknown("size overflows");
    n *= d;
  }
  return n;
}

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

const ValueFacts& ShapeContext::in(size_t i) const {
  if (!has_input(i)) unknown("input " + std::to_string(i) + " is missing");
  const ValueFacts& v = values_[static_cast<size_t>(node_.inputs[i])];
  if (!v.known) unknown("input '" + graph_.value(node_.inputs[i]).name + "' is unknown");
  return v;
}

const std::vector<int64_t>& ShapeContext::data(size_t i) const {
  const ValueFacts& v = in(i);
  if (!v.has_data) {
    unknown("the values of input '" + graph_.value(node_.inputs[i]).name +
            "' are only known when run");
  }
  return v.data;
}

const Tensor* ShapeContext::constant_input(size_t i) const {
  if (!has_input(i)) return nullptr;
  const ir::ValueInfo& v = graph_.value(node_.inputs[i]);
  return v.origin == ir::ValueOrigin::Initializer && v.constant.defined() ? &v.constant : nullptr;
}

void ShapeContext::set(size_t i, DataType dtype, Shape shape, const std::vector<int64_t>* data) {
  if (!has_output(i)) return;
  if (!out_) throw std::logic_error("a read-only shape context cannot set outputs");
  ValueFacts v;
  const int64_t n = numel_or_unknown(shape);
  v.known = true;
  v.dtype = dtype;
  v.shape = std::move(shape);
  if (data && small_int(dtype, n) && static_cast<int64_t>(data->size()) == n) {
    v.has_data = true;
    v.data = *data;
  }
  (*out_)[static_cast<size_t>(node_.outputs[i])] = std::move(v);
}

void ShapeContext::same(size_t out, size_t in_index) {
  const ValueFacts& v = in(in_index);
  set(out, v.dtype, v.shape, v.has_data ? &v.data : nullptr);
}

int64_t ShapeContext::attr_int(const char* name, int64_t fallback) const {
  const ir::Attribute* a = node_.attr(name);
  return a ? a->i : fallback;
}

float ShapeContext::attr_float(const char* name, float fallback) const {
  const ir::Attribute* a = node_.attr(name);
  return a ? a->f : fallback;
}

std::string ShapeContext::attr_string(const char* name, const char* fallback) const {
  const ir::Attribute* a = node_.attr(name);
  return a ? a->s : fallback;
}

std::vector<int64_t> ShapeContext::attr_ints(const char* name) const {
  const ir::Attribute* a = node_.attr(name);
  return a ? a->ints : std::vector<int64_t>{};
}

std::vector<int64_t> ShapeContext::ints_from(const char* name, int64_t input_since,
                                             size_t input) const {
  if (node_.opset < input_since) return attr_ints(name);
  return has_input(input) ? data(input) : std::vector<int64_t>{};
}

std::vector<ValueFacts> ShapeContext::subgraph_outputs(
    const char* name, const std::vector<ValueFacts>& inputs) const {
  const ir::Attribute* a = node_.attr(name);
  if (!a || !a->g) unknown(std::string("no graph '") + name + "'");
  if (!nested_) unknown("nested graphs are not inferred here");
  std::vector<ValueFacts> outs = nested_->outputs(*a->g, inputs, graph_, values_);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].known) unknown(std::string(name) + " output " + std::to_string(i) + " is unknown");
  }
  return outs;
}

void same_shape(ShapeContext& c) {
  c.set(0, c.dtype(0), c.shape(0));
}

void pass_through(ShapeContext& c) {
  c.same(0, 0);
}

Shape matmul_shape_of(Shape a, Shape b) {
  if (a.empty() || b.empty()) unknown("scalar operand");
  const bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a.insert(a.begin(), 1);
  if (b1) b.push_back(1);
  if (a.back() != b[b.size() - 2]) unknown("inner dimensions differ");
  Shape out = broadcast_shapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  if (!a1) out.push_back(a[a.size() - 2]);
  if (!b1) out.push_back(b.back());
  return out;
}

void broadcast_shape(ShapeContext& c, DataType out_type, size_t type_from,
                     int64_t (*f)(const std::vector<int64_t>&)) {
  Shape shape;
  bool first = true;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_input(i)) continue;
    shape = first ? c.shape(i) : broadcast_shapes(shape, c.shape(i));
    first = false;
  }
  if (first) unknown("no inputs");
  const DataType dtype = out_type == DataType::Undefined ? c.dtype(type_from) : out_type;
  const int64_t n = numel_or_unknown(shape);
  bool all_data = f != nullptr && small_int(dtype, n);
  for (size_t i = 0; all_data && i < c.num_inputs(); ++i)
    all_data = c.has_input(i) && c.in(i).has_data;
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

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) unknown("overflow");
  return r;
}

int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) unknown("overflow");
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) unknown("overflow");
  return r;
}

int64_t checked_div(int64_t a, int64_t b) {
  if (b == 0) unknown("division by zero");
  if (b == -1) return checked_sub(0, a);
  return a / b;
}

void place_alias(Placement& p) {
  p.view(0, 0, p.strides(0));
  for (size_t o = 1; o < p.node().outputs.size(); ++o) p.allocate(o);
}

void place_reshaped(Placement& p) {
  p.view(0, 0, {});
}

}  // namespace kiln::ops
