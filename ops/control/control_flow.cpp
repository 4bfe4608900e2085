// If, Loop and Scan: nested graphs run by the executor in a child scope.
//
// Captured values reach the nested graph as values, never as copies: If moves an owned
// value in when it is its last reader (so a branch can extend a KV cache in place), Loop
// and Scan lend them to every iteration. Loop-carried values move from one iteration to
// the next, and scan outputs are written once into their final buffer.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

bool read_condition(const OpContext& ctx, const Tensor& t, const char* what) {
  if (t.dtype() != DataType::Bool || t.numel() != 1) {
    ctx.fail(std::string(what) + " must be a single bool, got " + t.describe());
  }
  return t.contiguous().data<const bool>()[0];
}

// The element type a nested graph declares for its output i (Undefined when it declares none).
DataType declared_elem(const ir::Graph& g, size_t i) {
  const ir::TypeInfo& t = g.value(g.outputs[i]).type;
  return t.kind == Value::Kind::Tensor ? t.elem : DataType::Undefined;
}

// A nested graph's output i at run time against the element type the graph declares for it.
void check_declared(const OpContext& ctx, const ir::Graph& g, size_t i, const Value& v,
                    const char* what) {
  const DataType want = declared_elem(g, i);
  if (want == DataType::Undefined || !v.is_tensor() || v.tensor().dtype() == want) return;
  ctx.fail(std::string(what) + " output " + std::to_string(i) + " ('" + g.value(g.outputs[i]).name +
           "') is declared " + std::string(data_type_name(want)) + " but is " +
           v.tensor().describe());
}

class If final : public Kernel {
 public:
  explicit If(const NodeInfo& info)
      : then_(info.subgraph_index("then_branch")),
        else_(info.subgraph_index("else_branch")),
        then_graph_(&info.subgraph(then_)),
        else_graph_(&info.subgraph(else_)) {
    const size_t outs = info.num_outputs();
    if (info.subgraph(then_).outputs.size() != outs ||
        info.subgraph(else_).outputs.size() != outs) {
      info.fail("each branch must produce the node's " + std::to_string(outs) + " outputs");
    }
    for (size_t i = 0; i < outs; ++i) {
      const DataType a = declared_elem(info.subgraph(then_), i);
      const DataType b = declared_elem(info.subgraph(else_), i);
      if (a != DataType::Undefined && b != DataType::Undefined && a != b) {
        info.fail("output " + std::to_string(i) + " is " + std::string(data_type_name(a)) +
                  " in then_branch but " + std::string(data_type_name(b)) + " in else_branch");
      }
    }
  }

  void run(OpContext& ctx) override {
    const bool cond = read_condition(ctx, ctx.input(0), "the condition");
    // The branch's outputs become the node's outputs as they are: no copy.
    const int branch = cond ? then_ : else_;
    // The branch's outputs arrive in a vector the executor keeps; moved out, and cleared
    // whatever happens, so it holds no reference past this node.
    std::vector<Value>& outs = ctx.run_subgraph_kept(branch, {}, CaptureMode::MoveIfLastUse);
    struct Clear {
      std::vector<Value>& v;
      ~Clear() { v.clear(); }
    } clear{outs};
    for (size_t i = 0; i < outs.size(); ++i) {
      check_declared(ctx, cond ? *then_graph_ : *else_graph_, i, outs[i],
                     cond ? "then_branch" : "else_branch");
      ctx.set_output(i, std::move(outs[i]));
    }
  }

 private:
  int then_, else_;
  const ir::Graph *then_graph_, *else_graph_;
};

// Stacks per-iteration tensors along a new axis into one buffer allocated when the first
// item arrives, growing by doubling when the final count is not known in advance.
class StackedOutput {
 public:
  // `axis` in [0, rank of an item]; `reverse` fills from the end (Scan directions).
  StackedOutput(int64_t expected_count, int64_t axis, bool reverse)
      : expected_(expected_count), axis_(axis), reverse_(reverse) {}

  void add(OpContext& ctx, const Tensor& item) {
    if (!buffer_.defined()) {
      item_shape_ = item.shape();
      dtype_ = item.dtype();
      if (axis_ < 0 || axis_ > static_cast<int64_t>(item_shape_.size())) {
        ctx.fail("scan output axis " + std::to_string(axis_) + " is out of range");
      }
      capacity_ = expected_ > 0 ? expected_ : 4;
      buffer_ = ctx.allocate(dtype_, stacked_shape(capacity_));
    } else if (item.shape() != item_shape_ || item.dtype() != dtype_) {
      ctx.fail("scan output changes from " + Tensor(dtype_, item_shape_, nullptr).describe() +
               " to " + item.describe() + " between iterations");
    }
    if (count_ == capacity_) grow(ctx);
    const int64_t slot = reverse_ ? capacity_ - 1 - count_ : count_;
    copy_elements(item, slice(buffer_, slot));
    ctx.count_copy(item.nbytes());
    ++count_;
  }

