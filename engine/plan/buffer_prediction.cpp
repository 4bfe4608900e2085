#include "engine/plan/buffer_prediction.h"

#include <algorithm>

namespace kiln::plan {

namespace {

// A value's place: the predicted pool buffer it lives in (-1: none of this run's, such as a
// weight, a graph input or a copy made outside the pool) and its strides (empty:
// contiguous).
struct Place {
  int32_t buffer = -1;
  Shape strides;
  bool temporary = false;  // the executor's contiguous copy for this step
  bool at_start = true;    // the view starts where the buffer does
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

// Strides of a view that only adds or drops unit dimensions (Squeeze, Unsqueeze).
Shape unit_dims_view(const Shape& in, const Shape& in_strides, const Shape& out) {
  if (in_strides.empty()) return {};
  Shape strides(out.size(), 1);
  size_t j = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k] == 1) continue;
    while (j < in.size() && in[j] == 1) ++j;
    if (j < in.size()) strides[k] = in_strides[j++];
  }
  return strides;
}

std::vector<int64_t> known_ints(const std::vector<InferredValue>& values, const ir::Node& node,
                                size_t i) {
  if (i >= node.inputs.size() || node.inputs[i] == ir::kNoValue) return {};
  return values[static_cast<size_t>(node.inputs[i])].data;
}

}  // namespace

