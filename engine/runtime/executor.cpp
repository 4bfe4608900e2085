#include "engine/runtime/executor.h"

#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "engine/plan/shape_inference.h"
#include "engine/runtime/weight_release.h"
#include "engine/util/float_mode.h"
#include "kiln/error.h"

namespace kiln {

Tensor allocate_tensor(BufferPool& pool, DataType dtype, const Shape& shape, detail::PoolRun* run,
                       bool planned) {
  const int64_t n = checked_numel(shape);
  const uint64_t limit = pool.core().memory_limit;
  if (limit > 0) {
    const uint64_t bytes =
        dtype == DataType::String ? static_cast<uint64_t>(n) * 32 : storage_bytes(dtype, n);
    const uint64_t in_use = pool.core().bytes_in_use;
    if (bytes > limit || in_use > limit - bytes) {
      throw Error(ErrorKind::Memory,
                  "output " + std::string(data_type_name(dtype)) + shape_to_string(shape) +
                      " needs " + byte_size_text(bytes) + ", over the memory limit of " +
                      byte_size_text(limit) + " (" + byte_size_text(in_use) + " in use)");
    }
  }
  if (dtype == DataType::String) return Tensor::zeros(dtype, shape);
  const uint64_t bytes = storage_bytes(dtype, n);
  try {
    return Tensor(dtype, shape, pool.acquire(bytes, run, planned));
  } catch (const std::bad_alloc&) {
    // The system refused: say for what (the executor adds the node, the session the file).
    throw Error(ErrorKind::Memory, "output " + std::string(data_type_name(dtype)) +
                                       shape_to_string(shape) + " needs " + byte_size_text(bytes) +
                                       ": out of memory");
  }
}

namespace {

// KILN_CHECK_CONTRACTS=1: after every node, its outputs are compared with what its op's shape
// rule (ops/core/contract.h) gives for the inputs it was run with, and, when the run's arena was
// planned from the contracts, its buffers with where the plan put them, so tests that run
// models catch a rule that disagrees with its kernel (the planner's predictions rest on the
// rules). Off by default: it costs a shape inference per node.
// Denormal float32 elements of `v` (0 for other values).
uint64_t denormal_count(const Value& v) {
  if (!v.is_tensor() || v.tensor().dtype() != DataType::Float) return 0;
  const Tensor dense = v.tensor().is_contiguous() ? v.tensor() : v.tensor().contiguous();
  const float* x = dense.data<const float>();
  uint64_t n = 0;
  for (int64_t i = 0; i < dense.numel(); ++i) n += fp::is_denormal(x[i]) ? 1 : 0;
  return n;
}

bool check_contracts() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CHECK_CONTRACTS");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

std::string facts_text(const ops::ValueFacts& f) {
  std::string s = std::string(data_type_name(f.dtype)) + shape_to_string(f.shape);
  if (f.has_data) {
    s += " = {";
    for (size_t i = 0; i < f.data.size(); ++i) s += (i ? ", " : "") + std::to_string(f.data[i]);
    s += "}";
  }
  return s;
}

// The facts of the node's inputs (and of the enclosing values its nested graphs read), taken
// before the kernel runs: it may write its outputs over its inputs.
std::vector<ops::ValueFacts> input_facts(const ir::Graph& g, const ir::Node& node,
                                         const std::vector<const Value*>& in,
                                         const std::vector<Value>& slots) {
  std::vector<ops::ValueFacts> values(g.values.size());
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (in[i] && in[i]->is_tensor())
      values[static_cast<size_t>(node.inputs[i])] = plan::inferred_from(in[i]->tensor());
  }
  for (ir::ValueId id : node.implicit_inputs) {
    const Value& v = slots[static_cast<size_t>(id)];
    if (v.is_tensor()) values[static_cast<size_t>(id)] = plan::inferred_from(v.tensor());
  }
  return values;
}

// In a run whose arena was planned from the op contracts, every buffer a kernel asks for falls
// where the plan put it: one that misses means the node's placement or workspace rule
// disagrees with what its kernel allocated (`missed_before`: the run's misses before it). And
// in any run, a kernel whose contract declares a workspace takes all its scratch from it: an
// unplanned request (OpContext::allocate) beside it is scratch the rule does not count
// (`unplanned_before`: the run's unplanned requests before it).
void check_planned(const detail::PoolRun* run, const ops::OpRegistration& op,
                   uint64_t missed_before, uint64_t unplanned_before) {
  if (!run) return;
  const uint64_t unplanned = run->unplanned.load() - unplanned_before;
  if (op.workspace && unplanned != 0) {
    throw Error(ErrorKind::Runtime,
                "contract check: the kernel took " + std::to_string(unplanned) +
                    " scratch buffers outside the workspace its contract declares");
  }
  if (!run->from_shapes || !run->in_arena) return;
  const uint64_t missed = run->arena_missed.load() - missed_before;
  if (missed == 0) return;
  throw Error(ErrorKind::Runtime,
              "contract check: " + std::to_string(missed) +
                  " of the node's buffers missed the arena planned from the op contracts (its "
                  "placement or workspace rule disagrees with its kernel)");
}

void check_contract(const ir::Graph& g, const ir::Node& node, std::vector<ops::ValueFacts>& values,
                    const std::vector<Value>& outs) {
  std::vector<ops::ValueFacts> want;
  try {
    want = plan::infer_node(g, node, values);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::Runtime,
                std::string("contract check: the shape rule rejects inputs the kernel ran on: ") +
                    e.what());
  }
  for (size_t i = 0; i < outs.size() && i < want.size(); ++i) {
    if (!want[i].known || !outs[i].is_tensor()) continue;
    ops::ValueFacts got = plan::inferred_from(outs[i].tensor());
    if (!want[i].has_data || !got.has_data) {  // values compared where both sides keep them
      got.has_data = want[i].has_data = false;
      got.data.clear();
      want[i].data.clear();
    }
    if (got.dtype != want[i].dtype || got.shape != want[i].shape || got.data != want[i].data) {
      throw Error(ErrorKind::Runtime, "contract check: output " + std::to_string(i) + " is " +
                                          facts_text(got) + " but the shape rule gives " +
                                          facts_text(want[i]));
    }
  }
}

