#include "ops/core/kernel.h"

#include <tbb/task_arena.h>

#include <algorithm>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {

// ---- NodeInfo ----

bool NodeInfo::has_input(size_t i) const {
  return i < node_.inputs.size() && node_.inputs[i] != ir::kNoValue;
}

bool NodeInfo::has_output(size_t i) const {
  return i < node_.outputs.size() && node_.outputs[i] != ir::kNoValue;
}

const Tensor* NodeInfo::constant_input(size_t i) const {
  if (!has_input(i)) return nullptr;
  const ir::Graph* g = &graph_;
  const ir::ValueInfo* v = &g->value(node_.inputs[i]);
  // A capture names a value of an enclosing graph; follow it to where it is defined.
  while (v->origin == ir::ValueOrigin::Capture && g->parent) {
    g = g->parent;
    const ir::ValueId outer = g->find(v->name);
    if (outer == ir::kNoValue) return nullptr;
    v = &g->value(outer);
  }
  if (v->origin == ir::ValueOrigin::Initializer && v->constant.defined()) return &v->constant;
  return nullptr;
}

bool NodeInfo::is_initializer(size_t i) const {
  if (!has_input(i)) return false;
  const ir::ValueInfo& v = graph_.value(node_.inputs[i]);
  return v.origin == ir::ValueOrigin::Initializer && v.constant.defined();
}

std::shared_ptr<const Tensor> NodeInfo::prepared_input(
    size_t i, const std::string& packing, const std::function<Tensor(const Tensor&)>& make) const {
  const Tensor* w = constant_input(i);
  if (!w) return nullptr;
  if (!preparer_) return std::make_shared<const Tensor>(make(*w));
  return preparer_->prepare(graph_, node_.inputs[i], *w, packing, make);
}

const Shape* NodeInfo::input_shape_hint(size_t i) const {
  if (!hints_ || !has_input(i)) return nullptr;
  const auto id = static_cast<size_t>(node_.inputs[i]);
  if (id >= hints_->size() || !(*hints_)[id].known) return nullptr;
  return &(*hints_)[id].shape;
}

const ir::TypeInfo& NodeInfo::input_type(size_t i) const {
  static const ir::TypeInfo none;
  return has_input(i) ? graph_.value(node_.inputs[i]).type : none;
}

const ir::TypeInfo& NodeInfo::output_type(size_t i) const {
  static const ir::TypeInfo none;
  return has_output(i) ? graph_.value(node_.outputs[i]).type : none;
}

void NodeInfo::fail(const std::string& message, ErrorKind kind) const {
  throw Error(kind, message).with_node(node_.name, node_.op_type);
}

const ir::Attribute& NodeInfo::require(const std::string& name, ir::AttrKind kind) const {
  const ir::Attribute* a = node_.attr(name);
  if (!a) fail("missing required attribute '" + name + "'");
  if (a->kind != kind) fail("attribute '" + name + "' has the wrong type");
  return *a;
}

int64_t NodeInfo::attr_int(const std::string& name, int64_t fallback) const {
  return has_attr(name) ? attr_int(name) : fallback;
}
int64_t NodeInfo::attr_int(const std::string& name) const {
  return require(name, ir::AttrKind::Int).i;
}

float NodeInfo::attr_float(const std::string& name, float fallback) const {
  return has_attr(name) ? attr_float(name) : fallback;
}
float NodeInfo::attr_float(const std::string& name) const {
  return require(name, ir::AttrKind::Float).f;
}

std::string NodeInfo::attr_string(const std::string& name, const std::string& fallback) const {
  return has_attr(name) ? attr_string(name) : fallback;
}
std::string NodeInfo::attr_string(const std::string& name) const {
  return require(name, ir::AttrKind::String).s;
}

std::vector<int64_t> NodeInfo::attr_ints(const std::string& name,
                                         std::vector<int64_t> fallback) const {
  return has_attr(name) ? require(name, ir::AttrKind::Ints).ints : fallback;
}
std::vector<float> NodeInfo::attr_floats(const std::string& name,
                                         std::vector<float> fallback) const {
  return has_attr(name) ? require(name, ir::AttrKind::Floats).floats : fallback;
}
std::vector<std::string> NodeInfo::attr_strings(const std::string& name,
                                                std::vector<std::string> fallback) const {
  return has_attr(name) ? require(name, ir::AttrKind::Strings).strings : fallback;
}

const Tensor* NodeInfo::attr_tensor(const std::string& name) const {
  const ir::Attribute* a = node_.attr(name);
  if (!a) return nullptr;
  if (a->kind != ir::AttrKind::Tensor && a->kind != ir::AttrKind::SparseTensor) {
    fail("attribute '" + name + "' is not a tensor");
  }
  return &a->t;
}

int NodeInfo::subgraph_index(const std::string& name) const {
  int index = 0;
  for (const ir::Attribute* a : node_.graph_attributes()) {
    if (a->name == name) return index;
    ++index;
  }
  fail("missing graph attribute '" + name + "'");
}