  // The stacked result: `count` items (empty loops use `fallback_shape` for an item).
  Tensor finish(OpContext& ctx, DataType fallback_type, const Shape& fallback_item) {
    if (!buffer_.defined()) {
      item_shape_ = fallback_item;
      dtype_ = fallback_type;
      return ctx.allocate(dtype_, stacked_shape(0));
    }
    if (count_ == capacity_) return buffer_;
    // Fewer items than capacity: copy the filled part out (only happens when a Loop ends
    // early or a while-loop overshoots its doubling).
    Tensor out = ctx.allocate(dtype_, stacked_shape(count_));
    for (int64_t i = 0; i < count_; ++i) {
      const int64_t from = reverse_ ? capacity_ - count_ + i : i;
      copy_elements(slice(buffer_, from), slice(out, i));
    }
    ctx.count_copy(out.nbytes());
    return out;
  }

 private:
  Shape stacked_shape(int64_t n) const {
    Shape s = item_shape_;
    s.insert(s.begin() + axis_, n);
    return s;
  }
  // Item `i` of a stacked tensor: a view with the stacking axis removed.
  Tensor slice(const Tensor& t, int64_t i) const {
    Shape shape = t.shape(), strides = t.strides();
    const size_t esize = static_cast<size_t>(bits_per_element(t.dtype()) / 8);
    const size_t offset = t.byte_offset() + static_cast<size_t>(i * strides[axis_]) * esize;
    shape.erase(shape.begin() + axis_);
    strides.erase(strides.begin() + axis_);
    return t.view(shape, strides, offset);
  }
  void grow(OpContext& ctx) {
    Tensor bigger = ctx.allocate(dtype_, stacked_shape(capacity_ * 2));
    for (int64_t i = 0; i < count_; ++i) {
      const int64_t from = reverse_ ? capacity_ - count_ + i : i;
      const int64_t to = reverse_ ? 2 * capacity_ - count_ + i : i;
      copy_elements(slice(buffer_, from), slice(bigger, to));
    }
    ctx.count_copy(static_cast<uint64_t>(count_) * storage_bytes(dtype_, shape_numel(item_shape_)));
    buffer_ = bigger;
    capacity_ *= 2;
  }

  int64_t expected_, axis_;
  bool reverse_;
  Tensor buffer_;
  Shape item_shape_;
  DataType dtype_ = DataType::Undefined;
  int64_t capacity_ = 0, count_ = 0;
};

// Element type and shape a nested graph declares for output i (for empty scan outputs).
std::pair<DataType, Shape> declared_item(const ir::Graph& g, size_t i) {
  const ir::TypeInfo& t = g.value(g.outputs[i]).type;
  Shape shape;
  if (t.shape) {
    for (const ir::Dim& d : *t.shape) shape.push_back(d.value > 0 ? d.value : 0);
  }
  return {t.elem == DataType::Undefined ? DataType::Float : t.elem, shape};
}

// Loop: inputs (M, cond, v_initial...), body (iter, cond, v...) -> (cond, v..., scan...).
class Loop final : public Kernel {
 public:
  explicit Loop(const NodeInfo& info)
      : body_(info.subgraph_index("body")), graph_(info.subgraph(body_)) {
    if (info.num_inputs() < 2) info.fail("Loop takes at least the inputs M and cond");
    carried_ = info.num_inputs() - 2;
    if (graph_.inputs.size() != carried_ + 2) {
      info.fail("the body takes " + std::to_string(graph_.inputs.size()) + " inputs; expected " +
                std::to_string(carried_ + 2) + " (iteration, condition, loop-carried values)");
    }
    // The body returns the condition, then one value per output of the node: its loop-carried
    // values and its scan outputs (onnxruntime refuses any other count at load too).
    const size_t outs = info.num_outputs();
    if (outs < carried_) {
      info.fail("has " + std::to_string(outs) + " outputs; expected at least " +
                std::to_string(carried_) + " (one per loop-carried value)");
    }
    if (graph_.outputs.size() != outs + 1) {
      info.fail("the body has " + std::to_string(graph_.outputs.size()) + " outputs; expected " +
                std::to_string(outs + 1) + " (the condition, then the node's " +
                std::to_string(carried_) + " loop-carried values and " +
                std::to_string(outs - carried_) + " scan outputs)");
    }
    scans_ = outs - carried_;
  }

