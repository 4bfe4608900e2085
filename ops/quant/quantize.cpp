// QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear.
//
// Scale and zero point apply per tensor (one element), per axis (a 1-D tensor along `axis`)
// or per block (same rank as x, `block_size` elements of x along `axis` per scale). x is
// viewed as [outer, A, inner] around the axis and processed in tiles of one row segment, so
// the scale index is cheap and tiles run in parallel. Arithmetic matches the ONNX reference
// (numpy): x / scale in the inputs' precision, round half to even, add the zero point,
// clamp; dequantization (x - zero_point) * scale in float32.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/core/common.h"
#include "ops/core/float8.h"
#include "ops/math/kernels.h"
#include "ops/quant/quantize.h"

namespace kiln::ops {
namespace {

constexpr int64_t kTile = 256;

bool is_quant_type(DataType t) {
  int64_t lo = 0, hi = 0;
  return (t != DataType::Int32 && lowp::integer_range(t, lo, hi)) ||
         lowp::minifloat_format(t) != nullptr;
}

bool is_scale_type(DataType t) {
  return t == DataType::Float || t == DataType::Float16 || t == DataType::BFloat16 ||
         t == DataType::Float8E8M0;
}

// How scale and zero point map onto x.
struct Layout {
  int64_t outer = 1, axis_len = 1, inner = 1;
  int64_t block = 0;   // elements of x per scale along the axis when blocked
  int64_t blocks = 1;  // scale's extent along the axis when blocked
  enum Mode { PerTensor, PerAxis, Blocked } mode = PerTensor;

  int64_t scale_index(int64_t o, int64_t a, int64_t i) const {
    switch (mode) {
      case PerTensor:
        return 0;
      case PerAxis:
        return a;
      case Blocked:
        return (o * blocks + a / block) * inner + i;
    }
    return 0;
  }
};

Layout make_layout(const OpContext& ctx, const Tensor& x, const Tensor& scale, const Tensor* zp,
                   int64_t axis_attr, int64_t block_size) {
  if (zp && zp->shape() != scale.shape() && !(zp->numel() == 1 && scale.numel() == 1)) {
    ctx.fail("zero point shape " + shape_to_string(zp->shape()) + " differs from scale shape " +
             shape_to_string(scale.shape()));
  }
  Layout l;
  l.inner = x.numel();
  if (scale.numel() == 1 && (block_size == 0 || scale.rank() <= 1)) return l;
  const int64_t rank = static_cast<int64_t>(x.rank());
  const int64_t axis = normalize_axis(axis_attr, rank);
  l.outer = shape_numel(Shape(x.shape().begin(), x.shape().begin() + axis));
  l.axis_len = x.dim(static_cast<size_t>(axis));
  l.inner = shape_numel(Shape(x.shape().begin() + axis + 1, x.shape().end()));
  if (block_size == 0) {
    if (scale.rank() != 1 || scale.dim(0) != l.axis_len) {
      ctx.fail("per-axis scale must be 1-D of size " + std::to_string(l.axis_len) + ", got " +
               shape_to_string(scale.shape()));
    }
    l.mode = Layout::PerAxis;
    return l;
  }
  bool ok = static_cast<int64_t>(scale.rank()) == rank;
  for (int64_t d = 0; ok && d < rank; ++d) {
    const int64_t s = scale.dim(static_cast<size_t>(d)), xd = x.dim(static_cast<size_t>(d));
    ok = d == axis ? (s > 0 || xd == 0) && s >= (xd + block_size - 1) / block_size : s == xd;
  }
  if (!ok) {
    ctx.fail("blocked scale shape " + shape_to_string(scale.shape()) + " does not fit x " +
             shape_to_string(x.shape()) + " with block_size " + std::to_string(block_size));
  }
  l.mode = Layout::Blocked;
  l.block = block_size;
  l.blocks = scale.dim(static_cast<size_t>(axis));
  return l;
}

std::vector<double> all_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  lowp::read_as_doubles(t, 0, t.numel(), v.data());
  return v;
}

// Rounds to the nearest value of a floating type `p` (numpy computes in that type).
double round_to(double v, DataType p) {
  switch (p) {
    case DataType::Float:
      return static_cast<float>(v);
    case DataType::Float16:
      return float16::to_float(
          static_cast<uint16_t>(lowp::encode_minifloat(v, lowp::kHalf, false)));
    case DataType::BFloat16:
      return static_cast<float>(bfloat16::from_bits(
          static_cast<uint16_t>(lowp::encode_minifloat(v, lowp::kBFloat16, false))));
    default:
      return v;
  }
}

// Runs fn(o, a, i0, n, flat0) over tiles of rows; serially when tiles could share a byte.
template <typename F>
void for_each_tile(const Layout& l, bool serial, F&& fn) {
  const int64_t per_row = (l.inner + kTile - 1) / kTile;
  const int64_t tiles = l.outer * l.axis_len * per_row;
  auto body = [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t row = t / per_row, i0 = (t % per_row) * kTile;
      fn(row / l.axis_len, row % l.axis_len, i0, std::min(kTile, l.inner - i0), row * l.inner + i0);
    }
  };
  if (serial) {
    body(0, tiles);
  } else {
    parallel_for(tiles, std::max<int64_t>(1, 16384 / kTile), body);
  }
}

