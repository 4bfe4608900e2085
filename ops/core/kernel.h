// The contract between the executor and a kernel.
//
// A kernel is created once per node when a session is planned (define), from the node's
// attributes and any constant inputs (NodeInfo), and then run many times on data
// (OpContext). Registration is one KILN_REGISTER_OP line at the bottom of each op file,
// which also states the op's contract with the planner (ops/core/contract.h): its output shapes,
// views and scratch:
//
//   KILN_REGISTER_OP({.op = "Relu", .since = 6, .in_place = inputs(0), .shape = same_shape,
//                     .create = make<Relu>});
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/error.h"
#include "kiln/session.h"
#include "kiln/tensor.h"
#include "kiln/value.h"
#include "ops/core/contract.h"

namespace kiln::ops {

class Kernel;
class NodeInfo;
class OpContext;

constexpr int kLatestOpset = INT_MAX;

// Inputs a kernel may overwrite, as a bit mask: inputs(0) or inputs(0, 1).
template <typename... I>
constexpr uint32_t inputs(I... i) {
  return ((1u << i) | ... | 0u);
}

struct OpRegistration {
  const char* domain = "";  // "" is ai.onnx
  const char* op = nullptr;
  int since = 1;             // first opset version this kernel implements
  int until = kLatestOpset;  // last one
  int min_inputs = 0, max_inputs = INT_MAX;
  int min_outputs = 0, max_outputs = INT_MAX;
  uint32_t in_place = 0;        // inputs the kernel may overwrite when the executor allows
  bool strided_inputs = false;  // accepts non-contiguous tensors (else made contiguous)
  bool random = false;          // outputs differ from run to run: never folded at load
  const char* types = "";       // element types, for docs/ops.md ("float, double, int64")
  // The contract (ops/core/contract.h). Without `shape` the op's outputs are known only when it
  // runs; without `place` output 0 may be written over an `in_place` input and the others
  // are fresh; without `workspace` the kernel takes no scratch from OpContext::workspace.
  void (*shape)(ShapeContext&) = nullptr;
  void (*place)(Placement&) = nullptr;
  uint64_t (*workspace)(const ShapeContext&) = nullptr;
  std::unique_ptr<Kernel> (*create)(const NodeInfo&) = nullptr;
};

bool register_op(const OpRegistration& reg);
// The registration covering `opset` for (domain, op), or null.
const OpRegistration* find_op(const std::string& domain, const std::string& op, int64_t opset);
// Every registration (for docs/ops.md and error messages).
const std::vector<OpRegistration>& all_ops();

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
#define KILN_REGISTER_OP(...)                                                     \
  [[maybe_unused]] static const bool KILN_CONCAT(kiln_registered_op_, __LINE__) = \
      ::kiln::ops::register_op(::kiln::ops::OpRegistration __VA_ARGS__)

template <typename K>
std::unique_ptr<Kernel> make(const NodeInfo& info) {
  return std::make_unique<K>(info);
}

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run(OpContext& ctx) = 0;
};

// Makes (or finds) prepared forms of constant inputs; implemented by the runtime, which
// shares them between the sessions of an Environment.
class WeightPreparer {
 public:
  virtual ~WeightPreparer() = default;
  // `weight` is the reading graph's value (an initializer, or a capture of one), `constant`
  // its data.
  virtual std::shared_ptr<const Tensor> prepare(
      const ir::Graph& graph, ir::ValueId weight, const Tensor& constant,
      const std::string& packing, const std::function<Tensor(const Tensor&)>& make) = 0;
  // The precision GEMM weights are prepared in (SessionOptions::gemm_weights).
  virtual WeightPrecision gemm_weights() const { return WeightPrecision::Float32; }
};

// A node as its kernel sees it at plan time.
class NodeInfo {
 public:
  // `hints` (may be null): per ir::ValueId of `graph`, its shape as inferred at load from the
  // declared inputs (see input_shape_hint).
  NodeInfo(const ir::Graph& graph, const ir::Node& node, const OpRegistration& reg,
           WeightPreparer* preparer = nullptr, const std::vector<ValueFacts>* hints = nullptr)
      : graph_(graph), node_(node), reg_(reg), preparer_(preparer), hints_(hints) {}

