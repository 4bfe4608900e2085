#include "engine/plan/plan.h"

#include <algorithm>
#include <queue>
#include <string>

#include "engine/plan/shape_inference.h"
#include "kiln/error.h"

namespace kiln::plan {
namespace {

std::string domain_name(const std::string& d) {
  return d.empty() ? "ai.onnx" : d;
}

[[noreturn]] void unsupported(const ir::Node& node) {
  std::string msg = "unsupported op '" + node.op_type + "' (domain " + domain_name(node.domain) +
                    ", opset " + std::to_string(node.opset) + ")";
  std::string known;
  for (const auto& reg : ops::all_ops()) {
    if (node.op_type == reg.op && node.domain == reg.domain) {
      if (!known.empty()) known += ", ";
      known += std::to_string(reg.since) +
               (reg.until == ops::kLatestOpset ? "+" : "-" + std::to_string(reg.until));
    }
  }
  if (!known.empty()) msg += "; kiln implements opsets " + known;
  throw Error(ErrorKind::Unsupported, msg).with_node(node.name, node.op_type);
}

void check_arity(const ir::Node& node, const ops::OpRegistration& reg) {
  const auto n_in = static_cast<int>(node.inputs.size());
  const auto n_out = static_cast<int>(node.outputs.size());
  if (n_in < reg.min_inputs || n_in > reg.max_inputs) {
    throw Error(ErrorKind::InvalidModel,
                "has " + std::to_string(n_in) + " inputs; expected " +
                    std::to_string(reg.min_inputs) +
                    (reg.max_inputs == reg.min_inputs
                         ? ""
                         : " to " + (reg.max_inputs == INT_MAX ? std::string("any")
                                                               : std::to_string(reg.max_inputs))))
        .with_node(node.name, node.op_type);
  }
  if (n_out < reg.min_outputs || n_out > reg.max_outputs) {
    throw Error(ErrorKind::InvalidModel, "has " + std::to_string(n_out) + " outputs; expected " +
                                             std::to_string(reg.min_outputs) + " to " +
                                             std::to_string(reg.max_outputs))
        .with_node(node.name, node.op_type);
  }
}

}  // namespace

void check_arities(const ir::Graph& g) {
  for (const ir::Node& node : g.nodes) {
    if (const ops::OpRegistration* reg = ops::find_op(node.domain, node.op_type, node.opset)) {
      check_arity(node, *reg);
    } else {
      bool any = false;
      ops::OpRegistration loose{};
      for (const auto& r : ops::all_ops()) {
        if (r.op != node.op_type || r.domain != node.domain) continue;
        if (!any) {
          loose = r;
          any = true;
          continue;
        }
        loose.min_inputs = std::min(loose.min_inputs, r.min_inputs);
        loose.max_inputs = std::max(loose.max_inputs, r.max_inputs);
        loose.min_outputs = std::min(loose.min_outputs, r.min_outputs);
        loose.max_outputs = std::max(loose.max_outputs, r.max_outputs);
      }
      if (any) check_arity(node, loose);
    }
    for (const ir::Attribute* a : node.graph_attributes()) check_arities(*a->g);
  }
}

const OutputSlot* output_slot(const Step& step, size_t o, DataType dtype, const Shape& shape) {
  for (const OutputSlot& slot : step.slots) {
    if (slot.output == static_cast<int32_t>(o))
      return slot.dtype == dtype && slot.shape == shape ? &slot : nullptr;
  }
  return nullptr;
}

bool matches_hint(const GraphPlan& plan, size_t i, DataType dtype, const Shape& shape) {
  const ir::Graph& g = *plan.graph;
  if (i >= g.inputs.size()) return true;
  const auto id = static_cast<size_t>(g.inputs[i]);
  if (id >= plan.shape_hints.size() || !plan.shape_hints[id].known) return true;
  return plan.shape_hints[id].dtype == dtype && plan.shape_hints[id].shape == shape;
}

std::vector<int32_t> execution_order(const ir::Graph& g) {
  const size_t n = g.nodes.size();
  std::vector<std::vector<int32_t>> consumers(n);
  std::vector<int32_t> pending(n, 0);
  std::vector<bool> writes_inputs(n, false);
  for (size_t ni = 0; ni < n; ++ni) {
    const ir::Node& node = g.nodes[ni];
    const ops::OpRegistration* reg = ops::find_op(node.domain, node.op_type, node.opset);
    writes_inputs[ni] = reg && (reg->in_place != 0 || !node.implicit_inputs.empty());
    auto depend = [&](ir::ValueId id) {
      if (id == ir::kNoValue) return;
      const ir::ValueInfo& v = g.value(id);
      if (v.origin != ir::ValueOrigin::NodeOutput || v.producer < 0) return;
      consumers[static_cast<size_t>(v.producer)].push_back(static_cast<int32_t>(ni));
      ++pending[ni];
    };
    for (ir::ValueId id : node.inputs) depend(id);
    for (ir::ValueId id : node.implicit_inputs) depend(id);
  }
  // Ready nodes ordered by (may write its inputs, position in the file).
  using Key = std::pair<bool, int32_t>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  for (size_t ni = 0; ni < n; ++ni) {
    if (pending[ni] == 0) ready.push({writes_inputs[ni], static_cast<int32_t>(ni)});
  }
  std::vector<int32_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const int32_t ni = ready.top().second;
    ready.pop();
    order.push_back(ni);
    for (int32_t c : consumers[static_cast<size_t>(ni)]) {
      if (--pending[static_cast<size_t>(c)] == 0)
        ready.push({writes_inputs[static_cast<size_t>(c)], c});
    }
  }
  if (order.size() != n) (void)ir::topological_order(g);  // throws, naming a node on the cycle
  return order;
}

