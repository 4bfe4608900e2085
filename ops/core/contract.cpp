#include "ops/core/contract.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <utility>

#include "ops/core/common.h"

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
  v.ranked = true;
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

ValueFacts facts_of(const ir::TypeInfo& type) {
  ValueFacts v;
  if (type.kind != Value::Kind::Tensor) return v;
  v.dtype = type.elem;
  if (!type.shape) return v;
  v.ranked = true;
  bool named = false;
  for (const ir::Dim& d : *type.shape) {
    v.shape.push_back(d.value >= 0 ? d.value : kUnknownDim);
    named = named || (d.value < 0 && !d.param.empty());
  }
  if (named) {
    for (const ir::Dim& d : *type.shape) v.dim_names.push_back(d.value < 0 ? d.param : "");
  }
  settle(v);
  return v;
}

ValueFacts known_facts(DataType dtype, Shape shape, std::vector<int64_t> data, bool has_data) {
  ValueFacts v;
  v.known = true;
  v.ranked = true;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.has_data = has_data;
  if (has_data) v.data = std::move(data);
  return v;
}

ValueFacts ranked_facts(DataType dtype, Shape shape, std::vector<std::string> dim_names) {
  ValueFacts v;
  v.dtype = dtype;
  v.ranked = true;
  v.shape = std::move(shape);
  v.dim_names = std::move(dim_names);
  settle(v);
  return v;
}

void settle(ValueFacts& v) {
  if (!v.ranked) {
    v.shape.clear();
    v.dim_names.clear();
  }
  for (int64_t& d : v.shape) {
    if (d < 0) d = kUnknownDim;
  }
  if (v.dim_names.size() != v.shape.size()) v.dim_names.clear();
  for (size_t k = 0; k < v.dim_names.size(); ++k) {
    if (v.shape[k] != kUnknownDim) v.dim_names[k].clear();
  }
  bool all_known = v.ranked && v.dtype != DataType::Undefined;
  int64_t n = 1;
  for (int64_t d : v.shape) {
    all_known = all_known && d != kUnknownDim && !__builtin_mul_overflow(n, d, &n);
  }
  v.known = all_known;
  if (v.known && std::all_of(v.dim_names.begin(), v.dim_names.end(),
                             [](const std::string& s) { return s.empty(); })) {
    v.dim_names.clear();
  }
  // Element values: all of them known and a count that fits the shape -> data; else elements
  // of a rank 0/1 integer tensor only.
  const bool fits = v.known && small_int(v.dtype, n);
  if (fits && n == 0) v.has_data = true;  // an empty tensor's elements are all known
  if (v.has_data) {
    if (!fits || static_cast<int64_t>(v.data.size()) != n) {
      v.has_data = false;
      v.data.clear();
    }
    v.elems.clear();
    return;
  }
  if (v.elems.empty()) return;
  const bool all =
      std::all_of(v.elems.begin(), v.elems.end(), [](auto e) { return e.has_value(); });
  if (fits && all && static_cast<int64_t>(v.elems.size()) == n) {
    v.has_data = true;
    v.data.clear();
    for (auto e : v.elems) v.data.push_back(*e);
    v.elems.clear();
    return;
  }
  const bool length_fits =
      v.ranked && v.shape.size() <= 1 &&
      (v.shape.empty() ? v.elems.size() == 1 : v.shape[0] == static_cast<int64_t>(v.elems.size()));
  if (!length_fits || !is_integer_type(v.dtype) || v.elems.size() > kMaxKnownData) v.elems.clear();
}

void merge_declared(ValueFacts& v, const ValueFacts& more) {
  if (v.known) return;
  if (v.dtype == DataType::Undefined) v.dtype = more.dtype;
  if (!more.ranked) return;
  if (!v.ranked) {
    v.ranked = true;
    v.shape = more.shape;
    v.dim_names = more.dim_names;
    v.elems.clear();
  } else if (v.shape.size() == more.shape.size()) {
    for (size_t k = 0; k < v.shape.size(); ++k) {
      if (v.shape[k] != kUnknownDim || more.shape[k] == kUnknownDim) {
        if (v.shape[k] == kUnknownDim && v.dim_name(k).empty() && !more.dim_name(k).empty()) {
          v.dim_names.resize(v.shape.size());
          v.dim_names[k] = more.dim_names[k];
        }
        continue;
      }
      v.shape[k] = more.shape[k];
    }
  }
  settle(v);
}

int64_t ValueFacts::dim(int64_t k) const {
  if (!ranked) return kUnknownDim;
  const auto r = static_cast<int64_t>(shape.size());
  if (k < 0) k += r;
  return k >= 0 && k < r ? shape[static_cast<size_t>(k)] : kUnknownDim;
}

const std::string& ValueFacts::dim_name(size_t k) const {
  static const std::string none;
  return k < dim_names.size() ? dim_names[k] : none;
}

std::optional<int64_t> ValueFacts::elem(size_t k) const {
  if (has_data) return k < data.size() ? std::optional<int64_t>(data[k]) : std::nullopt;
  return k < elems.size() ? elems[k] : std::nullopt;
}

int64_t product_or_unknown(const Shape& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return kUnknownDim;
  }
  return n;
}