template <typename T>
void store_ints(std::byte* out, int64_t flat0, const int64_t* v, int64_t n) {
  T* p = reinterpret_cast<T*>(out) + flat0;
  for (int64_t k = 0; k < n; ++k) p[k] = static_cast<T>(v[k]);
}

struct QuantizeJob {
  const Layout& l;
  const std::vector<double>& s;  // scales
  const std::vector<double>& z;  // zero points
  DataType p;                    // precision of x / scale
  DataType out_t;
  std::byte* out;
  const lowp::MiniFloat* fmt;  // float8/float4 outputs
  int bits;                    // packed outputs
  int64_t lo, hi;              // integer outputs
  bool saturate;
};

// Quantizes x[0, n), elements i0... of row (o, a), into the output at flat0.
template <typename T>
void quantize_tile(const QuantizeJob& j, const T* x, int64_t o, int64_t a, int64_t i0, int64_t n,
                   int64_t flat0) {
  int64_t iv[kTile];
  double q[kTile];
  const bool one_scale = j.l.mode != Layout::Blocked;  // constant along a row
  const size_t si0 = static_cast<size_t>(j.l.scale_index(o, a, i0));
  bool done = false;
  if constexpr (std::is_same_v<T, float>) {
    if (!j.fmt && j.p == DataType::Float && one_scale) {
      // The common case, in float: the arithmetic below without the conversions.
      const float sv = static_cast<float>(j.s[si0]), zv = static_cast<float>(j.z[si0]);
      const float lo = static_cast<float>(j.lo), hi = static_cast<float>(j.hi);
      for (int64_t k = 0; k < n; ++k) {
        const float v = x[k] / sv;
        iv[k] =
            static_cast<int64_t>(std::clamp(std::isnan(v) ? zv : std::nearbyint(v) + zv, lo, hi));
      }
      done = true;
    }
  }
  for (int64_t k = 0; k < n && !done; ++k) {
    const double xv = static_cast<double>(static_cast<compute_t<T>>(x[k]));
    const size_t si = one_scale ? si0 : static_cast<size_t>(j.l.scale_index(o, a, i0 + k));
    q[k] = round_to(round_to(xv, j.p) / round_to(j.s[si], j.p), j.p);
    if (!j.fmt) {
      const double r = std::isnan(q[k]) ? j.z[si] : std::nearbyint(q[k]) + j.z[si];
      iv[k] =
          static_cast<int64_t>(std::clamp(r, static_cast<double>(j.lo), static_cast<double>(j.hi)));
    } else if (j.out_t == DataType::Float4E2M1) {
      q[k] = round_to(q[k] + j.z[si], j.p);
    }
  }
  if (j.fmt) {
    for (int64_t k = 0; k < n; ++k) {
      const uint32_t code = lowp::encode_minifloat(q[k], *j.fmt, j.saturate);
      if (j.bits) {
        lowp::set_packed(j.out, flat0 + k, j.bits, code);
      } else {
        reinterpret_cast<uint8_t*>(j.out)[flat0 + k] = static_cast<uint8_t>(code);
      }
    }
    return;
  }
  switch (j.out_t) {
    case DataType::UInt8:
      return store_ints<uint8_t>(j.out, flat0, iv, n);
    case DataType::Int8:
      return store_ints<int8_t>(j.out, flat0, iv, n);
    case DataType::UInt16:
      return store_ints<uint16_t>(j.out, flat0, iv, n);
    case DataType::Int16:
      return store_ints<int16_t>(j.out, flat0, iv, n);
    default:
      for (int64_t k = 0; k < n; ++k) {
        lowp::set_packed(j.out, flat0 + k, j.bits,
                         static_cast<uint32_t>(iv[k]) & ((1u << j.bits) - 1));
      }
  }
}

