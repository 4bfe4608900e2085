// Concat: joins its inputs along one axis into a new tensor. Inputs may have any strides;
// each is copied into its window of the output.
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

// The output shape of Concat along `axis_attr` of the `n` shapes shape_of(0), ...: each must
// match the first except along the axis. Shared by the kernel and the shape rule; throws
// kiln::Error without a node (the executor names it; shape inference makes it unknown).
template <typename ShapeOf>
Shape concat_output_shape(size_t n, ShapeOf shape_of, int64_t axis_attr, size_t* axis) {
  if (n == 0) throw Error(ErrorKind::Runtime, "needs at least one input");
  const Shape& first = shape_of(0);
  if (first.empty()) throw Error(ErrorKind::Runtime, "cannot concatenate scalars");
  *axis = static_cast<size_t>(normalize_axis(axis_attr, static_cast<int64_t>(first.size())));
  Shape shape = first;
  shape[*axis] = 0;
  for (size_t i = 0; i < n; ++i) {
    const Shape& s = shape_of(i);
    bool same = s.size() == first.size();
    for (size_t d = 0; same && d < s.size(); ++d) same = d == *axis || s[d] == first[d];
    if (!same) {
      throw Error(ErrorKind::Runtime, "input " + std::to_string(i) + " " + shape_to_string(s) +
                                          " does not match input 0 " + shape_to_string(first) +
                                          " outside axis " + std::to_string(*axis));
    }
    if (__builtin_add_overflow(shape[*axis], s[*axis], &shape[*axis])) {
      throw Error(ErrorKind::Runtime, "output size overflows");
    }
  }
  return shape;
}

class Concat final : public Kernel {
 public:
  explicit Concat(const NodeInfo& info) : axis_(info.attr_int("axis")) {}

  void run(OpContext& ctx) override {
    size_t axis = 0;
    const Shape shape = output_shape(ctx, &axis);
    if (append_in_place(ctx, shape, axis)) return;
    // The output may be a group's buffer (plan::ConcatGroup) whose producers wrote some inputs
    // in place already: only the others are copied.
    Tensor& out = ctx.output(0, ctx.input(0).dtype(), shape);
    ctx.count_copy(copy_inputs(ctx, out, axis, 0), CopyCause::Concat);
  }

 private:
  // The output's shape; every input must match the first except along the axis.
  Shape output_shape(const OpContext& ctx, size_t* axis) const {
    if (ctx.num_inputs() == 0) ctx.fail("needs at least one input");
    const Tensor& first = ctx.input(0);
    if (first.dtype() != DataType::String && bits_per_element(first.dtype()) < 8) {
      throw_unsupported_type(first.dtype(), "Concat input");
    }
    for (size_t i = 1; i < ctx.num_inputs(); ++i) {
      if (ctx.input(i).dtype() != first.dtype()) ctx.fail("inputs have different element types");
    }
    return concat_output_shape(
        ctx.num_inputs(), [&](size_t i) -> const Shape& { return ctx.input(i).shape(); }, axis_,
        axis);
  }

  // The KV-cache case: input 0 is owned, this is its last use, and its storage has spare
  // room along the axis (Tensor::with_capacity, or an earlier append). Only the other
  // inputs are written, into that room, and the output is input 0 grown in place, so
  // extending a cache costs the new entries' bytes whatever its length. When the room is
  // not enough, the cache moves once into a buffer of twice the capacity.
  bool append_in_place(OpContext& ctx, const Shape& shape, size_t axis) {
    const Tensor& base = ctx.input(0);
    if (ctx.num_inputs() < 2 || base.dtype() == DataType::String || !ctx.can_overwrite(0))
      return false;
    const int64_t capacity = axis_capacity(base, axis);
    const int64_t room = capacity - base.dim(axis);
    const int64_t needed = shape[axis];
    Tensor grown;
    if (capacity >= needed) {
      grown = base.view(shape, base.strides(), base.byte_offset());
    } else if (room > 0) {
      Shape full = shape;
      full[axis] = std::max(2 * capacity, needed);
      // Output 0's storage (a planned request), of which the output is the leading part.
      const Tensor buffer = ctx.output(0, base.dtype(), full);
      grown = buffer.view(shape, buffer.strides(), buffer.byte_offset());
      const Tensor old_part = grown.view(base.shape(), grown.strides(), grown.byte_offset());
      copy_strided(base, old_part);
      ctx.count_copy(base.nbytes(), CopyCause::Concat);
    } else {
      return false;
    }
    ctx.count_copy(copy_inputs(ctx, grown, axis, 1), CopyCause::Concat);
    ctx.count_in_place();
    ctx.set_output(0, grown);
    return true;
  }

