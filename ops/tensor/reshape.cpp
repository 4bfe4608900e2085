// Ops that change how a tensor is seen without touching its bytes: Reshape, Flatten,
// Squeeze, Unsqueeze and Identity return views sharing the input's storage; Shape and Size
// read only the shape.
#include <algorithm>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

// The shape functions below are shared by the kernels and the shape rules; they throw
// kiln::Error without a node (the executor names it; shape inference makes it unknown).
[[noreturn]] void bad_shape(const std::string& message) {
  throw Error(ErrorKind::Runtime, message);
}

int64_t size_product(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) bad_shape("shape size overflows int64");
  return r;
}

// Axes given as an attribute (before `input_since`) or as input 1 (from it on).
// A Shape, not a std::vector: a few axes stay inline, and Squeeze/Unsqueeze run on every
// decode step.
Shape read_axes(const OpContext& ctx, const std::vector<int64_t>& attr_axes, int64_t input_since,
                bool* given) {
  if (ctx.opset() < input_since) {
    *given = !attr_axes.empty();
    return Shape(attr_axes);
  }
  *given = ctx.has_input(1);
  return *given ? to_int64s(ctx.input(1)) : Shape{};
}

// ONNX Reshape: 0 copies the input's dim (unless allowzero), -1 is inferred.
Shape reshape_target(const Shape& in, const Shape& req, bool allowzero) {
  Shape out(req.size());
  int64_t infer = -1, known = 1;
  bool has_zero = false;
  for (size_t i = 0; i < req.size(); ++i) {
    int64_t v = req[i];
    if (v == -1) {
      if (infer >= 0) bad_shape("shape has more than one -1");
      infer = static_cast<int64_t>(i);
      continue;
    }
    if (v == 0) {
      has_zero = true;
      if (!allowzero) {
        if (i >= in.size())
          bad_shape("shape has a 0 at index " + std::to_string(i) + " beyond the input's rank " +
                    std::to_string(in.size()));
        v = in[i];
      }
    } else if (v < 0) {
      bad_shape("shape has a negative dimension " + std::to_string(v));
    }
    out[i] = v;
    known = size_product(known, v);
  }
  int64_t numel = 1;
  for (int64_t d : in) {
    if (d < 0) bad_shape("input shape " + shape_to_string(in) + " is not known");
    numel = size_product(numel, d);
  }
  if (infer >= 0) {
    if (allowzero && has_zero) bad_shape("allowzero shape cannot hold both 0 and -1");
    if (known == 0) {
      if (numel != 0) bad_shape("cannot infer -1 next to a zero dimension");
      out[static_cast<size_t>(infer)] = 0;
    } else {
      if (numel % known != 0) {
        bad_shape("cannot reshape " + shape_to_string(in) + " to " + shape_to_string(req));
      }
      out[static_cast<size_t>(infer)] = numel / known;
    }
  } else if (known != numel) {
    bad_shape("cannot reshape " + shape_to_string(in) + " to " + shape_to_string(req));
  }
  return out;
}

// Flatten: [prod(in[:axis]), prod(in[axis:])].
Shape flatten_target(const Shape& in, int64_t axis_attr) {
  const auto rank = static_cast<int64_t>(in.size());
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  if (axis < 0 || axis > rank) {
    bad_shape("axis " + std::to_string(axis_attr) + " is out of range for rank " +
              std::to_string(rank));
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t& part = d < axis ? outer : inner;
    part = size_product(part, in[static_cast<size_t>(d)]);
  }
  return {outer, inner};
}

// One 0/1 flag per dimension, held in a Shape so that a few of them need no heap.
using DimFlags = Shape;

// Squeeze: which dims of `in` go (`axes`, or every dim of size 1 when there are none).
DimFlags squeezed_dims(const Shape& in, const Shape& axes) {
  const auto rank = static_cast<int64_t>(in.size());
  DimFlags drop(in.size(), 0);
  if (axes.empty()) {
    for (size_t d = 0; d < in.size(); ++d) drop[d] = in[d] == 1 ? 1 : 0;
  }
  for (int64_t a : axes) {
    const auto d = static_cast<size_t>(normalize_axis(a, rank));
    if (in[d] != 1) {
      bad_shape("cannot squeeze axis " + std::to_string(a) + " of size " + std::to_string(in[d]));
    }
    drop[d] = 1;
  }
  return drop;
}

