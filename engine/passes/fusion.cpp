// Graph rewrites that remove work exporters leave in graphs and fuse chains of ops into one
// kernel, on every graph level (the merged decoder's work sits inside its If). Each rewrite
// is a small pattern match that checks op types, constants, ranks and single consumers
// before it changes anything, and never changes results beyond float rounding.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/passes/passes.h"

namespace kiln::passes {
namespace {

// A convolution: Conv, and the fused ones the passes write or onnxruntime's files hold.
bool conv_op(const ir::Node& n) {
  return n.op_type == "Conv"
             ? n.domain.empty()
             : n.op_type == "FusedConv" && (n.domain == "kiln" || n.domain == "com.microsoft");
}

// The node indices reading each value, kept up to date as the graph is rewritten.
class Rewriter {
 public:
  explicit Rewriter(ir::Graph& g) : g_(g), removed_(g.nodes.size(), false) { reindex(); }

  ir::Graph& graph() { return g_; }
  size_t size() const { return g_.nodes.size(); }
  bool removed(size_t n) const { return removed_[n]; }
  ir::Node& node(size_t n) { return g_.nodes[n]; }
  size_t index(const ir::Node* n) const { return static_cast<size_t>(n - g_.nodes.data()); }

  // The live node producing `v`, or null.
  ir::Node* producer(ir::ValueId v) {
    if (v == ir::kNoValue) return nullptr;
    const ir::ValueInfo& info = g_.value(v);
    if (info.origin != ir::ValueOrigin::NodeOutput || info.producer < 0) return nullptr;
    const auto p = static_cast<size_t>(info.producer);
    return p < g_.nodes.size() && !removed_[p] ? &g_.nodes[p] : nullptr;
  }
  ir::Node* producer(ir::ValueId v, const char* op) {
    ir::Node* n = producer(v);
    return n && n->domain.empty() && n->op_type == op ? n : nullptr;
  }

  // `v` is read by exactly one node input and nothing else (no graph output, no capture).
  bool single_use(ir::ValueId v) const {
    return v != ir::kNoValue && readers_[static_cast<size_t>(v)] == 1 &&
           !pinned_[static_cast<size_t>(v)];
  }
  // `v` is read by exactly `n` node inputs and nothing else.
  bool used_exactly(ir::ValueId v, int n) const {
    return v != ir::kNoValue && readers_[static_cast<size_t>(v)] == n &&
           !pinned_[static_cast<size_t>(v)];
  }
  // `v` is read by nothing (an unused optional output).
  bool unused(ir::ValueId v) const {
    return v == ir::kNoValue ||
           (readers_[static_cast<size_t>(v)] == 0 && !pinned_[static_cast<size_t>(v)]);
  }
  // A graph output or read by a nested graph: its name must stay.
  bool pinned(ir::ValueId v) const { return pinned_[static_cast<size_t>(v)]; }

