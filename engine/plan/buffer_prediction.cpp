#include "engine/plan/buffer_prediction.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "ops/kernel.h"

namespace kiln::plan {

namespace {

// A value's place: the predicted pool buffer it lives in (-1: none of this run's, such as a
// weight, a graph input or a copy made outside the pool) and its strides (empty:
// contiguous).
struct Place {
  int32_t buffer = -1;
  Shape strides;
  bool temporary = false;    // the executor's contiguous copy for this step
  bool at_start = true;      // the view starts where the buffer does
  bool owned_input = false;  // a graph input the run owns alone (outside the pool's buffers)
};

Shape strides_of(const Place& p, const Shape& shape) {
  return p.strides.empty() ? contiguous_strides(shape) : p.strides;
}

bool is_contiguous(const Shape& shape, const Shape& strides) {
  if (strides.empty()) return true;
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

// The state of one prediction, shared by the steps' placements.
struct Prediction {
  const std::vector<InferredValue>& values;
  BufferPrediction& r;
  std::vector<int32_t> last_read, produced;       // per value: the steps that read it last, made it
  std::vector<bool> outlives;                     // per value: handed to the caller
  std::vector<Place> place;                       // per value
  std::vector<std::vector<ir::ValueId>> members;  // per buffer: the values viewing it

  // The step at which a value's handle is dropped (-1: handed to the caller). A value never
  // read stays in the step's outputs until the next step starts.
  int32_t death(ir::ValueId id) const {
    const auto v = static_cast<size_t>(id);
    if (outlives[v]) return -1;
    return last_read[v] > 0 ? last_read[v] : produced[v] + 1;
  }
};

// One step's placement rule at work: views and fresh buffers recorded in the prediction.
class StepPlacement final : public ops::Placement {
 public:
  StepPlacement(Prediction& p, const Step& step, std::vector<Place> in, int32_t now)
      : p_(p), node_(*step.node), in_place_(step.op->in_place), in_(std::move(in)), now_(now) {}

  const ir::Node& node() const override { return node_; }
  const ops::ValueFacts& input(size_t i) const override {
    return p_.values[static_cast<size_t>(node_.inputs.at(i))];
  }
  const ops::ValueFacts& output(size_t o) const override {
    return p_.values[static_cast<size_t>(node_.outputs.at(o))];
  }
  Shape strides(size_t i) const override { return strides_of(in_[i], input(i).shape); }
  bool contiguous(size_t i) const override { return is_contiguous(input(i).shape, in_[i].strides); }
  uint64_t room(size_t i) const override {
    const int32_t b = in_[i].buffer;
    return b >= 0 && in_[i].at_start ? p_.r.buffers[static_cast<size_t>(b)].bytes : 0;
  }

  // ExecutionHooks::can_overwrite: the input is owned by the run, read for the last time
  // here, and no other live handle shares its storage.
  bool writable(size_t i) const override {
    if (i >= 32 || !(in_place_ & (1u << i)) || i >= node_.inputs.size() ||
        node_.inputs[i] == ir::kNoValue) {
      return false;
    }
    if (in_[i].temporary) return true;
    const int32_t b = in_[i].buffer;
    const ir::ValueId id = node_.inputs[i];
    if ((b < 0 && !in_[i].owned_input) || p_.last_read[static_cast<size_t>(id)] != now_ ||
        p_.outlives[static_cast<size_t>(id)]) {
      return false;
    }
    if (std::count(node_.inputs.begin(), node_.inputs.end(), id) != 1) return false;
    if (b < 0) return true;  // an owned graph input: its only handle is this one
    for (ir::ValueId m : p_.members[static_cast<size_t>(b)]) {
      if (m == id) continue;
      const int32_t d = p_.death(m);
      if (d < 0 || d >= now_) return false;  // another handle on the storage is alive
    }
    return true;
  }

  void view(size_t o, size_t i, Shape strides, bool at_start) override {
    if (o >= node_.outputs.size() || node_.outputs[o] == ir::kNoValue) return;
    const ir::ValueId id = node_.outputs[o];
    const Place& of = in_.at(i);
    if (!strides.empty() && is_contiguous(output(o).shape, strides)) strides.clear();
    p_.place[static_cast<size_t>(id)] =
        Place{of.buffer, std::move(strides), false, of.at_start && at_start};
    if (of.buffer >= 0) p_.members[static_cast<size_t>(of.buffer)].push_back(id);
  }

  void allocate(size_t o) override {
    if (o >= node_.outputs.size() || node_.outputs[o] == ir::kNoValue) return;
    const ir::ValueId id = node_.outputs[o];
    const InferredValue& v = output(o);
    if (v.dtype == DataType::String) {
      p_.place[static_cast<size_t>(id)] = Place{};
      return;
    }
    const auto buffer = static_cast<int32_t>(p_.r.buffers.size());
    p_.r.buffers.push_back({storage_bytes(v.dtype, shape_numel(v.shape)), now_, -1});
    p_.members.push_back({id});
    p_.place[static_cast<size_t>(id)] = Place{buffer, {}, false, true};
  }

  void reuse_or_allocate(size_t o, uint32_t candidates) override {
    if (o >= node_.outputs.size() || node_.outputs[o] == ir::kNoValue) return;
    const InferredValue& out = output(o);
    for (size_t i = 0; i < node_.inputs.size() && i < 32; ++i) {
      if (!(candidates & (1u << i)) || node_.inputs[i] == ir::kNoValue) continue;
      const InferredValue& x = input(i);
      if (x.dtype != out.dtype || x.shape != out.shape || !writable(i)) continue;
      if (!contiguous(i)) break;  // the kernel allocates then
      view(o, i, {}, true);
      return;
    }
    allocate(o);
  }

 private:
  Prediction& p_;
  const ir::Node& node_;
  const uint32_t in_place_;  // the inputs the kernel may overwrite (OpRegistration::in_place)
  const std::vector<Place> in_;
  const int32_t now_;
};

}  // namespace

BufferPrediction predict_buffers(const GraphPlan& plan, const std::vector<InferredValue>& values,
                                 const std::vector<bool>& owned_inputs) {
  const ir::Graph& g = *plan.graph;
  const size_t nv = g.values.size();
  BufferPrediction r;
  Prediction p{values,
               r,
               std::vector<int32_t>(nv, 0),
               std::vector<int32_t>(nv, 0),
               std::vector<bool>(nv, false),
               std::vector<Place>(nv),
               {}};
  for (ir::ValueId id : g.outputs) p.outlives[static_cast<size_t>(id)] = true;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const ir::Node& n = *plan.steps[s].node;
    if (!plan.steps[s].subgraphs.empty()) {
      r.why = n.label() + ": has nested graphs";
      return r;
    }
    for (ir::ValueId id : n.inputs)
      if (id != ir::kNoValue) p.last_read[static_cast<size_t>(id)] = static_cast<int32_t>(s + 1);
  }
  for (size_t i = 0; i < owned_inputs.size() && i < g.inputs.size(); ++i)
    p.place[static_cast<size_t>(g.inputs[i])].owned_input = owned_inputs[i];
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const Step& step = plan.steps[s];
    const ir::Node& node = *step.node;
    const auto now = static_cast<int32_t>(s + 1);
    for (ir::ValueId id : node.outputs) {
      if (id != ir::kNoValue && !values[static_cast<size_t>(id)].known) {
        r.why = node.label() + ": output '" + g.value(id).name + "' has no inferred shape";
        return r;
      }
    }
    std::vector<Place> in(node.inputs.size());
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ir::ValueId id = node.inputs[i];
      if (id == ir::kNoValue) continue;
      const InferredValue& v = values[static_cast<size_t>(id)];
      if (!v.known) {
        r.why = node.label() + ": input '" + g.value(id).name + "' has no inferred shape";
        return r;
      }
      in[i] = p.place[static_cast<size_t>(id)];
      if (!step.op->strided_inputs && !is_contiguous(v.shape, in[i].strides)) {
        in[i] = Place{-1, {}, true, true};  // copied outside the pool before the kernel runs
      }
    }
    StepPlacement placement(p, step, std::move(in), now);
    if (step.op->place) {
      step.op->place(placement);
    } else {
      placement.reuse_or_allocate(0, step.op->in_place);
      for (size_t o = 1; o < node.outputs.size(); ++o) placement.allocate(o);
    }
    // The kernel's workspace: requested after its outputs, released when it returns. A rule
    // that fails (as shape rules may, on attributes the kernel rejects) leaves the run to be
    // recorded, as an unknown shape does.
    if (step.op->workspace) {
      uint64_t bytes = 0;
      try {
        bytes = step.op->workspace(ops::ShapeContext(g, node, values));
      } catch (const ops::UnknownFacts& u) {
        r.why = node.label() + ": workspace: " + u.why;
        return r;
      } catch (const std::exception& e) {
        r.why = node.label() + ": workspace: " + e.what();
        return r;
      }
      if (bytes > 0) {
        r.buffers.push_back({bytes, now, now});
        p.members.emplace_back();  // no value views it
      }
    }
    for (ir::ValueId id : node.outputs)
      if (id != ir::kNoValue) p.produced[static_cast<size_t>(id)] = now;
  }
  for (size_t b = 0; b < r.buffers.size(); ++b) {
    if (p.members[b].empty()) continue;  // a workspace: released at its own step
    int32_t last = 0;
    for (ir::ValueId m : p.members[b]) {
      const int32_t d = p.death(m);
      if (d < 0) {
        last = -1;
        break;
      }
      last = std::max(last, d);
    }
    r.buffers[b].last = last;
  }
  r.complete = true;
  return r;
}

}  // namespace kiln::plan
