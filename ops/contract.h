// The op contract: what an op declares beside its kernel so that the planner knows, before
// any kernel runs, what the kernel will produce and where it will put it. Each op states it
// in its registration (ops/kernel.h), in the same file as its kernel:
//
//   .shape  — the element types and shapes of its outputs from those of its inputs (and the
//             values of small integer inputs: Shape -> Gather -> Concat -> Reshape chains);
//             static shape inference (engine/plan/shape_inference.h) runs these;
//   .place  — which outputs are views of an input (Reshape, Transpose, Slice, ...) and which
//             may be written over an input; without it, output 0 is written over one of the
//             `in_place` inputs when the executor allows, and every other output is fresh;
//             buffer prediction (engine/plan/buffer_prediction.h) runs these;
//   .workspace — the scratch bytes one run of the kernel takes from OpContext::workspace for
//             given input shapes and thread count, planned into the arena with a one-step
//             lifetime (ops/workspace.h lays out workspaces of several parts).
//
// The planner reads only this header and ops/kernel.h, never an op's own code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/tensor.h"

namespace kiln::ops {

// What is known of a value before the run.
struct ValueFacts {
  bool known = false;
  DataType dtype = DataType::Undefined;
  Shape shape;
  // The values of an integer or bool tensor of at most kMaxKnownData elements, when they
  // follow from constants and shapes (bool as 0/1).
  bool has_data = false;
  std::vector<int64_t> data;
};

constexpr int64_t kMaxKnownData = 64;

// The facts of a tensor whose data is known (data kept for small integer / bool tensors).
ValueFacts facts_of(const Tensor& t);

// Thrown by a shape rule when an output cannot be known before the run (the planner then
// falls back to recording a run); `why` says what was missing.
struct UnknownFacts {
  std::string why;
};
[[noreturn]] void unknown(std::string why);

// numel of `s`, unknown when a dimension is negative or the product overflows.
int64_t numel_or_unknown(const Shape& s);

// Shape inference of nested graphs, provided by the planner to the rules of ops that own
// graphs (If, Loop, Scan): the facts of `graph`'s outputs given those of its inputs, its captured
// values' taken from `enclosing_values` (the facts of the enclosing graph, by value id).
class NestedInference {
 public:
  virtual ~NestedInference() = default;
  virtual std::vector<ValueFacts> outputs(const ir::Graph& graph,
                                          const std::vector<ValueFacts>& inputs,
                                          const ir::Graph& enclosing,
                                          const std::vector<ValueFacts>& enclosing_values) = 0;
};

// A node as a shape rule sees it: the facts of its inputs, its attributes, and the facts it
// sets for its outputs.
class ShapeContext {
 public:
  // `values` holds the facts of every value of `graph` (by ir::ValueId); set() writes the
  // node's outputs there.
  ShapeContext(const ir::Graph& graph, const ir::Node& node, std::vector<ValueFacts>& values)
      : graph_(graph), node_(node), values_(values), out_(&values) {}
  // Read-only (workspace rules): set() is a logic error.
  ShapeContext(const ir::Graph& graph, const ir::Node& node, const std::vector<ValueFacts>& values)
      : graph_(graph), node_(node), values_(values), out_(nullptr) {}

  const ir::Node& node() const { return node_; }
  int64_t opset() const { return node_.opset; }
  size_t num_inputs() const { return node_.inputs.size(); }
  size_t num_outputs() const { return node_.outputs.size(); }
  bool has_input(size_t i) const {
    return i < node_.inputs.size() && node_.inputs[i] != ir::kNoValue;
  }
  bool has_output(size_t i) const {
    return i < node_.outputs.size() && node_.outputs[i] != ir::kNoValue;
  }
  // Input i's facts; unknown() when it is missing or unknown.
  const ValueFacts& in(size_t i) const;
  const Shape& shape(size_t i) const { return in(i).shape; }
  DataType dtype(size_t i) const { return in(i).dtype; }
  // Input i's values; unknown() unless they are known before the run.
  const std::vector<int64_t>& data(size_t i) const;
  // Input i's tensor when it is an initializer of the graph, else null: the values of float
  // inputs such as Resize's scales, which the facts do not keep.
  const Tensor* constant_input(size_t i) const;

  // Sets output i (ignored when the node does not produce it); `data` is kept when it is a
  // small integer tensor's full contents.
  void set(size_t i, DataType dtype, Shape shape, const std::vector<int64_t>* data = nullptr);
  // Output `out` = input `in` (type, shape and known values).
  void same(size_t out, size_t in);

  bool has_attr(const char* name) const { return node_.attr(name) != nullptr; }
  int64_t attr_int(const char* name, int64_t fallback) const;
  float attr_float(const char* name, float fallback) const;
  std::string attr_string(const char* name, const char* fallback) const;
  std::vector<int64_t> attr_ints(const char* name) const;
  // Integers from attribute `name` below opset `input_since`, else from input `input`
  // (empty when the input is omitted).
  std::vector<int64_t> ints_from(const char* name, int64_t input_since, size_t input) const;

  // The facts of the outputs of graph attribute `name` run on `inputs`; unknown() when the
  // graph is absent, no nested inference is available or an output is unknown.
  std::vector<ValueFacts> subgraph_outputs(const char* name,
                                           const std::vector<ValueFacts>& inputs) const;
  void set_nested(NestedInference* nested) { nested_ = nested; }