// Unsqueeze: which dims of the output (rank `in_rank` + the axes) are the inserted ones.
DimFlags unsqueezed_dims(size_t in_rank, const Shape& axes) {
  const auto out_rank = static_cast<int64_t>(in_rank + axes.size());
  DimFlags inserted(static_cast<size_t>(out_rank), 0);
  for (int64_t a : axes) {
    const auto d = static_cast<size_t>(normalize_axis(a, out_rank));
    if (inserted[d]) bad_shape("axis " + std::to_string(a) + " is repeated");
    inserted[d] = 1;
  }
  return inserted;
}

class Reshape final : public Kernel {
 public:
  explicit Reshape(const NodeInfo& info) : allowzero_(info.attr_int("allowzero", 0) != 0) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    ctx.set_output(0, x.reshaped(reshape_target(x.shape(), to_int64s(ctx.input(1)), allowzero_)));
  }

 private:
  bool allowzero_;
};

class Flatten final : public Kernel {
 public:
  explicit Flatten(const NodeInfo& info) : axis_(info.attr_int("axis", 1)) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    ctx.set_output(0, x.reshaped(flatten_target(x.shape(), axis_)));
  }

 private:
  int64_t axis_;
};

// Squeeze and Unsqueeze keep the input's strides: only size-1 dims come and go, so any
// layout stays a valid view.
class Squeeze final : public Kernel {
 public:
  explicit Squeeze(const NodeInfo& info) : attr_axes_(info.attr_ints("axes")) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    bool given = false;
    const Shape axes = read_axes(ctx, attr_axes_, 13, &given);
    const DimFlags drop = squeezed_dims(x.shape(), axes);
    Shape shape, strides;
    for (size_t d = 0; d < x.rank(); ++d) {
      if (drop[d]) continue;
      shape.push_back(x.dim(d));
      strides.push_back(x.strides()[d]);
    }
    ctx.set_output(0, x.view(std::move(shape), std::move(strides), x.byte_offset()));
  }

 private:
  std::vector<int64_t> attr_axes_;
};

class Unsqueeze final : public Kernel {
 public:
  explicit Unsqueeze(const NodeInfo& info) : attr_axes_(info.attr_ints("axes")) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    bool given = false;
    const Shape axes = read_axes(ctx, attr_axes_, 13, &given);
    if (!given) ctx.fail("axes are required");
    const DimFlags inserted = unsqueezed_dims(x.rank(), axes);
    const auto out_rank = static_cast<int64_t>(inserted.size());
    Shape shape(static_cast<size_t>(out_rank)), strides(static_cast<size_t>(out_rank));
    size_t src = x.rank();
    int64_t next_stride = 1;  // any value is valid for a size-1 dim; keep it "contiguous"
    for (size_t d = static_cast<size_t>(out_rank); d-- > 0;) {
      if (inserted[d]) {
        shape[d] = 1;
        strides[d] = next_stride;
      } else {
        --src;
        shape[d] = x.dim(src);
        strides[d] = x.strides()[src];
        next_stride = x.strides()[src] * std::max<int64_t>(x.dim(src), 1);
      }
    }
    ctx.set_output(0, x.view(std::move(shape), std::move(strides), x.byte_offset()));
  }

 private:
  std::vector<int64_t> attr_axes_;
};

// Passes any value through: tensor, sequence or optional.
class Identity final : public Kernel {
 public:
  explicit Identity(const NodeInfo&) {}
  void run(OpContext& ctx) override { ctx.set_output(0, ctx.input_value(0)); }
};