  // The constant behind `v` (an initializer here or in an enclosing graph), or null.
  const Tensor* constant(ir::ValueId v) const {
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
  // The value of a float constant holding one element, or nullopt.
  std::optional<double> scalar(ir::ValueId v) const {
    const Tensor* t = constant(v);
    if (!t || t->numel() != 1) return std::nullopt;
    if (t->dtype() == DataType::Float) return t->contiguous().data<const float>()[0];
    if (t->dtype() == DataType::Double) return t->contiguous().data<const double>()[0];
    return std::nullopt;
  }
  // The element type of `v` when the graph says it, else Undefined.
  DataType dtype(ir::ValueId v) const {
    if (const Tensor* t = constant(v)) return t->dtype();
    const ir::TypeInfo& type = declared(v);
    return type.kind == Value::Kind::Tensor ? type.elem : DataType::Undefined;
  }

  // The rank of `v`, from constants, declared shapes and the ops that produced it; -1 when
  // it cannot be told without running the graph.
  int64_t rank(ir::ValueId v, int depth = 0) {
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
    static const char* const kSameRank[] = {"Add",     "Sub",     "Mul",       "Div",
                                            "Where",   "Softmax", "Relu",      "Identity",
                                            "Cast",    "Concat",  "Erf",       "Tanh",
                                            "Sigmoid", "Neg",     "Sqrt",      "Pow",
                                            "Gelu",    "Dropout", "Attention", "LayerNormalization",
                                            "Swish"};
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

  // The size of `v`'s last axis when the graph tells it (constants, declared shapes, products
  // with a constant right operand, elementwise ops over such values), else -1.
  int64_t last_dim(ir::ValueId v, int depth = 0) {
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
      if (!shape || shape->rank() != 1 || shape->numel() == 0 ||
          shape->dtype() != DataType::Int64) {
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

  // The size of `v`'s axis 1 (its channels) when the graph tells it (constants, declared
  // shapes, convolutions with a constant filter, normalizations with constant parameters and
  // the ops that keep their input's channels), else -1.
  int64_t channels(ir::ValueId v, int depth = 0) {
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
    static const char* const kSameChannels[] = {
        "Relu",        "Sigmoid", "Tanh", "Identity",     "Dropout",   "MaxPool",
        "AveragePool", "LpPool",  "LRN",  "Clip",         "LeakyRelu", "Gelu",
        "Swish",       "Neg",     "Cast", "GlobalMaxPool"};
    const bool same =
        op == "GlobalAveragePool" || op == "BatchNormalization" || op == "InstanceNormalization" ||
        std::find_if(std::begin(kSameChannels), std::end(kSameChannels),
                     [&](const char* s) { return op == s; }) != std::end(kSameChannels);
    return same ? channels(p->inputs[0], depth + 1) : -1;
  }

  // Whether `v` is known to hold floats: declared so, a constant, or made by an op whose
  // output has the type of an input known to (a convolution's filter, a Mul's constant, a
  // pool's input, ...). Follows one input per node, so the search stays a path.
  bool float_type(ir::ValueId v, int depth = 0) {
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
    const bool one_type =
        op == "GlobalAveragePool" || op == "InstanceNormalization" ||
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

  // The live nodes reading `v` (each once, however many of its inputs do).
  std::vector<ir::Node*> readers(ir::ValueId v) {
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
  // The one live node reading `v` when `v` has no other use, else null.
  ir::Node* sole_reader(ir::ValueId v) {
    if (!single_use(v)) return nullptr;
    const std::vector<ir::Node*> r = readers(v);
    return r.size() == 1 ? r[0] : nullptr;
  }

  // Every node input reading `from` reads `to` instead.
  void replace_uses(ir::ValueId from, ir::ValueId to) {
    for (size_t n = 0; n < g_.nodes.size(); ++n) {
      if (removed_[n]) continue;
      for (ir::ValueId& id : g_.nodes[n].inputs) {
        if (id == from) id = to;
      }
    }
    reindex();
  }

  void remove(ir::Node* n) {
    const auto index = static_cast<size_t>(n - g_.nodes.data());
    removed_[index] = true;
    reindex();
  }

  // Appends a node producing `outputs` (values that exist already: their producer moves to it).
  ir::Node& add(ir::Node node) {
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

  // A new initializer of this graph holding `t` (made read-only).
  ir::ValueId new_constant(const std::string& hint, Tensor t) {
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

  ir::ValueId new_value(const std::string& hint) {
    std::string name = hint;
    for (int i = 1; g_.find(name) != ir::kNoValue; ++i) name = hint + "_" + std::to_string(i);
    return g_.add_value(name, ir::ValueOrigin::NodeOutput);
  }

  // Drops removed nodes and renumbers producers.
  void commit() {
    remove_nodes(g_, removed_);
    removed_.assign(g_.nodes.size(), false);
    reindex();
  }

 private:
  const ir::TypeInfo& declared(ir::ValueId v) const {
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

  void reindex() {
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

  ir::Graph& g_;
  std::vector<bool> removed_;
  std::vector<int32_t> readers_;
  std::vector<bool> pinned_;
};

bool is(const ir::Node& n, const char* op) {
  return n.domain.empty() && n.op_type == op;
}

bool near(double x, double want) {
  return std::abs(x - want) <= 1e-6 * std::abs(want) + 1e-7;
}

// The input of `n` other than `v` (n has two inputs, one of them v).
ir::ValueId other_input(const ir::Node& n, ir::ValueId v) {
  return n.inputs[0] == v ? n.inputs[1] : n.inputs[0];
}

// ---- identity elimination ----

// The value `n` merely passes on (its only output equals this input), or kNoValue.
ir::ValueId passes_on(Rewriter& r, const ir::Node& n) {
  if (!n.domain.empty() || n.outputs.empty() || n.outputs[0] == ir::kNoValue) return ir::kNoValue;
  const std::string& op = n.op_type;
  if (op == "Identity" && n.inputs.size() == 1) return n.inputs[0];
  if (op == "Dropout" && !n.inputs.empty()) {
    // Inference Dropout: training_mode absent or constant false, the mask unused.
    if (n.outputs.size() > 1 && !r.unused(n.outputs[1])) return ir::kNoValue;
    if (n.attr("is_test") == nullptr && n.opset < 7) return ir::kNoValue;
    if (n.inputs.size() > 2 && n.inputs[2] != ir::kNoValue) {
      const Tensor* training = r.constant(n.inputs[2]);
      if (!training || training->numel() != 1 || training->dtype() != DataType::Bool ||
          training->contiguous().data<const bool>()[0]) {
        return ir::kNoValue;
      }
    }
    return n.inputs[0];
  }
  if (op == "Cast" && n.inputs.size() == 1) {
    const ir::Attribute* to = n.attr("to");
    const DataType from = r.dtype(n.inputs[0]);
    if (to && from != DataType::Undefined && static_cast<int64_t>(from) == to->i) {
      return n.inputs[0];
    }
    return ir::kNoValue;
  }
  const bool mul = op == "Mul", div = op == "Div", add = op == "Add", sub = op == "Sub";
  if ((mul || div || add || sub) && n.inputs.size() == 2) {
    const double neutral = mul || div ? 1.0 : 0.0;
    // x op c with c a rank-0 constant equal to the neutral element: y is x (a constant of
    // rank 0 cannot broadcast x to a larger shape, and its type is x's).
    for (int side = 0; side < 2; ++side) {
      if (side == 1 && (div || sub)) break;  // 1 / x and 0 - x are not x
      const ir::ValueId c = n.inputs[side == 0 ? 1 : 0];
      const Tensor* t = r.constant(c);
      const std::optional<double> v = r.scalar(c);
      if (t && t->rank() == 0 && v && *v == neutral) return n.inputs[side == 0 ? 0 : 1];
    }
  }
  return ir::kNoValue;
}

int eliminate_identities(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node& n = r.node(i);
    const ir::ValueId in = passes_on(r, n);
    if (in == ir::kNoValue || r.pinned(n.outputs[0])) continue;
    const ir::ValueId out = n.outputs[0];
    r.remove(&n);
    r.replace_uses(out, in);
    ++count;
  }
  return count;
}

// ---- GELU ----

// The outer part both GELU forms share, around f (erf(x / sqrt2) or tanh(...)): 1 + f, then
// (x * (1 + f)) * 0.5 or (x * 0.5) * (1 + f), in any operand order. Appends its nodes to
// `drop` and returns the node whose output is the GELU, or null.
ir::Node* gelu_outer(Rewriter& r, ir::ValueId x, ir::ValueId f, std::vector<ir::Node*>& drop) {
  if (!r.single_use(f)) return nullptr;
  ir::Node* one = nullptr;
  for (size_t j = 0; j < r.size() && !one; ++j) {
    if (r.removed(j) || !is(r.node(j), "Add") || r.node(j).inputs.size() != 2) continue;
    ir::Node& a = r.node(j);
    if (a.inputs[0] != f && a.inputs[1] != f) continue;
    const auto c = r.scalar(other_input(a, f));
    if (c && *c == 1.0) one = &a;
  }
  if (!one || !r.single_use(one->outputs[0])) return nullptr;
  ir::Node* m1 = nullptr;  // the Mul reading 1 + f
  for (size_t j = 0; j < r.size() && !m1; ++j) {
    if (r.removed(j) || !is(r.node(j), "Mul") || r.node(j).inputs.size() != 2) continue;
    ir::Node& m = r.node(j);
    if (m.inputs[0] == one->outputs[0] || m.inputs[1] == one->outputs[0]) m1 = &m;
  }
  if (!m1) return nullptr;
  const ir::ValueId partner = other_input(*m1, one->outputs[0]);
  if (partner == x) {
    // (x * (1 + f)) * 0.5
    if (!r.single_use(m1->outputs[0])) return nullptr;
    for (size_t j = 0; j < r.size(); ++j) {
      if (r.removed(j) || !is(r.node(j), "Mul") || r.node(j).inputs.size() != 2) continue;
      ir::Node& m = r.node(j);
      if (m.inputs[0] != m1->outputs[0] && m.inputs[1] != m1->outputs[0]) continue;
      const auto c = r.scalar(other_input(m, m1->outputs[0]));
      if (!c || *c != 0.5) continue;
      drop.insert(drop.end(), {one, m1, &m});
      return &m;
    }
    return nullptr;
  }
  // (x * 0.5) * (1 + f)
  ir::Node* half = r.producer(partner, "Mul");
  if (!half || !r.single_use(partner) || half->inputs.size() != 2) return nullptr;
  bool ok = false;
  for (int s = 0; s < 2; ++s) {
    const auto c = r.scalar(half->inputs[s]);
    ok = ok || (c && *c == 0.5 && half->inputs[1 - s] == x);
  }
  if (!ok) return nullptr;
  drop.insert(drop.end(), {one, m1, half});
  return m1;
}

// One Gelu (opset 20, `approximate` "tanh" or none) in place of `drop`, named after `last`.
void replace_with_gelu(Rewriter& r, ir::ValueId x, ir::Node* last,
                       const std::vector<ir::Node*>& drop, bool tanh) {
  ir::Node gelu;
  gelu.name = last->name.empty() ? "gelu" : last->name + "/gelu";
  gelu.op_type = "Gelu";
  gelu.opset = 20;
  gelu.inputs = {x};
  gelu.outputs = {last->outputs[0]};
  if (tanh) {
    ir::Attribute a;
    a.name = "approximate";
    a.kind = ir::AttrKind::String;
    a.s = "tanh";
    gelu.attributes = {a};
  }
  for (ir::Node* d : drop) r.remove(d);
  r.add(std::move(gelu));
}

// 0.5 * x * (1 + erf(x / sqrt(2))) as torch exports it (Div or Mul by 1/sqrt2, the 0.5
// applied first or last, operands in either order): rewritten as Gelu (opset 20).
int fuse_gelu(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Erf")) continue;
    ir::Node* erf = &r.node(i);
    // Erf's input: x / sqrt2 or x * (1 / sqrt2).
    ir::Node* scale = r.producer(erf->inputs[0]);
    if (!scale || !r.single_use(erf->inputs[0]) || scale->inputs.size() != 2) continue;
    ir::ValueId x = ir::kNoValue;
    if (is(*scale, "Div")) {
      const auto c = r.scalar(scale->inputs[1]);
      if (c && near(*c, std::sqrt(2.0))) x = scale->inputs[0];
    } else if (is(*scale, "Mul")) {
      for (int s = 0; s < 2 && x == ir::kNoValue; ++s) {
        const auto c = r.scalar(scale->inputs[s]);
        if (c && near(*c, 1.0 / std::sqrt(2.0))) x = scale->inputs[1 - s];
      }
    }
    if (x == ir::kNoValue) continue;
    std::vector<ir::Node*> drop{scale, erf};
    ir::Node* last = gelu_outer(r, x, erf->outputs[0], drop);
    if (!last) continue;
    replace_with_gelu(r, x, last, drop, false);
    ++count;
  }
  return count;
}

// The Mul node computing c * v (either operand order, c a float scalar near `want`) when its
// output is read once: the node and v, else null.
std::pair<ir::Node*, ir::ValueId> scaled(Rewriter& r, ir::ValueId out, double want) {
  ir::Node* m = r.producer(out, "Mul");
  if (!m || m->inputs.size() != 2 || !r.single_use(out)) return {nullptr, ir::kNoValue};
  for (int s = 0; s < 2; ++s) {
    const auto c = r.scalar(m->inputs[s]);
    if (c && near(*c, want)) return {m, m->inputs[1 - s]};
  }
  return {nullptr, ir::kNoValue};
}

// The tanh approximation 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) (GPT-2's
// gelu_new, x^3 as Pow(x, 3)), with the outer part in the forms the erf GELU takes:
// Gelu(approximate = "tanh"), whose vector kernel reads x once instead of eight ops.
int fuse_gelu_tanh(Rewriter& r) {
  int count = 0;
  const double sqrt_2_over_pi = std::sqrt(2.0 / 3.14159265358979323846);
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Tanh") || r.node(i).inputs.size() != 1) continue;
    ir::Node* tanh = &r.node(i);
    const auto [outer_scale, inner] = scaled(r, tanh->inputs[0], sqrt_2_over_pi);
    ir::Node* sum = outer_scale ? r.producer(inner, "Add") : nullptr;
    if (!sum || sum->inputs.size() != 2 || !r.single_use(inner)) continue;
    // x + 0.044715 * Pow(x, 3), in either order.
    ir::ValueId x = ir::kNoValue;
    ir::Node *cube_scale = nullptr, *cube = nullptr;
    for (int s = 0; s < 2 && x == ir::kNoValue; ++s) {
      const auto [m, p] = scaled(r, sum->inputs[s], 0.044715);
      ir::Node* pow = m ? r.producer(p, "Pow") : nullptr;
      if (!pow || pow->inputs.size() != 2 || !r.single_use(p) ||
          pow->inputs[0] != sum->inputs[1 - s]) {
        continue;
      }
      const auto e = r.scalar(pow->inputs[1]);
      if (!e || *e != 3.0) continue;
      x = pow->inputs[0];
      cube_scale = m;
      cube = pow;
    }
    if (x == ir::kNoValue) continue;
    std::vector<ir::Node*> drop{cube, cube_scale, sum, outer_scale, tanh};
    ir::Node* last = gelu_outer(r, x, tanh->outputs[0], drop);
    if (!last) continue;
    replace_with_gelu(r, x, last, drop, true);
    ++count;
  }
  return count;
}

// ---- layer normalization ----

// The one axis a ReduceMean with keepdims reduces (the `axes` attribute before opset 18, the
// constant second input from 18 on), or nullopt.
std::optional<int64_t> reduced_axis(Rewriter& r, const ir::Node& n) {
  const ir::Attribute* keep = n.attr("keepdims");
  if (keep && keep->i == 0) return std::nullopt;
  if (n.opset >= 18) {
    const Tensor* t = r.constant(n.inputs.size() > 1 ? n.inputs[1] : ir::kNoValue);
    if (!t || t->dtype() != DataType::Int64 || t->numel() != 1) return std::nullopt;
    return t->contiguous().data<const int64_t>()[0];
  }
  const ir::Attribute* axes = n.attr("axes");
  if (!axes || axes->ints.size() != 1 || n.inputs.size() != 1) return std::nullopt;
  return axes->ints[0];
}

// A float constant vector of n values (n > 1: exactly the normalised axis), or null.
const Tensor* norm_param(Rewriter& r, ir::ValueId v, int64_t n) {
  const Tensor* t = r.constant(v);
  if (!t || t->dtype() != DataType::Float || t->rank() != 1 || t->numel() < 1) return nullptr;
  return n < 0 || t->numel() == n ? t : nullptr;
}

// The one node reading `v`, when it is a two-input `op`; else null.
ir::Node* binary_reader(Rewriter& r, ir::ValueId v, const char* op) {
  ir::Node* n = r.sole_reader(v);
  return n && is(*n, op) && n->inputs.size() == 2 ? n : nullptr;
}

// LayerNormalization written out in primitives over the last axis (PyTorch exports before
// opset 17):
//   d = x - ReduceMean(x);  var = ReduceMean(d^2) (Pow(d, 2) or d * d)
//   y = d / Sqrt(var + eps) * gamma [+ beta]
// with gamma and beta constant float vectors along the last axis: one LayerNormalization
// (opset 17), whose row kernel reads x twice instead of running nine elementwise passes.
int fuse_layer_norm(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "ReduceMean") || r.node(i).inputs.empty()) continue;
    ir::Node* mean = &r.node(i);
    const ir::ValueId x = mean->inputs[0];
    const int64_t rank = r.rank(x);
    auto last_axis = [rank](std::optional<int64_t> a) {
      return a && (*a == -1 || (rank >= 1 && *a == rank - 1));
    };
    if (!last_axis(reduced_axis(r, *mean))) continue;
    ir::Node* sub = binary_reader(r, mean->outputs[0], "Sub");
    if (!sub || sub->inputs[0] != x || sub->inputs[1] != mean->outputs[0]) continue;
    const ir::ValueId d = sub->outputs[0];
    // d is read by the square and by the Div, and nothing else.
    const std::vector<ir::Node*> dr = r.readers(d);
    if (dr.size() != 2 || r.pinned(d)) continue;
    ir::Node* square = nullptr;
    ir::Node* div = nullptr;
    for (ir::Node* n : dr) {
      if (n->inputs.size() != 2) continue;
      if (is(*n, "Div") && n->inputs[0] == d && n->inputs[1] != d) div = n;
      if (is(*n, "Mul") && n->inputs[0] == d && n->inputs[1] == d) square = n;
      if (is(*n, "Pow") && n->inputs[0] == d) {
        const auto e = r.scalar(n->inputs[1]);
        if (e && *e == 2.0) square = n;
      }
    }
    if (!square || !div) continue;
    ir::Node* var = r.sole_reader(square->outputs[0]);
    if (!var || !is(*var, "ReduceMean") || var->inputs[0] != square->outputs[0] ||
        !last_axis(reduced_axis(r, *var))) {
      continue;
    }
    ir::Node* add_eps = binary_reader(r, var->outputs[0], "Add");
    if (!add_eps) continue;
    const auto eps = r.scalar(other_input(*add_eps, var->outputs[0]));
    const Tensor* eps_t = r.constant(other_input(*add_eps, var->outputs[0]));
    if (!eps || !(*eps >= 0) || eps_t->dtype() != DataType::Float || eps_t->rank() > 1) continue;
    ir::Node* sqrt = r.sole_reader(add_eps->outputs[0]);
    if (!sqrt || !is(*sqrt, "Sqrt") || r.sole_reader(sqrt->outputs[0]) != div ||
        div->inputs[1] != sqrt->outputs[0]) {
      continue;
    }
    // The scale: a Mul reading the quotient alone, with a vector along the last axis.
    const int64_t n = r.last_dim(x);
    ir::Node* mul = binary_reader(r, div->outputs[0], "Mul");
    if (!mul) continue;
    const ir::ValueId gamma = other_input(*mul, div->outputs[0]);
    const Tensor* g = norm_param(r, gamma, -1);
    // A scale of more than one value must run along x's last axis (else it broadcasts x).
    if (!g || (g->numel() > 1 && g->numel() != n)) continue;
    std::vector<ir::Node*> chain{mean, sub, square, var, add_eps, sqrt, div, mul};
    ir::ValueId beta = ir::kNoValue;
    ir::ValueId y = mul->outputs[0];
    if (ir::Node* add = binary_reader(r, y, "Add")) {
      const ir::ValueId b = other_input(*add, y);
      const Tensor* bt = norm_param(r, b, -1);
      if (bt && (bt->numel() == 1 || bt->numel() == n)) {
        beta = b;
        chain.push_back(add);
        y = add->outputs[0];
      }
    }
    ir::Node ln;
    ln.name = mean->name.empty() ? "layer_norm" : mean->name + "/layer_norm";
    ln.op_type = "LayerNormalization";
    ln.opset = 17;
    ln.inputs = {x, gamma};
    if (beta != ir::kNoValue) ln.inputs.push_back(beta);
    ir::Attribute a;
    a.name = "axis";
    a.kind = ir::AttrKind::Int;
    a.i = -1;
    ir::Attribute e;
    e.name = "epsilon";
    e.kind = ir::AttrKind::Float;
    e.f = static_cast<float>(*eps);
    ln.attributes = {a, e};
    ln.outputs = {y};
    for (ir::Node* c : chain) r.remove(c);
    r.add(std::move(ln));
    ++count;
  }
  return count;
}

// Add(a, b) -> LayerNormalization over the last axis with constant float gamma (and beta):
// one com.microsoft.SkipLayerNormalization, whose row kernel adds, normalises and scales each
// row in one visit. When the sum has other readers (the residual stream of a pre-norm
// transformer) it becomes the node's fourth output, input_skip_bias_sum.
int fuse_skip_layer_norm(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "LayerNormalization")) continue;
    ir::Node* ln = &r.node(i);
    if (ln->opset < 17 || ln->inputs.size() < 2) continue;
    bool statistics_used = false;
    for (size_t o = 1; o < ln->outputs.size(); ++o) {
      statistics_used = statistics_used || !r.unused(ln->outputs[o]);
    }
    const ir::Attribute* stash = ln->attr("stash_type");
    if (statistics_used || (stash && stash->i != 1)) continue;
    const ir::ValueId sum = ln->inputs[0];
    ir::Node* add = r.producer(sum, "Add");
    if (!add || add->inputs.size() != 2) continue;
    const int64_t rank = r.rank(sum);
    const ir::Attribute* axis = ln->attr("axis");
    if (axis && axis->i != -1 && (rank < 1 || axis->i != rank - 1)) continue;
    const int64_t n = r.last_dim(sum);
    const Tensor* gamma = norm_param(r, ln->inputs[1], -1);
    if (!gamma || (gamma->numel() == 1 && n != 1) || (n >= 0 && gamma->numel() != n)) continue;
    const bool has_beta = ln->inputs.size() > 2 && ln->inputs[2] != ir::kNoValue;
    if (has_beta && !norm_param(r, ln->inputs[2], gamma->numel())) continue;
    const ir::Attribute* eps = ln->attr("epsilon");
    ir::Node fused;
    fused.name = ln->name.empty() ? "skip_layer_norm" : ln->name + "/skip";
    fused.domain = "com.microsoft";
    fused.op_type = "SkipLayerNormalization";
    fused.opset = 1;
    fused.inputs = {add->inputs[0], add->inputs[1], ln->inputs[1]};
    if (has_beta) fused.inputs.push_back(ln->inputs[2]);
    ir::Attribute e;
    e.name = "epsilon";
    e.kind = ir::AttrKind::Float;
    e.f = eps ? eps->f : 1e-5f;  // LayerNormalization's default, not SkipLayerNormalization's
    fused.attributes = {e};
    fused.outputs = {ln->outputs[0]};
    // Other readers of the sum read the fused node's fourth output.
    if (!r.single_use(sum)) fused.outputs = {ln->outputs[0], ir::kNoValue, ir::kNoValue, sum};
    r.remove(add);
    r.remove(ln);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

// ---- MatMul with bias and activation ----

// The `activation` attribute of the fused ops.
ir::Attribute activation_attr(const char* name) {
  ir::Attribute a;
  a.name = "activation";
  a.kind = ir::AttrKind::String;
  a.s = name;
  return a;
}

const char* activation_of(const ir::Node& n) {
  if (is(n, "Relu")) return "Relu";
  if (is(n, "Sigmoid")) return "Sigmoid";
  if (is(n, "Tanh")) return "Tanh";
  if (is(n, "Gelu")) {
    const ir::Attribute* a = n.attr("approximate");
    return a && a->s == "tanh" ? "GeluTanh" : "Gelu";
  }
  if (is(n, "Swish")) {
    const ir::Attribute* a = n.attr("alpha");
    const float alpha = a ? a->f : 1.0f;
    if (alpha == 1.0f) return "Silu";
    if (alpha == 1.702f) return "QuickGelu";  // math::kQuickGeluAlpha
  }
  return nullptr;
}

// MatMul(a, b) + bias (a constant float vector along the last axis), then optionally an
// activation: one kiln.FusedMatMul whose GEMM adds the bias and applies the activation to
// each tile while it is in cache.
int fuse_matmul_epilogue(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "MatMul")) continue;
    ir::Node* mm = &r.node(i);
    const ir::ValueId y = mm->outputs[0];
    if (!r.single_use(y)) continue;
    // The Add reading y with a constant bias.
    ir::Node* add = nullptr;
    ir::ValueId bias = ir::kNoValue;
    for (size_t j = 0; j < r.size() && !add; ++j) {
      if (r.removed(j) || !is(r.node(j), "Add") || r.node(j).inputs.size() != 2) continue;
      ir::Node& a = r.node(j);
      if (a.inputs[0] != y && a.inputs[1] != y) continue;
      const ir::ValueId b = other_input(a, y);
      const Tensor* t = r.constant(b);
      if (!t || t->dtype() != DataType::Float || t->rank() != 1) continue;
      const Tensor* w = r.constant(mm->inputs[1]);
      // The bias must run along the product's last axis: B's columns (when B is known) and
      // never broadcast the product to a larger shape (a 1-D product is not fused).
      if (w && w->rank() >= 2 && w->dim(w->rank() - 1) != t->dim(0)) continue;
      // B known and at least 2-D: the product has B's columns as its last axis, so the bias
      // adds along it without broadcasting the product to another shape.
      if (!w || w->dtype() != DataType::Float || w->rank() < 2) continue;
      add = &a;
      bias = b;
    }
    if (!add) continue;
    ir::Node fused;
    fused.name = mm->name.empty() ? "matmul" : mm->name;
    fused.op_type = "FusedMatMul";
    fused.domain = "kiln";
    fused.opset = 1;
    fused.inputs = {mm->inputs[0], mm->inputs[1], bias};
    fused.outputs = {add->outputs[0]};
    r.remove(mm);
    r.remove(add);
    r.add(std::move(fused));
    ++count;
  }
  // An activation reading a fused product alone joins it.
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node& act = r.node(i);
    const char* name = activation_of(act);
    if (!name || act.inputs.empty()) continue;
    ir::Node* fm = r.producer(act.inputs[0]);
    if (!fm || fm->domain != "kiln" || fm->op_type != "FusedMatMul" || fm->attr("activation") ||
        !r.single_use(act.inputs[0])) {
      continue;
    }
    ir::Node fused = *fm;
    fused.attributes.push_back(activation_attr(name));
    fused.outputs = {act.outputs[0]};
    r.remove(fm);
    r.remove(&act);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

// ---- scalars and transposes folded into products ----

bool is_fused_matmul(const ir::Node& n) {
  return n.op_type == "FusedMatMul" && (n.domain == "kiln" || n.domain == "com.microsoft");
}

void set_attr(ir::Node& n, const char* name, ir::AttrKind kind, float f, int64_t i) {
  auto it = std::find_if(n.attributes.begin(), n.attributes.end(),
                         [&](const ir::Attribute& a) { return a.name == name; });
  if (it == n.attributes.end()) {
    n.attributes.emplace_back();
    it = n.attributes.end() - 1;
    it->name = name;
  }
  it->kind = kind;
  it->f = f;
  it->i = i;
}

float alpha_of(const ir::Node& n) {
  const ir::Attribute* a = n.attr("alpha");
  return a ? a->f : 1.0f;
}

// `n` as a fused product (a MatMul becomes com.microsoft.FusedMatMul), to take alpha or trans.
ir::Node as_fused_matmul(const ir::Node& n) {
  ir::Node f = n;
  if (!is_fused_matmul(f)) {
    f.domain = "com.microsoft";
    f.op_type = "FusedMatMul";
    f.opset = 1;
  }
  return f;
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

// Scalar Muls and Divs folded into a float product's alpha: MatMul(A * s, B), MatMul(A, B * s)
// and MatMul(A, B) * s (or / s), where the product is a MatMul or a fused one (for a product
// scaled afterwards: without an activation, its bias scaled too). A Transpose swapping the
// last two axes of an operand becomes transA / transB (the GEMM reads the view either way;
// one node less). Plain MatMuls become com.microsoft.FusedMatMul, onnxruntime's op with this
// meaning. Runs after the attention fusion, which matches plain MatMuls.
int fold_into_matmul(Rewriter& r) {
  int count = 0;
  // The product scaled afterwards.
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node* op = &r.node(i);
    if ((!is(*op, "Mul") && !is(*op, "Div")) || op->inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      if (side == 1 && is(*op, "Div")) break;  // c / y is not a scaled y
      const ir::ValueId y = op->inputs[static_cast<size_t>(side)];
      const ir::ValueId c = op->inputs[static_cast<size_t>(1 - side)];
      ir::Node* mm = r.producer(y);
      if (!mm || !(is(*mm, "MatMul") || is_fused_matmul(*mm)) || mm->attr("activation") ||
          !r.single_use(y)) {
        continue;
      }
      auto s = scalar_factor(r, c, y);
      if (!s || (is(*op, "Div") && *s == 0.0)) continue;
      const double factor = is(*op, "Div") ? 1.0 / *s : *s;
      ir::Node fused = as_fused_matmul(*mm);
      if (fused.inputs.size() > 2 && fused.inputs[2] != ir::kNoValue) {
        const Tensor* bias = r.constant(fused.inputs[2]);
        if (!bias || bias->dtype() != DataType::Float) continue;
        const Tensor bc = bias->contiguous();
        Tensor scaled(DataType::Float, bias->shape(),
                      Storage::heap_uninitialized(storage_bytes(DataType::Float, bias->numel())));
        for (int64_t k = 0; k < bias->numel(); ++k) {
          scaled.data<float>()[k] =
              static_cast<float>(static_cast<double>(bc.data<const float>()[k]) * factor);
        }
        fused.inputs[2] =
            r.new_constant(r.graph().value(op->outputs[0]).name + "/bias", std::move(scaled));
      }
      set_attr(fused, "alpha", ir::AttrKind::Float,
               static_cast<float>(static_cast<double>(alpha_of(fused)) * factor), 0);
      fused.outputs = {op->outputs[0]};
      r.remove(mm);
      r.remove(op);
      r.add(std::move(fused));
      ++count;
      break;
    }
  }
  // Scaled or transposed operands.
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    if (!is(r.node(i), "MatMul") && !is_fused_matmul(r.node(i))) continue;
    if (r.node(i).inputs.size() < 2) continue;
    // The fused products take floats: a MatMul's type is told by a float operand (a scalar
    // Mul's constant says it too, below).
    const bool float_product = is_fused_matmul(r.node(i)) ||
                               r.dtype(r.node(i).inputs[0]) == DataType::Float ||
                               r.dtype(r.node(i).inputs[1]) == DataType::Float;
    ir::Node fused = as_fused_matmul(r.node(i));
    std::vector<ir::Node*> drop;
    for (size_t k = 0; k < 2; ++k) {
      const ir::ValueId v = fused.inputs[k];
      ir::Node* p = r.producer(v);
      if (!p || !r.single_use(v)) continue;
      if ((is(*p, "Mul") || is(*p, "Div")) && p->inputs.size() == 2) {
        for (int side = 0; side < 2; ++side) {
          if (side == 1 && is(*p, "Div")) break;
          const ir::ValueId x = p->inputs[static_cast<size_t>(side)];
          const auto s = scalar_factor(r, p->inputs[static_cast<size_t>(1 - side)], x);
          if (!s || (is(*p, "Div") && *s == 0.0)) continue;
          const double factor = is(*p, "Div") ? 1.0 / *s : *s;
          set_attr(fused, "alpha", ir::AttrKind::Float,
                   static_cast<float>(static_cast<double>(alpha_of(fused)) * factor), 0);
          fused.inputs[k] = x;
          drop.push_back(p);
          break;
        }
      } else if (is(*p, "Transpose") && float_product) {
        const char* name = k == 0 ? "transA" : "transB";
        const ir::Attribute* perm = p->attr("perm");
        const ir::Attribute* trans = fused.attr(name);
        if (!perm || perm->ints.size() < 2 || (trans && trans->i != 0)) continue;
        const size_t n = perm->ints.size();
        bool swaps_last = perm->ints[n - 1] == static_cast<int64_t>(n - 2) &&
                          perm->ints[n - 2] == static_cast<int64_t>(n - 1);
        for (size_t d = 0; d + 2 < n; ++d) swaps_last = swaps_last && perm->ints[d] == int64_t(d);
        if (!swaps_last) continue;
        set_attr(fused, name, ir::AttrKind::Int, 0.0f, 1);
        fused.inputs[k] = p->inputs[0];
        drop.push_back(p);
      }
    }
    if (drop.empty()) continue;
    r.remove(&r.node(i));
    for (ir::Node* d : drop) r.remove(d);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

// ---- SiLU and QuickGELU ----

// x * Sigmoid(x) (SiLU) and x * Sigmoid(alpha * x) with a constant scalar alpha (QuickGELU:
// 1.702), in either operand order: one Swish (opset 24), whose vector kernel reads x once;
// a product or convolution before it takes it as its epilogue's activation.
int fuse_swish(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Sigmoid") || r.node(i).inputs.size() != 1) continue;
    ir::Node* sigmoid = &r.node(i);
    const ir::ValueId z = sigmoid->inputs[0], s = sigmoid->outputs[0];
    ir::Node* mul = binary_reader(r, s, "Mul");
    if (!mul || mul->inputs[0] == mul->inputs[1]) continue;
    const ir::ValueId x = other_input(*mul, s);
    std::vector<ir::Node*> chain{sigmoid, mul};
    double alpha = 1.0;
    if (x != z) {
      ir::Node* scale = r.producer(z, "Mul");
      if (!scale || scale->inputs.size() != 2 || !r.single_use(z)) continue;
      const int side = scale->inputs[0] == x ? 0 : scale->inputs[1] == x ? 1 : -1;
      if (side < 0) continue;
      const auto c = scalar_factor(r, scale->inputs[static_cast<size_t>(1 - side)], x);
      if (!c) continue;
      alpha = *c;
      chain.push_back(scale);
    }
    ir::Node swish;
    swish.name = mul->name.empty() ? "swish" : mul->name + "/swish";
    swish.op_type = "Swish";
    swish.opset = 24;
    swish.inputs = {x};
    swish.outputs = {mul->outputs[0]};
    ir::Attribute a;
    a.name = "alpha";
    a.kind = ir::AttrKind::Float;
    a.f = static_cast<float>(alpha);
    swish.attributes = {a};
    for (ir::Node* c : chain) r.remove(c);
    r.add(std::move(swish));
    ++count;
  }
  return count;
}

// ---- attention ----

// Where(IsNaN(p), 0, p) over the probabilities `p` (Optimum's exports of scaled dot-product
// attention with a mask: a row whose keys are all masked is NaN after Softmax and becomes
// zeros): the Where and the IsNaN, else null. Attention gives such a row zeros itself (only
// a NaN reaching the scores from Q or K differs: Attention keeps it, the Where zeroed it).
std::pair<ir::Node*, ir::Node*> nan_to_zero(Rewriter& r, ir::ValueId probs) {
  ir::Node* where = r.producer(probs, "Where");
  if (!where || where->inputs.size() != 3 || !r.single_use(probs)) return {nullptr, nullptr};
  ir::Node* isnan = r.producer(where->inputs[0], "IsNaN");
  const std::optional<double> zero = r.scalar(where->inputs[1]);
  if (!isnan || !r.single_use(where->inputs[0]) || !zero || *zero != 0.0 ||
      isnan->inputs[0] != where->inputs[2] || !r.used_exactly(where->inputs[2], 2)) {
    return {nullptr, nullptr};
  }
  return {where, isnan};
}

// MatMul(Q [* s], K^T [* s]) [* or / scale] [+ mask] -> Softmax(last axis) [-> Where(IsNaN,
// 0)] -> MatMul(., V) on 4-D [batch, heads, positions, head size] operands: one Attention
// (opset 23), which computes the scores a block of query rows at a time and never holds the
// [heads, L, L] matrix. K is K^T transposed back: a view (Transpose of a view).
int fuse_attention(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "MatMul")) continue;
    ir::Node* pv = &r.node(i);
    const auto [where, isnan] = nan_to_zero(r, pv->inputs[0]);
    const ir::ValueId probs = where ? where->inputs[2] : pv->inputs[0];
    ir::Node* softmax = r.producer(probs, "Softmax");
    if (!softmax || !(where || r.single_use(probs)) || softmax->opset < 13) continue;
    const ir::Attribute* axis = softmax->attr("axis");
    if (axis && axis->i != -1 && axis->i != 3) continue;
    ir::ValueId s = softmax->inputs[0];
    if (!r.single_use(s)) continue;
    std::vector<ir::Node*> chain{pv, softmax};
    if (where) chain.insert(chain.end(), {where, isnan});
    ir::ValueId mask = ir::kNoValue;
    double scale = 1.0;
    ir::Node* n = r.producer(s);
    // Optional additive mask: the operand produced by the scores chain is the scores.
    if (n && is(*n, "Add") && n->inputs.size() == 2) {
      const bool first = r.producer(n->inputs[0], "MatMul") || r.producer(n->inputs[0], "Mul") ||
                         r.producer(n->inputs[0], "Div");
      const ir::ValueId scores = first ? n->inputs[0] : n->inputs[1];
      mask = first ? n->inputs[1] : n->inputs[0];
      const int64_t mr = r.rank(mask);
      if (mr < 1 || mr > 4 || !r.single_use(scores)) continue;  // Attention's mask ranks
      chain.push_back(n);
      s = scores;
      n = r.producer(s);
    }
    if (n && (is(*n, "Mul") || is(*n, "Div")) && n->inputs.size() == 2) {
      const bool mul = is(*n, "Mul");
      std::optional<double> c = r.scalar(n->inputs[1]);
      ir::ValueId scores = n->inputs[0];
      if (!c && mul) {
        c = r.scalar(n->inputs[0]);
        scores = n->inputs[1];
      }
      if (!c || *c == 0.0 || !r.single_use(scores)) continue;
      scale = mul ? *c : 1.0 / *c;
      chain.push_back(n);
      s = scores;
      n = r.producer(s);
    }
    if (!n || !is(*n, "MatMul") || !r.single_use(s)) continue;
    ir::Node* qk = n;
    chain.push_back(qk);
    ir::ValueId q = qk->inputs[0], kt = qk->inputs[1];
    const ir::ValueId v = pv->inputs[1];
    // Scales on the operands instead (Q * s and K^T * s, as BERT exports write the
    // 1/sqrt(head size) split between them): into the one scale.
    bool bad_operand_scale = false;
    for (ir::ValueId* operand : {&q, &kt}) {
      ir::Node* m = r.producer(*operand);
      if (!m || !is(*m, "Mul") || m->inputs.size() != 2 || !r.single_use(*operand)) continue;
      const std::optional<double> c1 = scalar_factor(r, m->inputs[1], m->inputs[0]);
      const std::optional<double> c0 =
          c1 ? std::nullopt : scalar_factor(r, m->inputs[0], m->inputs[1]);
      if (!c1 && !c0) continue;
      const ir::ValueId x = c1 ? m->inputs[0] : m->inputs[1];
      const double c = c1 ? *c1 : *c0;
      if (c == 0.0 || r.rank(x) != 4) {
        bad_operand_scale = true;
        break;
      }
      scale *= c;
      chain.push_back(m);
      *operand = x;
    }
    if (bad_operand_scale) continue;
    // Attention reads a mask shorter than the keys as masking the keys past it: a mask that
    // broadcasts along the keys (last axis 1) means something else.
    if (mask != ir::kNoValue && r.last_dim(mask) == 1 && r.last_dim(kt) != 1) continue;
    if (r.rank(q) != 4 || r.rank(kt) != 4 || r.rank(v) != 4) continue;
    // K = K^T with its last two axes swapped back.
    const ir::ValueId k = r.new_value(r.graph().value(kt).name + "/untransposed");
    ir::Node transpose;
    transpose.name = qk->name + "/k";
    transpose.op_type = "Transpose";
    transpose.opset = 13;
    ir::Attribute perm;
    perm.name = "perm";
    perm.kind = ir::AttrKind::Ints;
    perm.ints = {0, 1, 3, 2};
    transpose.attributes = {perm};
    transpose.inputs = {kt};
    transpose.outputs = {k};
    ir::Node attention;
    attention.name = pv->name.empty() ? "attention" : pv->name + "/attention";
    attention.op_type = "Attention";
    attention.opset = 23;
    attention.inputs = {q, k, v};
    if (mask != ir::kNoValue) attention.inputs.push_back(mask);
    ir::Attribute sc;
    sc.name = "scale";
    sc.kind = ir::AttrKind::Float;
    sc.f = static_cast<float>(scale);
    attention.attributes = {sc};
    attention.outputs = {pv->outputs[0]};
    for (ir::Node* d : chain) r.remove(d);
    r.add(std::move(transpose));
    r.add(std::move(attention));
    ++count;
  }
  return count;
}