class QuantizeLinear final : public Kernel {
 public:
  explicit QuantizeLinear(const NodeInfo& info)
      : axis_(info.attr_int("axis", 1)),
        block_size_(info.attr_int("block_size", 0)),
        saturate_(info.attr_int("saturate", 1) != 0) {
    if (block_size_ < 0) info.fail("block_size must be >= 0");
    const int64_t od = info.attr_int("output_dtype", 0);
    if (od != 0 && !(is_known_data_type(static_cast<int32_t>(od)) &&
                     od == static_cast<int32_t>(od) && is_quant_type(static_cast<DataType>(od)))) {
      info.fail("output_dtype " + std::to_string(od) + " is not a quantized type",
                ErrorKind::Unsupported);
    }
    output_dtype_ = static_cast<DataType>(od);
    const int64_t pr = info.attr_int("precision", 0);
    if (pr != 0 && pr != static_cast<int64_t>(DataType::Float) &&
        pr != static_cast<int64_t>(DataType::Float16) &&
        pr != static_cast<int64_t>(DataType::BFloat16) &&
        pr != static_cast<int64_t>(DataType::Double)) {
      info.fail("precision must be a floating type", ErrorKind::Unsupported);
    }
    precision_ = static_cast<DataType>(pr);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const Tensor* zp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    DataType out_t = output_dtype_ == DataType::Undefined ? DataType::UInt8 : output_dtype_;
    if (zp) {
      if (output_dtype_ != DataType::Undefined && zp->dtype() != output_dtype_) {
        ctx.fail("output_dtype differs from the zero point's type");
      }
      out_t = zp->dtype();
    }
    if (!is_quant_type(out_t)) throw_unsupported_type(out_t, "QuantizeLinear output");
    if (!is_scale_type(scale.dtype()))
      throw_unsupported_type(scale.dtype(), "QuantizeLinear scale");
    const Layout l = make_layout(ctx, x, scale, zp, axis_, block_size_);
    const DataType p = precision_ != DataType::Undefined ? precision_ : compute_type(x, scale);
    const std::vector<double> s = all_doubles(scale);
    const std::vector<double> z = zp ? all_doubles(*zp) : std::vector<double>(s.size(), 0.0);
    Tensor& y = ctx.output(0, out_t, x.shape());
    QuantizeJob job{l,
                    s,
                    z,
                    p,
                    out_t,
                    y.raw_data(),
                    lowp::minifloat_format(out_t),
                    lowp::packed_bits(out_t),
                    0,
                    0,
                    saturate_};
    lowp::integer_range(out_t, job.lo, job.hi);
    if (job.bits) std::fill(job.out, job.out + y.nbytes(), std::byte{0});
    dispatch(
        TypeList<float, float16, bfloat16, int32_t, double>{}, x.dtype(),
        [&]<typename T>() {
          const T* px = x.data<const T>();
          // Packed outputs run serially: neighbouring tiles may share a byte.
          for_each_tile(l, job.bits != 0,
                        [&](int64_t o, int64_t a, int64_t i0, int64_t n, int64_t flat0) {
                          quantize_tile<T>(job, px + flat0, o, a, i0, n, flat0);
                        });
        },
        "QuantizeLinear input");
  }

 private:
  // numpy's result type of x / scale.
  static DataType compute_type(const Tensor& x, const Tensor& scale) {
    if (x.dtype() == DataType::Int32 || x.dtype() == DataType::Double) return DataType::Double;
    if (scale.dtype() == x.dtype()) return x.dtype();
    return DataType::Float;
  }

  int64_t axis_, block_size_;
  bool saturate_;
  DataType output_dtype_ = DataType::Undefined;
  DataType precision_ = DataType::Undefined;
};