  void run(OpContext& ctx) override {
    int64_t max_trips = -1;  // -1: unbounded
    if (ctx.has_input(0)) {
      const Tensor& m = ctx.input(0);
      if (m.numel() != 1) ctx.fail("M must be a single integer");
      // A negative trip count runs no iteration (as onnxruntime does), never "no limit".
      max_trips = std::max<int64_t>(to_int64s(m)[0], 0);
    }
    bool cond = ctx.has_input(1) ? read_condition(ctx, ctx.input(1), "the condition") : true;
    std::vector<Value> carried;
    carried.reserve(carried_);
    for (size_t i = 0; i < carried_; ++i) carried.push_back(ctx.take_input_value(2 + i));
    // Loop-carried tensors keep their element type from one iteration to the next.
    std::vector<DataType> carried_types(carried_, DataType::Undefined);
    for (size_t i = 0; i < carried_; ++i) {
      if (carried[i].is_tensor()) carried_types[i] = carried[i].tensor().dtype();
    }

    std::vector<StackedOutput> stacks;
    const int64_t expected = max_trips >= 0 && max_trips <= (int64_t{1} << 20) ? max_trips : -1;
    for (size_t k = 0; k < scans_; ++k) stacks.emplace_back(expected, 0, false);

    for (int64_t iter = 0; (max_trips < 0 || iter < max_trips) && cond; ++iter) {
      std::vector<Value> body_inputs;
      body_inputs.reserve(carried_ + 2);
      body_inputs.push_back(Tensor::scalar<int64_t>(iter));
      body_inputs.push_back(Tensor::scalar<bool>(cond));
      for (Value& v : carried) body_inputs.push_back(std::move(v));
      std::vector<Value> outs =
          ctx.run_subgraph(body_, std::move(body_inputs), CaptureMode::Borrow);
      cond = read_condition(ctx, outs[0].tensor(), "the body's condition output");
      for (size_t i = 0; i < carried_; ++i) {
        check_declared(ctx, graph_, 1 + i, outs[1 + i], "the body's");
        if (carried_types[i] != DataType::Undefined && outs[1 + i].is_tensor() &&
            outs[1 + i].tensor().dtype() != carried_types[i]) {
          ctx.fail("loop-carried value " + std::to_string(i) + " changes from " +
                   std::string(data_type_name(carried_types[i])) + " to " +
                   outs[1 + i].tensor().describe() + " in iteration " + std::to_string(iter));
        }
        carried[i] = std::move(outs[1 + i]);
      }
      for (size_t k = 0; k < scans_; ++k) {
        const Value& item = outs[1 + carried_ + k];
        if (!item.is_tensor()) ctx.fail("scan outputs must be tensors");
        stacks[k].add(ctx, item.tensor());
      }
    }
    for (size_t i = 0; i < carried_ && i < ctx.num_outputs(); ++i)
      ctx.set_output(i, std::move(carried[i]));
    for (size_t k = 0; k < scans_; ++k) {
      if (!ctx.has_output(carried_ + k)) continue;
      auto [dtype, item] = declared_item(graph_, 1 + carried_ + k);
      ctx.set_output(carried_ + k, stacks[k].finish(ctx, dtype, item));
    }
  }

 private:
  int body_;
  const ir::Graph& graph_;
  size_t carried_ = 0, scans_ = 0;
};

// Item i of `t` along `axis` as a view (no copy).
Tensor slice_view(const Tensor& t, int64_t axis, int64_t i) {
  Shape shape = t.shape(), strides = t.strides();
  const size_t esize = static_cast<size_t>(bits_per_element(t.dtype()) / 8);
  const size_t offset =
      t.byte_offset() + static_cast<size_t>(i * strides[static_cast<size_t>(axis)]) * esize;
  shape.erase(shape.begin() + axis);
  strides.erase(strides.begin() + axis);
  return t.view(shape, strides, offset);
}

