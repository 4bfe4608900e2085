// Sequence and Optional ops. A sequence holds tensor handles, so building, slicing and
// extending sequences never copies element data.
#include <cstring>
#include <string>

#include "ops/core/common.h"

namespace kiln::ops {
namespace {

const Value& sequence_input(const OpContext& ctx, size_t i) {
  const Value& v = ctx.input_value(i);
  if (!v.is_sequence())
    ctx.fail("input " + std::to_string(i) + " must be a sequence, got " + v.describe());
  return v;
}

// Position input: negative counts from the end; `size_plus_one` allows the end position.
size_t position(const OpContext& ctx, size_t input, size_t size, bool size_plus_one) {
  const Tensor& t = ctx.input(input);
  if (t.numel() != 1) ctx.fail("position must be a single integer");
  int64_t p = to_int64s(t)[0];
  const auto n = static_cast<int64_t>(size) + (size_plus_one ? 1 : 0);
  if (p < 0) p += static_cast<int64_t>(size);
  if (p < 0 || p >= n) {
    ctx.fail("position " + std::to_string(to_int64s(t)[0]) + " is out of range for a sequence of " +
             std::to_string(size));
  }
  return static_cast<size_t>(p);
}

class SequenceEmpty final : public Kernel {
 public:
  explicit SequenceEmpty(const NodeInfo& info)
      : dtype_(
            static_cast<DataType>(info.attr_int("dtype", static_cast<int64_t>(DataType::Float)))) {
    if (!is_known_data_type(static_cast<int32_t>(dtype_))) info.fail("unknown dtype");
  }
  void run(OpContext& ctx) override { ctx.set_output(0, Value::sequence(dtype_, {})); }

