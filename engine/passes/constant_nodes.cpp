#include <string>

#include "engine/passes/passes.h"
#include "kiln/error.h"

namespace kiln::passes {

int fold_constant_nodes(ir::Graph& g) {
  int folded = 0;
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  std::vector<int32_t> new_index(g.nodes.size(), -1);
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    ir::Node& node = g.nodes[ni];
    for (ir::Attribute& a : node.attributes) {
      if (a.g) folded += fold_constant_nodes(*a.g);
      for (auto& sub : a.graphs) folded += fold_constant_nodes(*sub);
    }
    const bool is_constant = node.op_type == "Constant" && node.domain.empty() &&
                             node.inputs.empty() && node.outputs.size() == 1 &&
                             node.outputs[0] != ir::kNoValue;
    if (is_constant) {
      if (auto value = ir::constant_node_value(node)) {
        ir::ValueInfo& v = g.value(node.outputs[0]);
        v.origin = ir::ValueOrigin::Initializer;
        v.producer = -1;
        value->storage()->set_read_only();
        v.constant = *value;
        v.type.kind = Value::Kind::Tensor;
        v.type.elem = value->dtype();
        g.initializers.push_back(node.outputs[0]);
        ++folded;
        continue;
      }
    }
    new_index[ni] = static_cast<int32_t>(kept.size());
    kept.push_back(std::move(node));
  }
  const bool removed_any = kept.size() != g.nodes.size();
  g.nodes = std::move(kept);
  if (!removed_any) return folded;
  for (ir::ValueInfo& v : g.values) {
    if (v.origin == ir::ValueOrigin::NodeOutput && v.producer >= 0) {
      v.producer = new_index[static_cast<size_t>(v.producer)];
    }
  }
  return folded;
}

}  // namespace kiln::passes
