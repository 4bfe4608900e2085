// Transpose: a strided view with permuted dims; no bytes move. Consumers that accept
// strided inputs read it directly, the others get a contiguous copy from the executor.
// Strings are the exception: the engine cannot make a strided string tensor contiguous
// (copy_elements), so they are copied here.
#include <array>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

void copy_strings(const Tensor& src, const Tensor& dst) {
  const std::string* s = src.data<const std::string>();
  std::string* d = dst.data<std::string>();
  const std::array<Shape, 2> strides{src.strides(), dst.strides()};
  for_each_row<2>(src.shape(), strides, [&](const int64_t* off, int64_t n, const int64_t* st) {
    for (int64_t i = 0; i < n; ++i) d[off[1] + i * st[1]] = s[off[0] + i * st[0]];
  });
}

// `dims` (a shape or strides) permuted by `perm` (empty: reversed): the output's shape, and
// its strides as a view of the input, for the kernel and the rules alike.
Shape transposed(const Shape& dims, const std::vector<int64_t>& perm) {
  const size_t rank = dims.size();
  if (!perm.empty() && perm.size() != rank) {
    throw Error(ErrorKind::Runtime, "perm has " + std::to_string(perm.size()) +
                                        " entries for an input of rank " + std::to_string(rank));
  }
  Shape out(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t from = perm.empty() ? static_cast<int64_t>(rank - 1 - d) : perm[d];
    if (from < 0 || from >= static_cast<int64_t>(rank))
      throw Error(ErrorKind::Runtime, "perm entry " + std::to_string(from) + " is out of range");
    out[d] = dims[static_cast<size_t>(from)];
  }
  return out;
}

class Transpose final : public Kernel {
 public:
  explicit Transpose(const NodeInfo& info) : perm_(info.attr_ints("perm")) {
    std::vector<bool> seen(perm_.size(), false);
    for (int64_t p : perm_) {
      if (p < 0 || p >= static_cast<int64_t>(perm_.size()) || seen[static_cast<size_t>(p)]) {
        info.fail("perm is not a permutation of 0.." + std::to_string(perm_.size() - 1));
      }
      seen[static_cast<size_t>(p)] = true;
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    // The permuted shape, and the strides permuted alike.
    Tensor y =
        x.view(transposed(x.shape(), perm_), transposed(x.strides(), perm_), x.byte_offset());
    if (bits_per_element(x.dtype()) < 8 && !y.is_contiguous()) {
      // Sub-byte elements have no per-element address, so a permuted view cannot exist.
      throw_unsupported_type(x.dtype(), "Transpose of");
    }
    if (x.dtype() == DataType::String && !y.is_contiguous()) {
      Tensor& out = ctx.output(0, x.dtype(), y.shape());
      copy_strings(y, out);
      ctx.count_copy(out.nbytes());
      return;
    }
    ctx.set_output(0, std::move(y));
  }

 private:
  std::vector<int64_t> perm_;
};

void transpose_shape(ShapeContext& c) {
  const ValueFacts& x = c.facts(0);
  if (!x.ranked) {
    c.set(0, typed_facts(x.dtype));
    return;
  }
  // The permutation of the axes' indices, so that names follow their dimensions.
  Shape axes;
  for (size_t k = 0; k < x.shape.size(); ++k) axes.push_back(static_cast<int64_t>(k));
  ValueFacts out;
  out.dtype = x.dtype;
  out.ranked = true;
  for (int64_t k : transposed(axes, c.attr_ints("perm")))
    append_dim(out, x, static_cast<size_t>(k));
  c.set(0, std::move(out));
}

// A view of the input with its strides permuted.
void place_transposed(Placement& p) {
  const Shape from = p.strides(0);
  std::vector<int64_t> perm;
  if (const ir::Attribute* a = p.node().attr("perm")) perm = a->ints;
  p.view(0, 0, transposed(from, perm));
}

}  // namespace

KILN_REGISTER_OP({.op = "Transpose",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types (sub-byte types only when the result stays contiguous)",
                  .shape = transpose_shape,
                  .place = place_transposed,
                  .create = make<Transpose>});

}  // namespace kiln::ops
