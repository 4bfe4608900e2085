#include "engine/passes/fusion/rewriter.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "engine/passes/passes.h"

namespace kiln::passes::fusion {
namespace {

// A convolution: Conv, and the fused ones the passes write or onnxruntime's files hold.
bool conv_op(const ir::Node& n) {
  return n.op_type == "Conv"
             ? n.domain.empty()
             : n.op_type == "FusedConv" && (n.domain == "kiln" || n.domain == "com.microsoft");
}

}  // namespace

ir::Node* Rewriter::producer(ir::ValueId v) {
  if (v == ir::kNoValue) return nullptr;
  const ir::ValueInfo& info = g_.value(v);
  if (info.origin != ir::ValueOrigin::NodeOutput || info.producer < 0) return nullptr;
  const auto p = static_cast<size_t>(info.producer);
  return p < g_.nodes.size() && !removed_[p] ? &g_.nodes[p] : nullptr;
}

ir::Node* Rewriter::producer(ir::ValueId v, const char* op) {
  ir::Node* n = producer(v);
  return n && n->domain.empty() && n->op_type == op ? n : nullptr;
}

const Tensor* Rewriter::constant(ir::ValueId v) const {
  if (v == ir::kNoValue) return nullptr;
  const ir::Graph* graph = &g_;
  const ir::ValueInfo* info = &graph->value(v);
  while (info->origin == ir::ValueOrigin::Capture && graph->parent) {
    graph = graph->parent;
    const ir::ValueId outer = graph->find(info->name);
    if (outer == ir::kNoValue) return nullptr;
    info = &graph->value(outer);
  }
  if (info->origin != ir::ValueOrigin::Initializer || !info->constant.defined()) return nullptr;
  return &info->constant;
}

std::optional<double> Rewriter::scalar(ir::ValueId v) const {
  const Tensor* t = constant(v);
  if (!t || t->numel() != 1) return std::nullopt;
  if (t->dtype() == DataType::Float) return t->contiguous().data<const float>()[0];
  if (t->dtype() == DataType::Double) return t->contiguous().data<const double>()[0];
  return std::nullopt;
}

DataType Rewriter::dtype(ir::ValueId v) const {
  if (const Tensor* t = constant(v)) return t->dtype();
  const ir::TypeInfo& type = declared(v);
  return type.kind == Value::Kind::Tensor ? type.elem : DataType::Undefined;
}

int64_t Rewriter::rank(ir::ValueId v, int depth) {
  if (v == ir::kNoValue || depth > 32) return -1;
  if (const Tensor* t = constant(v)) return static_cast<int64_t>(t->rank());
  const ir::TypeInfo& type = declared(v);
  if (type.kind == Value::Kind::Tensor && type.shape) {
    return static_cast<int64_t>(type.shape->size());
  }
  ir::Node* p = producer(v);
  if (!p) return -1;
  const std::string& op = p->op_type;
  const bool first = !p->outputs.empty() && p->outputs[0] == v;
  // Convolutions: their filter's rank.
  if (first && conv_op(*p)) {
    const Tensor* w = constant(p->inputs.size() > 1 ? p->inputs[1] : ir::kNoValue);
    return w ? static_cast<int64_t>(w->rank()) : -1;
  }
  const bool keeps_rank =
      (p->domain == "kiln" && op == "ChannelAffine") ||
      (p->domain.empty() &&
       (op == "BatchNormalization" || op == "GlobalAveragePool" || op == "GlobalMaxPool"));
  if (first && keeps_rank) return rank(p->inputs[0], depth + 1);
  if (!p->domain.empty()) return -1;
  // Pools: batch, channels and the window's axes.
  if (first && (op == "MaxPool" || op == "AveragePool" || op == "LpPool")) {
    const ir::Attribute* k = p->attr("kernel_shape");
    return k ? 2 + static_cast<int64_t>(k->ints.size()) : -1;
  }
  // Concat: its last input's rank (in DenseNet the first input is the chain of every
  // earlier Concat, the last a convolution's output; one input, so the search stays a path).
  if (op == "Concat") return p->inputs.empty() ? -1 : rank(p->inputs.back(), depth + 1);
  if (op == "Transpose") {
    const ir::Attribute* perm = p->attr("perm");
    return perm ? static_cast<int64_t>(perm->ints.size()) : rank(p->inputs[0], depth + 1);
  }
  if (op == "Reshape") {
    const Tensor* shape = constant(p->inputs.size() > 1 ? p->inputs[1] : ir::kNoValue);
    return shape && shape->rank() == 1 ? shape->dim(0) : -1;
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    const Tensor* axes = constant(p->inputs.size() > 1 ? p->inputs[1] : ir::kNoValue);
    const int64_t r = rank(p->inputs[0], depth + 1);
    if (!axes || r < 0) return -1;
    return op == "Unsqueeze" ? r + axes->numel() : r - axes->numel();
  }
  // Attention: its output has Q's rank (3 or 4, whatever its mask's and past keys' ranks); its
  // present keys and values and its scores are 4-D.
  if (op == "Attention") return first ? rank(p->inputs[0], depth + 1) : 4;
  static const char* const kSameRank[] = {
      "Add",      "Sub",  "Mul",    "Div",     "Where", "Softmax",           "Relu",
      "Identity", "Cast", "Concat", "Erf",     "Tanh",  "Sigmoid",           "Neg",
      "Sqrt",     "Pow",  "Gelu",   "Dropout", "Swish", "LayerNormalization"};
  const bool same = std::find_if(std::begin(kSameRank), std::end(kSameRank),
                                 [&](const char* s) { return op == s; }) != std::end(kSameRank);
  if (!same && op != "MatMul") return -1;
  int64_t r = -1;
  for (ir::ValueId in : p->inputs) {
    if (in == ir::kNoValue) continue;
    const int64_t ri = rank(in, depth + 1);
    if (ri < 0) return -1;
    r = std::max(r, ri);
  }
  if (op == "MatMul" && r < 2) return -1;
  return r;
}

int64_t Rewriter::last_dim(ir::ValueId v, int depth) {
  if (v == ir::kNoValue || depth > 32) return -1;
  if (const Tensor* t = constant(v)) return t->rank() > 0 ? t->dim(t->rank() - 1) : -1;
  const ir::TypeInfo& type = declared(v);
  if (type.kind == Value::Kind::Tensor && type.shape && !type.shape->empty() &&
      type.shape->back().value >= 0) {
    return type.shape->back().value;
  }
  ir::Node* p = producer(v);
  if (!p || p->inputs.empty()) return -1;
  const std::string& op = p->op_type;
  if ((op == "MatMul" && p->domain.empty()) || (op == "FusedMatMul" && p->domain == "kiln")) {
    return rank(p->inputs[1]) >= 2 ? last_dim(p->inputs[1], depth + 1) : -1;
  }
  if (!p->domain.empty()) return -1;
  if (op == "Reshape" && p->inputs.size() > 1) {
    const Tensor* shape = constant(p->inputs[1]);
    if (!shape || shape->rank() != 1 || shape->numel() == 0 || shape->dtype() != DataType::Int64) {
      return -1;
    }
    const int64_t d = shape->contiguous().data<const int64_t>()[shape->numel() - 1];
    return d > 0 ? d : -1;
  }
  // Broadcasting ops: an operand whose last axis is d > 1 makes the result's d (or fails).
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    for (ir::ValueId in : p->inputs) {
      const int64_t d = last_dim(in, depth + 1);
      if (d > 1) return d;
    }
    return -1;
  }
  static const char* const kSameShape[] = {
      "Relu",    "Gelu",    "Erf",  "Neg",      "Sqrt",
      "Tanh",    "Sigmoid", "Cast", "Identity", "LayerNormalization",
      "Softmax", "Dropout", "Swish"};
  const bool same = std::find_if(std::begin(kSameShape), std::end(kSameShape),
                                 [&](const char* s) { return op == s; }) != std::end(kSameShape);
  return same ? last_dim(p->inputs[0], depth + 1) : -1;
}