// Scan (opset 9+): inputs (state..., scan inputs...), body (state..., slices...) ->
// (state..., scan output items...). Opset 8 adds a leading batch axis and sequence_lens.
class Scan final : public Kernel {
 public:
  explicit Scan(const NodeInfo& info)
      : body_(info.subgraph_index("body")), graph_(info.subgraph(body_)) {
    v8_ = info.opset() < 9;
    const int64_t m = info.attr_int("num_scan_inputs");
    const size_t first = v8_ ? 1 : 0;  // opset 8: sequence_lens comes first
    if (m < 1 || static_cast<size_t>(m) + first > info.num_inputs())
      info.fail("bad num_scan_inputs");
    scan_inputs_ = static_cast<size_t>(m);
    states_ = info.num_inputs() - first - scan_inputs_;
    if (graph_.inputs.size() != states_ + scan_inputs_) info.fail("the body's inputs do not match");
    // The body returns one value per output of the node: its states, then its scan outputs.
    if (info.num_outputs() < states_) {
      info.fail("has " + std::to_string(info.num_outputs()) + " outputs; expected at least " +
                std::to_string(states_) + " (one per state)");
    }
    if (graph_.outputs.size() != info.num_outputs()) {
      info.fail("the body has " + std::to_string(graph_.outputs.size()) + " outputs; expected " +
                std::to_string(info.num_outputs()) + " (the node's " + std::to_string(states_) +
                " states and " + std::to_string(info.num_outputs() - states_) + " scan outputs)");
    }
    scan_outputs_ = graph_.outputs.size() - states_;
    in_axes_ = info.attr_ints("scan_input_axes", std::vector<int64_t>(scan_inputs_, 0));
    in_dirs_ = info.attr_ints(v8_ ? "directions" : "scan_input_directions",
                              std::vector<int64_t>(scan_inputs_, 0));
    out_axes_ = info.attr_ints("scan_output_axes", std::vector<int64_t>(scan_outputs_, 0));
    out_dirs_ = info.attr_ints("scan_output_directions", std::vector<int64_t>(scan_outputs_, 0));
    if (in_axes_.size() != scan_inputs_ || in_dirs_.size() != scan_inputs_ ||
        out_axes_.size() != scan_outputs_ || out_dirs_.size() != scan_outputs_) {
      info.fail("scan axes/directions do not match the number of scan inputs/outputs");
    }
    if (v8_ && info.has_input(0)) info.fail("sequence_lens is not supported");
  }

  void run(OpContext& ctx) override {
    const size_t first = v8_ ? 1 : 0;
    if (!v8_) {
      std::vector<Value> states;
      for (size_t i = 0; i < states_; ++i) states.push_back(ctx.take_input_value(first + i));
      std::vector<Tensor> scans;
      for (size_t j = 0; j < scan_inputs_; ++j) scans.push_back(ctx.input(first + states_ + j));
      std::vector<Tensor> outs = run_one(ctx, states, scans, 0);
      for (size_t i = 0; i < states_; ++i) ctx.set_output(i, std::move(states[i]));
      for (size_t k = 0; k < scan_outputs_; ++k) ctx.set_output(states_ + k, std::move(outs[k]));
      return;
    }
    // Opset 8: every input has a leading batch axis; run each batch item and stack.
    const int64_t batch = ctx.input(first).dim(0);
    std::vector<StackedOutput> state_stack, scan_stack;
    for (size_t i = 0; i < states_; ++i) state_stack.emplace_back(batch, 0, false);
    for (size_t k = 0; k < scan_outputs_; ++k) scan_stack.emplace_back(batch, 0, false);
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<Value> states;
      for (size_t i = 0; i < states_; ++i) states.push_back(slice_view(ctx.input(first + i), 0, b));
      std::vector<Tensor> scans;
      for (size_t j = 0; j < scan_inputs_; ++j)
        scans.push_back(slice_view(ctx.input(first + states_ + j), 0, b));
      std::vector<Tensor> outs = run_one(ctx, states, scans, 0);
      for (size_t i = 0; i < states_; ++i) state_stack[i].add(ctx, states[i].tensor());
      for (size_t k = 0; k < scan_outputs_; ++k) scan_stack[k].add(ctx, outs[k]);
    }
    for (size_t i = 0; i < states_; ++i)
      ctx.set_output(i, state_stack[i].finish(ctx, DataType::Float, {}));
    for (size_t k = 0; k < scan_outputs_; ++k) {
      ctx.set_output(states_ + k, scan_stack[k].finish(ctx, DataType::Float, {}));
    }
  }

 private:
  // One scan over `scans` (sliced along their axes); updates `states`, returns scan outputs.
  std::vector<Tensor> run_one(OpContext& ctx, std::vector<Value>& states,
                              const std::vector<Tensor>& scans, int) {
    int64_t length = -1;
    std::vector<int64_t> axes(scan_inputs_);
    for (size_t j = 0; j < scan_inputs_; ++j) {
      axes[j] = normalize_axis(in_axes_[j], static_cast<int64_t>(scans[j].rank()));
      const int64_t n = scans[j].dim(static_cast<size_t>(axes[j]));
      if (length >= 0 && n != length) ctx.fail("scan inputs have different lengths");
      length = n;
    }
    std::vector<StackedOutput> stacks;
    for (size_t k = 0; k < scan_outputs_; ++k) {
      stacks.emplace_back(length, 0, out_dirs_[k] != 0);  // axis fixed after the first item
    }
    std::vector<int64_t> out_axes(scan_outputs_, -1);
    for (int64_t t = 0; t < length; ++t) {
      std::vector<Value> body_inputs;
      for (Value& v : states) body_inputs.push_back(std::move(v));
      for (size_t j = 0; j < scan_inputs_; ++j) {
        const int64_t i = in_dirs_[j] != 0 ? length - 1 - t : t;
        body_inputs.push_back(slice_view(scans[j], axes[j], i));
      }
      std::vector<Value> outs =
          ctx.run_subgraph(body_, std::move(body_inputs), CaptureMode::Borrow);
      for (size_t i = 0; i < states_; ++i) states[i] = std::move(outs[i]);
      for (size_t k = 0; k < scan_outputs_; ++k) {
        const Tensor& item = outs[states_ + k].tensor();
        if (out_axes[k] < 0) {
          out_axes[k] = normalize_axis(out_axes_[k], static_cast<int64_t>(item.rank()) + 1);
          stacks[k] = StackedOutput(length, out_axes[k], out_dirs_[k] != 0);
        }
        stacks[k].add(ctx, item);
      }
    }
    std::vector<Tensor> results;
    for (size_t k = 0; k < scan_outputs_; ++k) {
      auto [dtype, item] = declared_item(graph_, states_ + k);
      results.push_back(stacks[k].finish(ctx, dtype, item));
    }
    return results;
  }

  int body_;
  const ir::Graph& graph_;
  bool v8_ = false;
  size_t states_ = 0, scan_inputs_ = 0, scan_outputs_ = 0;
  std::vector<int64_t> in_axes_, in_dirs_, out_axes_, out_dirs_;
};