class DequantizeLinear final : public Kernel {
 public:
  explicit DequantizeLinear(const NodeInfo& info)
      : axis_(info.attr_int("axis", 1)), block_size_(info.attr_int("block_size", 0)) {
    if (block_size_ < 0) info.fail("block_size must be >= 0");
    const int64_t od = info.attr_int("output_dtype", 0);
    if (od != 0 && od != static_cast<int64_t>(DataType::Float) &&
        od != static_cast<int64_t>(DataType::Float16) &&
        od != static_cast<int64_t>(DataType::BFloat16)) {
      info.fail("output_dtype must be float, float16 or bfloat16", ErrorKind::Unsupported);
    }
    output_dtype_ = static_cast<DataType>(od);
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const Tensor* zp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    if (!is_quant_type(x.dtype()) && x.dtype() != DataType::Int32) {
      throw_unsupported_type(x.dtype(), "DequantizeLinear input");
    }
    if (!is_scale_type(scale.dtype())) {
      throw_unsupported_type(scale.dtype(), "DequantizeLinear scale");
    }
    const bool float_x = lowp::minifloat_format(x.dtype()) != nullptr;
    if (zp && !float_x && zp->dtype() != x.dtype()) {
      ctx.fail("zero point type " + std::string(data_type_name(zp->dtype())) +
               " differs from x's " + std::string(data_type_name(x.dtype())));
    }
    const DataType out_t = output_dtype_ != DataType::Undefined ? output_dtype_ : scale.dtype();
    if (out_t == DataType::Float8E8M0) ctx.fail("output_dtype is required with a float8e8m0 scale");
    const Layout l = make_layout(ctx, x, scale, zp, axis_, block_size_);
    const std::vector<double> s = all_doubles(scale);
    // The reference ignores float8/float4 zero points (they must be zero).
    const std::vector<double> z =
        zp && !float_x ? all_doubles(*zp) : std::vector<double>(s.size(), 0.0);
    Tensor& y = ctx.output(0, out_t, x.shape());
    std::byte* out = y.raw_data();
    for_each_tile(l, false, [&](int64_t o, int64_t a, int64_t i0, int64_t n, int64_t flat0) {
      double v[kTile];
      lowp::read_as_doubles(x, flat0, n, v);
      float r[kTile];
      const bool one_scale = l.mode != Layout::Blocked;  // constant along a row
      const size_t si0 = static_cast<size_t>(l.scale_index(o, a, i0));
      for (int64_t k = 0; k < n; ++k) {
        const size_t si = one_scale ? si0 : static_cast<size_t>(l.scale_index(o, a, i0 + k));
        r[k] = static_cast<float>((static_cast<double>(static_cast<float>(v[k])) - z[si]) * s[si]);
      }
      if (out_t == DataType::Float) {
        std::copy(r, r + n, reinterpret_cast<float*>(out) + flat0);
      } else if (out_t == DataType::Float16) {
        auto* d = reinterpret_cast<float16*>(out) + flat0;
        for (int64_t k = 0; k < n; ++k) d[k] = float16(r[k]);
      } else {
        auto* d = reinterpret_cast<bfloat16*>(out) + flat0;
        for (int64_t k = 0; k < n; ++k) d[k] = bfloat16(r[k]);
      }
    });
  }

 private:
  int64_t axis_, block_size_;
  DataType output_dtype_ = DataType::Undefined;
};

// uint8 quantization with a scale and zero point computed from the data's range (which
// always includes 0).
class DynamicQuantizeLinear final : public Kernel {
 public:
  explicit DynamicQuantizeLinear(const NodeInfo&) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DataType::Float)
      throw_unsupported_type(x.dtype(), "DynamicQuantizeLinear input");
    Tensor& y = ctx.output(0, DataType::UInt8, x.shape());
    const DynamicQuant q = dynamic_quantize_u8(x.data<const float>(), x.numel(), y.data<uint8_t>());
    if (ctx.has_output(1)) ctx.output(1, DataType::Float, {}).data<float>()[0] = q.scale;
    if (ctx.has_output(2)) ctx.output(2, DataType::UInt8, {}).data<uint8_t>()[0] = q.zero_point;
  }
};

