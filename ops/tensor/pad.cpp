// Pad: constant, reflect, edge and wrap modes; negative pads crop. Pads and the constant
// are attributes before opset 11 and inputs from 11; `axes` (input 3) from opset 18.
//
// The (cropped) input is copied into the middle of the output. Constant mode fills the
// rest first; the other modes fill the borders one dim at a time from the innermost,
// copying whole slabs of the output onto themselves, so each border element is computed
// once from already-complete data.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

// Where Pad takes the input and puts it: per dim, the part of the input that survives
// negative pads (from crop_start, len elements) and where it lands in the output of
// out_shape (from out_start). Shared by the kernel and the shape rule; throws kiln::Error
// without a node.
struct PadGeometry {
  Shape crop_start, len, out_start, out_shape;
};

// `pads` holds the begins then the ends of `axes` (every dim when null).
PadGeometry pad_geometry(const Shape& x, const std::vector<int64_t>& pads,
                         const std::vector<int64_t>* axes, bool constant) {
  auto fail = [](const std::string& m) { throw Error(ErrorKind::Runtime, m); };
  const size_t rank = x.size();
  std::vector<int64_t> all;
  if (!axes) {
    for (size_t d = 0; d < rank; ++d) all.push_back(static_cast<int64_t>(d));
    axes = &all;
  }
  if (pads.size() != 2 * axes->size()) {
    fail("pads has " + std::to_string(pads.size()) + " entries for " +
         std::to_string(axes->size()) + " axes");
  }
  Shape begin(rank, 0), end(rank, 0);
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < axes->size(); ++i) {
    const auto a = static_cast<size_t>(normalize_axis((*axes)[i], static_cast<int64_t>(rank)));
    if (seen[a]) fail("axis " + std::to_string((*axes)[i]) + " is repeated");
    seen[a] = true;
    begin[a] = pads[i];
    end[a] = pads[i + axes->size()];
    if (begin[a] == INT64_MIN || end[a] == INT64_MIN) fail("pads hold a value out of range");
  }
  PadGeometry g{Shape(rank), Shape(rank), Shape(rank), Shape(rank)};
  for (size_t d = 0; d < rank; ++d) {
    g.crop_start[d] = std::max<int64_t>(0, -begin[d]);
    g.out_start[d] = std::max<int64_t>(0, begin[d]);
    if (__builtin_sub_overflow(x[d] - g.crop_start[d], std::max<int64_t>(0, -end[d]), &g.len[d]) ||
        g.len[d] < 0) {
      fail("pads crop more than axis " + std::to_string(d) + " holds");
    }
    if (__builtin_add_overflow(g.len[d], g.out_start[d] + std::max<int64_t>(0, end[d]),
                               &g.out_shape[d])) {
      fail("output too large");
    }
    if (!constant && g.len[d] == 0 && g.out_shape[d] > 0) {
      fail("cannot pad an empty axis except in constant mode");
    }
  }
  check_output_size(g.out_shape);
  return g;
}

// The block of `t` starting at `start` with `len` elements along each dim.
Tensor window(const Tensor& t, const Shape& start, const Shape& len) {
  int64_t off = 0;
  for (size_t d = 0; d < start.size(); ++d) off += start[d] * t.strides()[d];
  const int64_t es = bits_per_element(t.dtype()) / 8;
  return t.view(len, t.strides(),
                static_cast<size_t>(static_cast<int64_t>(t.byte_offset()) + off * es));
}

// One element of type `dt` holding `v` (the opset 2-10 float `value` attribute).
std::vector<std::byte> element_from_double(DataType dt, double v) {
  std::vector<std::byte> out(static_cast<size_t>(bits_per_element(dt) / 8));
  dispatch(PodTypes{}, dt, [&]<typename T>() {
    T t{};
    if constexpr (std::is_same_v<T, bool>) {
      t = v != 0;
    } else if constexpr (std::is_integral_v<T>) {
      const double hi = std::ldexp(1.0, std::numeric_limits<T>::digits);
      const double lo = std::is_signed_v<T> ? -hi : 0.0;
      if (!(v > lo - 1 && v < hi)) {
        throw Error(ErrorKind::InvalidModel, "pad value " + std::to_string(v) + " does not fit " +
                                                 std::string(data_type_name(dt)));
      }
      t = static_cast<T>(v);
    } else {
      t = T(static_cast<compute_t<T>>(v));
    }
    std::memcpy(out.data(), &t, sizeof(T));
  });
  return out;
}

// Repeats one element over a contiguous tensor by doubling memcpys.
void fill_bytes(const Tensor& out, const std::byte* elem, size_t es) {
  const size_t total = out.nbytes();
  if (total == 0) return;
  std::byte* p = out.raw_data();
  std::memcpy(p, elem, es);
  for (size_t done = es; done < total;) {
    const size_t n = std::min(done, total - done);
    std::memcpy(p + done, p, n);
    done += n;
  }
}

enum class Mode { Constant, Reflect, Edge, Wrap };