int64_t Rewriter::channels(ir::ValueId v, int depth) {
  if (v == ir::kNoValue || depth > 32) return -1;
  if (const Tensor* t = constant(v)) return t->rank() >= 2 ? t->dim(1) : -1;
  const ir::TypeInfo& type = declared(v);
  if (type.kind == Value::Kind::Tensor && type.shape && type.shape->size() >= 2 &&
      (*type.shape)[1].value >= 0) {
    return (*type.shape)[1].value;
  }
  ir::Node* p = producer(v);
  if (!p || p->inputs.empty() || p->outputs.empty() || p->outputs[0] != v) return -1;
  const std::string& op = p->op_type;
  if (conv_op(*p)) {
    const Tensor* w = constant(p->inputs.size() > 1 ? p->inputs[1] : ir::kNoValue);
    return w && w->rank() >= 3 ? w->dim(0) : -1;
  }
  if (p->domain == "kiln" && op == "ChannelAffine") return channels(p->inputs[0], depth + 1);
  if (!p->domain.empty()) return -1;
  static const char* const kSameChannels[] = {"Relu",    "Sigmoid", "Tanh",        "Identity",
                                              "Dropout", "MaxPool", "AveragePool", "LpPool",
                                              "LRN",     "Clip",    "LeakyRelu",   "Gelu",
                                              "Swish",   "Neg",     "Cast",        "GlobalMaxPool"};
  const bool same = op == "GlobalAveragePool" || op == "BatchNormalization" ||
                    op == "InstanceNormalization" ||
                    std::find_if(std::begin(kSameChannels), std::end(kSameChannels),
                                 [&](const char* s) { return op == s; }) != std::end(kSameChannels);
  return same ? channels(p->inputs[0], depth + 1) : -1;
}

