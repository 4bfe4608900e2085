// Split: cuts a tensor into consecutive pieces along one axis, each copied into its own
// output. Sizes come from the `split` attribute (before opset 13) or input (from 13), or
// are equal parts (the last one smaller when uneven, `num_outputs` from opset 18).
#include <array>
#include <cstring>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

// The sizes of the `n` pieces of an axis of size `dim`: `given` ones (n of them, adding up to
// dim), or equal parts, every part but the last ceil(dim / n) when uneven. Shared by the
// kernel and the shape rule; throws kiln::Error without a node.
std::vector<int64_t> split_sizes(int64_t dim, const std::vector<int64_t>* given, int64_t n) {
  auto fail = [](const std::string& m) { throw Error(ErrorKind::Runtime, m); };
  if (given) {
    if (static_cast<int64_t>(given->size()) != n) {
      fail("split has " + std::to_string(given->size()) + " entries for " + std::to_string(n) +
           " outputs");
    }
    int64_t total = 0;
    for (int64_t s : *given) {
      if (s < 0) fail("split has a negative size " + std::to_string(s));
      if (__builtin_add_overflow(total, s, &total)) fail("split sizes overflow");
    }
    if (total != dim) {
      fail("split sizes add up to " + std::to_string(total) + ", not the axis size " +
           std::to_string(dim));
    }
    return *given;
  }
  if (n <= 0) fail("has no outputs");
  const int64_t part = dim / n + (dim % n != 0 ? 1 : 0);
  std::vector<int64_t> sizes(static_cast<size_t>(n), part);
  sizes.back() = dim - part * (n - 1);
  if (sizes.back() < 0) {
    fail("cannot split an axis of size " + std::to_string(dim) + " into " + std::to_string(n) +
         " parts");
  }
  return sizes;
}

class Split final : public Kernel {
 public:
  explicit Split(const NodeInfo& info)
      : axis_(info.attr_int("axis", 0)),
        attr_split_(info.attr_ints("split")),
        has_attr_split_(info.has_attr("split")),
        num_outputs_(info.attr_int("num_outputs", 0)) {
    if (info.has_attr("num_outputs")) {
      if (info.opset() < 18) info.fail("num_outputs exists from opset 18");
      if (num_outputs_ != static_cast<int64_t>(info.num_outputs())) {
        info.fail("num_outputs is " + std::to_string(num_outputs_) + " but the node has " +
                  std::to_string(info.num_outputs()) + " outputs");
      }
    }
    if (info.opset() >= 18 && info.has_input(1) && info.has_attr("num_outputs")) {
      info.fail("split and num_outputs cannot both be given");
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.rank() == 0) ctx.fail("cannot split a scalar");
    if (x.dtype() != DataType::String && bits_per_element(x.dtype()) < 8) {
      throw_unsupported_type(x.dtype(), "Split input");
    }
    const auto axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank())));
    const std::vector<int64_t> sizes = split_sizes(ctx, x.dim(axis));
    const auto es = static_cast<size_t>(bits_per_element(x.dtype()) / 8);
    int64_t offset = 0;
    uint64_t copied = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Shape shape = x.shape();
      shape[axis] = sizes[i];
      if (ctx.has_output(i)) {
        const size_t byte_offset =
            x.byte_offset() +
            static_cast<size_t>(offset * x.strides()[axis] * static_cast<int64_t>(es));
        const Tensor piece = x.view(shape, x.strides(), byte_offset);
        Tensor& out = ctx.output(i, x.dtype(), shape);
        copy_strided(piece, out);
        copied += out.nbytes();
      }
      offset += sizes[i];
    }
    ctx.count_copy(copied);
  }

 private:
  std::vector<int64_t> split_sizes(const OpContext& ctx, int64_t dim) const {
    const bool given = ctx.opset() < 13 ? has_attr_split_ : ctx.has_input(1);
    std::vector<int64_t> sizes;
    if (given)
      sizes = ctx.opset() < 13 ? attr_split_ : std::vector<int64_t>(to_int64s(ctx.input(1)));
    return ops::split_sizes(dim, given ? &sizes : nullptr, static_cast<int64_t>(ctx.num_outputs()));
  }

  int64_t axis_;
  std::vector<int64_t> attr_split_;
  bool has_attr_split_;
  int64_t num_outputs_;
};

void split_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  const size_t outputs = c.num_outputs();
  if (!x.ranked) {
    for (size_t i = 0; i < outputs; ++i) c.set(i, typed_facts(x.dtype));
    return;
  }
  const auto axis = static_cast<size_t>(
      normalize_axis(c.attr_int("axis", 0), static_cast<int64_t>(x.shape.size())));
  const bool given = c.opset() < 13 ? c.has_attr("split") : c.has_input(1);
  const std::vector<int64_t> listed = c.ints_from("split", 13, 1);
  const int64_t dim = x.shape[axis];
  // An axis of unknown size: the listed sizes (a valid model's add up to it), else unknown.
  std::vector<int64_t> sizes(outputs, kUnknownDim);
  if (dim != kUnknownDim) {
    sizes = split_sizes(dim, given ? &listed : nullptr, static_cast<int64_t>(outputs));
  } else if (given && listed.size() == outputs) {
    sizes = listed;
  }
  for (size_t i = 0; i < outputs; ++i) {
    ValueFacts out = x;
    out.has_data = false;
    out.data.clear();
    out.elems.clear();
    out.shape[axis] = sizes[i];
    c.set(i, std::move(out));
  }
}

}  // namespace

KILN_REGISTER_OP({.op = "Split",
                  .since = 2,
                  .min_inputs = 1,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = split_shape,
                  .create = make<Split>});

}  // namespace kiln::ops