  const ir::Node& node() const { return node_; }
  const ir::Graph& graph() const { return graph_; }
  const std::string& name() const { return node_.name; }
  const std::string& op_type() const { return node_.op_type; }
  int64_t opset() const { return node_.opset; }
  size_t num_inputs() const { return node_.inputs.size(); }
  size_t num_outputs() const { return node_.outputs.size(); }
  bool has_input(size_t i) const;
  bool has_output(size_t i) const;
  // The value of input i if it is known now, else null: an initializer of this graph, or
  // one of an enclosing graph that a nested graph captures (Optimum's merged decoders keep
  // every weight in the outer graph).
  const Tensor* constant_input(size_t i) const;
  // Whether input i is an initializer of this node's own graph (not a capture): a weight the
  // shape rules see as constant (ShapeContext::constant), so workspace and buffer plans made
  // at load may rely on it.
  bool is_initializer(size_t i) const;
  // A prepared form of constant input i (see constant_input): `make` turns the weight into
  // the form the kernel runs on (packed, widened, reordered), and `packing` names that form
  // (the same name must always mean the same `make`). Sessions of one Environment share one
  // copy; the kernel holds it for its lifetime. When every reader of a mapped weight uses a
  // prepared form, the original's pages are given back. Null when input i is not a constant.
  std::shared_ptr<const Tensor> prepared_input(
      size_t i, const std::string& packing, const std::function<Tensor(const Tensor&)>& make) const;
  // The precision MatMul/Gemm should pack their constant B in (SessionOptions::gemm_weights).
  WeightPrecision gemm_weights() const {
    return preparer_ ? preparer_->gemm_weights() : WeightPrecision::Float32;
  }
  // The shape input i is expected to have, inferred at load from the graph's declared inputs
  // (a symbolic leading dimension taken as 1); null when unknown. Only a hint for choosing
  // a prepared form: the kernel must run whatever shape it is given.
  const Shape* input_shape_hint(size_t i) const;
  // Declared type of input/output i (kind None when undeclared).
  const ir::TypeInfo& input_type(size_t i) const;
  const ir::TypeInfo& output_type(size_t i) const;

  bool has_attr(const std::string& name) const { return node_.attr(name) != nullptr; }
  int64_t attr_int(const std::string& name, int64_t fallback) const;
  int64_t attr_int(const std::string& name) const;  // required
  float attr_float(const std::string& name, float fallback) const;
  float attr_float(const std::string& name) const;
  std::string attr_string(const std::string& name, const std::string& fallback) const;
  std::string attr_string(const std::string& name) const;
  std::vector<int64_t> attr_ints(const std::string& name, std::vector<int64_t> fallback = {}) const;
  std::vector<float> attr_floats(const std::string& name, std::vector<float> fallback = {}) const;
  std::vector<std::string> attr_strings(const std::string& name,
                                        std::vector<std::string> fallback = {}) const;
  const Tensor* attr_tensor(const std::string& name) const;  // null if absent
  const ir::Attribute* attr(const std::string& name) const { return node_.attr(name); }
  // Index of the graph attribute `name`, for OpContext::run_subgraph.
  int subgraph_index(const std::string& name) const;
  const ir::Graph& subgraph(int index) const;

  // Throws Error(kind) naming this node.
  [[noreturn]] void fail(const std::string& message,
                         ErrorKind kind = ErrorKind::InvalidModel) const;

 private:
  const ir::Attribute& require(const std::string& name, ir::AttrKind kind) const;
  const ir::Graph& graph_;
  const ir::Node& node_;
  const OpRegistration& reg_;
  WeightPreparer* preparer_;
  const std::vector<ValueFacts>* hints_;
};

enum class CopyCause { Contiguous, Concat, Capture, Kernel };