namespace {

// The values of the root graph as inferred from its declared inputs, an input whose only
// symbolic dimension is the leading one (a batch) taken with 1 there: what kernels choose
// their prepared forms by (NodeInfo::input_shape_hint).
std::vector<ops::ValueFacts> load_shape_hints(const ir::Graph& g) {
  std::vector<ops::ValueFacts> given(g.inputs.size());
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ir::TypeInfo& t = g.value(g.inputs[i]).type;
    if (t.kind != Value::Kind::Tensor || !t.shape || t.elem == DataType::Undefined) continue;
    Shape shape;
    bool fixed = true;
    for (size_t d = 0; d < t.shape->size() && fixed; ++d) {
      const int64_t v = (*t.shape)[d].value;
      fixed = v >= 0 || d == 0;
      shape.push_back(v >= 0 ? v : 1);
    }
    if (!fixed) continue;
    given[i] = ops::known_facts(t.elem, shape);
  }
  return infer_shapes(g, execution_order(g), given).values;
}

// Concat groups (ConcatGroup) of the root graph, from its shape hints.
class ConcatGrouping {
 public:
  explicit ConcatGrouping(GraphPlan& plan) : plan_(plan), g_(*plan.graph) {
    const size_t n = g_.values.size();
    producer_.assign(n, {-1, -1});
    member_.assign(n, false);
    for (size_t pos = 0; pos < plan.steps.size(); ++pos) {
      const ir::Node& node = *plan.steps[pos].node;
      for (size_t o = 0; o < node.outputs.size(); ++o) {
        if (node.outputs[o] != ir::kNoValue)
          producer_[static_cast<size_t>(node.outputs[o])] = {static_cast<int32_t>(pos),
                                                             static_cast<int32_t>(o)};
      }
    }
  }

  void form() {
    // Outermost first: a Concat read by a later one joins that one's group.
    for (size_t pos = plan_.steps.size(); pos-- > 0;) {
      const Step& step = plan_.steps[pos];
      const ir::Node& node = *step.node;
      if (!concat(step) || member_[static_cast<size_t>(node.outputs[0])]) continue;
      const ops::ValueFacts& y = hint(node.outputs[0]);
      if (storage_bytes(y.dtype, shape_numel(y.shape)) < kMinBytes) continue;
      // Input 0 made elsewhere (a cache passed in) may be appended to in place instead.
      if (!joins(node.inputs[0], y.dtype, 0)) continue;
      ConcatGroup group;
      group.first_step = static_cast<int32_t>(pos);
      group.dtype = y.dtype;
      group.elements = shape_numel(y.shape);
      const auto id = static_cast<int32_t>(plan_.concat_groups.size());
      plan_.concat_groups.push_back(group);
      member_[static_cast<size_t>(node.outputs[0])] = true;
      place(static_cast<int32_t>(pos), 0, id, 0);
      ConcatGroup& made = plan_.concat_groups.back();
      plan_.steps[static_cast<size_t>(made.first_step)].groups_begin.push_back(id);
      plan_.steps[pos].groups_end.push_back(id);
    }
  }

 private:
  // Below this the copy costs less than the group's bookkeeping.
  static constexpr uint64_t kMinBytes = 16384;

  const ops::ValueFacts& hint(ir::ValueId id) const {
    return plan_.shape_hints[static_cast<size_t>(id)];
  }

  // A Concat whose inputs are consecutive blocks of its output (every dimension outside the
  // axis 1) and whose shapes are all known.
  bool concat(const Step& step) const {
    const ir::Node& node = *step.node;
    if (node.op_type != "Concat" || !node.domain.empty() || node.inputs.size() < 2 ||
        node.outputs.size() != 1 || !step.subgraphs.empty())
      return false;
    const ops::ValueFacts& y = hint(node.outputs[0]);
    if (!y.known || y.shape.empty() || y.dtype == DataType::String || bits_per_element(y.dtype) < 8)
      return false;
    const ir::Attribute* a = node.attr("axis");
    const auto rank = static_cast<int64_t>(y.shape.size());
    if (!a || a->i < -rank || a->i >= rank) return false;
    const int64_t axis = a->i < 0 ? a->i + rank : a->i;
    for (int64_t d = 0; d < axis; ++d)
      if (y.shape[static_cast<size_t>(d)] != 1) return false;
    for (ir::ValueId id : node.inputs) {
      if (id == ir::kNoValue || !hint(id).known || hint(id).dtype != y.dtype) return false;
    }
    return true;
  }

