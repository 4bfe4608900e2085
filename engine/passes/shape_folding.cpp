// Shape-aware constant folding: the dimensions a graph fixes (a head size, a hidden size)
// are known at load even when others (batch, sequence) are symbolic, and exporters often
// compute constants from them at run time (Shape -> Slice -> Cast -> Sqrt for an attention
// scale). This pass tracks partially known shapes, and the partially known values of small
// integer tensors computed from shapes, through the common ops; an integer output all of
// whose elements follow from fixed dimensions becomes an initializer, and the ordinary
// folding then evaluates what reads it. A dimension is known only when the graph fixes it:
// a symbolic or unknown one is never guessed.
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/passes/passes.h"

namespace kiln::passes {
namespace {

constexpr int64_t kUnknown = -1;
constexpr size_t kMaxValues = 64;  // tracked values per integer tensor

// What load time knows of a value: its rank and some of its dimensions, and for a small
// integer tensor of rank 0 or 1, some of its elements.
struct Partial {
  bool has_rank = false;
  std::vector<int64_t> dims;  // kUnknown where not known
  DataType dtype = DataType::Undefined;
  bool has_vals = false;
  std::vector<std::optional<int64_t>> vals;

  bool fully_valued() const {
    return has_vals && std::all_of(vals.begin(), vals.end(), [](auto v) { return v.has_value(); });
  }
};

Partial with_rank(std::vector<int64_t> dims) {
  Partial p;
  p.has_rank = true;
  p.dims = std::move(dims);
  return p;
}

Partial with_vals(DataType dtype, std::vector<std::optional<int64_t>> vals, bool scalar) {
  Partial p = with_rank(scalar ? std::vector<int64_t>{}
                               : std::vector<int64_t>{static_cast<int64_t>(vals.size())});
  p.dtype = dtype;
  p.has_vals = true;
  p.vals = std::move(vals);
  return p;
}

bool int_type(DataType t) {
  return t == DataType::Int64 || t == DataType::Int32;
}

Partial from_tensor(const Tensor& t) {
  Partial p = with_rank(t.shape());
  p.dtype = t.dtype();
  if (int_type(t.dtype()) && t.rank() <= 1 && static_cast<size_t>(t.numel()) <= kMaxValues) {
    p.has_vals = true;
    const Tensor c = t.contiguous();
    for (int64_t i = 0; i < t.numel(); ++i) {
      p.vals.emplace_back(t.dtype() == DataType::Int64
                              ? c.data<const int64_t>()[i]
                              : static_cast<int64_t>(c.data<const int32_t>()[i]));
    }
  }
  return p;
}

Partial from_type(const ir::TypeInfo& type) {
  Partial p;
  if (type.kind != Value::Kind::Tensor) return p;
  p.dtype = type.elem;
  if (!type.shape) return p;
  p.has_rank = true;
  for (const ir::Dim& d : *type.shape) p.dims.push_back(d.value >= 0 ? d.value : kUnknown);
  return p;
}

// Numpy broadcasting of known ranks: a known dimension other than 1 decides (a valid model
// broadcasts the unknown one to it); 1 with an unknown one stays unknown.
Partial broadcast(const std::vector<const Partial*>& in) {
  size_t rank = 0;
  for (const Partial* p : in) {
    if (!p->has_rank) return {};
    rank = std::max(rank, p->dims.size());
  }
  std::vector<int64_t> out(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    bool unknown = false;
    int64_t decided = 1;
    for (const Partial* p : in) {
      const size_t lead = rank - p->dims.size();
      if (k < lead) continue;
      const int64_t d = p->dims[k - lead];
      if (d == kUnknown) {
        unknown = true;
      } else if (d != 1) {
        decided = d;
      }
    }
    out[k] = decided != 1 ? decided : (unknown ? kUnknown : 1);
  }
  return with_rank(std::move(out));
}

std::optional<int64_t> normalize(int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) return std::nullopt;
  return axis < 0 ? axis + r : axis;
}

// What a nested graph knows of a value it reads from an enclosing graph: the constant when
// the enclosing value is one, else its type (the enclosing graph's folding wrote what it
// found into the types of its undeclared values first).
Partial captured(const ir::Graph& g, const ir::ValueInfo& v) {
  for (const ir::Graph* outer = g.parent; outer; outer = outer->parent) {
    const ir::ValueId id = outer->find(v.name);
    if (id == ir::kNoValue) continue;
    const ir::ValueInfo& o = outer->value(id);
    if (o.origin == ir::ValueOrigin::Capture) continue;  // defined further out
    if (o.origin == ir::ValueOrigin::Initializer && !o.hollow && o.constant.defined())
      return from_tensor(o.constant);
    return from_type(o.type.kind != Value::Kind::None ? o.type : v.type);
  }
  return from_type(v.type);
}

class Analysis {
 public:
  explicit Analysis(const ir::Graph& g) : g_(g), parts_(g.values.size()) {
    for (size_t id = 0; id < g.values.size(); ++id) {
      const ir::ValueInfo& v = g.values[id];
      if (v.origin == ir::ValueOrigin::Initializer && !v.hollow && v.constant.defined()) {
        parts_[id] = from_tensor(v.constant);
      } else if (v.origin == ir::ValueOrigin::Capture) {
        parts_[id] = captured(g, v);
      } else if (v.origin == ir::ValueOrigin::GraphInput ||
                 (v.origin == ir::ValueOrigin::Initializer && v.hollow)) {
        parts_[id] = from_type(v.type);
      }
    }
  }