BufferPrediction predict_buffers(const GraphPlan& plan, const std::vector<InferredValue>& values) {
  const ir::Graph& g = *plan.graph;
  BufferPrediction r;
  const size_t nv = g.values.size();
  std::vector<int32_t> last_read(nv, 0), produced(nv, 0);
  std::vector<bool> outlives(nv, false);
  for (ir::ValueId id : g.outputs) outlives[static_cast<size_t>(id)] = true;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const ir::Node& n = *plan.steps[s].node;
    if (!plan.steps[s].subgraphs.empty()) {
      r.why = n.label() + ": has nested graphs";
      return r;
    }
    for (ir::ValueId id : n.inputs)
      if (id != ir::kNoValue) last_read[static_cast<size_t>(id)] = static_cast<int32_t>(s + 1);
  }
  // The step at which a value's handle is dropped (-1: handed to the caller). A value never
  // read stays in the step's outputs until the next step starts.
  auto death = [&](ir::ValueId id) -> int32_t {
    const auto v = static_cast<size_t>(id);
    if (outlives[v]) return -1;
    return last_read[v] > 0 ? last_read[v] : produced[v] + 1;
  };

  std::vector<Place> place(nv);
  std::vector<std::vector<ir::ValueId>> members;  // per buffer: the values viewing it
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
      in[i] = place[static_cast<size_t>(id)];
      if (!step.op->strided_inputs && !is_contiguous(v.shape, in[i].strides)) {
        in[i] = Place{-1, {}, true, true};  // copied outside the pool before the kernel runs
      }
    }
    auto out_value = [&](size_t o) -> const InferredValue& {
      return values[static_cast<size_t>(node.outputs[o])];
    };
    auto in_value = [&](size_t i) -> const InferredValue& {
      return values[static_cast<size_t>(node.inputs[i])];
    };
    auto view = [&](size_t o, const Place& of, Shape strides, bool at_start = true) {
      const ir::ValueId id = node.outputs[o];
      if (id == ir::kNoValue) return;
      place[static_cast<size_t>(id)] =
          Place{of.buffer, std::move(strides), false, of.at_start && at_start};
      if (of.buffer >= 0) members[static_cast<size_t>(of.buffer)].push_back(id);
    };
    auto allocate = [&](size_t o) {
      const ir::ValueId id = node.outputs[o];
      if (id == ir::kNoValue) return;
      const InferredValue& v = values[static_cast<size_t>(id)];
      if (v.dtype == DataType::String) {
        place[static_cast<size_t>(id)] = Place{};
        return;
      }
      const auto buffer = static_cast<int32_t>(r.buffers.size());
      r.buffers.push_back({storage_bytes(v.dtype, shape_numel(v.shape)), now, -1});
      members.push_back({id});
      place[static_cast<size_t>(id)] = Place{buffer, {}, false, true};
    };
    // May the kernel write its output over input i (ExecutionHooks::can_overwrite)?
    auto writable = [&](size_t i) {
      if (i >= 32 || !(step.op->in_place & (1u << i)) || i >= node.inputs.size() ||
          node.inputs[i] == ir::kNoValue) {
        return false;
      }
      if (in[i].temporary) return true;
      const int32_t b = in[i].buffer;
      const ir::ValueId id = node.inputs[i];
      if (b < 0 || last_read[static_cast<size_t>(id)] != now || outlives[static_cast<size_t>(id)])
        return false;
      if (std::count(node.inputs.begin(), node.inputs.end(), id) != 1) return false;
      for (ir::ValueId m : members[static_cast<size_t>(b)]) {
        if (m == id) continue;
        const int32_t d = death(m);
        if (d < 0 || d >= now) return false;  // another handle on the storage is alive
      }
      return true;
    };
    auto reuse_or_allocate = [&](size_t o, uint32_t candidates) {
      const InferredValue& out = out_value(o);
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        if (!(candidates & (1u << i)) || node.inputs[i] == ir::kNoValue) continue;
        const InferredValue& x = in_value(i);
        if (x.dtype != out.dtype || x.shape != out.shape || !writable(i)) continue;
        if (!is_contiguous(x.shape, in[i].strides)) break;  // the kernel allocates then
        view(o, in[i], {});
        return;
      }
      allocate(o);
    };

    const std::string& op = node.op_type;
    if (op == "Identity" || op == "Dropout") {
      view(0, in[0], in[0].strides);
      for (size_t o = 1; o < node.outputs.size(); ++o) allocate(o);
    } else if (op == "Squeeze" || op == "Unsqueeze") {
      view(0, in[0], unit_dims_view(in_value(0).shape, in[0].strides, out_value(0).shape));
    } else if (op == "Reshape" || op == "Flatten") {
      view(0, in[0], {});
    } else if (op == "Transpose") {
      const Shape& xs = in_value(0).shape;
      const Shape from = strides_of(in[0], xs);
      std::vector<int64_t> perm;
      if (const ir::Attribute* a = node.attr("perm")) perm = a->ints;
      Shape strides(xs.size());
      for (size_t d = 0; d < xs.size(); ++d) {
        const size_t p = perm.empty() ? xs.size() - 1 - d : static_cast<size_t>(perm[d]);
        strides[d] = from[p];
      }
      view(0, in[0], strides);
    } else if (op == "Slice") {
      const Shape& xs = in_value(0).shape;
      const Shape& ys = out_value(0).shape;
      Shape strides = strides_of(in[0], xs);
      std::vector<int64_t> axes = known_ints(values, node, 3), steps = known_ints(values, node, 4);
      if (node.opset < 10) {
        if (const ir::Attribute* a = node.attr("axes")) axes = a->ints;
        steps.clear();
      }
      bool backwards = false;
      for (size_t k = 0; k < steps.size(); ++k) {
        int64_t a = k < axes.size() ? axes[k] : static_cast<int64_t>(k);
        if (a < 0) a += static_cast<int64_t>(xs.size());
        const auto ax = static_cast<size_t>(a);
        if (ax >= xs.size() || ys[ax] <= 1) continue;
        strides[ax] *= steps[k];
        backwards = backwards || steps[k] < 0;
      }
      if (backwards)
        allocate(0);
      else
        view(0, in[0], strides, false);
    } else if (op == "Expand") {
      const Shape& xs = in_value(0).shape;
      const Shape& ys = out_value(0).shape;
      const Shape from = strides_of(in[0], xs);
      Shape strides(ys.size(), 0);
      for (size_t k = 0; k < xs.size(); ++k) {
        const size_t d = ys.size() - xs.size() + k;
        strides[d] = xs[k] == 1 && ys[d] != 1 ? 0 : from[k];
      }
      view(0, in[0], strides);
    } else if (op == "Split") {
      const Shape from = strides_of(in[0], in_value(0).shape);
      for (size_t o = 0; o < node.outputs.size(); ++o) view(o, in[0], from, o == 0);
    } else if (op == "Cast") {
      const InferredValue& x = in_value(0);
      const DataType to = out_value(0).dtype;
      const int bits = bits_per_element(x.dtype);
      if (x.dtype == to) {
        view(0, in[0], in[0].strides);
      } else if (bits >= 8 && bits == bits_per_element(to) && x.dtype != DataType::String &&
                 to != DataType::String && is_contiguous(x.shape, in[0].strides) && writable(0)) {
        view(0, in[0], {});
      } else {
        allocate(0);
      }
    } else if (op == "Concat") {
      // Appends in place along the outermost axis when input 0 may be overwritten and its
      // buffer (sized to 64-byte multiples in the arena) has room for the whole output.
      const InferredValue& x = in_value(0);
      const InferredValue& y = out_value(0);
      const ir::Attribute* axis = node.attr("axis");
      const int32_t b = in[0].buffer;
      const bool room = b >= 0 && in[0].at_start &&
                        (r.buffers[static_cast<size_t>(b)].bytes + 63) / 64 * 64 >=
                            storage_bytes(y.dtype, shape_numel(y.shape));
      if (node.inputs.size() >= 2 && axis &&
          (axis->i == 0 || axis->i == -static_cast<int64_t>(x.shape.size())) &&
          x.dtype != DataType::String && room && is_contiguous(x.shape, in[0].strides) &&
          writable(0)) {
        view(0, in[0], {});
      } else {
        allocate(0);
      }
    } else {
      reuse_or_allocate(0, step.op->in_place);
      for (size_t o = 1; o < node.outputs.size(); ++o) allocate(o);
    }
    for (ir::ValueId id : node.outputs)
      if (id != ir::kNoValue) produced[static_cast<size_t>(id)] = now;
  }
  for (size_t b = 0; b < r.buffers.size(); ++b) {
    int32_t last = 0;
    for (ir::ValueId m : members[b]) {
      const int32_t d = death(m);
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