// ---- convolutions ----

// A float constant of `n` values (any shape holding n), as doubles; empty otherwise.
std::vector<double> float_values(Rewriter& r, ir::ValueId v, int64_t n) {
  const Tensor* t = r.constant(v);
  if (!t || t->dtype() != DataType::Float || t->numel() != n || t->rank() != 1) return {};
  const Tensor c = t->contiguous();
  const float* p = c.data<const float>();
  return std::vector<double>(p, p + n);
}

// A float tensor of m values.
Tensor float_vector(const std::vector<double>& v) {
  const auto m = static_cast<int64_t>(v.size());
  Tensor t(DataType::Float, Shape{m},
           Storage::heap_uninitialized(storage_bytes(DataType::Float, m)));
  for (int64_t k = 0; k < m; ++k)
    t.data<float>()[k] = static_cast<float>(v[static_cast<size_t>(k)]);
  return t;
}

// y = x * scale[c] + shift[c] over channels c, composed in double along a chain.
struct ChannelTransform {
  std::vector<double> scale, shift;
};

// `t` followed by the inference BatchNormalization `bn` over m channels, y = (x - mean) * a +
// bias with a = scale / sqrt(variance + epsilon), in double; false (t unchanged) when its
// parameters are not m float constants.
bool apply_batchnorm(Rewriter& r, const ir::Node& bn, int64_t m, ChannelTransform& t) {
  const std::vector<double> scale = float_values(r, bn.inputs[1], m),
                            bias = float_values(r, bn.inputs[2], m),
                            mean = float_values(r, bn.inputs[3], m),
                            var = float_values(r, bn.inputs[4], m);
  if (scale.empty() || bias.empty() || mean.empty() || var.empty()) return false;
  const ir::Attribute* eps = bn.attr("epsilon");
  const double epsilon = eps ? static_cast<double>(eps->f) : 1e-5;
  for (size_t k = 0; k < static_cast<size_t>(m); ++k) {
    const double a = scale[k] / std::sqrt(var[k] + epsilon);
    t.scale[k] *= a;
    t.shift[k] = (t.shift[k] - mean[k]) * a + bias[k];
  }
  return true;
}