// The taken branch's outputs when the condition is known before the run; else those both
// branches agree on (their values only when equal too).
void if_shape(ShapeContext& c) {
  std::optional<bool> cond;  // known before the run?
  try {
    const ValueFacts& v = c.in(0);
    if (v.has_data && v.data.size() == 1) cond = v.data[0] != 0;
  } catch (const UnknownFacts&) {
  }
  auto set_all = [&](const std::vector<ValueFacts>& outs) {
    if (outs.size() != c.num_outputs()) unknown("branch outputs do not match the node's");
    for (size_t i = 0; i < outs.size(); ++i)
      c.set(i, outs[i].dtype, outs[i].shape, outs[i].has_data ? &outs[i].data : nullptr);
  };
  if (cond) {
    set_all(c.subgraph_outputs(*cond ? "then_branch" : "else_branch", {}));
    return;
  }
  std::vector<ValueFacts> a = c.subgraph_outputs("then_branch", {});
  const std::vector<ValueFacts> b = c.subgraph_outputs("else_branch", {});
  if (a.size() != b.size()) unknown("branches differ in their outputs");
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype != b[i].dtype || a[i].shape != b[i].shape)
      unknown("branches differ in output " + std::to_string(i));
    if (!b[i].has_data || a[i].data != b[i].data) {
      a[i].has_data = false;
      a[i].data.clear();
    }
  }
  set_all(a);
}

// Whether input i's value is known before the run; `value` gets its first element.
bool known_scalar(const ShapeContext& c, size_t i, int64_t& value) {
  try {
    const ValueFacts& v = c.in(i);
    if (!v.has_data || v.data.size() != 1) return false;
    value = v.data[0];
    return true;
  } catch (const UnknownFacts&) {
    return false;
  }
}

// Loops of at most this many iterations, with their trip count known, are inferred one
// iteration at a time with the iteration number's value; longer ones once for all iterations.
constexpr int64_t kMaxUnrolledTrips = 64;

// No iteration runs: the carried values are the initial ones and every scan output is empty,
// shaped as the kernel makes it from the body's declared item.
void loop_without_trips(ShapeContext& c, size_t carried) {
  for (size_t i = 0; i < carried; ++i) c.same(i, 2 + i);
  const ir::Attribute* body = c.node().attr("body");
  if (!body || !body->g) unknown("no graph 'body'");
  const ir::Graph& g = *body->g;
  for (size_t k = 0; carried + k < c.num_outputs(); ++k) {
    if (1 + carried + k >= g.outputs.size()) unknown("more outputs than the body produces");
    auto [dtype, item] = declared_item(g, 1 + carried + k);
    item.insert(item.begin(), 0);
    c.set(carried + k, dtype, item);
  }
}

// The body's inputs for one iteration: its number (value known or not), the condition (true
// in every iteration that runs: the loop goes on only while it is) and the carried values.
std::vector<ValueFacts> loop_body_inputs(std::optional<int64_t> iteration,
                                         const std::vector<ValueFacts>& carried) {
  std::vector<ValueFacts> in;
  in.push_back(known_facts(DataType::Int64, {}, {}, iteration.has_value()));
  if (iteration) in.back().data = {*iteration};
  in.push_back(known_facts(DataType::Bool, {}, {1}, true));
  in.insert(in.end(), carried.begin(), carried.end());
  return in;
}