 private:
  DataType dtype_;
};

class SequenceConstruct final : public Kernel {
 public:
  explicit SequenceConstruct(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    std::vector<Tensor> items;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      items.push_back(ctx.input(i));
      if (items.back().dtype() != items.front().dtype())
        ctx.fail("sequence items must share one element type");
    }
    const DataType dtype = items.front().dtype();
    ctx.set_output(0, Value::sequence(dtype, std::move(items)));
  }
};

class SequenceAt final : public Kernel {
 public:
  explicit SequenceAt(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Value& seq = sequence_input(ctx, 0);
    ctx.set_output(0, seq.items()[position(ctx, 1, seq.items().size(), false)]);
  }
};

class SequenceLength final : public Kernel {
 public:
  explicit SequenceLength(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const auto n = static_cast<int64_t>(sequence_input(ctx, 0).items().size());
    Tensor& out = ctx.output(0, DataType::Int64, {});
    out.data<int64_t>()[0] = n;
  }
};

class SequenceInsert final : public Kernel {
 public:
  explicit SequenceInsert(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Value& seq = sequence_input(ctx, 0);
    const Tensor& item = ctx.input(1);
    if (!seq.items().empty() && item.dtype() != seq.elem_type()) {
      ctx.fail("cannot insert " + item.describe() + " into " + seq.describe());
    }
    std::vector<Tensor> items = seq.items();
    const size_t at = ctx.has_input(2) ? position(ctx, 2, items.size(), true) : items.size();
    items.insert(items.begin() + static_cast<long>(at), item);
    ctx.set_output(0, Value::sequence(item.dtype(), std::move(items)));
  }
};

class SequenceErase final : public Kernel {
 public:
  explicit SequenceErase(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Value& seq = sequence_input(ctx, 0);
    std::vector<Tensor> items = seq.items();
    if (items.empty()) ctx.fail("cannot erase from an empty sequence");
    const size_t at = ctx.has_input(1) ? position(ctx, 1, items.size(), false) : items.size() - 1;
    items.erase(items.begin() + static_cast<long>(at));
    ctx.set_output(0, Value::sequence(seq.elem_type(), std::move(items)));
  }
};

// Copies `src` into `dst` at `offset` along `axis` (both contiguous), as Concat would.
void copy_into(const Tensor& src, const Tensor& dst, int64_t axis, int64_t offset) {
  const auto a = static_cast<size_t>(axis);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= src.dim(d);
  for (size_t d = a + 1; d < src.rank(); ++d) inner *= src.dim(d);
  const size_t esize = static_cast<size_t>(bits_per_element(src.dtype()) / 8);
  const size_t src_row = static_cast<size_t>(src.dim(a) * inner) * esize;
  const size_t dst_row = static_cast<size_t>(dst.dim(a) * inner) * esize;
  const size_t start = static_cast<size_t>(offset * inner) * esize;
  for (int64_t o = 0; o < outer && src_row > 0; ++o) {
    std::memcpy(dst.raw_data() + static_cast<size_t>(o) * dst_row + start,
                src.raw_data() + static_cast<size_t>(o) * src_row, src_row);
  }
}

class ConcatFromSequence final : public Kernel {
 public:
  explicit ConcatFromSequence(const NodeInfo& info)
      : axis_(info.attr_int("axis")), new_axis_(info.attr_int("new_axis", 0) != 0) {}
  void run(OpContext& ctx) override {
    const Value& seq = sequence_input(ctx, 0);
    const auto& items = seq.items();
    if (items.empty()) ctx.fail("cannot concatenate an empty sequence");
    const Shape& first = items[0].shape();
    const auto rank = static_cast<int64_t>(first.size());
    const int64_t axis = normalize_axis(axis_, new_axis_ ? rank + 1 : rank);
    Shape out_shape = first;
    if (new_axis_) {
      out_shape.insert(out_shape.begin() + axis, static_cast<int64_t>(items.size()));
    } else {
      out_shape[static_cast<size_t>(axis)] = 0;
      for (const Tensor& t : items) {
        if (t.rank() != first.size()) ctx.fail("sequence items differ in rank");
        out_shape[static_cast<size_t>(axis)] += t.dim(static_cast<size_t>(axis));
      }
    }
    if (items[0].dtype() == DataType::String) ctx.fail("string sequences cannot be concatenated");
    Tensor& out = ctx.output(0, items[0].dtype(), out_shape);
    int64_t offset = 0;
    for (const Tensor& item : items) {
      Tensor t = item.contiguous();
      if (new_axis_) {
        Shape s = t.shape();
        s.insert(s.begin() + axis, 1);
        t = t.reshaped(s);
      }
      for (size_t d = 0; d < out_shape.size(); ++d) {
        if (static_cast<int64_t>(d) != axis && t.dim(d) != out_shape[d]) {
          ctx.fail("sequence items have incompatible shapes " + t.describe() + " and " +
                   shape_to_string(out_shape));
        }
      }
      copy_into(t, out, axis, offset);
      offset += t.dim(static_cast<size_t>(axis));
    }
    ctx.count_copy(out.nbytes());
  }

 private:
  int64_t axis_;
  bool new_axis_;
};

class SplitToSequence final : public Kernel {
 public:
  explicit SplitToSequence(const NodeInfo& info)
      : axis_(info.attr_int("axis", 0)), keepdims_(info.attr_int("keepdims", 1) != 0) {}
  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const int64_t axis = normalize_axis(axis_, static_cast<int64_t>(x.rank()));
    const int64_t len = x.dim(static_cast<size_t>(axis));
    std::vector<int64_t> sizes;
    bool squeeze = false;
    if (ctx.has_input(1)) {
      const Tensor& split = ctx.input(1);
      if (split.rank() == 0) {
        const int64_t chunk = to_int64s(split)[0];
        if (chunk <= 0) ctx.fail("split size must be positive");
        for (int64_t at = 0; at < len; at += chunk) sizes.push_back(std::min(chunk, len - at));
      } else {
        sizes = to_int64s(split);
        int64_t total = 0;
        for (int64_t s : sizes) {
          if (s < 0) ctx.fail("split sizes must not be negative");
          total += s;
        }
        if (total != len)
          ctx.fail("split sizes add up to " + std::to_string(total) + ", not " +
                   std::to_string(len));
      }
    } else {
      sizes.assign(static_cast<size_t>(len), 1);
      squeeze = !keepdims_;
    }
    std::vector<Tensor> items;
    int64_t at = 0;
    const size_t esize = static_cast<size_t>(bits_per_element(x.dtype()) / 8);
    for (int64_t s : sizes) {
      Shape shape = x.shape();
      shape[static_cast<size_t>(axis)] = s;
      const Tensor view =
          x.view(shape, x.strides(),
                 x.byte_offset() +
                     static_cast<size_t>(at * x.strides()[static_cast<size_t>(axis)]) * esize);
      Tensor item = ctx.allocate(x.dtype(), shape);
      copy_elements(view, item);
      ctx.count_copy(item.nbytes());
      if (squeeze) {
        shape.erase(shape.begin() + axis);
        item = item.reshaped(shape);
      }
      items.push_back(std::move(item));
      at += s;
    }
    ctx.set_output(0, Value::sequence(x.dtype(), std::move(items)));
  }