  // How many elements `t` can hold along `axis` without moving: its layout must be
  // row-major over a shape that is t's with a larger dimension at `axis`, and the storage
  // must hold that whole shape. Returns t.dim(axis) when there is no spare room (or the
  // layout is anything else).
  static int64_t axis_capacity(const Tensor& t, size_t axis) {
    const Shape& shape = t.shape();
    const Shape& strides = t.strides();
    const int64_t len = shape[axis];
    // Dimensions inside the axis must be dense.
    int64_t inner = 1;
    for (size_t d = shape.size(); d-- > axis + 1;) {
      if (shape[d] != 1 && strides[d] != inner) return len;
      inner *= shape[d];
    }
    if (len > 1 && strides[axis] != inner) return len;
    // The stride of the dimension outside the axis fixes the capacity (the outermost axis
    // is bounded by the storage alone).
    int64_t capacity = std::numeric_limits<int64_t>::max();
    if (axis > 0) {
      if (inner == 0 || strides[axis - 1] % inner != 0) return len;
      capacity = strides[axis - 1] / inner;
      int64_t outer_stride = capacity * inner;
      for (size_t d = axis; d-- > 0;) {
        if (shape[d] != 1 && strides[d] != outer_stride) return len;
        outer_stride *= shape[d];
      }
    }
    // The storage must hold the whole grown extent.
    const auto es = static_cast<int64_t>(bits_per_element(t.dtype()) / 8);
    const int64_t avail = static_cast<int64_t>(t.storage()->capacity() - t.byte_offset()) / es;
    int64_t outer = 1;
    for (size_t d = 0; d < axis; ++d) outer *= shape[d];
    if (inner == 0 || outer == 0) return len;
    int64_t fit = 0;
    if (axis == 0) {
      fit = avail / inner;
    } else {
      // The last outer block starts at (outer - 1) * capacity * inner.
      const int64_t last_block = (outer - 1) * capacity * inner;
      fit = avail <= last_block ? 0 : (avail - last_block) / inner;
    }
    return std::max(len, std::min(capacity, fit));
  }

  // Whether two tensors of one shape lay their elements out alike (a unit dimension's stride
  // is any).
  static bool same_layout(const Tensor& a, const Tensor& b) {
    for (size_t d = 0; d < a.shape().size(); ++d) {
      if (a.dim(d) != 1 && a.strides()[d] != b.strides()[d]) return false;
    }
    return true;
  }

  // Copies inputs [first, n) into their windows along the axis (input i's window starts
  // after the dims of inputs 0..i-1), but for those already there; returns the bytes copied.
  static uint64_t copy_inputs(const OpContext& ctx, const Tensor& out, size_t axis, size_t first) {
    const auto es = static_cast<size_t>(bits_per_element(out.dtype()) / 8);
    int64_t offset = 0;
    uint64_t copied = 0;
    for (size_t i = 0; i < first; ++i) offset += ctx.input(i).dim(axis);
    for (size_t i = first; i < ctx.num_inputs(); ++i) {
      const Tensor& t = ctx.input(i);
      const size_t byte_offset =
          out.byte_offset() + static_cast<size_t>(offset * out.strides()[axis]) * es;
      const Tensor window = out.view(t.shape(), out.strides(), byte_offset);
      offset += t.dim(axis);
      if (t.storage() == out.storage() && t.byte_offset() == byte_offset && same_layout(t, window))
        continue;
      copy_strided(t, window);
      copied += t.nbytes();
    }
    return copied;
  }

  int64_t axis_;
};