  // The threads the kernel may run on (the session's Environment::threads()): workspace rules
  // of kernels that keep per-thread scratch size it for this many (OpContext::threads()).
  int threads() const { return threads_; }
  void set_threads(int threads) { threads_ = threads < 1 ? 1 : threads; }

 private:
  const ir::Graph& graph_;
  const ir::Node& node_;
  const std::vector<ValueFacts>& values_;
  std::vector<ValueFacts>* out_;
  NestedInference* nested_ = nullptr;
  int threads_ = 1;
};

// Shape rules many ops share.
// Output 0 has input 0's type and shape (values not kept).
void same_shape(ShapeContext& c);
// Output 0 is input 0 (type, shape and values): Identity and its kin.
void pass_through(ShapeContext& c);
// Output 0 is the broadcast of every present input, of type `out_type` (Undefined: input
// `type_from`'s). When every input's values are known, `f` (when given) computes the
// output's from one element of each input.
void broadcast_shape(ShapeContext& c, DataType out_type, size_t type_from,
                     int64_t (*f)(const std::vector<int64_t>&));

// numpy matmul's output shape for operands of shapes `a` and `b` (a 1-D operand gets a unit
// axis, removed again from the result; batch axes broadcast); unknown() for a scalar operand or
// inner dimensions that differ.
Shape matmul_shape_of(Shape a, Shape b);

// Integer arithmetic on known values; an overflow leaves the value unknown.
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_sub(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);
int64_t checked_div(int64_t a, int64_t b);

// The flat index into a tensor of shape `in` read for flat index `flat` of the broadcast
// shape `out`.
int64_t broadcast_index(const Shape& in, const Shape& out, int64_t flat);

// How captured values enter a nested graph's run.
enum class CaptureMode {
  Borrow,         // read-only handles (Loop and Scan: every iteration reads them)
  MoveIfLastUse,  // owned values this node is the last reader of are moved in (If)
};

// Where a node's outputs live, as a buffer-placement rule decides it. Implemented by the
// planner; the rule only reads facts and calls view/allocate once per produced output.
//
// Ops that run nested graphs (If, Loop, Scan) state their runs instead, as their kernel makes
// them, on handles: each handle is one reference to a value the kernel holds (an input taken
// or shared, a value it makes outside the arena's plan, a nested graph's output). A handle
// given to run_subgraph or set_output passes on; one dropped lets go at once; those the rule
// still holds when it returns are let go at the end of the step, as a kernel's locals are.
class Placement {
 public:
  using Handle = int32_t;

  virtual ~Placement() = default;
  virtual const ir::Node& node() const = 0;
  virtual const ValueFacts& input(size_t i) const = 0;
  virtual const ValueFacts& output(size_t o) const = 0;
  // Input i's element strides (contiguous ones when it is dense).
  virtual Shape strides(size_t i) const = 0;
  virtual bool contiguous(size_t i) const = 0;
  // Whether the kernel may write over input i now (OpContext::can_overwrite would say yes).
  virtual bool writable(size_t i) const = 0;
  // The bytes input i's buffer holds from where input i starts (0 when it is not at the
  // start of a buffer of this run).
  virtual uint64_t room(size_t i) const = 0;
  // Output o views input i's storage with `strides` (empty: contiguous); `at_start` says
  // whether it starts where input i does.
  virtual void view(size_t o, size_t i, Shape strides, bool at_start = true) = 0;
  // Output o gets a fresh buffer.
  virtual void allocate(size_t o) = 0;
  // Output o written over the first of `inputs` (a bit mask) that is writable, contiguous
  // and of its type and shape (OpContext::output_reusing), else a fresh buffer.
  virtual void reuse_or_allocate(size_t o, uint32_t inputs) = 0;

  // Input i as OpContext::take_input_value gives it: moved out of the executor when
  // writable(i), else shared.
  virtual Handle take_input(size_t i) = 0;
  // Input i shared (a kernel's copy of the tensor).
  virtual Handle share_input(size_t i) = 0;
  // A view of `of`'s storage as `facts` with `strides` (empty: contiguous).
  virtual Handle view_of(Handle of, ValueFacts facts, Shape strides, bool at_start) = 0;
  // A value the kernel makes outside the arena's plan (a scalar, OpContext::allocate).
  virtual Handle make_unplanned(ValueFacts facts) = 0;
  virtual const ValueFacts& facts(Handle h) const = 0;
  virtual Shape strides_of(Handle h) const = 0;
  // One run of graph attribute `name` on `inputs` (moved in), captures entering per `mode`,
  // as OpContext::run_subgraph makes it: its outputs. unknown() when the run's values
  // cannot be inferred.
  virtual std::vector<Handle> run_subgraph(const char* name, std::vector<Handle> inputs,
                                           CaptureMode mode) = 0;
  virtual void drop(Handle h) = 0;
  virtual void set_output(size_t o, Handle h) = 0;
};

// Placement rules many ops share.
// Output 0 views input 0 as it is (same strides); other outputs are fresh.
void place_alias(Placement& p);
// Output 0 views input 0 made contiguous (Reshape, Flatten: the kernel reshapes a dense
// input, and the executor makes a strided one dense first).
void place_reshaped(Placement& p);

}  // namespace kiln::ops