// A BatchNormalization at inference (opset 7 or later: before, is_test and spatial), its
// statistics outputs unread and its parameters one per channel (spatial not 0).
bool inference_batchnorm(Rewriter& r, const ir::Node& bn) {
  if (!is(bn, "BatchNormalization") || bn.inputs.size() != 5 || bn.opset < 7) return false;
  for (size_t o = 1; o < bn.outputs.size(); ++o) {
    if (!r.unused(bn.outputs[o])) return false;
  }
  const ir::Attribute* training = bn.attr("training_mode");
  const ir::Attribute* spatial = bn.attr("spatial");
  return !(training && training->i != 0) && !(spatial && spatial->i == 0);
}

// A Conv whose filter a fold may rewrite: its constant float filter (rank >= 3, at least one
// output channel), the channel count m, the filter values per channel, and its bias as
// doubles (zeros when it has none).
struct FoldableConv {
  const Tensor* w = nullptr;
  int64_t m = 0, per = 0;
  std::vector<double> bias;
};

std::optional<FoldableConv> foldable_conv(Rewriter& r, const ir::Node& conv) {
  if (conv.inputs.size() < 2) return std::nullopt;
  const Tensor* w = r.constant(conv.inputs[1]);
  if (!w || w->dtype() != DataType::Float || w->rank() < 3 || w->dim(0) == 0) return std::nullopt;
  FoldableConv f{w, w->dim(0), w->numel() / w->dim(0), {}};
  f.bias.assign(static_cast<size_t>(f.m), 0.0);
  if (conv.inputs.size() > 2 && conv.inputs[2] != ir::kNoValue) {
    f.bias = float_values(r, conv.inputs[2], f.m);
    if (f.bias.empty()) return std::nullopt;
  }
  return f;
}