// Index into [0, len) that output offset `i` (relative to the copied block) reads.
int64_t source_index(Mode mode, int64_t i, int64_t len) {
  switch (mode) {
    case Mode::Edge:
      return std::clamp<int64_t>(i, 0, len - 1);
    case Mode::Wrap:
      return ((i % len) + len) % len;
    case Mode::Reflect: {
      if (len == 1) return 0;
      const int64_t period = 2 * (len - 1);
      const int64_t m = ((i % period) + period) % period;
      return m < len ? m : period - m;
    }
    case Mode::Constant:
      break;
  }
  return 0;
}

class Pad final : public Kernel {
 public:
  explicit Pad(const NodeInfo& info) {
    const std::string mode = info.attr_string("mode", "constant");
    if (mode == "constant") {
      mode_ = Mode::Constant;
    } else if (mode == "reflect") {
      mode_ = Mode::Reflect;
    } else if (mode == "edge") {
      mode_ = Mode::Edge;
    } else if (mode == "wrap") {
      mode_ = Mode::Wrap;
    } else {
      info.fail("unknown mode '" + mode + "'", ErrorKind::Unsupported);
    }
    if (info.opset() < 11) {
      if (!info.has_attr("pads")) info.fail("missing required attribute 'pads'");
      attr_pads_ = info.attr_ints("pads");
      attr_value_ = info.attr_float("value", 0.0f);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::String && bits_per_element(x.dtype()) < 8) {
      throw_unsupported_type(x.dtype(), "Pad input");
    }
    const std::optional<std::vector<int64_t>> axes = read_axes(ctx);
    const PadGeometry g =
        pad_geometry(x.shape(), read_pads(ctx), axes ? &*axes : nullptr, mode_ == Mode::Constant);
    Tensor& out = ctx.output(0, x.dtype(), g.out_shape);
    if (mode_ == Mode::Constant) fill_constant(ctx, out);
    copy_strided(window(x, g.crop_start, g.len), window(out, g.out_start, g.len));
    if (mode_ != Mode::Constant) fill_borders(out, g.out_start, g.len);
    ctx.count_copy(out.nbytes());
  }

 private:
  // The pads: the attribute (before opset 11) or input 1.
  std::vector<int64_t> read_pads(const OpContext& ctx) const {
    if (ctx.opset() < 11) return attr_pads_;
    return to_int64s(ctx.input(1));
  }

  // The padded axes (input 3, from opset 18); null: every dim.
  static std::optional<std::vector<int64_t>> read_axes(const OpContext& ctx) {
    if (ctx.opset() < 18 || !ctx.has_input(3)) return std::nullopt;
    return to_int64s(ctx.input(3));
  }

  void fill_constant(const OpContext& ctx, const Tensor& out) const {
    const bool has_value = ctx.opset() >= 11 && ctx.has_input(2) && ctx.input(2).numel() > 0;
    if (has_value && ctx.input(2).dtype() != out.dtype()) {
      ctx.fail("constant_value has type " + ctx.input(2).describe() + ", data has " +
               out.describe());
    }
    if (out.dtype() == DataType::String) {
      const std::string v = has_value ? ctx.input(2).contiguous().data<const std::string>()[0] : "";
      std::string* p = out.data<std::string>();
      for (int64_t i = 0; i < out.numel(); ++i) p[i] = v;
      return;
    }
    const auto es = static_cast<size_t>(bits_per_element(out.dtype()) / 8);
    if (has_value) {
      const Tensor v = ctx.input(2).contiguous();
      fill_bytes(out, v.raw_data(), es);
    } else {
      const std::vector<std::byte> v = element_from_double(out.dtype(), attr_value_);
      fill_bytes(out, v.data(), es);
    }
  }

  // Dims after d are complete (over the middle of dims before d) when dim d is filled.
  void fill_borders(const Tensor& out, const Shape& start, const Shape& len) const {
    const size_t rank = out.rank();
    for (size_t d = rank; d-- > 0;) {
      Shape from(rank), to(rank), extent(rank);
      for (size_t k = 0; k < rank; ++k) {
        from[k] = k < d ? start[k] : 0;
        extent[k] = k < d ? len[k] : out.dim(k);
      }
      extent[d] = 1;
      to = from;
      for (int64_t p = 0; p < out.dim(d); ++p) {
        if (p >= start[d] && p < start[d] + len[d]) continue;
        from[d] = start[d] + source_index(mode_, p - start[d], len[d]);
        to[d] = p;
        copy_strided(window(out, from, extent), window(out, to, extent));
      }
    }
  }

  Mode mode_ = Mode::Constant;
  std::vector<int64_t> attr_pads_;
  float attr_value_ = 0;
};

void pad_shape(ShapeContext& c) {
  const ValueFacts& x = c.in(0);
  std::vector<int64_t> axes;
  const bool has_axes = c.opset() >= 18 && c.has_input(3);
  if (has_axes) axes = c.data(3);
  const bool constant = c.attr_string("mode", "constant") == "constant";
  c.set(0, x.dtype,
        pad_geometry(x.shape, c.ints_from("pads", 11, 1), has_axes ? &axes : nullptr, constant)
            .out_shape);
}

}  // namespace

KILN_REGISTER_OP({.op = "Pad",
                  .since = 2,
                  .min_inputs = 1,
                  .max_inputs = 4,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "all types but sub-byte ones",
                  .shape = pad_shape,
                  .create = make<Pad>});

}  // namespace kiln::ops