// Empties a slot in place: cheaper than assigning a temporary Value, which is large.
void clear_value(Value& v) {
  std::destroy_at(&v);
  std::construct_at(&v);
}

struct Frame {
  const plan::GraphPlan& plan;
  std::vector<Value>& slots;
  std::vector<int32_t>& uses;
  // Initializers stay bound in their slots after their last read and between runs, unless
  // weights give their pages back after their last use (which counts the slots viewing them).
  bool keep_initializers = true;
  WeightRelease* weights = nullptr;  // main graph with release_weights_after_use only
};

bool is_initializer(const ir::Graph& g, size_t id) {
  return g.values[id].origin == ir::ValueOrigin::Initializer;
}

// Empties a run's buffers when it ends, normally or by an exception, so that no value
// outlives its run in the kept buffers (initializers excepted, see Frame).
struct ClearOnExit {
  FrameBuffers& b;
  const ir::Graph& g;
  bool keep_initializers;
  ~ClearOnExit() {
    for (size_t i = 0; i < b.slots.size(); ++i) {
      if (b.slots[i].defined() && !(keep_initializers && is_initializer(g, i))) {
        clear_value(b.slots[i]);
      }
    }
    b.temps.clear();
    b.captures.clear();
    for (Tensor& t : b.groups) t = Tensor();
    for (Value& v : b.outs) {
      if (v.defined()) clear_value(v);
    }
  }
};

bool uniquely_owned(const Value& v) {
  if (!v.is_tensor()) return false;
  const Tensor& t = v.tensor();
  return t.defined() && t.storage()->writable() && t.storage().use_count() == 1;
}

void release_use(Frame& f, ir::ValueId id) {
  if (id == ir::kNoValue) return;
  if (--f.uses[static_cast<size_t>(id)] == 0) {
    Value& slot = f.slots[static_cast<size_t>(id)];
    if (f.keep_initializers && is_initializer(*f.plan.graph, static_cast<size_t>(id))) return;
    if (f.weights) f.weights->drop(slot);
    clear_value(slot);
  }
}

std::string value_shape(const Value* v) {
  if (!v || !v->defined()) return "";
  return v->describe();
}

}  // namespace

// The executor's side of OpContext for one step.
class StepHooks final : public ops::ExecutionHooks {
 public:
  StepHooks(Executor& ex, Frame& frame, const plan::Step& step, std::vector<const Value*>& inputs,
            std::vector<bool>& temporary, const std::vector<Tensor>& groups, int depth)
      : ex_(ex),
        frame_(frame),
        step_(step),
        inputs_(inputs),
        temporary_(temporary),
        groups_(groups),
        depth_(depth) {}

  Tensor allocate(DataType dtype, const Shape& shape) override {
    return allocate_tensor(ex_.pool_, dtype, shape, ex_.run_);
  }