// `conv` and the node `after` reading it replaced by one Conv writing after's output: its
// filter scaled per output channel by `scale` in double (kept as it is when `scale` is
// empty), its bias `bias`; the new constants are named after that output.
void replace_with_folded_conv(Rewriter& r, ir::Node* conv, ir::Node* after, const FoldableConv& f,
                              const std::vector<double>& scale, const std::vector<double>& bias) {
  const std::string base = r.graph().value(after->outputs[0]).name;
  ir::Node folded = *conv;
  ir::ValueId weight = conv->inputs[1];
  if (!scale.empty()) {
    Tensor nw(DataType::Float, f.w->shape(),
              Storage::heap_uninitialized(storage_bytes(DataType::Float, f.w->numel())));
    const Tensor wc = f.w->contiguous();
    const float* src = wc.data<const float>();
    float* dst = nw.data<float>();
    for (int64_t c = 0; c < f.m; ++c) {
      const double s = scale[static_cast<size_t>(c)];
      for (int64_t j = 0; j < f.per; ++j) {
        dst[c * f.per + j] = static_cast<float>(static_cast<double>(src[c * f.per + j]) * s);
      }
    }
    weight = r.new_constant(base + "/conv_weight", std::move(nw));
  }
  folded.inputs = {conv->inputs[0], weight,
                   r.new_constant(base + "/conv_bias", float_vector(bias))};
  folded.outputs = {after->outputs[0]};
  r.remove(conv);
  r.remove(after);
  r.add(std::move(folded));
}