  const Partial& at(ir::ValueId id) const {
    static const Partial none;
    return id == ir::kNoValue ? none : parts_[static_cast<size_t>(id)];
  }

  // The values of a constant integer input, or nullopt.
  std::optional<std::vector<int64_t>> ints(const ir::Node& n, size_t i) const {
    if (i >= n.inputs.size()) return std::nullopt;
    const Partial& p = at(n.inputs[i]);
    if (!p.fully_valued()) return std::nullopt;
    std::vector<int64_t> out;
    for (auto v : p.vals) out.push_back(*v);
    return out;
  }

  void visit(const ir::Node& n) {
    if (!n.domain.empty() || n.outputs.empty()) return;
    if (n.op_type == "Split") {
      std::vector<Partial> outs = split(n);
      for (size_t k = 0; k < outs.size() && k < n.outputs.size(); ++k) {
        record(n.outputs[k], std::move(outs[k]));
      }
      return;
    }
    if (n.outputs[0] == ir::kNoValue) return;
    record(n.outputs[0], infer(n), n.op_type == "Shape");
  }

 private:
  // What was found of `id` plus what its declared type says (`shape_op`: `id` is a Shape's
  // output).
  void record(ir::ValueId id, Partial out, bool shape_op = false) {
    if (id == ir::kNoValue) return;
    // A declared output shape may know more than the rules (a dimension the rule left open).
    const Partial declared = from_type(g_.value(id).type);
    if (declared.has_rank) {
      if (!out.has_rank) {
        out.has_rank = true;
        out.dims = declared.dims;
      } else if (out.dims.size() == declared.dims.size()) {
        for (size_t k = 0; k < out.dims.size(); ++k) {
          if (out.dims[k] == kUnknown) out.dims[k] = declared.dims[k];
        }
      }
    }
    if (out.dtype == DataType::Undefined) out.dtype = declared.dtype;
    // A Shape of a value whose rank only the declared output tells (the output of an op these
    // rules do not follow, such as a com.microsoft one): its elements are unknown, but their
    // number is, so constants concatenated to them stay known (a Reshape's fixed head size).
    if (shape_op && !out.has_vals && out.has_rank && out.dims.size() == 1 &&
        out.dims[0] != kUnknown && static_cast<size_t>(out.dims[0]) <= kMaxValues) {
      out.has_vals = true;
      out.dtype = DataType::Int64;
      out.vals.assign(static_cast<size_t>(out.dims[0]), std::nullopt);
    }
    parts_[static_cast<size_t>(id)] = std::move(out);
  }