// What the executor provides to OpContext; implemented by the runtime.
class ExecutionHooks {
 public:
  virtual ~ExecutionHooks() = default;
  // A buffer in the run's planned sequence (outputs, and workspace the op's contract
  // declares).
  virtual Tensor allocate(DataType dtype, const Shape& shape) = 0;
  // Output `o` of the step: a planned buffer, or the window the plan keeps for it in a
  // Concat's output (plan::OutputSlot) when it has that type and shape.
  virtual Tensor allocate_output(size_t /*o*/, DataType dtype, const Shape& shape) {
    return allocate(dtype, shape);
  }
  // Unplanned scratch: served by the pool beside the arena's plan.
  virtual Tensor allocate_scratch(DataType dtype, const Shape& shape) {
    return allocate(dtype, shape);
  }
  virtual bool can_overwrite(size_t input) = 0;
  // Moves input i out of the executor (only after can_overwrite(i) said yes).
  virtual Value take_input(size_t input) = 0;
  virtual void count_copy(uint64_t bytes, CopyCause cause) = 0;
  virtual void count_in_place() = 0;
  virtual std::vector<Value> run_subgraph(int index, std::vector<Value> inputs,
                                          CaptureMode mode) = 0;
  // The same run, its outputs left in a vector the hooks keep for that nested graph (it never
  // runs inside itself), valid until its next run: the caller moves them out and clears it.
  virtual std::vector<Value>& run_subgraph_kept(int index, std::vector<Value> inputs,
                                                CaptureMode mode) {
    kept_ = run_subgraph(index, std::move(inputs), mode);
    return kept_;
  }

 private:
  std::vector<Value> kept_;
};

// A node as its kernel sees it when running.
class OpContext {
 public:
  OpContext(const ir::Node& node, const std::vector<const Value*>& inputs,
            std::vector<Value>& outputs, ExecutionHooks& hooks)
      : node_(node), inputs_(inputs), outputs_(outputs), hooks_(hooks) {}

  const ir::Node& node() const { return node_; }
  int64_t opset() const { return node_.opset; }

  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const {
    return i < inputs_.size() && inputs_[i] && inputs_[i]->defined();
  }
  const Value& input_value(size_t i) const;
  const Tensor& input(size_t i) const;  // throws unless input i is a present tensor

  size_t num_outputs() const { return outputs_.size(); }
  bool has_output(size_t i) const;
  // Scratch: a fresh contiguous tensor from the session's pool (contents undefined), outside
  // the arena's plan. Scratch a kernel takes on every run of common shapes should be its
  // workspace instead.
  Tensor allocate(DataType dtype, const Shape& shape) {
    return hooks_.allocate_scratch(dtype, shape);
  }
  // The workspace the op's contract declares (OpRegistration::workspace) for this run's
  // shapes, as `elements` of `dtype` (exactly the declared bytes), requested once, after
  // every output is allocated. It is planned into the arena with the step's lifetime; hold
  // it no longer than run().
  Tensor workspace(DataType dtype, int64_t elements);
  // The threads this run's kernel may use (its arena's): what a workspace rule's
  // ShapeContext::threads() says for the session.
  int threads() const;
  // Allocates output i and returns it.
  Tensor& output(size_t i, DataType dtype, const Shape& shape);
  // Output i written over input `in` when the executor allows it (the input is owned, this
  // is its last use, its storage is writable and referenced by it alone, and it is
  // contiguous with the same dtype and shape); otherwise a fresh allocation. Kernels must
  // read each element before writing the same element.
  Tensor& output_reusing(size_t i, size_t in, DataType dtype, const Shape& shape);
  void set_output(size_t i, Value v);
  // May the kernel write into input i's storage? (see output_reusing)
  bool can_overwrite(size_t i) { return hooks_.can_overwrite(i); }
  // Input i as a value the kernel keeps: moved out of the executor when it may be
  // overwritten (so whoever receives it next may write into it), else a shared handle.
  Value take_input_value(size_t i);
  void count_in_place() { hooks_.count_in_place(); }

  void count_copy(uint64_t bytes, CopyCause cause = CopyCause::Kernel) {
    hooks_.count_copy(bytes, cause);
  }
  std::vector<Value> run_subgraph(int index, std::vector<Value> inputs, CaptureMode mode) {
    return hooks_.run_subgraph(index, std::move(inputs), mode);
  }
  // run_subgraph without a vector per run (ExecutionHooks::run_subgraph_kept).
  std::vector<Value>& run_subgraph_kept(int index, std::vector<Value> inputs, CaptureMode mode) {
    return hooks_.run_subgraph_kept(index, std::move(inputs), mode);
  }

  [[noreturn]] void fail(const std::string& message, ErrorKind kind = ErrorKind::Runtime) const;

 private:
  const ir::Node& node_;
  const std::vector<const Value*>& inputs_;
  std::vector<Value>& outputs_;
  ExecutionHooks& hooks_;
};

}  // namespace kiln::ops