// Sets the scan outputs: the items stacked along a new first axis of length `trips`.
void set_loop_scans(ShapeContext& c, size_t carried, const std::vector<ValueFacts>& outs,
                    int64_t trips) {
  for (size_t k = 0; carried + k < c.num_outputs(); ++k) {
    Shape shape = outs[1 + carried + k].shape;
    shape.insert(shape.begin(), trips);
    c.set(carried + k, outs[1 + carried + k].dtype, shape);
  }
}

// A short loop, one iteration at a time: the carried values (with their values) follow the
// body exactly, the scan items must keep their type and shape, and the loop stops where the
// body's condition turns false.
void loop_unrolled(ShapeContext& c, size_t carried, int64_t max_trips) {
  std::vector<ValueFacts> state;
  for (size_t i = 0; i < carried; ++i) state.push_back(c.in(2 + i));
  std::vector<ValueFacts> first;
  int64_t trips = 0;
  for (int64_t k = 0; k < max_trips; ++k) {
    const std::vector<ValueFacts> outs = c.subgraph_outputs("body", loop_body_inputs(k, state));
    if (outs.size() < 1 + carried || outs.size() - 1 < c.num_outputs())
      unknown("the body's outputs do not match the node's");
    for (size_t i = 0; i < carried; ++i) {
      if (outs[1 + i].dtype != state[i].dtype)
        unknown("carried value " + std::to_string(i) + " changes type in the body");
      state[i] = outs[1 + i];
    }
    for (size_t j = 1 + carried; k > 0 && j < outs.size(); ++j) {
      if (outs[j].dtype != first[j].dtype || outs[j].shape != first[j].shape)
        unknown("scan output " + std::to_string(j - 1 - carried) + " changes between iterations");
    }
    if (k == 0) first = outs;
    ++trips;
    if (!outs[0].has_data || outs[0].data.size() != 1)
      unknown("whether the loop goes on depends on the body's data");
    if (outs[0].data[0] == 0) break;
  }
  for (size_t i = 0; i < carried; ++i)
    c.set(i, state[i].dtype, state[i].shape, state[i].has_data ? &state[i].data : nullptr);
  set_loop_scans(c, carried, first, trips);
}

// Loop: the body inferred with the iteration number, the condition and the carried values.
// A loop whose trip count M is known and short is followed iteration by iteration
// (loop_unrolled). Otherwise the body is inferred once with the iteration number's value
// unknown and the carried values' values dropped (they change every iteration): the final
// carried values are known when the body keeps each one's type and shape, and the scan
// outputs stack the items along a new first axis whose length is the trip count, known when
// M is and the body's condition output is known whatever the iteration (true: M
// iterations; false: one).
void loop_shape(ShapeContext& c) {
  if (c.num_inputs() < 2) unknown("Loop takes at least the inputs M and cond");
  const size_t carried = c.num_inputs() - 2;
  const bool limited = c.has_input(0);  // else the loop ends on its condition alone
  int64_t m = 0, cond = 1;
  const bool m_known = limited && known_scalar(c, 0, m);
  const bool cond_known = !c.has_input(1) || known_scalar(c, 1, cond);
  if ((m_known && m <= 0) || (cond_known && cond == 0)) return loop_without_trips(c, carried);
  if (m_known && cond_known && m <= kMaxUnrolledTrips) return loop_unrolled(c, carried, m);
  std::vector<ValueFacts> state;
  for (size_t i = 0; i < carried; ++i) state.push_back(known_facts(c.dtype(2 + i), c.shape(2 + i)));
  const std::vector<ValueFacts> outs =
      c.subgraph_outputs("body", loop_body_inputs(std::nullopt, state));
  if (outs.size() < 1 + carried || outs.size() - 1 < c.num_outputs())
    unknown("the body's outputs do not match the node's");
  for (size_t i = 0; i < carried; ++i) {
    if (outs[1 + i].dtype != state[i].dtype || outs[1 + i].shape != state[i].shape)
      unknown("carried value " + std::to_string(i) + " changes type or shape in the body");
    c.set(i, outs[1 + i].dtype, outs[1 + i].shape);
  }
  if (c.num_outputs() == carried) return;
  if (!cond_known) unknown("whether the loop starts is known only when run");
  const ValueFacts& go_on = outs[0];
  if (!go_on.has_data || go_on.data.size() != 1)
    unknown("the trip count depends on the body's data");
  if (go_on.data[0] != 0 && !limited) unknown("no trip count: the loop ends on its data");
  if (go_on.data[0] != 0 && !m_known) unknown("the trip count M is known only when run");
  set_loop_scans(c, carried, outs, go_on.data[0] != 0 ? m : 1);
}