  // Split's outputs: x's rank, the split axis's length where the sizes are known (an input
  // or attribute `split`, or an even split of a known length).
  std::vector<Partial> split(const ir::Node& n) const {
    const Partial& x = at(n.inputs.empty() ? ir::kNoValue : n.inputs[0]);
    const size_t count = n.outputs.size();
    std::vector<Partial> outs(count);
    if (!x.has_rank) return outs;
    const ir::Attribute* a = n.attr("axis");
    const auto axis = normalize(a ? a->i : 0, x.dims.size());
    if (!axis) return outs;
    std::optional<std::vector<int64_t>> sizes;
    if (n.opset >= 13) {
      if (n.inputs.size() > 1 && n.inputs[1] != ir::kNoValue) sizes = ints(n, 1);
    } else if (const ir::Attribute* s = n.attr("split")) {
      sizes = s->ints;
    }
    const bool given = n.opset >= 13 ? n.inputs.size() > 1 && n.inputs[1] != ir::kNoValue
                                     : n.attr("split") != nullptr;
    const int64_t d = x.dims[*axis];
    if (!given && d != kUnknown && count > 0 && d % static_cast<int64_t>(count) == 0) {
      sizes = std::vector<int64_t>(count, d / static_cast<int64_t>(count));
    }
    if (sizes && sizes->size() != count) sizes.reset();
    for (size_t k = 0; k < count; ++k) {
      std::vector<int64_t> dims = x.dims;
      dims[*axis] = sizes ? (*sizes)[k] : kUnknown;
      outs[k] = with_rank(std::move(dims));
      outs[k].dtype = x.dtype;
    }
    return outs;
  }

