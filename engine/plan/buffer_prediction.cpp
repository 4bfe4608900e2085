#include "engine/plan/buffer_prediction.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "ops/core/kernel.h"

namespace kiln::plan {

namespace {

using Handle = ops::Placement::Handle;
constexpr Handle kNone = -1;

size_t idx(ir::ValueId id) {
  return static_cast<size_t>(id);
}

// Why a run cannot be predicted: the node, and what was missing.
struct Unpredictable {
  std::string why;
};

bool is_contiguous(const Shape& shape, const Shape& strides) {
  if (strides.empty()) return true;
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

// A storage as the executor's tensors share it: one of the run's planned pool requests, or
// memory outside the plan (weights, the caller's inputs, the executor's contiguous copies,
// kernels' scratch and scalars).
struct Store {
  int32_t request = -1;   // index in BufferPrediction::buffers; -1: outside the plan
  bool writable = false;  // a kernel may write over it (the storage test of can_overwrite)
  int32_t holders = 0;    // live references: the storage's use count
};

// One reference to a value, as a Value in a frame slot, a step's output or a kernel's local.
struct Ref {
  int32_t store = 0;
  ops::ValueFacts facts;
  Shape strides;  // empty: contiguous
  bool at_start = true;
  bool live = false;
};

// One graph run in progress: the executor's frame.
struct Frame {
  const GraphPlan& plan;
  std::vector<ops::ValueFacts> values;  // this run's inferred values, per ir::ValueId
  std::vector<Handle> slots;            // per value
  std::vector<int32_t> uses;            // reads left, per value
  std::vector<Handle> unread;           // the previous step's outputs that nothing reads
  std::vector<Handle> groups;           // the Concat groups' buffers while held (root graph)
  bool groups_apply = false;
};

// Replays a run as the executor makes it, on references instead of tensors: each storage
// counts its references, and a planned buffer is released at the step its last one goes.
// Steps are numbered as the executor numbers them, nested graphs' steps included.
class Simulation {
 public:
  static constexpr int32_t kReadOnly = 0;  // weights, and inputs the caller keeps

  Simulation(BufferPrediction& r, int threads) : r_(r), threads_(threads) {
    stores_.push_back({-1, false, 0});
  }

  int32_t now() const { return now_; }
  const Ref& ref(Handle h) const { return refs_[static_cast<size_t>(h)]; }
  const Store& store_of(Handle h) const { return stores_[static_cast<size_t>(ref(h).store)]; }
  uint64_t request_bytes(int32_t request) const {
    return r_.buffers[static_cast<size_t>(request)].bytes;
  }

  int32_t unplanned() {
    stores_.push_back({-1, true, 0});
    return static_cast<int32_t>(stores_.size() - 1);
  }
  int32_t request(uint64_t bytes) {
    r_.buffers.push_back({bytes, now_, -1});
    stores_.push_back({static_cast<int32_t>(r_.buffers.size() - 1), true, 0});
    return static_cast<int32_t>(stores_.size() - 1);
  }
  // A workspace: requested after the step's outputs, released when the kernel returns.
  void workspace(uint64_t bytes) { r_.buffers.push_back({bytes, now_, now_}); }

  Handle hold(int32_t store, ops::ValueFacts facts, Shape strides, bool at_start) {
    if (!strides.empty() && is_contiguous(facts.shape, strides)) strides.clear();
    refs_.push_back({store, std::move(facts), std::move(strides), at_start, true});
    ++stores_[static_cast<size_t>(store)].holders;
    return static_cast<Handle>(refs_.size() - 1);
  }
  Handle share(Handle h) {
    const Ref r = ref(h);
    return hold(r.store, r.facts, r.strides, r.at_start);
  }
  void drop(Handle h) {
    if (h == kNone || !ref(h).live) return;
    Ref& r = refs_[static_cast<size_t>(h)];
    r.live = false;
    Store& s = stores_[static_cast<size_t>(r.store)];
    if (--s.holders == 0 && s.request >= 0) r_.buffers[static_cast<size_t>(s.request)].last = now_;
  }
  // The executor's uniquely_owned: a writable storage referenced by this handle alone.
  bool sole(Handle h) const {
    const Store& s = store_of(h);
    return s.writable && s.holders == 1;
  }

  // Runs `plan` on `inputs` and `captures` (moved in); returns its outputs' handles.
  std::vector<Handle> run(const GraphPlan& plan, std::vector<ops::ValueFacts> values,
                          const std::vector<Handle>& inputs, const std::vector<Handle>& captures);

 private:
  void run_step(Frame& f, const Step& step);
  void release_use(Frame& f, ir::ValueId id);

  BufferPrediction& r_;
  int threads_;
  std::vector<Store> stores_;
  std::vector<Ref> refs_;
  int32_t now_ = 0;
};

// One step's placement rule at work on the simulation.
class StepPlacement final : public ops::Placement {
 public:
  StepPlacement(Simulation& sim, Frame& f, const Step& step, std::vector<Handle> in,
                std::vector<bool> temporary)
      : sim_(sim),
        f_(f),
        step_(step),
        node_(*step.node),
        in_(std::move(in)),
        temporary_(std::move(temporary)),
        taken_(in_.size(), false),
        outs_(node_.outputs.size(), kNone) {}

  const ir::Node& node() const override { return node_; }
  const ops::ValueFacts& input(size_t i) const override {
    return in_.at(i) == kNone ? missing_ : sim_.ref(in_[i]).facts;
  }
  const ops::ValueFacts& output(size_t o) const override {
    const ir::ValueId id = node_.outputs.at(o);
    return id == ir::kNoValue ? missing_ : f_.values[idx(id)];
  }
  Shape strides(size_t i) const override { return strides_of(present(i)); }
  bool contiguous(size_t i) const override {
    return is_contiguous(input(i).shape, sim_.ref(present(i)).strides);
  }
  uint64_t room(size_t i) const override {
    const Ref& r = sim_.ref(present(i));
    const int32_t request = sim_.store_of(in_[i]).request;
    return request >= 0 && r.at_start ? sim_.request_bytes(request) : 0;
  }

  // ExecutionHooks::can_overwrite: the input's storage is writable and held by its handle
  // alone, and it is read for the last time here (or is the executor's contiguous copy).
  bool writable(size_t i) const override {
    if (i >= 32 || !(step_.op->in_place & (1u << i)) || i >= in_.size() || in_[i] == kNone ||
        taken_[i]) {
      return false;
    }
    if (!sim_.sole(in_[i])) return false;
    return temporary_[i] || f_.uses[idx(node_.inputs[i])] == 1;
  }

  void view(size_t o, size_t i, Shape strides, bool at_start) override {
    if (!produced(o)) return;
    const Ref& of = sim_.ref(present(i));
    set(o, sim_.hold(of.store, output(o), std::move(strides), of.at_start && at_start));
  }

  void allocate(size_t o) override {
    if (!produced(o)) return;
    const ops::ValueFacts& v = output(o);
    // The window of a Concat group kept for it (the executor's allocate_output).
    if (const OutputSlot* slot = output_slot(step_, o, v.dtype, v.shape)) {
      const Handle group = f_.groups[static_cast<size_t>(slot->group)];
      if (group != kNone) {
        set(o, sim_.hold(sim_.ref(group).store, v, {}, slot->byte_offset == 0));
        return;
      }
    }
    const int32_t store = v.dtype == DataType::String
                              ? sim_.unplanned()
                              : sim_.request(storage_bytes(v.dtype, shape_numel(v.shape)));
    set(o, sim_.hold(store, v, {}, true));
  }

  void reuse_or_allocate(size_t o, uint32_t candidates) override {
    if (!produced(o)) return;
    const ops::ValueFacts& out = output(o);
    for (size_t i = 0; i < node_.inputs.size() && i < 32; ++i) {
      if (!(candidates & (1u << i)) || node_.inputs[i] == ir::kNoValue) continue;
      const ops::ValueFacts& x = input(i);
      if (x.dtype != out.dtype || x.shape != out.shape || !writable(i)) continue;
      if (!contiguous(i)) break;  // the kernel allocates then
      view(o, i, {}, true);
      return;
    }
    allocate(o);
  }

  Handle take_input(size_t i) override {
    if (!writable(i)) return share_input(i);
    taken_[i] = true;
    if (!temporary_[i]) f_.slots[idx(node_.inputs[i])] = kNone;
    held_.push_back(in_[i]);
    return in_[i];
  }
  Handle share_input(size_t i) override { return keep(sim_.share(present(i))); }
  Handle view_of(Handle of, ops::ValueFacts facts, Shape strides, bool at_start) override {
    const Ref& r = sim_.ref(of);
    return keep(sim_.hold(r.store, std::move(facts), std::move(strides), r.at_start && at_start));
  }
  Handle make_unplanned(ops::ValueFacts facts) override {
    return keep(sim_.hold(sim_.unplanned(), std::move(facts), {}, true));
  }
  const ops::ValueFacts& facts(Handle h) const override { return sim_.ref(h).facts; }
  Shape strides_of(Handle h) const override {
    const Ref& r = sim_.ref(h);
    return r.strides.empty() ? contiguous_strides(r.facts.shape) : r.strides;
  }

  std::vector<Handle> run_subgraph(const char* name, std::vector<Handle> inputs,
                                   ops::CaptureMode mode) override;

  void drop(Handle h) override {
    release(h);
    sim_.drop(h);
  }
  void set_output(size_t o, Handle h) override {
    release(h);
    set(o, h);
  }

  // The kernel returns: its locals go, and its outputs are what it set.
  std::vector<Handle> finish() {
    for (Handle h : held_) sim_.drop(h);
    held_.clear();
    return std::move(outs_);
  }
  bool taken(size_t i) const { return taken_[i]; }

 private:
  // Input i's handle; unknown() when the node omits it (a rule asking for it fails the
  // prediction, as the kernel would fail the run).
  Handle present(size_t i) const {
    if (i >= in_.size() || in_[i] == kNone)
      ops::unknown("input " + std::to_string(i) + " is missing");
    return in_[i];
  }
  bool produced(size_t o) const {
    return o < node_.outputs.size() && node_.outputs[o] != ir::kNoValue;
  }
  void set(size_t o, Handle h) {
    if (o >= outs_.size()) {
      sim_.drop(h);
      return;
    }
    sim_.drop(outs_[o]);  // replaced, as OpContext::set_output replaces it
    outs_[o] = h;
  }
  Handle keep(Handle h) {
    held_.push_back(h);
    return h;
  }
  // The rule gives `h` on (to a nested run or as an output): no longer the kernel's local.
  void release(Handle h) {
    auto it = std::find(held_.begin(), held_.end(), h);
    if (it != held_.end()) held_.erase(it);
  }

  Simulation& sim_;
  Frame& f_;
  const Step& step_;
  const ir::Node& node_;
  std::vector<Handle> in_;
  const std::vector<bool> temporary_;
  std::vector<bool> taken_;
  std::vector<Handle> outs_;
  std::vector<Handle> held_;  // the kernel's locals
  const ops::ValueFacts missing_;
};

std::vector<Handle> StepPlacement::run_subgraph(const char* name, std::vector<Handle> inputs,
                                                ops::CaptureMode mode) {
  const std::vector<const ir::Attribute*> graphs = node_.graph_attributes();
  size_t index = 0;
  while (index < graphs.size() && graphs[index]->name != name) ++index;
  if (index >= graphs.size() || index >= step_.subgraphs.size())
    ops::unknown(std::string("no graph '") + name + "'");
  const GraphPlan& plan = *step_.subgraphs[index];
  std::vector<ops::ValueFacts> in_facts, captured_facts;
  for (Handle h : inputs) {
    release(h);
    in_facts.push_back(h == kNone ? ops::ValueFacts{} : sim_.ref(h).facts);
  }
  // Captures enter as the executor passes them: moved when this node is an owned value's
  // last reader and the mode allows, else shared.
  std::vector<Handle> captures;
  for (int32_t slot : step_.capture_slots[index]) {
    const ir::ValueId id = node_.implicit_inputs[static_cast<size_t>(slot)];
    const Handle h = f_.slots[idx(id)];
    if (h == kNone) ops::unknown("captured value '" + f_.plan.graph->value(id).name + "' is gone");
    if (mode == ops::CaptureMode::MoveIfLastUse && f_.uses[idx(id)] == 1 && sim_.sole(h)) {
      captures.push_back(h);
      f_.slots[idx(id)] = kNone;
    } else {
      captures.push_back(sim_.share(h));
    }
    captured_facts.push_back(sim_.ref(captures.back()).facts);
  }
  std::vector<int32_t> order;
  for (const Step& s : plan.steps) order.push_back(s.node_index);
  ShapeInference inferred = infer_shapes(*plan.graph, order, in_facts, captured_facts);
  if (!inferred.first_unknown.empty())
    ops::unknown(std::string(name) + ": " + inferred.first_unknown);
  std::vector<Handle> outs = sim_.run(plan, std::move(inferred.values), inputs, captures);
  held_.insert(held_.end(), outs.begin(), outs.end());
  return outs;
}

std::vector<Handle> Simulation::run(const GraphPlan& plan, std::vector<ops::ValueFacts> values,
                                    const std::vector<Handle>& inputs,
                                    const std::vector<Handle>& captures) {
  const ir::Graph& g = *plan.graph;
  Frame f{
      plan, std::move(values), std::vector<Handle>(g.values.size(), kNone), plan.use_counts, {}, {},
      false};
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ir::ValueId id = g.inputs[i];
    Handle h = i < inputs.size() ? inputs[i] : kNone;
    if (h == kNone && g.value(id).constant.defined())
      h = hold(kReadOnly, f.values[idx(id)], {}, true);
    f.slots[idx(id)] = h;
    if (f.uses[idx(id)] == 0) {  // never read: freed at once
      drop(h);
      f.slots[idx(id)] = kNone;
    }
  }
  for (ir::ValueId id : g.initializers)
    f.slots[idx(id)] = hold(kReadOnly, f.values[idx(id)], {}, true);
  for (size_t k = 0; k < g.captures.size() && k < captures.size(); ++k)
    f.slots[idx(g.captures[k])] = captures[k];
  // The Concat groups apply when the inputs have the shapes they were formed for.
  f.groups.assign(plan.concat_groups.size(), kNone);
  f.groups_apply = !plan.concat_groups.empty();
  for (size_t i = 0; f.groups_apply && i < g.inputs.size(); ++i) {
    const Handle h = f.slots[idx(g.inputs[i])];
    if (h != kNone) f.groups_apply = matches_hint(plan, i, ref(h).facts.dtype, ref(h).facts.shape);
  }
  for (const Step& step : plan.steps) run_step(f, step);
  std::vector<Handle> results;
  for (ir::ValueId id : g.outputs) {
    const Handle h = f.slots[idx(id)];
    if (h == kNone) throw Unpredictable{"graph output '" + g.value(id).name + "' has no value"};
    if (--f.uses[idx(id)] == 0) {
      results.push_back(h);
      f.slots[idx(id)] = kNone;
    } else {
      results.push_back(share(h));
    }
  }
  // The frame is cleared when the run ends: what is left goes at the last step.
  for (Handle h : f.slots) drop(h);
  for (Handle h : f.unread) drop(h);
  return results;
}

void Simulation::release_use(Frame& f, ir::ValueId id) {
  if (id == ir::kNoValue || --f.uses[idx(id)] != 0) return;
  if (f.plan.graph->value(id).origin == ir::ValueOrigin::Initializer) return;  // stays bound
  drop(f.slots[idx(id)]);
  f.slots[idx(id)] = kNone;
}

void Simulation::run_step(Frame& f, const Step& step) {
  const ir::Node& node = *step.node;
  const ir::Graph& g = *f.plan.graph;
  ++now_;
  for (Handle h : f.unread) drop(h);  // cleared when the next step starts
  f.unread.clear();
  for (int32_t k : step.groups_begin) {
    if (!f.groups_apply) break;
    const ConcatGroup& group = f.plan.concat_groups[static_cast<size_t>(k)];
    const ops::ValueFacts facts = ops::known_facts(group.dtype, Shape{group.elements});
    f.groups[static_cast<size_t>(k)] =
        hold(request(storage_bytes(group.dtype, group.elements)), facts, {}, true);
  }
  for (ir::ValueId id : node.outputs) {
    if (id != ir::kNoValue && !f.values[idx(id)].known)
      throw Unpredictable{node.label() + ": output '" + g.value(id).name +
                          "' has no inferred shape"};
  }
  std::vector<Handle> in(node.inputs.size(), kNone);
  std::vector<bool> temporary(node.inputs.size(), false);
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ir::ValueId id = node.inputs[i];
    if (id == ir::kNoValue) continue;
    const Handle h = f.slots[idx(id)];
    if (h == kNone || !ref(h).facts.known)
      throw Unpredictable{node.label() + ": input '" + g.value(id).name +
                          "' has no inferred shape"};
    in[i] = h;
    if (!step.op->strided_inputs && !is_contiguous(ref(h).facts.shape, ref(h).strides)) {
      in[i] = hold(unplanned(), ref(h).facts, {}, true);  // copied outside the pool
      temporary[i] = true;
    }
  }
  StepPlacement placement(*this, f, step, in, temporary);
  try {
    if (step.op->place) {
      step.op->place(placement);
    } else if (!step.subgraphs.empty()) {
      throw Unpredictable{node.label() + ": runs nested graphs without a placement rule"};
    } else {
      placement.reuse_or_allocate(0, step.op->in_place);
      for (size_t o = 1; o < node.outputs.size(); ++o) placement.allocate(o);
    }
    // The kernel's workspace: requested after its outputs, released when it returns. A rule
    // that fails (as shape rules may, on attributes the kernel rejects) leaves the run to be
    // recorded, as an unknown shape does.
    if (step.op->workspace) {
      ops::ShapeContext c(g, node, static_cast<const std::vector<ops::ValueFacts>&>(f.values));
      c.set_threads(threads_);
      const uint64_t bytes = step.op->workspace(c);
      if (bytes > 0) workspace(bytes);
    }
  } catch (const ops::UnknownFacts& u) {
    throw Unpredictable{node.label() + ": " + u.why};
  } catch (const Unpredictable&) {
    throw;
  } catch (const std::exception& e) {
    throw Unpredictable{node.label() + ": " + e.what()};
  }
  const std::vector<Handle> outs = placement.finish();
  for (size_t i = 0; i < in.size(); ++i)
    if (temporary[i] && !placement.taken(i)) drop(in[i]);
  for (ir::ValueId id : node.inputs) release_use(f, id);
  for (ir::ValueId id : node.implicit_inputs) release_use(f, id);
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const ir::ValueId id = node.outputs[o];
    if (id != ir::kNoValue && outs[o] == kNone)
      throw Unpredictable{node.label() + ": produces no value for '" + g.value(id).name + "'"};
    if (id != ir::kNoValue && f.uses[idx(id)] > 0) {
      f.slots[idx(id)] = outs[o];
    } else if (outs[o] != kNone) {
      f.unread.push_back(outs[o]);
    }
  }
  for (int32_t k : step.groups_end) {
    drop(f.groups[static_cast<size_t>(k)]);
    f.groups[static_cast<size_t>(k)] = kNone;
  }
}

}  // namespace

BufferPrediction predict_buffers(const GraphPlan& plan, const std::vector<ops::ValueFacts>& values,
                                 const std::vector<bool>& owned_inputs, int threads) {
  const ir::Graph& g = *plan.graph;
  BufferPrediction r;
  try {
    Simulation sim(r, threads);
    std::vector<Handle> inputs;
    for (size_t i = 0; i < g.inputs.size(); ++i) {
      const bool owned = i < owned_inputs.size() && owned_inputs[i];
      inputs.push_back(sim.hold(owned ? sim.unplanned() : Simulation::kReadOnly,
                                values[idx(g.inputs[i])], {}, true));
    }
    sim.run(plan, values, inputs, {});  // the outputs go to the caller: never released
    r.complete = true;
  } catch (const Unpredictable& u) {
    r.why = u.why;
    r.buffers.clear();
  }
  return r;
}

}  // namespace kiln::plan