class ShapeOp final : public Kernel {
 public:
  explicit ShapeOp(const NodeInfo& info)
      : start_(info.attr_int("start", 0)), end_(info.attr_int("end", INT64_MAX)) {}
  void run(OpContext& ctx) override {
    const Shape& s = ctx.input(0).shape();
    const auto rank = static_cast<int64_t>(s.size());
    auto clamp = [rank](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
    const int64_t begin = clamp(start_), end = std::max(begin, clamp(end_));
    Tensor& y = ctx.output(0, DataType::Int64, {end - begin});
    std::copy(s.begin() + begin, s.begin() + end, y.data<int64_t>());
  }

 private:
  int64_t start_, end_;
};

class Size final : public Kernel {
 public:
  explicit Size(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const int64_t n = ctx.input(0).numel();
    ctx.output(0, DataType::Int64, {}).data<int64_t>()[0] = n;
  }
};

// The rules: on inputs known in full the kernels' own functions (their checks included); on
// partial facts the dimensions that follow from what is known. The values of a small integer
// input pass through (a Shape -> Reshape chain).
constexpr int64_t kMaxRuleRank = 64;  // longer shape tensors leave only the type known

ValueFacts ranked_of(const Shape& s) {
  ValueFacts v;
  v.ranked = true;
  v.shape = s;
  return v;
}

void reshaped_facts(ShapeContext& c, ValueFacts out) {
  const ValueFacts& x = c.facts(0);
  out.dtype = x.dtype;
  out.ranked = true;
  out.has_data = x.has_data;
  out.data = x.data;
  out.elems = x.elems;
  c.set(0, std::move(out));
}

void reshape_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  const ValueFacts& req = c.facts(1);
  const bool allowzero = c.attr_int("allowzero", 0) != 0;
  if (x.known && req.has_data) {
    reshaped_facts(c, ranked_of(reshape_target(x.shape, c.data(1), allowzero)));
    return;
  }
  if (req.rank() != 1 || req.shape[0] == kUnknownDim || req.shape[0] > kMaxRuleRank) {
    c.set(0, typed_facts(x.dtype));
    return;
  }
  ValueFacts out;
  out.ranked = true;
  int64_t infer = -1;
  for (int64_t k = 0; k < req.shape[0]; ++k) {
    const std::optional<int64_t> e = req.elem(static_cast<size_t>(k));
    if (!e) {
      append_dim(out, kUnknownDim);
    } else if (*e == 0 && !allowzero) {
      if (x.ranked && k >= x.rank()) bad_shape("shape has a 0 beyond the input's rank");
      append_dim(out, x, static_cast<size_t>(k));
    } else if (*e == -1) {
      if (infer >= 0) bad_shape("shape has more than one -1");
      infer = k;
      append_dim(out, kUnknownDim);
    } else if (*e < 0) {
      bad_shape("shape has a negative dimension " + std::to_string(*e));
    } else {
      append_dim(out, *e);
    }
  }
  if (infer >= 0 && x.ranked) {
    Shape others = out.shape;
    others.erase(others.begin() + infer);
    const int64_t total = product_or_unknown(x.shape), rest = product_or_unknown(others);
    if (total != kUnknownDim && rest > 0 && total % rest == 0) {
      out.shape[static_cast<size_t>(infer)] = total / rest;
    }
  }
  reshaped_facts(c, std::move(out));
}

void flatten_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  if (x.known) {
    reshaped_facts(c, ranked_of(flatten_target(x.shape, c.attr_int("axis", 1))));
    return;
  }
  ValueFacts out;
  out.ranked = true;
  const int64_t rank = x.rank();
  int64_t axis = c.attr_int("axis", 1);
  if (rank >= 0 && axis < 0) axis += rank;
  if (rank < 0 || axis < 0 || axis > rank) {
    out.shape = {kUnknownDim, kUnknownDim};
    reshaped_facts(c, std::move(out));
    return;
  }
  // Each side: the product of its dimensions; one dimension alone keeps its name.
  const auto split = static_cast<size_t>(axis);
  const auto side = [&](size_t from, size_t to) {
    if (to - from == 1) {
      append_dim(out, x, from);
    } else {
      append_dim(out, product_or_unknown(Shape(x.shape.begin() + static_cast<int64_t>(from),
                                               x.shape.begin() + static_cast<int64_t>(to))));
    }
  };
  side(0, split);
  side(split, x.shape.size());
  reshaped_facts(c, std::move(out));
}

void unsqueeze_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  if (!x.ranked) {
    c.set(0, typed_facts(x.dtype));
    return;
  }
  const DimFlags inserted = unsqueezed_dims(x.shape.size(), c.ints_from("axes", 13, 1));
  ValueFacts out;
  out.ranked = true;
  size_t next = 0;
  for (const int64_t one : inserted) {
    if (one) {
      append_dim(out, 1);
    } else {
      append_dim(out, x, next++);
    }
  }
  reshaped_facts(c, std::move(out));
}