 private:
  int64_t axis_;
  bool keepdims_;
};

// SequenceMap: runs the body once per sequence position; non-sequence inputs are passed
// whole to every iteration.
class SequenceMap final : public Kernel {
 public:
  explicit SequenceMap(const NodeInfo& info)
      : body_(info.subgraph_index("body")), graph_(info.subgraph(body_)) {
    if (graph_.inputs.size() != info.num_inputs())
      info.fail("the body's inputs do not match the node's");
    if (graph_.outputs.size() != info.num_outputs())
      info.fail("the body's outputs do not match the node's");
  }
  void run(OpContext& ctx) override {
    const size_t n = sequence_input(ctx, 0).items().size();
    std::vector<std::vector<Tensor>> results(ctx.num_outputs());
    for (size_t i = 0; i < n; ++i) {
      std::vector<Value> inputs;
      for (size_t k = 0; k < ctx.num_inputs(); ++k) {
        const Value& v = ctx.input_value(k);
        if (v.is_sequence()) {
          if (v.items().size() != n) ctx.fail("input sequences differ in length");
          inputs.push_back(v.items()[i]);
        } else {
          inputs.push_back(v);
        }
      }
      std::vector<Value> outs = ctx.run_subgraph(body_, std::move(inputs), CaptureMode::Borrow);
      for (size_t k = 0; k < outs.size(); ++k) results[k].push_back(outs[k].tensor());
    }
    for (size_t k = 0; k < results.size(); ++k) {
      DataType dt = graph_.value(graph_.outputs[k]).type.elem;
      if (!results[k].empty()) dt = results[k][0].dtype();
      ctx.set_output(k, Value::sequence(dt, std::move(results[k])));
    }
  }

 private:
  int body_;
  const ir::Graph& graph_;
};

class OptionalOp final : public Kernel {
 public:
  explicit OptionalOp(const NodeInfo& info) {
    if (const ir::Attribute* a = info.attr("type")) {
      inner_kind_ =
          a->type.kind == Value::Kind::Sequence ? Value::Kind::Sequence : Value::Kind::Tensor;
      elem_ = a->type.elem;
    }
  }
  void run(OpContext& ctx) override {
    if (ctx.has_input(0)) {
      ctx.set_output(0, Value::optional(ctx.input_value(0)));
    } else {
      ctx.set_output(0, Value::empty_optional(inner_kind_, elem_));
    }
  }

 private:
  Value::Kind inner_kind_ = Value::Kind::Tensor;
  DataType elem_ = DataType::Undefined;
};

class OptionalHasElement final : public Kernel {
 public:
  explicit OptionalHasElement(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    bool has = false;
    if (ctx.has_input(0)) {
      const Value& v = ctx.input_value(0);
      has = v.is_optional() ? v.has_element() : v.defined();
    }
    Tensor& out = ctx.output(0, DataType::Bool, {});
    out.data<bool>()[0] = has;
  }
};