const ir::Graph& NodeInfo::subgraph(int index) const {
  auto graphs = node_.graph_attributes();
  if (index < 0 || static_cast<size_t>(index) >= graphs.size()) fail("no such nested graph");
  return *graphs[static_cast<size_t>(index)]->g;
}

// ---- OpContext ----

const Value& OpContext::input_value(size_t i) const {
  if (!has_input(i)) fail("input " + std::to_string(i) + " is missing");
  return *inputs_[i];
}

const Tensor& OpContext::input(size_t i) const {
  const Value& v = input_value(i);
  if (!v.is_tensor()) fail("input " + std::to_string(i) + " must be a tensor, got " + v.describe());
  return v.tensor();
}

bool OpContext::has_output(size_t i) const {
  return i < node_.outputs.size() && node_.outputs[i] != ir::kNoValue;
}

Tensor& OpContext::output(size_t i, DataType dtype, const Shape& shape) {
  outputs_.at(i) = Value(hooks_.allocate_output(i, dtype, shape));
  return outputs_[i].tensor();
}

Tensor OpContext::workspace(DataType dtype, int64_t elements) {
  return hooks_.allocate(dtype, Shape{elements});
}

int OpContext::threads() const {
  return std::max(tbb::this_task_arena::max_concurrency(), 1);
}

Tensor& OpContext::output_reusing(size_t i, size_t in, DataType dtype, const Shape& shape) {
  if (has_input(in) && inputs_[in]->is_tensor()) {
    const Tensor& t = inputs_[in]->tensor();
    if (t.dtype() == dtype && t.shape() == shape && t.is_contiguous() && can_overwrite(in)) {
      count_in_place();
      outputs_.at(i) = Value(t);
      return outputs_[i].tensor();
    }
  }
  return output(i, dtype, shape);
}

void OpContext::set_output(size_t i, Value v) {
  outputs_.at(i) = std::move(v);
}

Value OpContext::take_input_value(size_t i) {
  const Value& v = input_value(i);
  if (can_overwrite(i)) return hooks_.take_input(i);
  return v;
}

void OpContext::fail(const std::string& message, ErrorKind kind) const {
  throw Error(kind, message).with_node(node_.name, node_.op_type);
}

// ---- common.h helpers ----

void check_output_size(const Shape& shape) {
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) {
      throw Error(ErrorKind::Runtime,
                  "shape " + shape_to_string(shape) + " has a negative dimension");
    }
    empty = empty || d == 0;
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (!empty && (__builtin_mul_overflow(n, d, &n) || n > kMaxOutputElements)) {
      throw Error(ErrorKind::Runtime, "shape " + shape_to_string(shape) + " is too large");
    }
  }
}

void throw_unsupported_type(DataType dt, const char* what) {
  throw Error(ErrorKind::Unsupported, std::string(what) + " element type " +
                                          std::string(data_type_name(dt)) + " is not supported");
}

int64_t normalize_axis(int64_t axis, int64_t rank) {
  const int64_t lo = -rank, hi = rank - 1;
  if (axis < lo || axis > hi) {
    throw Error(ErrorKind::Runtime, "axis " + std::to_string(axis) + " is out of range for rank " +
                                        std::to_string(rank));
  }
  return axis < 0 ? axis + rank : axis;
}

Shape to_int64s(const Tensor& t) {
  Shape out;
  const Tensor c = t.contiguous();
  const int64_t n = c.numel();
  out.reserve(static_cast<size_t>(n));
  if (c.dtype() == DataType::Int64) {
    const int64_t* p = c.data<const int64_t>();
    out.assign(p, p + n);
  } else if (c.dtype() == DataType::Int32) {
    const int32_t* p = c.data<const int32_t>();
    for (int64_t i = 0; i < n; ++i) out.push_back(p[i]);
  } else {
    throw Error(ErrorKind::Runtime, "expected an int32 or int64 tensor, got " + c.describe());
  }
  return out;
}

double scalar_as_double(const Tensor& t) {
  if (t.numel() != 1)
    throw Error(ErrorKind::Runtime, "expected a single value, got " + t.describe());
  double v = 0;
  const Tensor c = t.contiguous();
  dispatch(PodTypes{}, c.dtype(), [&]<typename T>() {
    v = static_cast<double>(static_cast<compute_t<T>>(c.data<const T>()[0]));
  });
  return v;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw Error(ErrorKind::Runtime, "shapes " + shape_to_string(a) + " and " +
                                          shape_to_string(b) + " cannot be broadcast together");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Tensor& t, const Shape& out) {
  if (t.rank() > out.size()) {
    throw Error(ErrorKind::Runtime,
                t.describe() + " cannot broadcast to the lower rank of " + shape_to_string(out));
  }
  Shape s(out.size(), 0);
  const size_t off = out.size() - t.rank();
  for (size_t i = 0; i < t.rank(); ++i) {
    s[off + i] = t.dim(i) == 1 ? 0 : t.strides()[i];
  }
  return s;
}

}  // namespace kiln::ops