void squeeze_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  const std::vector<int64_t> axes = c.ints_from("axes", 13, 1);
  // Without axes, every dimension of size 1 goes: only known when every dimension is.
  if (!x.ranked || (axes.empty() && !x.known)) {
    c.set(0, typed_facts(x.dtype));
    return;
  }
  // A squeezed axis of unknown size is 1 in a valid model.
  Shape probe = x.shape;
  for (int64_t a : axes) {
    int64_t& d = probe[static_cast<size_t>(normalize_axis(a, static_cast<int64_t>(probe.size())))];
    if (d == kUnknownDim) d = 1;
  }
  const DimFlags drop = squeezed_dims(probe, axes);
  ValueFacts out;
  out.ranked = true;
  for (size_t d = 0; d < x.shape.size(); ++d)
    if (!drop[d]) append_dim(out, x, d);
  reshaped_facts(c, std::move(out));
}

// Squeeze and Unsqueeze view their input: the strides of the kept dimensions carry over.
void place_unit_dims(Placement& p) {
  const Shape& in = p.input(0).shape;
  const Shape& out = p.output(0).shape;
  const Shape in_strides = p.strides(0);
  Shape strides(out.size(), 1);
  size_t j = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k] == 1) continue;
    while (j < in.size() && in[j] == 1) ++j;
    if (j < in.size()) strides[k] = in_strides[j++];
  }
  p.view(0, 0, p.contiguous(0) ? Shape{} : strides);
}

void shape_of_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  if (!x.ranked) {  // a 1-D tensor of unknown length
    c.set(0, ranked_facts(DataType::Int64, {kUnknownDim}));
    return;
  }
  const auto rank = static_cast<int64_t>(x.shape.size());
  auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
  const int64_t start = clamp(c.attr_int("start", 0)), end = clamp(c.attr_int("end", rank));
  ValueFacts out = ranked_facts(DataType::Int64, {std::max<int64_t>(end - start, 0)});
  for (int64_t d = start; d < end; ++d) {
    const int64_t n = x.shape[static_cast<size_t>(d)];
    out.elems.push_back(n == kUnknownDim ? std::nullopt : std::optional<int64_t>(n));
  }
  c.set(0, std::move(out));
}

void size_shape(ShapeContext& c) {
  ValueFacts out = ranked_facts(DataType::Int64, {});
  const int64_t n = c.facts(0).ranked ? product_or_unknown(c.facts(0).shape) : kUnknownDim;
  out.elems.push_back(n == kUnknownDim ? std::nullopt : std::optional<int64_t>(n));
  c.set(0, std::move(out));
}

}  // namespace

constexpr const char* kAllTypes = "all types";
KILN_REGISTER_OP({.op = "Reshape",
                  .since = 5,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = kAllTypes,
                  .shape = reshape_shape,
                  .place = place_reshaped,
                  .create = make<Reshape>});
KILN_REGISTER_OP({.op = "Flatten",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = kAllTypes,
                  .shape = flatten_shape,
                  .place = place_reshaped,
                  .create = make<Flatten>});
KILN_REGISTER_OP({.op = "Squeeze",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = kAllTypes,
                  .shape = squeeze_shape,
                  .place = place_unit_dims,
                  .create = make<Squeeze>});
KILN_REGISTER_OP({.op = "Unsqueeze",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = kAllTypes,
                  .shape = unsqueeze_shape,
                  .place = place_unit_dims,
                  .create = make<Unsqueeze>});
KILN_REGISTER_OP({.op = "Identity",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types, sequences, optionals",
                  .shape = pass_through,
                  .place = place_alias,
                  .create = make<Identity>});
KILN_REGISTER_OP({.op = "Shape",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = kAllTypes,
                  .shape = shape_of_shape,
                  .create = make<ShapeOp>});
KILN_REGISTER_OP({.op = "Size",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = kAllTypes,
                  .shape = size_shape,
                  .create = make<Size>});

}  // namespace kiln::ops