// Scan (opset 9+): the body inferred on the initial states and one slice of each scan input
// (their values dropped: they change every iteration). The final states are known when the
// body keeps each state's type and shape; scan outputs stack the items along their axis.
void scan_shape(ShapeContext& c) {
  if (c.opset() < 9) unknown("opset 8 Scan's batch form");
  const int64_t m = c.attr_int("num_scan_inputs", 0);
  if (m < 1 || static_cast<size_t>(m) > c.num_inputs()) unknown("bad num_scan_inputs");
  const size_t scans = static_cast<size_t>(m), states = c.num_inputs() - scans;
  std::vector<int64_t> in_axes = c.attr_ints("scan_input_axes");
  if (in_axes.empty()) in_axes.assign(scans, 0);
  if (in_axes.size() != scans) unknown("scan_input_axes does not match the scan inputs");
  std::vector<ValueFacts> body_in;
  for (size_t i = 0; i < states; ++i) body_in.push_back(known_facts(c.dtype(i), c.shape(i)));
  int64_t length = -1;
  for (size_t j = 0; j < scans; ++j) {
    Shape slice = c.shape(states + j);
    const auto axis =
        static_cast<size_t>(normalize_axis(in_axes[j], static_cast<int64_t>(slice.size())));
    if (length >= 0 && slice[axis] != length) unknown("scan inputs differ in length");
    length = slice[axis];
    slice.erase(slice.begin() + static_cast<std::ptrdiff_t>(axis));
    body_in.push_back(known_facts(c.dtype(states + j), slice));
  }
  const std::vector<ValueFacts> outs = c.subgraph_outputs("body", body_in);
  if (outs.size() != c.num_outputs() || outs.size() < states)
    unknown("the body's outputs do not match the node's");
  for (size_t i = 0; i < states; ++i) {
    if (outs[i].dtype != body_in[i].dtype || outs[i].shape != body_in[i].shape)
      unknown("state " + std::to_string(i) + " changes type or shape in the body");
    c.set(i, outs[i].dtype, outs[i].shape);
  }
  std::vector<int64_t> out_axes = c.attr_ints("scan_output_axes");
  if (out_axes.empty()) out_axes.assign(outs.size() - states, 0);
  if (out_axes.size() != outs.size() - states) unknown("scan_output_axes does not match");
  for (size_t k = 0; k < out_axes.size(); ++k) {
    Shape shape = outs[states + k].shape;
    const auto axis =
        static_cast<size_t>(normalize_axis(out_axes[k], static_cast<int64_t>(shape.size()) + 1));
    shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(axis), length);
    c.set(states + k, outs[states + k].dtype, shape);
  }
}

// ---- Placement: each kernel's runs of its nested graphs, as it makes them ----

using Handle = Placement::Handle;

// The value of a known scalar input (a condition, a trip count); unknown() otherwise.
int64_t known_value(const Placement& p, size_t i, const char* what) {
  const ValueFacts& v = p.input(i);
  if (!v.has_data || v.data.size() != 1) unknown(std::string(what) + " is known only when run");
  return v.data[0];
}

// If runs the taken branch, captured values moved in at their last use, and its outputs are
// the branch's.
void if_place(Placement& p) {
  const bool cond = known_value(p, 0, "the condition") != 0;
  const std::vector<Handle> outs =
      p.run_subgraph(cond ? "then_branch" : "else_branch", {}, CaptureMode::MoveIfLastUse);
  for (size_t o = 0; o < outs.size(); ++o) p.set_output(o, outs[o]);
}

// Iterations a prediction follows at most (each infers the body once).
constexpr int64_t kMaxPredictedTrips = 4096;

// Loop: each iteration gets its number and condition as scalars made outside the plan and
// the carried values moved in; the condition and the scan items it returns go when the
// iteration ends (the items copied into stacked buffers, OpContext::allocate scratch).
void loop_place(Placement& p) {
  const ir::Node& node = p.node();
  const auto has = [&](size_t i) {
    return i < node.inputs.size() && node.inputs[i] != ir::kNoValue;
  };
  const int64_t max_trips = has(0) ? std::max<int64_t>(known_value(p, 0, "the trip count"), 0) : -1;
  bool cond = !has(1) || known_value(p, 1, "the condition") != 0;
  const size_t carried = node.inputs.size() - 2;
  std::vector<Handle> state;
  for (size_t i = 0; i < carried; ++i) state.push_back(p.take_input(2 + i));
  for (int64_t iter = 0; (max_trips < 0 || iter < max_trips) && cond; ++iter) {
    if (iter == kMaxPredictedTrips) unknown("too many iterations to follow");
    std::vector<Handle> in;
    in.push_back(p.make_unplanned(known_facts(DataType::Int64, {}, {iter}, true)));
    in.push_back(p.make_unplanned(known_facts(DataType::Bool, {}, {1}, true)));
    in.insert(in.end(), state.begin(), state.end());
    const std::vector<Handle> outs = p.run_subgraph("body", std::move(in), CaptureMode::Borrow);
    if (outs.size() < 1 + carried) unknown("the body has too few outputs");
    const ValueFacts& go_on = p.facts(outs[0]);
    if (!go_on.has_data || go_on.data.size() != 1)
      unknown("whether the loop goes on depends on the body's data");
    cond = go_on.data[0] != 0;
    for (size_t i = 0; i < carried; ++i) state[i] = outs[1 + i];
    p.drop(outs[0]);
    for (size_t k = 1 + carried; k < outs.size(); ++k) p.drop(outs[k]);
  }
  for (size_t i = 0; i < carried && i < node.outputs.size(); ++i) p.set_output(i, state[i]);
  for (size_t o = carried; o < node.outputs.size(); ++o)
    if (node.outputs[o] != ir::kNoValue) p.set_output(o, p.make_unplanned(p.output(o)));
}