  Partial infer(const ir::Node& n) const {
    const std::string& op = n.op_type;
    auto in = [&](size_t i) -> const Partial& {
      return at(i < n.inputs.size() ? n.inputs[i] : ir::kNoValue);
    };
    auto attr_i = [&](const char* name, int64_t def) {
      const ir::Attribute* a = n.attr(name);
      return a ? a->i : def;
    };
    static const std::unordered_set<std::string> same_shape = {
        "Identity", "Cast",       "Sqrt",    "Erf",         "Relu",
        "Tanh",     "Sigmoid",    "Exp",     "Log",         "Neg",
        "Abs",      "Reciprocal", "Softmax", "LogSoftmax",  "LayerNormalization",
        "Dropout",  "Not",        "Gelu",    "Floor",       "Ceil",
        "Round",    "Sin",        "Cos",     "HardSigmoid", "LeakyRelu",
        "Elu",      "Softplus",   "IsNaN",   "IsInf",       "Sign",
        "Clip"};
    static const std::unordered_set<std::string> broadcasting = {
        "Add",   "Sub",  "Mul",     "Div",         "Pow",
        "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
        "And",   "Or",   "Xor",     "Where",       "Max",
        "Min",   "Mod",  "BitShift"};
    const Partial& x = in(0);
    if (op == "Shape") {
      if (!x.has_rank) {  // a 1-D int64 tensor of unknown length
        Partial p = with_rank({kUnknown});
        p.dtype = DataType::Int64;
        return p;
      }
      const size_t r = x.dims.size();
      auto clampi = [&](int64_t v) {
        if (v < 0) v += static_cast<int64_t>(r);
        return std::clamp<int64_t>(v, 0, static_cast<int64_t>(r));
      };
      const int64_t s = clampi(attr_i("start", 0));
      const int64_t e = clampi(attr_i("end", static_cast<int64_t>(r)));
      std::vector<std::optional<int64_t>> vals;
      for (int64_t k = s; k < e; ++k) {
        const int64_t d = x.dims[static_cast<size_t>(k)];
        vals.push_back(d == kUnknown ? std::nullopt : std::optional<int64_t>(d));
      }
      return with_vals(DataType::Int64, std::move(vals), false);
    }
    if (op == "Cast" || op == "Identity") {
      if (!x.has_rank) return {};
      Partial p = with_rank(x.dims);
      const ir::Attribute* to = n.attr("to");
      p.dtype =
          op == "Identity" ? x.dtype : (to ? static_cast<DataType>(to->i) : DataType::Undefined);
      if (x.has_vals && int_type(x.dtype) && int_type(p.dtype)) {
        p.has_vals = true;
        p.vals = x.vals;
        if (p.dtype == DataType::Int32) {
          for (auto& v : p.vals) {
            if (v && (*v < std::numeric_limits<int32_t>::min() ||
                      *v > std::numeric_limits<int32_t>::max())) {
              v.reset();
            }
          }
        }
      }
      return p;
    }
    if (same_shape.count(op)) {
      if (!x.has_rank) return {};
      Partial p = with_rank(x.dims);
      p.dtype = op == "IsNaN" || op == "IsInf" || op == "Not" ? DataType::Bool : x.dtype;
      return p;
    }
    if (broadcasting.count(op)) {
      std::vector<const Partial*> ins;
      for (size_t i = 0; i < n.inputs.size(); ++i) ins.push_back(&in(i));
      if (ins.empty()) return {};
      Partial p = broadcast(ins);
      if (!p.has_rank) return p;
      const bool compares = op == "Equal" || op == "Less" || op == "Greater" ||
                            op == "LessOrEqual" || op == "GreaterOrEqual" || op == "And" ||
                            op == "Or" || op == "Xor";
      p.dtype = compares ? DataType::Bool : (op == "Where" ? in(1).dtype : x.dtype);
      // Integer arithmetic on shape values (exact: no division).
      const bool arith = op == "Add" || op == "Sub" || op == "Mul";
      if (arith && ins.size() == 2 && int_type(x.dtype) && x.dtype == in(1).dtype && x.has_vals &&
          in(1).has_vals && p.dims.size() <= 1 && (p.dims.empty() || p.dims[0] != kUnknown)) {
        const Partial& a = x;
        const Partial& b = in(1);
        const size_t len = p.dims.empty() ? 1 : static_cast<size_t>(p.dims[0]);
        if ((a.vals.size() == len || a.vals.size() == 1) &&
            (b.vals.size() == len || b.vals.size() == 1)) {
          p.has_vals = true;
          for (size_t i = 0; i < len; ++i) {
            const auto u = a.vals[a.vals.size() == 1 ? 0 : i];
            const auto w = b.vals[b.vals.size() == 1 ? 0 : i];
            std::optional<int64_t> r;
            int64_t z = 0;
            if (u && w) {
              const bool overflow = op == "Add"   ? __builtin_add_overflow(*u, *w, &z)
                                    : op == "Sub" ? __builtin_sub_overflow(*u, *w, &z)
                                                  : __builtin_mul_overflow(*u, *w, &z);
              if (!overflow) r = z;
            }
            p.vals.push_back(r);
          }
          if (x.dtype == DataType::Int32) {
            for (auto& v : p.vals) {
              if (v && (*v < std::numeric_limits<int32_t>::min() ||
                        *v > std::numeric_limits<int32_t>::max())) {
                v.reset();
              }
            }
          }
        }
      }
      return p;
    }
    if (op == "Gather") {
      const Partial& idx = in(1);
      if (!x.has_rank || !idx.has_rank) return {};
      const auto axis = normalize(attr_i("axis", 0), x.dims.size());
      if (!axis) return {};
      std::vector<int64_t> dims(x.dims.begin(), x.dims.begin() + *axis);
      dims.insert(dims.end(), idx.dims.begin(), idx.dims.end());
      dims.insert(dims.end(), x.dims.begin() + *axis + 1, x.dims.end());
      Partial p = with_rank(std::move(dims));
      p.dtype = x.dtype;
      const auto indices = ints(n, 1);
      if (x.has_vals && x.dims.size() == 1 && indices && idx.dims.size() <= 1) {
        const auto len = static_cast<int64_t>(x.vals.size());
        p.has_vals = true;
        for (int64_t i : *indices) {
          if (i < -len || i >= len) return {};  // the kernel reports it when run
          p.vals.push_back(x.vals[static_cast<size_t>(i < 0 ? i + len : i)]);
        }
      }
      return p;
    }
    if (op == "Unsqueeze" || op == "Squeeze") {
      if (!x.has_rank) return {};
      std::optional<std::vector<int64_t>> axes;
      if (n.opset >= 13) {
        axes = n.inputs.size() > 1 && n.inputs[1] != ir::kNoValue ? ints(n, 1)
                                                                  : std::vector<int64_t>{};
      } else if (const ir::Attribute* a = n.attr("axes")) {
        axes = a->ints;
      } else {
        axes = std::vector<int64_t>{};
      }
      if (!axes) return {};
      std::vector<int64_t> dims;
      if (op == "Unsqueeze") {
        const size_t r = x.dims.size() + axes->size();
        std::vector<bool> inserted(r, false);
        for (int64_t a : *axes) {
          const auto k = normalize(a, r);
          if (!k || inserted[static_cast<size_t>(*k)]) return {};
          inserted[static_cast<size_t>(*k)] = true;
        }
        size_t j = 0;
        for (size_t k = 0; k < r; ++k) dims.push_back(inserted[k] ? 1 : x.dims[j++]);
      } else {
        if (axes->empty()) {
          // Every dimension of size 1: only when all are known.
          for (int64_t d : x.dims) {
            if (d == kUnknown) return {};
            if (d != 1) dims.push_back(d);
          }
        } else {
          std::vector<bool> removed(x.dims.size(), false);
          for (int64_t a : *axes) {
            const auto k = normalize(a, x.dims.size());
            if (!k) return {};
            removed[static_cast<size_t>(*k)] = true;
          }
          for (size_t k = 0; k < x.dims.size(); ++k) {
            if (!removed[k]) dims.push_back(x.dims[k]);
          }
        }
      }
      Partial p = with_rank(std::move(dims));
      p.dtype = x.dtype;
      if (x.has_vals && p.dims.size() <= 1) {
        p.has_vals = true;
        p.vals = x.vals;
      }
      return p;
    }
    if (op == "Concat") {
      const ir::Attribute* a = n.attr("axis");
      if (!a || !x.has_rank) return {};
      const auto axis = normalize(a->i, x.dims.size());
      if (!axis) return {};
      std::vector<int64_t> dims = x.dims;
      dims[static_cast<size_t>(*axis)] = 0;
      bool vals = x.dims.size() == 1, all_valued = true;
      std::vector<std::optional<int64_t>> all;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const Partial& p = in(i);
        if (!p.has_rank || p.dims.size() != dims.size()) return {};
        for (size_t k = 0; k < dims.size(); ++k) {
          int64_t& d = dims[k];
          if (k == static_cast<size_t>(*axis)) {
            d = d == kUnknown || p.dims[k] == kUnknown ? kUnknown : d + p.dims[k];
          } else if (d == kUnknown) {
            d = p.dims[k];
          }
        }
        // A 1-D piece of known length whose elements are not known adds unknown elements.
        all_valued = all_valued && p.has_vals;
        vals = vals && (p.has_vals || (p.dims[0] != kUnknown &&
                                       all.size() + static_cast<size_t>(p.dims[0]) <= kMaxValues));
        if (vals && p.has_vals) {
          all.insert(all.end(), p.vals.begin(), p.vals.end());
        } else if (vals) {
          all.insert(all.end(), static_cast<size_t>(p.dims[0]), std::nullopt);
        }
      }
      Partial p = with_rank(std::move(dims));
      p.dtype = x.dtype;
      if (vals && all.size() <= kMaxValues && (all_valued || int_type(x.dtype))) {
        p.has_vals = true;
        p.vals = std::move(all);
      }
      return p;
    }
    if (op == "Slice" && n.opset >= 10) {
      if (!x.has_rank) return {};
      std::vector<int64_t> dims = x.dims;
      const auto starts = ints(n, 1), ends = ints(n, 2);
      std::optional<std::vector<int64_t>> axes, steps;
      const bool has_axes = n.inputs.size() > 3 && n.inputs[3] != ir::kNoValue;
      const bool has_steps = n.inputs.size() > 4 && n.inputs[4] != ir::kNoValue;
      if (has_axes) axes = ints(n, 3);
      if (has_steps) steps = ints(n, 4);
      if (!starts || !ends || (has_axes && !axes) || (has_steps && !steps) ||
          starts->size() != ends->size()) {
        // Which axes change is not known: keep only the rank.
        if (has_axes && axes) {
          for (int64_t a : *axes) {
            const auto k = normalize(a, dims.size());
            if (!k) return {};
            dims[static_cast<size_t>(*k)] = kUnknown;
          }
        } else if (!has_axes && in(1).has_rank && in(1).dims.size() == 1 &&
                   in(1).dims[0] != kUnknown) {
          for (int64_t k = 0; k < in(1).dims[0] && k < static_cast<int64_t>(dims.size()); ++k) {
            dims[static_cast<size_t>(k)] = kUnknown;
          }
        } else {
          std::fill(dims.begin(), dims.end(), kUnknown);
        }
        Partial p = with_rank(std::move(dims));
        p.dtype = x.dtype;
        return p;
      }
      if (!axes) {
        axes = std::vector<int64_t>();
        for (size_t k = 0; k < starts->size(); ++k) axes->push_back(static_cast<int64_t>(k));
      }
      if (!steps) steps = std::vector<int64_t>(starts->size(), 1);
      if (axes->size() != starts->size() || steps->size() != starts->size()) return {};
      // Per axis: the kept indices, when the axis length is known.
      std::vector<std::vector<int64_t>> kept(dims.size());
      std::vector<bool> sliced(dims.size(), false);
      for (size_t i = 0; i < axes->size(); ++i) {
        const auto k = normalize((*axes)[i], dims.size());
        const int64_t step = (*steps)[i];
        if (!k || step == 0 || sliced[static_cast<size_t>(*k)]) return {};
        const size_t ax = static_cast<size_t>(*k);
        sliced[ax] = true;
        const int64_t d = dims[ax];
        if (d == kUnknown) continue;
        int64_t s = (*starts)[i], e = (*ends)[i];
        if (s < 0) s = s < -d ? (step > 0 ? 0 : -1) : s + d;
        if (e < 0) e = e < -d ? -1 : e + d;
        if (step > 0) {
          s = std::clamp<int64_t>(s, 0, d);
          e = std::clamp<int64_t>(e, 0, d);
          for (int64_t j = s; j < e; j += step) kept[ax].push_back(j);
        } else {
          s = std::clamp<int64_t>(s, -1, d - 1);
          e = std::clamp<int64_t>(e, -1, d - 1);
          for (int64_t j = s; j > e; j += step) kept[ax].push_back(j);
        }
        dims[ax] = static_cast<int64_t>(kept[ax].size());
      }
      Partial p = with_rank(dims);
      p.dtype = x.dtype;
      if (x.has_vals && x.dims.size() == 1 && x.dims[0] != kUnknown) {
        p.has_vals = true;
        if (!sliced[0]) {
          p.vals = x.vals;
        } else {
          for (int64_t j : kept[0]) p.vals.push_back(x.vals[static_cast<size_t>(j)]);
        }
      }
      return p;
    }
    if (op == "Reshape" && n.opset >= 5) {
      const Partial& shape = in(1);
      if (!shape.has_vals || shape.dims.size() != 1) return {};
      const bool allowzero = attr_i("allowzero", 0) != 0;
      std::vector<int64_t> dims;
      int minus = -1;
      for (size_t k = 0; k < shape.vals.size(); ++k) {
        const auto v = shape.vals[k];
        if (!v) {
          dims.push_back(kUnknown);
        } else if (*v == 0 && !allowzero) {
          dims.push_back(x.has_rank && k < x.dims.size() ? x.dims[k] : kUnknown);
        } else if (*v == -1) {
          if (minus >= 0) return {};
          minus = static_cast<int>(k);
          dims.push_back(kUnknown);
        } else if (*v < 0) {
          return {};
        } else {
          dims.push_back(*v);
        }
      }
      if (minus >= 0 && x.has_rank) {
        // The inferred dimension: input size over the others, when all are known.
        int64_t total = 1, others = 1;
        bool known = true;
        for (int64_t d : x.dims) {
          known = known && d != kUnknown && !__builtin_mul_overflow(total, d, &total);
        }
        for (size_t k = 0; k < dims.size(); ++k) {
          if (static_cast<int>(k) == minus) continue;
          known = known && dims[k] != kUnknown && !__builtin_mul_overflow(others, dims[k], &others);
        }
        if (known && others > 0 && total % others == 0) {
          dims[static_cast<size_t>(minus)] = total / others;
        }
      }
      Partial p = with_rank(std::move(dims));
      p.dtype = x.dtype;
      if (x.has_vals && p.dims.size() <= 1 &&
          (p.dims.empty() ? x.vals.size() == 1
                          : p.dims[0] == static_cast<int64_t>(x.vals.size()))) {
        p.has_vals = true;
        p.vals = x.vals;
      }
      return p;
    }
    if (op == "Transpose") {
      if (!x.has_rank) return {};
      const ir::Attribute* perm = n.attr("perm");
      std::vector<int64_t> dims;
      if (!perm) {
        dims.assign(x.dims.rbegin(), x.dims.rend());
      } else {
        if (perm->ints.size() != x.dims.size()) return {};
        for (int64_t a : perm->ints) {
          const auto k = normalize(a, x.dims.size());
          if (!k) return {};
          dims.push_back(x.dims[static_cast<size_t>(*k)]);
        }
      }
      Partial p = with_rank(std::move(dims));
      p.dtype = x.dtype;
      return p;
    }
    if (op == "MatMul") {
      const Partial& y = in(1);
      if (!x.has_rank || !y.has_rank || x.dims.size() < 2 || y.dims.size() < 2) return {};
      Partial a = with_rank(std::vector<int64_t>(x.dims.begin(), x.dims.end() - 2));
      Partial b = with_rank(std::vector<int64_t>(y.dims.begin(), y.dims.end() - 2));
      Partial p = broadcast({&a, &b});
      p.dims.push_back(x.dims[x.dims.size() - 2]);
      p.dims.push_back(y.dims.back());
      p.dtype = x.dtype;
      return p;
    }
    if (op == "Expand") {
      const Partial& shape = in(1);
      if (!x.has_rank || !shape.has_rank || shape.dims.size() != 1 || shape.dims[0] == kUnknown) {
        return {};
      }
      std::vector<int64_t> dims(static_cast<size_t>(shape.dims[0]), kUnknown);
      if (shape.has_vals) {
        for (size_t k = 0; k < dims.size(); ++k) {
          const auto v = shape.vals[k];
          if (v && *v >= 0) dims[k] = *v;
        }
      }
      Partial target = with_rank(std::move(dims));
      Partial p = broadcast({&x, &target});
      p.dtype = x.dtype;
      return p;
    }
    if (op == "Gemm") {
      const Partial& y = in(1);
      Partial p = with_rank({kUnknown, kUnknown});
      p.dtype = x.dtype;
      if (x.has_rank && x.dims.size() == 2) p.dims[0] = x.dims[attr_i("transA", 0) ? 1 : 0];
      if (y.has_rank && y.dims.size() == 2) p.dims[1] = y.dims[attr_i("transB", 0) ? 0 : 1];
      return p;
    }
    if (op == "Flatten") {
      if (!x.has_rank) return {};
      const auto r = static_cast<int64_t>(x.dims.size());
      int64_t axis = attr_i("axis", 1);
      if (axis < 0) axis += r;
      if (axis < 0 || axis > r) return {};
      int64_t outer = 1, inner = 1;
      for (int64_t k = 0; k < r; ++k) {
        int64_t& part = k < axis ? outer : inner;
        const int64_t d = x.dims[static_cast<size_t>(k)];
        if (part != kUnknown && (d == kUnknown || __builtin_mul_overflow(part, d, &part))) {
          part = kUnknown;
        }
      }
      Partial p = with_rank({outer, inner});
      p.dtype = x.dtype;
      return p;
    }
    if (op == "Range") {
      Partial p = with_rank({kUnknown});
      p.dtype = x.dtype;
      return p;
    }
    if (op == "ConstantOfShape") {
      if (!x.has_vals || x.dims.size() != 1) return {};
      std::vector<int64_t> dims;
      for (auto v : x.vals) dims.push_back(v && *v >= 0 ? *v : kUnknown);
      return with_rank(std::move(dims));
    }
    return {};
  }

