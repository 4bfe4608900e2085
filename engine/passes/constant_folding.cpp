// Constant folding: nodes whose inputs are all known at load run once, then and there, with
// their own kernels, and their outputs become initializers. Exporters leave much such work in
// graphs (shape arithmetic on constant shapes, weights built by ConstantOfShape or
// dequantized by Cast and Mul, reshaped or transposed weights), and a folded weight is also
// one that kernels can prepare (pack) at plan time.
#include <algorithm>
#include <string>
#include <vector>

#include "engine/passes/passes.h"
#include "kiln/error.h"
#include "ops/core/kernel.h"

namespace kiln::passes {
namespace {

// Ops whose results differ from run to run (their registration says so).
bool nondeterministic(const ir::Node& node) {
  const ops::OpRegistration* reg = ops::find_op(node.domain, node.op_type, node.opset);
  return reg && reg->random;
}

// A kernel run at load: outputs on the heap, no input overwritten, no nested graphs.
class LoadTimeHooks final : public ops::ExecutionHooks {
 public:
  explicit LoadTimeHooks(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  Tensor allocate(DataType dtype, const Shape& shape) override {
    const int64_t n = checked_numel(shape);
    const size_t bytes = storage_bytes(dtype, n);
    if (bytes > max_bytes_) throw Error(ErrorKind::Runtime, "too large to fold");
    if (dtype == DataType::String) return Tensor::zeros(dtype, shape);
    return Tensor(dtype, shape, Storage::heap_uninitialized(bytes));
  }
  bool can_overwrite(size_t) override { return false; }
  Value take_input(size_t) override {
    throw Error(ErrorKind::Runtime, "constant folding takes no input");
  }
  void count_copy(uint64_t, ops::CopyCause) override {}
  void count_in_place() override {}
  std::vector<Value> run_subgraph(int, std::vector<Value>, ops::CaptureMode) override {
    throw Error(ErrorKind::Runtime, "constant folding runs no nested graph");
  }

 private:
  uint64_t max_bytes_;
};

// The constant behind value `id` of `g` (an initializer here or in an enclosing graph), or
// null.
const Tensor* known(const ir::Graph& g, ir::ValueId id) {
  const ir::Graph* graph = &g;
  const ir::ValueInfo* v = &graph->value(id);
  while (v->origin == ir::ValueOrigin::Capture && graph->parent) {
    graph = graph->parent;
    const ir::ValueId outer = graph->find(v->name);
    if (outer == ir::kNoValue) return nullptr;
    v = &graph->value(outer);
  }
  if (v->origin != ir::ValueOrigin::Initializer || v->hollow || !v->constant.defined()) {
    return nullptr;
  }
  return &v->constant;
}

// Runs `node` on its constant inputs; the outputs, or an empty vector when it cannot be folded.
std::vector<Tensor> evaluate(const ir::Graph& g, const ir::Node& node, uint64_t max_bytes) {
  if (nondeterministic(node) || !node.graph_attributes().empty() || node.inputs.empty()) {
    return {};
  }
  std::vector<Value> values;
  values.reserve(node.inputs.size());
  for (ir::ValueId id : node.inputs) {
    if (id == ir::kNoValue) {
      values.emplace_back();
      continue;
    }
    const Tensor* t = known(g, id);
    if (!t) return {};
    values.emplace_back(*t);
  }
  const ops::OpRegistration* reg = ops::find_op(node.domain, node.op_type, node.opset);
  const auto n_in = static_cast<int>(node.inputs.size());
  const auto n_out = static_cast<int>(node.outputs.size());
  if (!reg || n_in < reg->min_inputs || n_in > reg->max_inputs || n_out < reg->min_outputs ||
      n_out > reg->max_outputs) {
    return {};  // planning reports it
  }
  std::vector<const Value*> inputs;
  for (const Value& v : values) inputs.push_back(v.defined() ? &v : nullptr);
  std::vector<Value> outputs(node.outputs.size());
  try {
    std::unique_ptr<ops::Kernel> kernel = reg->create(ops::NodeInfo(g, node, *reg));
    LoadTimeHooks hooks(max_bytes);
    ops::OpContext ctx(node, inputs, outputs, hooks);
    kernel->run(ctx);
  } catch (const std::exception&) {
    return {};  // left to run time, where it fails with its usual message
  }
  std::vector<Tensor> out;
  uint64_t bytes = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (node.outputs[i] == ir::kNoValue) {
      out.emplace_back();
      continue;
    }
    if (!outputs[i].is_tensor()) return {};
    // Kernels may return views (Reshape, Transpose): initializers are stored contiguous.
    Tensor t = outputs[i].tensor().contiguous();
    bytes += t.nbytes();
    if (bytes > max_bytes) return {};
    out.push_back(std::move(t));
  }
  return out;
}

// Drops initializers nothing reads any more (inputs of folded nodes).
void fold_graph(ir::Graph& g, const std::function<Tensor(Tensor)>& keep, uint64_t max_bytes,
                FoldStats& stats) {
  std::vector<bool> graph_output(g.values.size(), false);
  for (ir::ValueId id : g.outputs) graph_output[static_cast<size_t>(id)] = true;
  std::vector<bool> folded(g.nodes.size(), false);
  for (int32_t ni : ir::topological_order(g)) {
    const ir::Node& node = g.nodes[static_cast<size_t>(ni)];
    bool feeds_output = false;
    for (ir::ValueId id : node.outputs) {
      feeds_output = feeds_output || (id != ir::kNoValue && graph_output[static_cast<size_t>(id)]);
    }
    if (feeds_output) continue;
    std::vector<Tensor> out = evaluate(g, node, max_bytes);
    if (out.empty()) continue;
    for (size_t i = 0; i < out.size(); ++i) {
      const ir::ValueId id = node.outputs[i];
      if (id == ir::kNoValue) continue;
      Tensor t = keep ? keep(std::move(out[i])) : std::move(out[i]);
      t.storage()->set_read_only();
      ir::ValueInfo& v = g.value(id);
      v.origin = ir::ValueOrigin::Initializer;
      v.producer = -1;
      v.type = ir::tensor_type(t.dtype(), t.shape());
      stats.bytes += t.nbytes();
      v.constant = std::move(t);
      g.initializers.push_back(id);
    }
    folded[static_cast<size_t>(ni)] = true;
    ++stats.nodes;
  }
  // Remove the folded nodes and renumber producers.
  if (std::find(folded.begin(), folded.end(), true) != folded.end()) {
    remove_nodes(g, folded);
    drop_unused_initializers(g);
  }
  // Nested graphs after their parent, so they see the parent's folded values.
  for (ir::Node& node : g.nodes) {
    for (ir::Attribute& a : node.attributes) {
      if (a.g) fold_graph(*a.g, keep, max_bytes, stats);
      for (auto& sub : a.graphs) fold_graph(*sub, keep, max_bytes, stats);
    }
  }
}

}  // namespace

void remove_nodes(ir::Graph& g, const std::vector<bool>& removed) {
  std::vector<ir::Node> kept;
  std::vector<int32_t> new_index(g.nodes.size(), -1);
  for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
    if (removed[ni]) continue;
    new_index[ni] = static_cast<int32_t>(kept.size());
    kept.push_back(std::move(g.nodes[ni]));
  }
  g.nodes = std::move(kept);
  for (ir::ValueInfo& v : g.values) {
    if (v.origin == ir::ValueOrigin::NodeOutput && v.producer >= 0) {
      v.producer = new_index[static_cast<size_t>(v.producer)];
    }
  }
}