bool Rewriter::float_type(ir::ValueId v, int depth) {
  if (v == ir::kNoValue || depth > 32) return false;
  const DataType t = dtype(v);
  if (t != DataType::Undefined) return t == DataType::Float;
  ir::Node* p = producer(v);
  if (!p || p->inputs.empty() || p->outputs.empty() || p->outputs[0] != v) return false;
  const std::string& op = p->op_type;
  if (conv_op(*p)) return p->inputs.size() > 1 && float_type(p->inputs[1], depth + 1);
  if (p->domain == "kiln" && op == "ChannelAffine") return true;  // float only
  if (!p->domain.empty()) return false;
  // Every input of these has the output's type: a constant one tells it, else the first
  // (a Concat's last: see rank).
  static const char* const kOneType[] = {
      "Add",     "Sub",         "Mul",      "Div",  "Concat",       "Relu", "Neg",
      "Sigmoid", "Tanh",        "Identity", "Gelu", "Swish",        "Clip", "LeakyRelu",
      "MaxPool", "AveragePool", "LpPool",   "LRN",  "GlobalMaxPool"};
  const bool one_type = op == "GlobalAveragePool" || op == "InstanceNormalization" ||
                        std::find_if(std::begin(kOneType), std::end(kOneType),
                                     [&](const char* s) { return op == s; }) != std::end(kOneType);
  // BatchNormalization's parameters have its input's type before opset 15.
  if (!one_type && !(op == "BatchNormalization" && p->opset < 15)) {
    return op == "BatchNormalization" && float_type(p->inputs[0], depth + 1);
  }
  for (ir::ValueId in : p->inputs) {
    if (const Tensor* c = constant(in)) return c->dtype() == DataType::Float;
  }
  return float_type(op == "Concat" ? p->inputs.back() : p->inputs[0], depth + 1);
}

std::vector<ir::Node*> Rewriter::readers(ir::ValueId v) {
  std::vector<ir::Node*> out;
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (removed_[n]) continue;
    ir::Node& node = g_.nodes[n];
    if (std::find(node.inputs.begin(), node.inputs.end(), v) != node.inputs.end()) {
      out.push_back(&node);
    }
  }
  return out;
}

ir::Node* Rewriter::sole_reader(ir::ValueId v) {
  if (!single_use(v)) return nullptr;
  const std::vector<ir::Node*> r = readers(v);
  return r.size() == 1 ? r[0] : nullptr;
}