// Conv(X, W, B) -> BatchNormalization at inference, W, B and the normalization's scale,
// bias, mean and variance constants: one Conv(X, W', B') with W' = W * s per output channel
// and B' = (B - mean) * s + bias, s = scale / sqrt(variance + epsilon), computed in double.
int fold_conv_batchnorm(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !inference_batchnorm(r, r.node(i))) continue;
    ir::Node* bn = &r.node(i);
    ir::Node* conv = r.producer(bn->inputs[0], "Conv");
    if (!conv || !r.single_use(bn->inputs[0])) continue;
    const std::optional<FoldableConv> fc = foldable_conv(r, *conv);
    if (!fc) continue;
    // The convolution's output is 1 * conv + bias before the normalization.
    ChannelTransform t{std::vector<double>(static_cast<size_t>(fc->m), 1.0), fc->bias};
    if (!apply_batchnorm(r, *bn, fc->m, t)) continue;
    replace_with_folded_conv(r, conv, bn, *fc, t.scale, t.shift);
    ++count;
  }
  return count;
}

// The values of a float constant `c` that scales or shifts a convolution's output (rank
// `rank`, m channels) per output channel: m values along axis 1 (its shape right-aligned to
// the output's, every other axis 1) or one value for all; empty otherwise.
std::vector<double> per_channel(Rewriter& r, ir::ValueId c, int64_t rank, int64_t m) {
  const Tensor* t = r.constant(c);
  if (!t || t->dtype() != DataType::Float) return {};
  const auto t_rank = static_cast<int64_t>(t->rank());
  if (t_rank > rank) return {};
  const Tensor v = t->contiguous();
  const float* p = v.data<const float>();
  if (t->numel() == 1) return std::vector<double>(static_cast<size_t>(m), p[0]);
  const int64_t channel_axis = t_rank - (rank - 1);  // axis 1 of the output, in t
  for (int64_t a = 0; a < t_rank; ++a) {
    if (t->dim(static_cast<size_t>(a)) != (a == channel_axis ? m : 1)) return {};
  }
  if (channel_axis < 0) return {};
  return std::vector<double>(p, p + m);
}

// Conv(X, W, B) -> Mul or Add by a per-output-channel float constant (a batch normalization
// written out as a scale and a shift, as Caffe2's exports have it), the convolution's output
// read by that node alone: one Conv(X, W', B') with W' = W * s and B' = B * s for a Mul,
// B' = B + a for an Add, computed in double. Repeats along a chain of them.
int fold_conv_scale_shift(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node* op = &r.node(i);
    const bool mul = is(*op, "Mul");
    if ((!mul && !is(*op, "Add")) || op->inputs.size() != 2) continue;
    ir::Node* conv = nullptr;
    ir::ValueId y = ir::kNoValue;
    for (ir::ValueId v : op->inputs) {
      ir::Node* p = r.producer(v, "Conv");
      if (p && r.single_use(v) && other_input(*op, v) != v) conv = p, y = v;
    }
    if (!conv) continue;
    const std::optional<FoldableConv> fc = foldable_conv(r, *conv);
    if (!fc) continue;
    const std::vector<double> f =
        per_channel(r, other_input(*op, y), static_cast<int64_t>(fc->w->rank()), fc->m);
    if (f.empty()) continue;
    std::vector<double> bias(fc->bias.size());
    for (size_t k = 0; k < bias.size(); ++k)
      bias[k] = mul ? fc->bias[k] * f[k] : fc->bias[k] + f[k];
    replace_with_folded_conv(r, conv, op, *fc, mul ? f : std::vector<double>{}, bias);
    ++count;
  }
  return count;
}