  const ir::Graph& g_;
  std::vector<Partial> parts_;
};

Tensor to_tensor(const Partial& p) {
  if (p.dtype == DataType::Int64) {
    std::vector<int64_t> v;
    for (auto x : p.vals) v.push_back(*x);
    return p.dims.empty() ? Tensor::scalar<int64_t>(v.at(0))
                          : Tensor::from_vector<int64_t>({p.dims[0]}, v);
  }
  std::vector<int32_t> v;
  for (auto x : p.vals) v.push_back(static_cast<int32_t>(*x));
  return p.dims.empty() ? Tensor::scalar<int32_t>(v.at(0))
                        : Tensor::from_vector<int32_t>({p.dims[0]}, v);
}

// One graph's folding (nested graphs are left to the caller).
FoldStats fold_graph_shapes(ir::Graph& g, const std::function<Tensor(Tensor)>& keep) {
  FoldStats stats;
  Analysis a(g);
  std::vector<bool> graph_output(g.values.size(), false);
  for (ir::ValueId id : g.outputs) graph_output[static_cast<size_t>(id)] = true;
  std::vector<bool> folded(g.nodes.size(), false);
  for (int32_t ni : ir::topological_order(g)) {
    const ir::Node& node = g.nodes[static_cast<size_t>(ni)];
    if (!node.graph_attributes().empty()) continue;
    a.visit(node);
    // What was found of an undeclared output is written into its type (later passes read
    // ranks and fixed dimensions from there).
    for (ir::ValueId id : node.outputs) {
      if (id == ir::kNoValue || graph_output[static_cast<size_t>(id)]) continue;
      ir::ValueInfo& v = g.value(id);
      const Partial& p = a.at(id);
      if (v.type.kind != Value::Kind::None || !p.has_rank || p.dtype == DataType::Undefined) {
        continue;
      }
      v.type.kind = Value::Kind::Tensor;
      v.type.elem = p.dtype;
      std::vector<ir::Dim> dims;
      for (int64_t d : p.dims) dims.push_back(ir::Dim{d, ""});
      v.type.shape = std::move(dims);
    }
    if (node.outputs.size() != 1 || node.outputs[0] == ir::kNoValue ||
        graph_output[static_cast<size_t>(node.outputs[0])]) {
      continue;
    }
    const Partial& p = a.at(node.outputs[0]);
    if (!p.fully_valued() || !int_type(p.dtype) || p.dims.size() > 1 ||
        (p.dims.size() == 1 && p.dims[0] != static_cast<int64_t>(p.vals.size())) ||
        (p.dims.empty() && p.vals.size() != 1)) {
      continue;
    }
    Tensor t = to_tensor(p);
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