  Tensor allocate_output(size_t o, DataType dtype, const Shape& shape) override {
    if (const plan::OutputSlot* slot = plan::output_slot(step_, o, dtype, shape)) {
      const Tensor& group = groups_[static_cast<size_t>(slot->group)];
      if (group.defined())
        return group.view(shape, contiguous_strides(shape),
                          group.byte_offset() + slot->byte_offset);
    }
    return allocate(dtype, shape);
  }

  Tensor allocate_scratch(DataType dtype, const Shape& shape) override {
    return allocate_tensor(ex_.pool_, dtype, shape, ex_.run_, false);
  }

  bool can_overwrite(size_t i) override {
    if (i >= 32 || !(step_.op->in_place & (1u << i)) || i >= inputs_.size() || !inputs_[i]) {
      return false;
    }
    if (!uniquely_owned(*inputs_[i])) return false;
    if (temporary_[i]) return true;  // a contiguous copy the executor made for this step
    const ir::ValueId id = step_.node->inputs[i];
    return frame_.uses[static_cast<size_t>(id)] == 1;
  }

  Value take_input(size_t i) override {
    // The executor's slot (or its contiguous temporary) gives up the value; the input
    // pointer keeps pointing at the now-empty slot until the step ends.
    Value& v = const_cast<Value&>(*inputs_[i]);
    Value out = std::move(v);
    v = Value();
    return out;
  }

  void count_copy(uint64_t bytes, ops::CopyCause cause) override {
    RunStats& s = ex_.stats_;
    s.bytes_copied += bytes;
    switch (cause) {
      case ops::CopyCause::Contiguous:
        s.bytes_copied_contiguous += bytes;
        break;
      case ops::CopyCause::Concat:
        s.bytes_copied_concat += bytes;
        break;
      case ops::CopyCause::Capture:
        s.bytes_copied_capture += bytes;
        break;
      case ops::CopyCause::Kernel:
        s.bytes_copied_kernels += bytes;
        break;
    }
  }

  void count_in_place() override { ++ex_.stats_.in_place_ops; }

  std::vector<Value> run_subgraph(int index, std::vector<Value> sub_inputs,
                                  ops::CaptureMode mode) override {
    std::vector<Value> results;
    run_nested(index, sub_inputs, mode, results);
    return results;
  }

  std::vector<Value>& run_subgraph_kept(int index, std::vector<Value> sub_inputs,
                                        ops::CaptureMode mode) override {
    std::vector<Value>& results = ex_.scratch_.at(nested_plan(index).index).results;
    results.clear();
    run_nested(index, sub_inputs, mode, results);
    return results;
  }

 private:
  const plan::GraphPlan& nested_plan(int index) const {
    if (index < 0 || static_cast<size_t>(index) >= step_.subgraphs.size()) {
      throw Error(ErrorKind::Runtime, "no nested graph #" + std::to_string(index));
    }
    return *step_.subgraphs[static_cast<size_t>(index)];
  }

  void run_nested(int index, std::vector<Value>& sub_inputs, ops::CaptureMode mode,
                  std::vector<Value>& results) {
    const plan::GraphPlan& sub = nested_plan(index);
    const auto& slots = step_.capture_slots[static_cast<size_t>(index)];
    // The nested graph's own buffers carry them in: it never runs inside itself, so they are
    // free now, and they keep their capacity.
    std::vector<Value>& captures = ex_.scratch_.at(sub.index).captures;
    captures.clear();
    for (int32_t slot : slots) {
      const ir::ValueId id = step_.node->implicit_inputs[static_cast<size_t>(slot)];
      Value& v = frame_.slots[static_cast<size_t>(id)];
      // Moving is safe when this node is the value's last reader and nobody else holds
      // its storage: the nested graph then owns it and may write into it.
      if (mode == ops::CaptureMode::MoveIfLastUse && frame_.uses[static_cast<size_t>(id)] == 1 &&
          uniquely_owned(v)) {
        captures.push_back(std::move(v));
        v = Value();
      } else {
        captures.push_back(v);
      }
    }
    ex_.run(sub, sub_inputs, captures, results, depth_ + 1);
  }

  Executor& ex_;
  Frame& frame_;
  const plan::Step& step_;
  std::vector<const Value*>& inputs_;
  std::vector<bool>& temporary_;
  const std::vector<Tensor>& groups_;
  int depth_;
};

void Executor::check_stop() const {
  if (options_->cancelled()) throw RunCancelled("run cancelled");
  if (options_->deadline != std::chrono::steady_clock::time_point::max() &&
      std::chrono::steady_clock::now() >= options_->deadline) {
    throw RunCancelled("run stopped at its deadline");
  }
}