  // Whether value `id` can be written into a group's window at `byte_offset`: made by a step of
  // this graph (no nested graph), not a graph output, in no other group, and aligned as the
  // pool aligns buffers.
  bool joins(ir::ValueId id, DataType dtype, uint64_t byte_offset) const {
    const auto v = static_cast<size_t>(id);
    if (id == ir::kNoValue || member_[v] || producer_[v].first < 0 || byte_offset % 64 != 0)
      return false;
    if (std::find(g_.outputs.begin(), g_.outputs.end(), id) != g_.outputs.end()) return false;
    if (!hint(id).known || hint(id).dtype != dtype) return false;
    return plan_.steps[static_cast<size_t>(producer_[v].first)].subgraphs.empty();
  }

  // Concat step `pos` writes its output (output 0) into group `id` at `base`: its inputs that
  // can join take their windows, a Concat among them recursively.
  void place(int32_t pos, int32_t output, int32_t id, uint64_t base) {
    Step& step = plan_.steps[static_cast<size_t>(pos)];
    const ir::ValueId out = step.node->outputs[static_cast<size_t>(output)];
    step.slots.push_back({output, id, base, hint(out).dtype, hint(out).shape});
    ConcatGroup& group = plan_.concat_groups[static_cast<size_t>(id)];
    group.first_step = std::min(group.first_step, pos);
    if (output != 0 || !concat(step)) return;
    uint64_t offset = base;
    for (ir::ValueId in : step.node->inputs) {
      const ops::ValueFacts& f = hint(in);
      const uint64_t bytes = storage_bytes(f.dtype, shape_numel(f.shape));
      if (joins(in, f.dtype, offset)) {
        member_[static_cast<size_t>(in)] = true;
        const auto [p, o] = producer_[static_cast<size_t>(in)];
        place(p, o, id, offset);
      }
      offset += bytes;
    }
  }

  GraphPlan& plan_;
  const ir::Graph& g_;
  std::vector<std::pair<int32_t, int32_t>> producer_;  // per value: step position, output
  std::vector<bool> member_;
};

std::unique_ptr<GraphPlan> build_plan_tree(const ir::Graph& g, ops::WeightPreparer* preparer,
                                           int32_t& next_index) {
  auto plan = std::make_unique<GraphPlan>();
  plan->graph = &g;
  plan->index = next_index++;
  if (plan->index == 0) plan->shape_hints = load_shape_hints(g);
  plan->use_counts.assign(g.values.size(), 0);
  for (const ir::Node& node : g.nodes) {
    for (ir::ValueId id : node.inputs) {
      if (id != ir::kNoValue) ++plan->use_counts[static_cast<size_t>(id)];
    }
    for (ir::ValueId id : node.implicit_inputs) ++plan->use_counts[static_cast<size_t>(id)];
  }
  for (ir::ValueId id : g.outputs) ++plan->use_counts[static_cast<size_t>(id)];

  for (int32_t ni : execution_order(g)) {
    const ir::Node& node = g.nodes[static_cast<size_t>(ni)];
    const ops::OpRegistration* reg = ops::find_op(node.domain, node.op_type, node.opset);
    if (!reg) unsupported(node);
    check_arity(node, *reg);
    Step step;
    step.node_index = ni;
    step.node = &node;
    step.op = reg;
    for (const ir::Attribute* a : node.graph_attributes()) {
      const ir::Graph& sub = *a->g;
      step.subgraphs.push_back(build_plan_tree(sub, preparer, next_index));
      std::vector<int32_t> slots;
      for (ir::ValueId c : sub.captures) {
        const std::string& name = sub.value(c).name;
        int32_t slot = -1;
        for (size_t k = 0; k < node.implicit_inputs.size(); ++k) {
          if (g.value(node.implicit_inputs[k]).name == name) slot = static_cast<int32_t>(k);
        }
        if (slot < 0) {
          throw Error(ErrorKind::InvalidModel,
                      "nested graph reads '" + name + "' which is not visible")
              .with_node(node.name, node.op_type);
        }
        slots.push_back(slot);
      }
      step.capture_slots.push_back(std::move(slots));
    }
    try {
      step.kernel = reg->create(ops::NodeInfo(g, node, *reg, preparer, &plan->shape_hints));
    } catch (Error& e) {
      e.with_node(node.name, node.op_type);
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorKind::InvalidModel, e.what()).with_node(node.name, node.op_type);
    }
    plan->steps.push_back(std::move(step));
  }
  if (plan->index == 0) ConcatGrouping(*plan).form();
  return plan;
}

}  // namespace

std::unique_ptr<GraphPlan> build_plan(const ir::Graph& g, ops::WeightPreparer* preparer) {
  int32_t next_index = 0;
  return build_plan_tree(g, preparer, next_index);
}

}  // namespace kiln::plan