// A float Conv, then optionally an Add (or a two-input Sum) of another tensor Z (a residual
// connection; it may broadcast), then optionally an activation, each reading the previous output
// alone: one kiln.FusedConv(X, W, B, Z) with the `activation` attribute, y = act(conv + B + Z),
// which accumulates onto Z in place and applies the activation to each tile while it is in cache.
int fuse_conv_epilogue(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i) || !is(r.node(i), "Conv")) continue;
    ir::Node* conv = &r.node(i);
    if (conv->inputs.size() < 2 || r.dtype(conv->inputs[1]) != DataType::Float) continue;
    ir::ValueId y = conv->outputs[0];
    std::vector<ir::Node*> chain{conv};
    ir::ValueId z = ir::kNoValue;
    auto reader = [&](ir::ValueId v) -> ir::Node* {
      if (!r.single_use(v)) return nullptr;
      for (size_t j = 0; j < r.size(); ++j) {
        if (r.removed(j)) continue;
        ir::Node& n = r.node(j);
        if (std::find(n.inputs.begin(), n.inputs.end(), v) != n.inputs.end()) return &n;
      }
      return nullptr;
    };
    ir::Node* next = reader(y);
    // (Add and Sum take one type, so Z is float as the convolution is. Sum of two inputs is
    // Add from opset 8, which broadcasts as Add does; Caffe2's ResNets write residuals so.)
    const bool adds = next && (is(*next, "Add") || (is(*next, "Sum") && next->opset >= 8));
    if (adds && next->inputs.size() == 2 && other_input(*next, y) != y) {
      z = other_input(*next, y);
      chain.push_back(next);
      y = next->outputs[0];
      next = reader(y);
    }
    const char* act = next ? activation_of(*next) : nullptr;
    if (act) {
      chain.push_back(next);
      y = next->outputs[0];
    }
    if (chain.size() == 1) continue;
    ir::Node fused = *conv;
    fused.domain = "kiln";
    fused.op_type = "FusedConv";
    fused.opset = 1;
    fused.inputs.resize(3, ir::kNoValue);
    if (z != ir::kNoValue) fused.inputs.push_back(z);
    if (act) fused.attributes.push_back(activation_attr(act));
    fused.outputs = {y};
    for (ir::Node* n : chain) r.remove(n);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

// ---- per-channel scale and shift ----

// One step of a chain of per-channel affine ops: the node (by index: fusing a chain appends a
// node, which may move the others), the value it reads along the chain and, for a Mul, Add,
// Sub or Div, its constant operand.
struct AffineStep {
  size_t node = 0;
  ir::ValueId x = ir::kNoValue;
  ir::ValueId c = ir::kNoValue;
};

// Node `i` as a step of such a chain by its form alone: an inference BatchNormalization, a
// Mul, Add or Sub with one float constant operand, or x divided by one. Whether the constants
// hold one value per channel is checked once the chain's channels are known.
std::optional<AffineStep> affine_step(Rewriter& r, size_t i) {
  const ir::Node& n = r.node(i);
  if (r.removed(i) || n.outputs.empty() || n.outputs[0] == ir::kNoValue) return std::nullopt;
  if (inference_batchnorm(r, n)) return AffineStep{i, n.inputs[0], ir::kNoValue};
  const bool div = is(n, "Div");
  if ((!is(n, "Mul") && !is(n, "Add") && !is(n, "Sub") && !div) || n.inputs.size() != 2) {
    return std::nullopt;
  }
  for (int s = 0; s < 2; ++s) {
    const Tensor* t = r.constant(n.inputs[s]);
    if (!t || t->dtype() != DataType::Float || r.constant(n.inputs[1 - s])) continue;
    if (div && s == 0) continue;  // c / x is no affine function of x
    return AffineStep{i, n.inputs[1 - s], n.inputs[s]};
  }
  return std::nullopt;
}

// The step reading `v` alone, or nullopt.
std::optional<AffineStep> next_affine_step(Rewriter& r, ir::ValueId v) {
  ir::Node* n = r.sole_reader(v);
  if (!n) return std::nullopt;
  const std::optional<AffineStep> s = affine_step(r, r.index(n));
  return s && s->x == v ? s : std::nullopt;
}

// `t` followed by step `s` on a tensor of rank `rank` (-1: unknown) with `m` channels; false
// (t unchanged) when s's constants are not one float per channel along axis 1 or one for all
// (of a rank that cannot broadcast the tensor to a larger one; the tensor's rank is at least
// 2, as the chain's start tells).
bool compose(Rewriter& r, const AffineStep& s, int64_t rank, int64_t m, ChannelTransform& t) {
  const ir::Node& n = r.node(s.node);
  const auto size = static_cast<size_t>(m);
  if (s.c == ir::kNoValue) return apply_batchnorm(r, n, m, t);
  std::vector<double> v;
  if (rank >= 0) {
    v = per_channel(r, s.c, rank, m);
  } else if (const Tensor* c = r.constant(s.c); c->numel() == 1 && c->rank() <= 1) {
    v.assign(size, static_cast<double>(c->contiguous().data<const float>()[0]));
  }
  if (v.empty()) return false;
  const bool constant_first = n.inputs[0] == s.c;
  for (size_t k = 0; k < size; ++k) {
    if (is(n, "Mul")) {
      t.scale[k] *= v[k];
      t.shift[k] *= v[k];
    } else if (is(n, "Div")) {
      t.scale[k] /= v[k];
      t.shift[k] /= v[k];
    } else if (is(n, "Add")) {
      t.shift[k] += v[k];
    } else if (constant_first) {  // c - y
      t.scale[k] = -t.scale[k];
      t.shift[k] = v[k] - t.shift[k];
    } else {  // y - c
      t.shift[k] -= v[k];
    }
  }
  return true;
}

// A chain of per-channel affine ops over axis 1, each reading the previous one's output alone:
// inference BatchNormalizations with constant parameters, and Muls, Adds, Subs and Divs by
// float constants of one value per channel ([C, 1, 1], [1, C, 1, 1]) or one for all, in any
// order and number, optionally followed by an activation: one kiln.ChannelAffine(X, scale,
// shift) with the `activation` attribute, its scale and shift composed in double. The chain
// starts where X's channels are known, so no constant broadcasts X to more of them: at a
// BatchNormalization (which fails on any other count, as the fused op does) or where the
// graph tells them. Made for a chain of two ops or more, or a BatchNormalization alone, that
// holds a normalization or a constant of more than one value (scalars alone, as in attention
// masks and near misses of the GELU patterns, are left to the other fusions). Runs after the
// folds into convolutions, which take such chains whole.
int fuse_channel_affine(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const std::optional<AffineStep> head = affine_step(r, i);
    if (!head) continue;
    // A run is taken from its first step (its steps may be listed in any order).
    if (ir::Node* p = r.producer(head->x)) {
      const std::optional<AffineStep> before = affine_step(r, r.index(p));
      if (before && r.single_use(head->x) && p->outputs[0] == head->x) continue;
    }
    std::vector<AffineStep> run{*head};
    while (auto s = next_affine_step(r, r.node(run.back().node).outputs[0])) run.push_back(*s);
    for (size_t pos = 0; pos < run.size();) {
      const AffineStep& first = run[pos];
      const ir::Node& start = r.node(first.node);
      int64_t m = -1;
      if (first.c == ir::kNoValue) {
        const Tensor* scale = r.constant(start.inputs[1]);
        if (scale && scale->rank() == 1) m = scale->dim(0);
      } else {
        m = r.channels(first.x);
      }
      const int64_t rank = r.rank(first.x);
      ChannelTransform t{std::vector<double>(static_cast<size_t>(std::max<int64_t>(m, 0)), 1.0),
                         std::vector<double>(static_cast<size_t>(std::max<int64_t>(m, 0)), 0.0)};
      // The chain's type is X's: told by the graph, or by a Mul, Add, Sub or Div constant
      // (of the other operand's type) or a BatchNormalization's parameters before opset 15
      // (which allows other types for them) along the chain.
      bool is_float = r.float_type(first.x);
      bool normalizes = false, per_channel_values = false;
      size_t end = pos;
      while (m > 0 && end < run.size() && compose(r, run[end], rank, m, t)) {
        const bool bn = run[end].c == ir::kNoValue;
        normalizes = normalizes || bn;
        per_channel_values = per_channel_values || bn || r.constant(run[end].c)->numel() > 1;
        is_float = is_float || !bn || r.node(run[end].node).opset < 15;
        ++end;
      }
      if (end == pos) {
        ++pos;
        continue;
      }
      ir::ValueId y = r.node(run[end - 1].node).outputs[0];
      ir::Node* act = end == run.size() ? r.sole_reader(y) : nullptr;
      const char* act_name = act ? activation_of(*act) : nullptr;
      if (!act_name || act->inputs.empty() || act->inputs[0] != y) act = nullptr;
      if (!is_float || !per_channel_values || (!normalizes && end - pos + (act ? 1 : 0) < 2)) {
        pos = end;
        continue;
      }
      if (act) y = act->outputs[0];
      const std::string base = r.graph().value(y).name;
      ir::Node fused;
      fused.name = start.name.empty() ? "channel_affine" : start.name;
      fused.domain = "kiln";
      fused.op_type = "ChannelAffine";
      fused.opset = 1;
      fused.inputs = {first.x, r.new_constant(base + "/affine_scale", float_vector(t.scale)),
                      r.new_constant(base + "/affine_shift", float_vector(t.shift))};
      fused.outputs = {y};
      if (act) fused.attributes.push_back(activation_attr(act_name));
      if (act) r.remove(act);
      for (size_t k = pos; k < end; ++k) r.remove(&r.node(run[k].node));
      r.add(std::move(fused));
      ++count;
      pos = end;
    }
  }
  return count;
}

// ---- dynamically quantized products ----

// The DynamicQuantizeLinear whose three outputs are `q`, `scale` and `zero`, or null.
ir::Node* dynamic_quantizer(Rewriter& r, ir::ValueId q, ir::ValueId scale, ir::ValueId zero) {
  ir::Node* d = r.producer(q, "DynamicQuantizeLinear");
  if (!d || d->outputs.size() != 3 || d->outputs[0] != q || d->outputs[1] != scale ||
      d->outputs[2] != zero) {
    return nullptr;
  }
  return d;
}