// y has x's shape; its type is the zero point's, else output_dtype, else uint8.
void quantize_shape(ShapeContext& c) {
  const auto od = static_cast<DataType>(c.attr_int("output_dtype", 0));
  DataType out = od == DataType::Undefined ? DataType::UInt8 : od;
  if (c.has_input(2)) {
    if (od != DataType::Undefined && c.dtype(2) != od) unknown("output_dtype differs from zp's");
    out = c.dtype(2);
  }
  if (!is_quant_type(out) || !is_scale_type(c.dtype(1)))
    unknown("types QuantizeLinear does not take");
  c.set(0, out, c.shape(0));
}

// y has x's shape; its type is output_dtype, else the scale's.
void dequantize_shape(ShapeContext& c) {
  const auto od = static_cast<DataType>(c.attr_int("output_dtype", 0));
  const DataType out = od != DataType::Undefined ? od : c.dtype(1);
  if ((!is_quant_type(c.dtype(0)) && c.dtype(0) != DataType::Int32) || !is_scale_type(c.dtype(1)) ||
      out == DataType::Float8E8M0) {
    unknown("types DequantizeLinear does not take");
  }
  c.set(0, out, c.shape(0));
}

// y (uint8, x's shape), its float scale and uint8 zero point as scalars.
void dynamic_quantize_shape(ShapeContext& c) {
  if (c.dtype(0) != DataType::Float) unknown("x must be float");
  c.set(0, DataType::UInt8, c.shape(0));
  c.set(1, DataType::Float, {});
  c.set(2, DataType::UInt8, {});
}

}  // namespace

constexpr const char* kQuantTypes =
    "x float/float16/bfloat16/int32 -> uint8, int8, uint16, int16, uint4, int4, uint2, int2, "
    "float8 (4 kinds), float4e2m1";
KILN_REGISTER_OP({.op = "QuantizeLinear",
                  .since = 10,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = kQuantTypes,
                  .shape = quantize_shape,
                  .create = make<QuantizeLinear>});
KILN_REGISTER_OP({.op = "DequantizeLinear",
                  .since = 10,
                  .min_inputs = 2,
                  .max_inputs = 3,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "all quantized types and int32 -> float, float16, bfloat16",
                  .shape = dequantize_shape,
                  .create = make<DequantizeLinear>});
KILN_REGISTER_OP({.op = "DynamicQuantizeLinear",
                  .since = 11,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 3,
                  .max_outputs = 3,
                  .types = "float -> uint8",
                  .shape = dynamic_quantize_shape,
                  .create = make<DynamicQuantizeLinear>});

DynamicQuant dynamic_quant_params(const float* px, int64_t n) {
  const math::Int8GemmKernels& k = math::kernels().int8_gemm;
  constexpr int64_t kPart = 1 << 16;
  const int64_t parts = (n + kPart - 1) / kPart;
  // One slot even for an empty x, whose range is then [0, 0].
  const size_t slots = static_cast<size_t>(std::max<int64_t>(parts, 1));
  std::vector<float> mins(slots, 0.0f), maxs(slots, 0.0f);
  parallel_for(parts, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t at = p * kPart;
      k.quant_range(px + at, std::min(n - at, kPart), &mins[static_cast<size_t>(p)],
                    &maxs[static_cast<size_t>(p)]);
    }
  });
  const float mn = *std::min_element(mins.begin(), mins.end());
  const float mx = *std::max_element(maxs.begin(), maxs.end());
  const float scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
  const float zp_f = std::clamp(0.0f - mn / scale, 0.0f, 255.0f);
  const float zp = std::isnan(zp_f) ? 0.0f : std::nearbyint(zp_f);
  return {scale, static_cast<uint8_t>(zp)};
}

DynamicQuant dynamic_quantize_u8(const float* px, int64_t n, uint8_t* py) {
  const math::Int8GemmKernels& k = math::kernels().int8_gemm;
  const DynamicQuant q = dynamic_quant_params(px, n);
  const float zp = q.zero_point;
  parallel_for(n, 1 << 14,
               [&](int64_t b, int64_t e) { k.quantize_u8(px + b, e - b, q.scale, zp, py + b); });
  return q;
}

}  // namespace kiln::ops