void drop_unused_initializers(ir::Graph& g) {
  std::vector<bool> used(g.values.size(), false);
  for (const ir::Node& node : g.nodes) {
    for (ir::ValueId id : node.inputs) {
      if (id != ir::kNoValue) used[static_cast<size_t>(id)] = true;
    }
    for (ir::ValueId id : node.implicit_inputs) used[static_cast<size_t>(id)] = true;
  }
  for (ir::ValueId id : g.outputs) used[static_cast<size_t>(id)] = true;
  std::vector<ir::ValueId> kept;
  for (ir::ValueId id : g.initializers) {
    if (used[static_cast<size_t>(id)]) {
      kept.push_back(id);
    } else {
      g.value(id).constant = Tensor();  // its storage goes when nothing else holds it
    }
  }
  g.initializers = std::move(kept);
}

FoldStats fold_constants(ir::Graph& graph, const std::function<Tensor(Tensor)>& keep,
                         uint64_t max_bytes) {
  FoldStats stats;
  fold_graph(graph, keep, max_bytes, stats);
  // Values computed from fixed dimensions of symbolic shapes, then what reads them.
  const FoldStats shapes = fold_static_shapes(graph, keep);
  if (shapes.nodes > 0) {
    stats.nodes += shapes.nodes;
    stats.bytes += shapes.bytes;
    fold_graph(graph, keep, max_bytes, stats);
  }
  return stats;
}

}  // namespace kiln::passes
