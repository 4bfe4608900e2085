// The op contract: what an op declares beside its kernel so that the planner knows, before
// any kernel runs, what the kernel will produce and where it will put it. Each op states it
// in its registration (ops/core/kernel.h), in the same file as its kernel:
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
//             lifetime (ops/core/workspace.h lays out workspaces of several parts).
//
// The planner reads only this header and ops/core/kernel.h, never an op's own code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/ir/graph.h"
#include "kiln/tensor.h"

namespace kiln::ops {

// A dimension not known before the run.
constexpr int64_t kUnknownDim = -1;

// What is known of a value before the run. The planner needs all of it (`known`: the element
// type and every dimension); the passes also use less: the element type alone, the rank with
// some dimensions unknown, some elements of a small integer tensor (a Shape of a value whose
// hidden size is fixed but whose batch is not).
struct ValueFacts {
  // The element type and every dimension are known (then `ranked` too).
  bool known = false;
  DataType dtype = DataType::Undefined;  // Undefined: not known
  // The rank is known: `shape` has one entry per axis, kUnknownDim where not known.
  bool ranked = false;
  Shape shape;
  // Empty, or one entry per axis: the name the model gives a dimension that is not fixed
  // ("batch", "sequence"; empty where it gives none). Two unknown dimensions of one name are
  // equal.
  std::vector<std::string> dim_names;
  // Every element of an integer or bool tensor of at most kMaxKnownData elements is known,
  // when they follow from constants and shapes (bool as 0/1).
  bool has_data = false;
  std::vector<int64_t> data;
  // Some elements known (not has_data): one entry per element of a tensor of rank 0 or 1 of
  // an integer type, nullopt where not known.
  std::vector<std::optional<int64_t>> elems;

  // The rank, -1 when not known.
  int64_t rank() const { return ranked ? static_cast<int64_t>(shape.size()) : -1; }
  // Dimension k (kUnknownDim when it or the rank is not known; k < 0 counts from the end).
  int64_t dim(int64_t k) const;
  // The name of dimension k, empty when none.
  const std::string& dim_name(size_t k) const;
  // Element k when known (from data or elems).
  std::optional<int64_t> elem(size_t k) const;
  // How many elements are tracked (data or elems), 0 when none.
  size_t num_elems() const { return has_data ? data.size() : elems.size(); }
};

constexpr int64_t kMaxKnownData = 64;

// The facts of a tensor whose data is known (data kept for small integer / bool tensors).
ValueFacts facts_of(const Tensor& t);
// What a declared type says (the element type; the rank, fixed dimensions and names).
ValueFacts facts_of(const ir::TypeInfo& type);
// Facts known in full: this type and shape, and `data` when given (a small integer tensor's).
ValueFacts known_facts(DataType dtype, Shape shape, std::vector<int64_t> data = {},
                       bool has_data = false);
// Facts of this type and rank (`shape` may hold kUnknownDim), made `known` when every part is.
ValueFacts ranked_facts(DataType dtype, Shape shape, std::vector<std::string> dim_names = {});
// Completes `v` after a rule filled it in part: known when the type and every dimension are;
// elems all known become data; elems that cannot be (too many, not rank 0/1) are dropped.
void settle(ValueFacts& v);
// `v` with what `more` (a declared type's facts) adds where `v` knows less: the type, the
// rank, dimensions and names. For the passes, which trust a model's declared types; the
// planner never merges them (a rule decides its facts).
void merge_declared(ValueFacts& v, const ValueFacts& more);

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
  // Input i's facts; unknown() when it is missing or not known in full. The rules that
  // are written over partial facts read facts() instead.
  const ValueFacts& in(size_t i) const;
  // Input i's facts, whatever is known of it (empty facts when it is missing).
  const ValueFacts& facts(size_t i) const;
  // Whether every present input is known in full.
  bool inputs_known() const;
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
  // Output `out` = input `in` (type, shape and known values; partial facts as they are).
  void same(size_t out, size_t in);
  // Sets output i from partial facts (settled: known when every part is).
  void set(size_t i, ValueFacts v);

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

// Shape rules many ops share, written over partial facts.
// Output 0 has input 0's type and shape (values not kept).
void same_shape(ShapeContext& c);
// Output 0 has input 0's shape, of type `dtype`.
void same_shape_as(ShapeContext& c, DataType dtype);
// Output 0 is input 0 (type, shape and values): Identity and its kin.
void pass_through(ShapeContext& c);
// Output 0 is the broadcast of every present input, of type `out_type` (Undefined: input
// `type_from`'s). Where the inputs' values are known, `f` (when given) computes the
// output's from one element of each input.
void broadcast_shape(ShapeContext& c, DataType out_type, size_t type_from,
                     int64_t (*f)(const std::vector<int64_t>&));
// Numpy broadcasting of partial shapes (every one ranked): a known dimension other than 1
// decides (a valid model broadcasts an unknown one to it); 1 beside an unknown one stays
// unknown, named when every unknown one has that name. unknown() when known ones conflict.
ValueFacts broadcast_facts(const std::vector<const ValueFacts*>& in);
// The product of `dims` (kUnknownDim when one is unknown or it overflows).
int64_t product_or_unknown(const Shape& dims);
// Appends a dimension to `out`'s shape: of size `d` (kUnknownDim: not known) and `name`.
void append_dim(ValueFacts& out, int64_t d, const std::string& name = {});
// Appends dimension k of `from` (its size and name).
void append_dim(ValueFacts& out, const ValueFacts& from, size_t k);
// Dimensions [from, to) of `v` (sizes and names), as ranked facts with no type.
ValueFacts sub_shape(const ValueFacts& v, size_t from, size_t to);
// An output of type `dtype` whose rank is not known.
ValueFacts typed_facts(DataType dtype);

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