void append_dim(ValueFacts& out, int64_t d, const std::string& name) {
  const bool named = d < 0 && !name.empty();
  if (named || !out.dim_names.empty()) {
    out.dim_names.resize(out.shape.size());
    out.dim_names.push_back(named ? name : std::string());
  }
  out.ranked = true;
  out.shape.push_back(d < 0 ? kUnknownDim : d);
}

void append_dim(ValueFacts& out, const ValueFacts& from, size_t k) {
  append_dim(out, k < from.shape.size() ? from.shape[k] : kUnknownDim, from.dim_name(k));
}

ValueFacts sub_shape(const ValueFacts& v, size_t from, size_t to) {
  ValueFacts out;
  out.ranked = true;
  for (size_t k = from; k < to && k < v.shape.size(); ++k) append_dim(out, v, k);
  return out;
}

ValueFacts typed_facts(DataType dtype) {
  ValueFacts v;
  v.dtype = dtype;
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

const ValueFacts& ShapeContext::facts(size_t i) const {
  static const ValueFacts none;
  return has_input(i) ? values_[static_cast<size_t>(node_.inputs[i])] : none;
}

bool ShapeContext::inputs_known() const {
  for (size_t i = 0; i < num_inputs(); ++i) {
    if (has_input(i) && !facts(i).known) return false;
  }
  return true;
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
  v.ranked = true;
  v.dtype = dtype;
  v.shape = std::move(shape);
  if (data && small_int(dtype, n) && static_cast<int64_t>(data->size()) == n) {
    v.has_data = true;
    v.data = *data;
  }
  (*out_)[static_cast<size_t>(node_.outputs[i])] = std::move(v);
}

void ShapeContext::set(size_t i, ValueFacts v) {
  if (!has_output(i)) return;
  if (!out_) throw std::logic_error("a read-only shape context cannot set outputs");
  settle(v);
  (*out_)[static_cast<size_t>(node_.outputs[i])] = std::move(v);
}

void ShapeContext::same(size_t out, size_t in_index) {
  if (!has_input(in_index)) unknown("input " + std::to_string(in_index) + " is missing");
  set(out, facts(in_index));
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

void same_shape_as(ShapeContext& c, DataType dtype) {
  const ValueFacts& x = c.facts(0);
  ValueFacts out;
  out.dtype = dtype;
  out.ranked = x.ranked;
  out.shape = x.shape;
  out.dim_names = x.dim_names;
  c.set(0, std::move(out));
}

void same_shape(ShapeContext& c) {
  same_shape_as(c, c.facts(0).dtype);
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

ValueFacts broadcast_facts(const std::vector<const ValueFacts*>& in) {
  size_t rank = 0;
  for (const ValueFacts* v : in) rank = std::max(rank, v->shape.size());
  ValueFacts out;
  out.ranked = true;
  out.shape.assign(rank, 1);
  std::vector<std::string> names(rank);
  bool named = false;
  for (size_t k = 0; k < rank; ++k) {
    int64_t decided = 1;
    bool open = false, one_name = true;
    std::string name;
    for (const ValueFacts* v : in) {
      const size_t lead = rank - v->shape.size();
      if (k < lead) continue;
      const int64_t d = v->shape[k - lead];
      if (d == kUnknownDim) {
        const std::string& n = v->dim_name(k - lead);
        one_name = one_name && !n.empty() && (!open || n == name);
        name = n;
        open = true;
      } else if (d != 1) {
        if (decided != 1 && decided != d) unknown("shapes do not broadcast");
        decided = d;
      }
    }
    out.shape[k] = decided != 1 ? decided : (open ? kUnknownDim : 1);
    if (out.shape[k] == kUnknownDim && one_name) {
      names[k] = name;
      named = true;
    }
  }
  if (named) out.dim_names = std::move(names);
  return out;
}

void broadcast_shape(ShapeContext& c, DataType out_type, size_t type_from,
                     int64_t (*f)(const std::vector<int64_t>&)) {
  std::vector<const ValueFacts*> ins;
  bool ranked = true;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_input(i)) continue;
    ins.push_back(&c.facts(i));
    ranked = ranked && ins.back()->ranked;
  }
  if (ins.empty()) unknown("no inputs");
  const DataType dtype = out_type == DataType::Undefined ? c.facts(type_from).dtype : out_type;
  if (!ranked) {
    ValueFacts out;
    out.dtype = dtype;
    c.set(0, std::move(out));
    return;
  }
  ValueFacts out = broadcast_facts(ins);
  out.dtype = dtype;
  const int64_t n = product_or_unknown(out.shape);
  bool values = f != nullptr && n != kUnknownDim && small_int(dtype, n);
  for (const ValueFacts* v : ins) {
    values = values && product_or_unknown(v->shape) == static_cast<int64_t>(v->num_elems()) &&
             v->num_elems() > 0;
  }
  if (values) {
    std::vector<int64_t> args(ins.size());
    for (int64_t k = 0; k < n; ++k) {
      std::optional<int64_t> e;
      bool all = true;
      for (size_t i = 0; i < ins.size() && all; ++i) {
        const auto a =
            ins[i]->elem(static_cast<size_t>(broadcast_index(ins[i]->shape, out.shape, k)));
        all = a.has_value();
        if (all) args[i] = *a;
      }
      if (all) {
        try {
          e = f(args);
        } catch (const UnknownFacts&) {
          e.reset();  // an overflow leaves this element unknown
        }
      }
      out.elems.push_back(e);
    }
  }
  c.set(0, std::move(out));
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