void Executor::run(const plan::GraphPlan& plan, std::span<Value> inputs, std::span<Value> captures,
                   std::vector<Value>& results, int depth) {
  if (options_) check_stop();
  const ir::Graph& g = *plan.graph;
  FrameBuffers& buffers = scratch_.at(plan.index);
  const bool keep_initializers = !(depth == 0 && weight_release_);
  ClearOnExit clear{buffers, g, keep_initializers};
  buffers.slots.resize(g.values.size());
  buffers.uses.assign(plan.use_counts.begin(), plan.use_counts.end());
  Frame f{plan, buffers.slots, buffers.uses, keep_initializers};
  if (inputs.size() > g.inputs.size()) {
    throw Error(ErrorKind::Runtime, "graph '" + g.name + "' takes " +
                                        std::to_string(g.inputs.size()) + " inputs, given " +
                                        std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ir::ValueId id = g.inputs[i];
    const ir::ValueInfo& info = g.value(id);
    Value& slot = f.slots[static_cast<size_t>(id)];
    if (i < inputs.size() && inputs[i].defined()) {
      slot = std::move(inputs[i]);
      if (adopt_inputs_ && depth == 0 && uniquely_owned(slot)) {
        pool_.core().adopt(*slot.tensor().storage());
      }
    } else if (info.constant.defined()) {
      slot = Value(info.constant);
    }
    if (f.uses[static_cast<size_t>(id)] == 0) slot = Value();  // never read: free it now
  }
  for (ir::ValueId id : g.initializers) {
    // A hollow constant (data not given yet) stays empty: its readers report it by name.
    const Tensor& constant = g.value(id).constant;
    Value& slot = f.slots[static_cast<size_t>(id)];
    if (!constant.defined()) {
      if (slot.defined()) clear_value(slot);
      continue;
    }
    // Still bound from an earlier run, unless the constant was set anew or moved out as a
    // graph output.
    const bool bound = slot.is_tensor() && slot.tensor().storage() == constant.storage() &&
                       slot.tensor().byte_offset() == constant.byte_offset();
    if (!bound) slot = Value(constant);
  }
  if (captures.size() != g.captures.size()) {
    throw Error(ErrorKind::Runtime, "nested graph '" + g.name + "' expects " +
                                        std::to_string(g.captures.size()) + " captured values");
  }
  for (size_t i = 0; i < captures.size(); ++i) {
    f.slots[static_cast<size_t>(g.captures[i])] = std::move(captures[i]);
  }
  // The Concat groups apply when the inputs have the shapes they were formed for.
  bool groups_apply = !plan.concat_groups.empty();
  for (size_t i = 0; groups_apply && i < g.inputs.size(); ++i) {
    const Value& v = f.slots[static_cast<size_t>(g.inputs[i])];
    if (v.is_tensor() && v.tensor().defined())
      groups_apply = plan::matches_hint(plan, i, v.tensor().dtype(), v.tensor().shape());
  }
  buffers.groups.resize(plan.concat_groups.size());
  if (depth == 0 && weight_release_) {
    f.weights = weight_release_;
    for (const Value& v : f.slots) f.weights->hold(v);
  }

  std::vector<const Value*>& in_ptrs = buffers.in_ptrs;
  std::vector<Value>& temps = buffers.temps;
  std::vector<bool>& temporary = buffers.temporary;
  std::vector<Value>& outs = buffers.outs;
  for (const plan::Step& step : plan.steps) {
    const ir::Node& node = *step.node;
    if (options_) {
      try {
        check_stop();
      } catch (Error& e) {
        e.with_node(node.name, node.op_type);
        throw;
      }
    }
    ++steps_;
    if (run_) run_->step.store(steps_, std::memory_order_relaxed);
    for (int32_t k : step.groups_begin) {
      if (!groups_apply) break;
      const plan::ConcatGroup& group = plan.concat_groups[static_cast<size_t>(k)];
      try {
        buffers.groups[static_cast<size_t>(k)] =
            allocate_tensor(pool_, group.dtype, Shape{group.elements}, run_);
      } catch (Error& e) {
        e.with_node(node.name, node.op_type);
        throw;
      }
    }
    const size_t n_in = node.inputs.size();
    in_ptrs.assign(n_in, nullptr);
    temporary.assign(n_in, false);
    temps.clear();
    temps.reserve(n_in);
    for (size_t i = 0; i < n_in; ++i) {
      const ir::ValueId id = node.inputs[i];
      if (id == ir::kNoValue) continue;
      const Value& v = f.slots[static_cast<size_t>(id)];
      if (!v.defined()) {
        throw Error(ErrorKind::Runtime, "input '" + g.value(id).name + "' has no value")
            .with_node(node.name, node.op_type);
      }
      in_ptrs[i] = &v;
      if (!step.op->strided_inputs && v.is_tensor() && !v.tensor().is_contiguous()) {
        try {
          // A broadcast view (Expand's) may stand for far more bytes than exist.
          temps.push_back(Value(v.tensor().contiguous()));
        } catch (Error& e) {
          e.with_node(node.name, node.op_type);
          throw;
        }
        in_ptrs[i] = &temps.back();
        temporary[i] = true;
        const uint64_t bytes = v.tensor().nbytes();
        stats_.bytes_copied += bytes;
        stats_.bytes_copied_contiguous += bytes;
      }
    }
    outs.resize(node.outputs.size());
    for (Value& v : outs) {
      if (v.defined()) clear_value(v);  // moved from by the previous step
    }
    StepHooks hooks(*this, f, step, in_ptrs, temporary, buffers.groups, depth);
    ops::OpContext ctx(node, in_ptrs, outs, hooks);
    // The clock is read only for profiles: two reads cost as much as a tiny kernel.
    const auto t0 =
        profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const uint64_t copied_before = stats_.bytes_copied;
    std::vector<ops::ValueFacts> facts;
    uint64_t missed_before = 0, unplanned_before = 0;
    if (check_contracts()) {
      facts = input_facts(g, node, in_ptrs, f.slots);
      if (run_) {
        missed_before = run_->arena_missed.load();
        unplanned_before = run_->unplanned.load();
      }
    }
    try {
      step.kernel->run(ctx);
      if (check_contracts()) {
        check_contract(g, node, facts, outs);
        check_planned(run_, *step.op, missed_before, unplanned_before);
      }
    } catch (Error& e) {
      e.with_node(node.name, node.op_type);
      throw;
    } catch (const std::length_error&) {
      // A standard container refused a size computed from the inputs: no library text.
      throw Error(ErrorKind::Memory, "a size computed from the inputs is too large to allocate")
          .with_node(node.name, node.op_type);
    } catch (const std::bad_alloc&) {
      throw Error(ErrorKind::Memory, "out of memory").with_node(node.name, node.op_type);
    } catch (const std::exception& e) {
      throw Error(ErrorKind::Runtime, e.what()).with_node(node.name, node.op_type);
    }
    ++stats_.nodes_run;
    uint64_t denormals = 0;
    if (count_denormals_) {
      for (const Value& v : outs) denormals += denormal_count(v);
      stats_.denormals_produced += denormals;
    }
    if (profile_) {
      const auto t1 = std::chrono::steady_clock::now();
      NodeEvent ev;
      ev.name = node.name;
      ev.op_type = node.op_type;
      ev.start_us = std::chrono::duration<double, std::micro>(t0 - start_).count();
      ev.duration_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
      ev.depth = depth;
      ev.bytes_copied = stats_.bytes_copied - copied_before;
      ev.denormals = denormals;
      for (const Value* v : in_ptrs) ev.input_shapes.push_back(value_shape(v));
      for (const Value& v : outs) ev.output_shapes.push_back(value_shape(&v));
      profile_->push_back(std::move(ev));
    }
    temps.clear();
    for (ir::ValueId id : node.inputs) release_use(f, id);
    for (ir::ValueId id : node.implicit_inputs) release_use(f, id);
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const ir::ValueId id = node.outputs[i];
      if (id == ir::kNoValue) continue;
      if (!outs[i].defined()) {
        throw Error(ErrorKind::Runtime, "produced no value for output '" + g.value(id).name + "'")
            .with_node(node.name, node.op_type);
      }
      if (f.uses[static_cast<size_t>(id)] > 0) {
        f.slots[static_cast<size_t>(id)] = std::move(outs[i]);
        if (f.weights) f.weights->hold(f.slots[static_cast<size_t>(id)]);
      }
    }
    for (int32_t k : step.groups_end) buffers.groups[static_cast<size_t>(k)] = Tensor();
    if (f.weights) f.weights->end_step();
  }

  results.clear();
  results.reserve(g.outputs.size());
  for (ir::ValueId id : g.outputs) {
    Value& v = f.slots[static_cast<size_t>(id)];
    if (!v.defined()) {
      throw Error(ErrorKind::Runtime, "graph output '" + g.value(id).name + "' has no value");
    }
    if (--f.uses[static_cast<size_t>(id)] == 0) {
      results.push_back(std::move(v));
      v = Value();
    } else {
      results.push_back(v);
    }
  }
}

}  // namespace kiln