void concat_shape(ShapeContext& c) {
  bool some_elems = false;  // a piece with some elements known goes the partial way
  for (size_t i = 0; i < c.num_inputs(); ++i)
    some_elems = some_elems || (!c.facts(i).has_data && !c.facts(i).elems.empty());
  if (c.inputs_known() && !some_elems) {
    const ValueFacts& first = c.in(0);
    size_t axis = 0;
    const Shape out = concat_output_shape(
        c.num_inputs(), [&](size_t i) -> const Shape& { return c.shape(i); }, c.attr_int("axis", 0),
        &axis);
    bool all_data = true;
    std::vector<int64_t> data;
    for (size_t i = 0; i < c.num_inputs(); ++i) {
      const ValueFacts& v = c.in(i);
      all_data = all_data && v.has_data;
      if (v.has_data) data.insert(data.end(), v.data.begin(), v.data.end());
    }
    // Flat concatenation is the concatenation along the outermost non-unit axis only.
    bool outer = true;
    for (size_t d = 0; d < axis; ++d) outer = outer && out[d] == 1;
    c.set(0, first.dtype, out, all_data && outer ? &data : nullptr);
    return;
  }
  // Partial facts: the rank of any input; each dimension off the axis from any input that
  // knows it, the axis's when every input's is known; the elements of 1-D pieces.
  DataType dtype = DataType::Undefined;
  int64_t rank = -1;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const ValueFacts& v = c.facts(i);
    if (dtype == DataType::Undefined) dtype = v.dtype;
    if (!v.ranked) continue;
    if (rank >= 0 && v.rank() != rank) unknown("ranks differ");
    rank = v.rank();
  }
  if (rank < 0) {
    c.set(0, typed_facts(dtype));
    return;
  }
  const auto axis = static_cast<size_t>(normalize_axis(c.attr_int("axis", 0), rank));
  ValueFacts out;
  out.dtype = dtype;
  out.ranked = true;
  for (size_t k = 0; k < static_cast<size_t>(rank); ++k) {
    int64_t d = k == axis ? 0 : kUnknownDim;
    std::string name;
    for (size_t i = 0; i < c.num_inputs(); ++i) {
      const ValueFacts& v = c.facts(i);
      const int64_t dk = v.dim(static_cast<int64_t>(k));
      if (k == axis) {
        d = d == kUnknownDim || dk == kUnknownDim ? kUnknownDim : checked_add(d, dk);
      } else if (d == kUnknownDim) {
        d = dk;
        if (name.empty() && v.ranked) name = v.dim_name(k);
      }
    }
    append_dim(out, d, name);
  }
  if (rank == 1 && is_integer_type(dtype)) {
    for (size_t i = 0; i < c.num_inputs() && out.elems.size() <= kMaxKnownData; ++i) {
      const ValueFacts& v = c.facts(i);
      const int64_t n = v.dim(0);
      if (n == kUnknownDim || n > kMaxKnownData) {
        out.elems.clear();
        break;
      }
      for (int64_t k = 0; k < n; ++k) out.elems.push_back(v.elem(static_cast<size_t>(k)));
    }
  }
  c.set(0, std::move(out));
}

// Appends in place along the outermost axis when input 0 may be overwritten and its buffer
// (sized to 64-byte multiples in the arena) has room for the whole output; see Concat::run.
// When the other inputs are empty along the axis, input 0 is the output as it is (the
// kernel's capacity test holds along any axis, whatever its layout).
void place_concat(Placement& p) {
  const ValueFacts& x = p.input(0);
  const ValueFacts& y = p.output(0);
  const ir::Attribute* axis = p.node().attr("axis");
  const bool outer = axis && (axis->i == 0 || axis->i == -static_cast<int64_t>(x.shape.size()));
  const bool room = (p.room(0) + 63) / 64 * 64 >= storage_bytes(y.dtype, shape_numel(y.shape));
  const bool appends = p.node().inputs.size() >= 2 && x.dtype != DataType::String;
  if (appends && x.shape == y.shape && p.writable(0)) {
    p.view(0, 0, p.strides(0));
  } else if (appends && outer && room && p.contiguous(0) && p.writable(0)) {
    p.view(0, 0, {});
  } else {
    p.allocate(0);
  }
}

}  // namespace

KILN_REGISTER_OP({.op = "Concat",
                  .since = 4,
                  .min_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .in_place = inputs(0),
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = concat_shape,
                  .place = place_concat,
                  .create = make<Concat>});

}  // namespace kiln::ops
