// Shape-aware constant folding: the dimensions a graph fixes (a head size, a hidden size)
// are known at load even when others (batch, sequence) are open, and exporters often compute
// constants from them at run time (Shape -> Slice -> Cast -> Sqrt for an attention scale).
// What is known of each value comes from the op contracts' shape rules run over partial
// facts (ops/core/inference.h, with the model's declared types); an integer value of rank 0
// or 1 all of whose elements are known becomes an initializer, and the ordinary folding then
// evaluates what reads it. A dimension is known only when the graph fixes it: an open one is
// never guessed.
#include <string>
#include <vector>

#include "engine/passes/passes.h"
#include "ops/core/inference.h"

namespace kiln::passes {
namespace {

bool int_type(DataType t) {
  return t == DataType::Int64 || t == DataType::Int32;
}

Tensor to_tensor(const ops::ValueFacts& v) {
  if (v.dtype == DataType::Int64) {
    return v.shape.empty() ? Tensor::scalar<int64_t>(v.data.at(0))
                           : Tensor::from_vector<int64_t>({v.shape[0]}, v.data);
  }
  std::vector<int32_t> d(v.data.begin(), v.data.end());
  return v.shape.empty() ? Tensor::scalar<int32_t>(d.at(0))
                         : Tensor::from_vector<int32_t>({v.shape[0]}, d);
}

// One graph's folding (nested graphs are left to the caller).
FoldStats fold_graph_shapes(ir::Graph& g, const std::function<Tensor(Tensor)>& keep) {
  FoldStats stats;
  const ops::GraphFacts facts = ops::infer_declared(g);
  std::vector<bool> graph_output(g.values.size(), false);
  for (ir::ValueId id : g.outputs) graph_output[static_cast<size_t>(id)] = true;
  std::vector<bool> folded(g.nodes.size(), false);
  for (int32_t ni : ir::topological_order(g)) {
    const ir::Node& node = g.nodes[static_cast<size_t>(ni)];
    if (!node.graph_attributes().empty()) continue;
    // What was found of an undeclared output is written into its type (later passes read
    // ranks and fixed dimensions from there).
    for (ir::ValueId id : node.outputs) {
      if (id == ir::kNoValue || graph_output[static_cast<size_t>(id)]) continue;
      ir::ValueInfo& v = g.value(id);
      const ops::ValueFacts& f = facts.values[static_cast<size_t>(id)];
      if (v.type.kind != Value::Kind::None || !f.ranked || f.dtype == DataType::Undefined) {
        continue;
      }
      v.type.kind = Value::Kind::Tensor;
      v.type.elem = f.dtype;
      std::vector<ir::Dim> dims;
      for (size_t k = 0; k < f.shape.size(); ++k)
        dims.push_back(ir::Dim{f.shape[k], f.dim_name(k)});
      v.type.shape = std::move(dims);
    }
    if (node.outputs.size() != 1 || node.outputs[0] == ir::kNoValue ||
        graph_output[static_cast<size_t>(node.outputs[0])]) {
      continue;
    }
    const ops::ValueFacts& f = facts.values[static_cast<size_t>(node.outputs[0])];
    if (!f.has_data || !int_type(f.dtype) || f.shape.size() > 1) continue;
    Tensor t = to_tensor(f);
    if (keep) t = keep(std::move(t));
    t.storage()->set_read_only();
    ir::ValueInfo& v = g.value(node.outputs[0]);
    v.origin = ir::ValueOrigin::Initializer;
    v.producer = -1;
    v.type = ir::tensor_type(t.dtype(), t.shape());
    stats.bytes += t.nbytes();
    v.constant = std::move(t);
    g.initializers.push_back(node.outputs[0]);
    folded[static_cast<size_t>(ni)] = true;
    ++stats.nodes;
  }
  if (stats.nodes == 0) return stats;
  // Nodes left without readers by the folding (the Shape a folded Slice read): removed,
  // back to front.
  std::vector<int> readers(g.values.size(), 0);
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    if (folded[ni]) continue;
    for (ir::ValueId id : g.nodes[ni].inputs) {
      if (id != ir::kNoValue) ++readers[static_cast<size_t>(id)];
    }
    for (ir::ValueId id : g.nodes[ni].implicit_inputs) ++readers[static_cast<size_t>(id)];
  }
  std::vector<int32_t> work;
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    if (!folded[ni]) continue;
    for (ir::ValueId id : g.nodes[ni].inputs) {
      if (id != ir::kNoValue && g.value(id).origin == ir::ValueOrigin::NodeOutput) {
        work.push_back(g.value(id).producer);
      }
    }
  }
  while (!work.empty()) {
    const int32_t ni = work.back();
    work.pop_back();
    if (ni < 0 || folded[static_cast<size_t>(ni)]) continue;
    const ir::Node& node = g.nodes[static_cast<size_t>(ni)];
    if (!node.graph_attributes().empty()) continue;
    bool dead = true;
    for (ir::ValueId id : node.outputs) {
      dead = dead && (id == ir::kNoValue || (readers[static_cast<size_t>(id)] == 0 &&
                                             !graph_output[static_cast<size_t>(id)]));
    }
    if (!dead) continue;
    folded[static_cast<size_t>(ni)] = true;
    for (ir::ValueId id : node.inputs) {
      if (id == ir::kNoValue) continue;
      if (--readers[static_cast<size_t>(id)] == 0 &&
          g.value(id).origin == ir::ValueOrigin::NodeOutput) {
        work.push_back(g.value(id).producer);
      }
    }
  }
  remove_nodes(g, folded);
  drop_unused_initializers(g);
  return stats;
}

}  // namespace

FoldStats fold_static_shapes(ir::Graph& g, const std::function<Tensor(Tensor)>& keep) {
  // This graph first: what it finds (types of its values, new initializers) is what its
  // nested graphs then see of the values they capture.
  FoldStats stats = fold_graph_shapes(g, keep);
  for (ir::Node& node : g.nodes) {
    for (ir::Attribute& a : node.attributes) {
      std::vector<ir::Graph*> subs;
      if (a.g) subs.push_back(a.g.get());
      for (auto& sub : a.graphs) subs.push_back(sub.get());
      for (ir::Graph* sub : subs) {
        const FoldStats inner = fold_static_shapes(*sub, keep);
        stats.nodes += inner.nodes;
        stats.bytes += inner.bytes;
      }
    }
  }
  return stats;
}

}  // namespace kiln::passes