class OptionalGetElement final : public Kernel {
 public:
  explicit OptionalGetElement(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Value& v = ctx.input_value(0);
    if (!v.is_optional()) {
      ctx.set_output(0, v);  // opset 18: plain tensors and sequences pass through
      return;
    }
    if (!v.has_element()) ctx.fail("the optional input is empty");
    ctx.set_output(0, v.element());
  }
};

// ---- Shape rules ----
// Static shape inference follows tensors only: what a sequence or optional holds is known
// when run.

void sequence_shape(ShapeContext&) {
  unknown("a sequence is not a tensor");
}

void sequence_element_shape(ShapeContext&) {
  unknown("the elements of a sequence are only known when run");
}

void sequence_length_shape(ShapeContext& c) {
  c.set(0, DataType::Int64, {});
}

void optional_shape(ShapeContext&) {
  unknown("an optional is not a tensor");
}

// An omitted input has no element; a tensor whose facts are known is one.
void optional_has_element_shape(ShapeContext& c) {
  if (c.has_input(0) && !c.in(0).known) unknown("an optional's element is only known when run");
  const std::vector<int64_t> has{c.has_input(0) ? 1 : 0};
  c.set(0, DataType::Bool, {}, &has);
}

// A plain tensor passes through (opset 18); an optional's element is only known when run.
void optional_get_element_shape(ShapeContext& c) {
  c.same(0, 0);
}

}  // namespace

KILN_REGISTER_OP({.op = "SequenceEmpty",
                  .since = 11,
                  .max_inputs = 0,
                  .types = "any",
                  .shape = sequence_shape,
                  .create = make<SequenceEmpty>});
KILN_REGISTER_OP({.op = "SequenceConstruct",
                  .since = 11,
                  .min_inputs = 1,
                  .strided_inputs = true,
                  .types = "any",
                  .shape = sequence_shape,
                  .create = make<SequenceConstruct>});
KILN_REGISTER_OP({.op = "SequenceAt",
                  .since = 11,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .types = "any",
                  .shape = sequence_element_shape,
                  .create = make<SequenceAt>});
KILN_REGISTER_OP({.op = "SequenceLength",
                  .since = 11,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .types = "any",
                  .shape = sequence_length_shape,
                  .create = make<SequenceLength>});
KILN_REGISTER_OP({.op = "SequenceInsert",
                  .since = 11,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .strided_inputs = true,
                  .types = "any",
                  .shape = sequence_shape,
                  .create = make<SequenceInsert>});
KILN_REGISTER_OP({.op = "SequenceErase",
                  .since = 11,
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .types = "any",
                  .shape = sequence_shape,
                  .create = make<SequenceErase>});
KILN_REGISTER_OP({.op = "ConcatFromSequence",
                  .since = 11,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .types = "all fixed-width types",
                  .shape = sequence_element_shape,
                  .create = make<ConcatFromSequence>});
KILN_REGISTER_OP({.op = "SplitToSequence",
                  .since = 11,
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .strided_inputs = true,
                  .types = "all fixed-width types",
                  .shape = sequence_shape,
                  .create = make<SplitToSequence>});
KILN_REGISTER_OP({.op = "SequenceMap",
                  .since = 17,
                  .min_inputs = 1,
                  .strided_inputs = true,
                  .types = "any",
                  .shape = sequence_shape,
                  .create = make<SequenceMap>});
KILN_REGISTER_OP({.op = "Optional",
                  .since = 15,
                  .max_inputs = 1,
                  .strided_inputs = true,
                  .types = "any",
                  .shape = optional_shape,
                  .create = make<OptionalOp>});
KILN_REGISTER_OP({.op = "OptionalHasElement",
                  .since = 15,
                  .max_inputs = 1,
                  .strided_inputs = true,
                  .types = "any",
                  .shape = optional_has_element_shape,
                  .create = make<OptionalHasElement>});
KILN_REGISTER_OP({.op = "OptionalGetElement",
                  .since = 15,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .strided_inputs = true,
                  .types = "any",
                  .shape = optional_get_element_shape,
                  .place = place_alias,
                  .create = make<OptionalGetElement>});

}  // namespace kiln::ops