// Scan (opset 9+): the states taken, the scan inputs held by the kernel, and each iteration
// gets the states moved in and a view of one slice of each scan input; the items it returns
// go when the iteration ends (copied into stacked buffers outside the plan).
void scan_place(Placement& p) {
  const ir::Node& node = p.node();
  if (node.opset < 9) unknown("opset 8 Scan's batch form");
  const ir::Attribute* m = node.attr("num_scan_inputs");
  const size_t scans = m ? static_cast<size_t>(std::max<int64_t>(m->i, 0)) : 0;
  if (scans < 1 || scans > node.inputs.size()) unknown("bad num_scan_inputs");
  const size_t states = node.inputs.size() - scans;
  const ir::Attribute* axes_attr = node.attr("scan_input_axes");
  const ir::Attribute* dirs_attr = node.attr("scan_input_directions");
  std::vector<int64_t> axes(scans, 0), dirs(scans, 0);
  if (axes_attr && axes_attr->ints.size() == scans) axes = axes_attr->ints;
  if (dirs_attr && dirs_attr->ints.size() == scans) dirs = dirs_attr->ints;
  std::vector<Handle> state, xs;
  for (size_t i = 0; i < states; ++i) state.push_back(p.take_input(i));
  int64_t length = -1;
  for (size_t j = 0; j < scans; ++j) {
    xs.push_back(p.share_input(states + j));
    const Shape& shape = p.facts(xs[j]).shape;
    axes[j] = normalize_axis(axes[j], static_cast<int64_t>(shape.size()));
    length = shape[static_cast<size_t>(axes[j])];
  }
  for (int64_t t = 0; t < length; ++t) {
    std::vector<Handle> in = state;
    for (size_t j = 0; j < scans; ++j) {
      const int64_t at = dirs[j] != 0 ? length - 1 - t : t;
      const auto axis = static_cast<size_t>(axes[j]);
      ValueFacts slice = known_facts(p.facts(xs[j]).dtype, p.facts(xs[j]).shape);
      Shape strides = p.strides_of(xs[j]);
      const bool at_start = at * strides[axis] == 0;
      slice.shape.erase(slice.shape.begin() + static_cast<std::ptrdiff_t>(axis));
      strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(axis));
      in.push_back(p.view_of(xs[j], slice, strides, at_start));
    }
    const std::vector<Handle> outs = p.run_subgraph("body", std::move(in), CaptureMode::Borrow);
    if (outs.size() < states) unknown("the body has too few outputs");
    for (size_t i = 0; i < states; ++i) state[i] = outs[i];
    for (size_t k = states; k < outs.size(); ++k) p.drop(outs[k]);
  }
  for (size_t i = 0; i < states && i < node.outputs.size(); ++i) p.set_output(i, state[i]);
  for (size_t o = states; o < node.outputs.size(); ++o)
    if (node.outputs[o] != ir::kNoValue) p.set_output(o, p.make_unplanned(p.output(o)));
}

}  // namespace

KILN_REGISTER_OP({.op = "If",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .strided_inputs = true,
                  .types = "any (branches may differ in shape)",
                  .shape = if_shape,
                  .place = if_place,
                  .create = make<If>});
// Loop-carried initial values (inputs 2..) move into the first iteration when owned.
KILN_REGISTER_OP({.op = "Loop",
                  .since = 1,
                  .min_inputs = 2,
                  .in_place = ~3u,
                  .strided_inputs = true,
                  .types = "any",
                  .shape = loop_shape,
                  .place = loop_place,
                  .create = make<Loop>});
KILN_REGISTER_OP({.op = "Scan",
                  .since = 8,
                  .min_inputs = 1,
                  .in_place = ~0u,
                  .strided_inputs = true,
                  .types = "any",
                  .shape = scan_shape,
                  .place = scan_place,
                  .create = make<Scan>});

}  // namespace kiln::ops