void Rewriter::replace_uses(ir::ValueId from, ir::ValueId to) {
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (removed_[n]) continue;
    for (ir::ValueId& id : g_.nodes[n].inputs) {
      if (id == from) id = to;
    }
  }
  reindex();
}

void Rewriter::remove(ir::Node* n) {
  const auto index = static_cast<size_t>(n - g_.nodes.data());
  removed_[index] = true;
  reindex();
}

ir::Node& Rewriter::add(ir::Node node) {
  const auto index = static_cast<int32_t>(g_.nodes.size());
  for (ir::ValueId id : node.outputs) {
    if (id == ir::kNoValue) continue;
    ir::ValueInfo& v = g_.value(id);
    v.origin = ir::ValueOrigin::NodeOutput;
    v.producer = index;
  }
  g_.nodes.push_back(std::move(node));
  removed_.push_back(false);
  reindex();
  return g_.nodes.back();
}

ir::ValueId Rewriter::new_constant(const std::string& hint, Tensor t) {
  const ir::ValueId id = new_value(hint);
  ir::ValueInfo& v = g_.value(id);
  v.origin = ir::ValueOrigin::Initializer;
  v.type = ir::tensor_type(t.dtype(), t.shape());
  t.storage()->set_read_only();
  v.constant = std::move(t);
  g_.initializers.push_back(id);
  reindex();
  return id;
}

ir::ValueId Rewriter::new_value(const std::string& hint) {
  std::string name = hint;
  for (int i = 1; g_.find(name) != ir::kNoValue; ++i) name = hint + "_" + std::to_string(i);
  return g_.add_value(name, ir::ValueOrigin::NodeOutput);
}

void Rewriter::commit() {
  remove_nodes(g_, removed_);
  removed_.assign(g_.nodes.size(), false);
  reindex();
}

const ir::TypeInfo& Rewriter::declared(ir::ValueId v) const {
  static const ir::TypeInfo none;
  if (v == ir::kNoValue) return none;  // an omitted optional input (or a malformed node)
  const ir::Graph* graph = &g_;
  const ir::ValueInfo* info = &graph->value(v);
  while (info->origin == ir::ValueOrigin::Capture && graph->parent &&
         info->type.kind == Value::Kind::None) {
    graph = graph->parent;
    const ir::ValueId outer = graph->find(info->name);
    if (outer == ir::kNoValue) break;
    info = &graph->value(outer);
  }
  return info->type;
}

void Rewriter::reindex() {
  readers_.assign(g_.values.size(), 0);
  pinned_.assign(g_.values.size(), false);
  for (size_t n = 0; n < g_.nodes.size(); ++n) {
    if (removed_[n]) continue;
    for (ir::ValueId id : g_.nodes[n].inputs) {
      if (id != ir::kNoValue) ++readers_[static_cast<size_t>(id)];
    }
    for (ir::ValueId id : g_.nodes[n].implicit_inputs) pinned_[static_cast<size_t>(id)] = true;
  }
  for (ir::ValueId id : g_.outputs) pinned_[static_cast<size_t>(id)] = true;
}

// The one node reading `v`, when it is a two-input `op`; else null.
ir::Node* binary_reader(Rewriter& r, ir::ValueId v, const char* op) {
  ir::Node* n = r.sole_reader(v);
  return n && is(*n, op) && n->inputs.size() == 2 ? n : nullptr;
}

// A float scalar constant that cannot broadcast `other` to a larger rank: its value, else
// nullopt.
std::optional<double> scalar_factor(Rewriter& r, ir::ValueId c, ir::ValueId other) {
  const Tensor* t = r.constant(c);
  const auto v = r.scalar(c);
  if (!t || !v || t->dtype() != DataType::Float || !std::isfinite(*v)) return std::nullopt;
  if (t->rank() > 0 && r.rank(other) < static_cast<int64_t>(t->rank())) return std::nullopt;
  return v;
}

}  // namespace kiln::passes::fusion