// A constant of `type` with one value or one per column of a 2-D B of n columns (the forms
// both fused ops take).
bool per_column_constant(Rewriter& r, ir::ValueId v, DataType type, int64_t n) {
  const Tensor* t = r.constant(v);
  return t && t->dtype() == type && (t->numel() == 1 ? t->rank() <= 1 : t->rank() == 1) &&
         (t->numel() == 1 || t->dim(0) == n);
}

void remove_if_unused(Rewriter& r, ir::Node* n) {
  if (n && std::all_of(n->outputs.begin(), n->outputs.end(),
                       [&](ir::ValueId v) { return r.unused(v); })) {
    r.remove(n);
  }
}

// The reader of `y` alone adding a constant float bias of n values along the last axis, or
// null.
ir::Node* bias_add(Rewriter& r, ir::ValueId y, int64_t n) {
  ir::Node* add = r.sole_reader(y);
  if (!add || !is(*add, "Add") || add->inputs.size() != 2) return nullptr;
  const Tensor* t = r.constant(other_input(*add, y));
  return t && t->dtype() == DataType::Float && t->rank() == 1 && t->dim(0) == n ? add : nullptr;
}

ir::Node ms_node(const std::string& name, const char* op, std::vector<ir::ValueId> inputs,
                 ir::ValueId output) {
  ir::Node n;
  n.name = name;
  n.op_type = op;
  n.domain = "com.microsoft";
  n.opset = 1;
  n.inputs = std::move(inputs);
  while (!n.inputs.empty() && n.inputs.back() == ir::kNoValue) n.inputs.pop_back();
  n.outputs = {output};
  return n;
}

// onnxruntime's quantize_dynamic writes each MatMul as
//   DynamicQuantizeLinear(x) -> (A, a_scale, a_zero)
//   MatMulInteger(A, B, a_zero[, b_zero]) -> Cast(float) -> Mul(., Mul(a_scale, b_scale))
// with B (2-D), b_scale and b_zero constant, b_scale and b_zero per tensor or per column. The
// chain becomes com.microsoft.DynamicQuantizeMatMul(x, B, b_scale, b_zero) when A has no
// other reader: its kernel quantizes x straight into the GEMM's packed panels (no uint8
// tensor) and scales the sums in the GEMM's store. Else (A shared by several products: the
// query, key and value) MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero, b_zero), which
// packs the shared A. A constant bias Add after the Mul joins as the bias input. Both compute
// float(sum) * (a_scale * b_scale_j) (+ bias_j) with the chain's roundings: results are the
// same bit for bit. MatMulIntegerToFloat reading a DynamicQuantizeLinear alone (onnxruntime's
// own fusion of the chain) becomes DynamicQuantizeMatMul the same way.
int fuse_dynamic_quant_matmul(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node* mm = &r.node(i);
    const bool integer = is(*mm, "MatMulInteger");
    const bool to_float = mm->domain == "com.microsoft" && mm->op_type == "MatMulIntegerToFloat";
    if (!integer && !to_float) continue;
    const size_t zero_at = integer ? 2 : 4;  // A's zero point
    if (mm->inputs.size() <= zero_at) continue;
    const ir::ValueId a = mm->inputs[0], b = mm->inputs[1];
    const Tensor* w = r.constant(b);
    if (!w || w->rank() != 2 || (w->dtype() != DataType::Int8 && w->dtype() != DataType::UInt8)) {
      continue;
    }
    const int64_t n = w->dim(1);
    const ir::ValueId b_zero =
        mm->inputs.size() > zero_at + 1 ? mm->inputs[zero_at + 1] : ir::kNoValue;
    if (b_zero != ir::kNoValue && !per_column_constant(r, b_zero, w->dtype(), n)) continue;
    std::string name = mm->name.empty() ? "matmul" : mm->name;
    if (to_float) {
      ir::Node* d = dynamic_quantizer(r, a, mm->inputs[2], mm->inputs[4]);
      if (!d || !r.single_use(a)) continue;
      const ir::ValueId bias = mm->inputs.size() > 6 ? mm->inputs[6] : ir::kNoValue;
      ir::Node fused = ms_node(name, "DynamicQuantizeMatMul",
                               {d->inputs[0], b, mm->inputs[3], b_zero, bias}, mm->outputs[0]);
      r.remove(mm);
      remove_if_unused(r, d);
      r.add(std::move(fused));
      ++count;
      continue;
    }
    ir::Node* cast = r.sole_reader(mm->outputs[0]);
    const ir::Attribute* to = cast && is(*cast, "Cast") ? cast->attr("to") : nullptr;
    if (!to || to->i != static_cast<int64_t>(DataType::Float)) continue;
    ir::Node* mul = r.sole_reader(cast->outputs[0]);
    if (!mul || !is(*mul, "Mul") || mul->inputs.size() != 2) continue;
    ir::Node* scales = r.producer(other_input(*mul, cast->outputs[0]), "Mul");
    if (!scales || scales->inputs.size() != 2 || !r.single_use(scales->outputs[0])) continue;
    // Mul(a_scale, b_scale), in either order, a_scale from the quantizer of A.
    ir::Node* d = nullptr;
    ir::ValueId b_scale = ir::kNoValue;
    for (int s = 0; s < 2 && !d; ++s) {
      d = dynamic_quantizer(r, a, scales->inputs[s], mm->inputs[2]);
      b_scale = scales->inputs[1 - s];
    }
    if (!d || !per_column_constant(r, b_scale, DataType::Float, n)) continue;
    ir::ValueId out = mul->outputs[0];
    ir::Node* add = bias_add(r, out, n);
    ir::ValueId bias = add ? other_input(*add, out) : ir::kNoValue;
    if (add) out = add->outputs[0];
    ir::Node fused =
        r.single_use(a)
            ? ms_node(name, "DynamicQuantizeMatMul", {d->inputs[0], b, b_scale, b_zero}, out)
            : ms_node(name, "MatMulIntegerToFloat",
                      {a, b, d->outputs[1], b_scale, d->outputs[2], b_zero}, out);
    if (bias != ir::kNoValue) {
      fused.inputs.resize(fused.op_type == "DynamicQuantizeMatMul" ? 4 : 6, ir::kNoValue);
      fused.inputs.push_back(bias);
    }
    for (ir::Node* gone : {mm, cast, mul, scales, add}) {
      if (gone) r.remove(gone);
    }
    remove_if_unused(r, d);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

// A com.microsoft.Gelu reading a DynamicQuantizeMatMul alone (the first feed-forward product
// of a quantized BERT) joins it: kiln.DynamicQuantizeMatMul with the `activation` attribute
// applies it to each finished tile while the tile is in cache, with the vector kernel the Gelu
// op runs, element by element: the same results, one pass over the product's output less.
int fuse_dynamic_quant_activation(Rewriter& r) {
  int count = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r.removed(i)) continue;
    ir::Node& act = r.node(i);
    if (act.domain != "com.microsoft" || act.op_type != "Gelu" || act.inputs.size() != 1) continue;
    ir::Node* mm = r.producer(act.inputs[0]);
    if (!mm || mm->domain != "com.microsoft" || mm->op_type != "DynamicQuantizeMatMul" ||
        !r.single_use(act.inputs[0])) {
      continue;
    }
    ir::Node fused = *mm;
    fused.domain = "kiln";
    fused.attributes.push_back(activation_attr("Gelu"));
    fused.outputs = {act.outputs[0]};
    r.remove(mm);
    r.remove(&act);
    r.add(std::move(fused));
    ++count;
  }
  return count;
}

void optimize_graph(ir::Graph& g, GraphOptimization level, OptimizeStats& stats) {
  Rewriter r(g);
  stats.identities_removed += eliminate_identities(r);
  if (level == GraphOptimization::All) {
    stats.fused += fuse_gelu(r);
    stats.fused += fuse_gelu_tanh(r);
    stats.fused += fuse_swish(r);
    stats.fused += fuse_layer_norm(r);
    stats.fused += fuse_skip_layer_norm(r);
    stats.fused += fuse_matmul_epilogue(r);
    stats.fused += fuse_dynamic_quant_matmul(r);
    stats.fused += fuse_dynamic_quant_activation(r);
    stats.fused += fuse_attention(r);
    stats.fused += fold_into_matmul(r);
    const int convs = fold_conv_batchnorm(r) + fold_conv_scale_shift(r);
    stats.fused += convs + fuse_conv_epilogue(r);
    const int affine = fuse_channel_affine(r);
    stats.fused += affine;
    r.commit();
    // the filters, biases and normalization parameters folded
    if (convs + affine > 0) drop_unused_initializers(g);
  }
  r.commit();
  for (ir::Node& node : g.nodes) {
    for (ir::Attribute& a : node.attributes) {
      if (a.g) optimize_graph(*a.g, level, stats);
      for (auto& sub : a.graphs) optimize_graph(*sub, level, stats);
    }
  }
}

}  // namespace

OptimizeStats optimize(ir::Graph& graph, GraphOptimization level) {
  OptimizeStats stats;
  if (level != GraphOptimization::None) optimize_graph(graph, level, stats);
  return stats;
}

}  // namespace kiln::passes
