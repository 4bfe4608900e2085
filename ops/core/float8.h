// Encoding and decoding of the low-precision element types (float8 variants, float8e8m0,
// float4e2m1, packed int4/uint4/int2/uint2) shared by Cast, QuantizeLinear and friends.
//
// Rounding follows ml_dtypes (which the ONNX reference uses): round to nearest even on the
// exact value, then an overflowing result becomes the largest finite value (saturate), else
// infinity where the format has one, else NaN. Formats without NaN or infinity (float4)
// always saturate.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kiln/data_type.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::ops::lowp {

// A small binary floating-point format with a sign bit at `sign_shift`.
struct MiniFloat {
  int mbits;              // mantissa bits
  int bias;               // exponent bias
  int sign_shift;         // position of the sign bit
  uint32_t max_code;      // largest finite magnitude
  uint32_t inf_code;      // magnitude code of infinity, 0 if the format has none
  uint32_t nan_code;      // code of NaN (magnitude, or the full code when nan_fixed)
  bool nan_fixed;         // NaN has one code whatever the sign (FNUZ formats)
  bool unsigned_zero;     // no negative zero (FNUZ formats)
  uint32_t special_mask;  // magnitudes with all these bits set are inf/NaN (IEEE-like)
};

inline constexpr MiniFloat kE4M3FN{3, 7, 7, 0x7e, 0, 0x7f, false, false, 0};
inline constexpr MiniFloat kE4M3FNUZ{3, 8, 7, 0x7f, 0, 0x80, true, true, 0};
inline constexpr MiniFloat kE5M2{2, 15, 7, 0x7b, 0x7c, 0x7e, false, false, 0x7c};
inline constexpr MiniFloat kE5M2FNUZ{2, 16, 7, 0x7f, 0, 0x80, true, true, 0};
inline constexpr MiniFloat kHalf{10, 15, 15, 0x7bff, 0x7c00, 0x7e00, false, false, 0x7c00};
inline constexpr MiniFloat kBFloat16{7, 127, 15, 0x7f7f, 0x7f80, 0x7fc0, false, false, 0x7f80};
// float4e2m1 has no NaN: ml_dtypes turns NaN into the zero with the opposite sign bit.
inline constexpr MiniFloat kE2M1{1, 1, 3, 0x7, 0, 0, false, false, 0};

// The format of a float8/float4 DataType, or null.
inline const MiniFloat* minifloat_format(DataType t) {
  switch (t) {
    case DataType::Float8E4M3FN:
      return &kE4M3FN;
    case DataType::Float8E4M3FNUZ:
      return &kE4M3FNUZ;
    case DataType::Float8E5M2:
      return &kE5M2;
    case DataType::Float8E5M2FNUZ:
      return &kE5M2FNUZ;
    case DataType::Float4E2M1:
      return &kE2M1;
    default:
      return nullptr;
  }
}

// Nearest-even encoding of `x` (exact for any double input).
inline uint32_t encode_minifloat(double x, const MiniFloat& f, bool saturate) {
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const bool neg = (bits >> 63) != 0;
  const uint32_t sign = neg ? (1u << f.sign_shift) : 0u;
  const uint64_t mag = bits & 0x7fffffffffffffffull;
  const bool no_nan = f.nan_code == 0 && f.inf_code == 0 && !f.nan_fixed;
  if (mag > 0x7ff0000000000000ull) {  // NaN
    if (no_nan) return neg ? 0u : (1u << f.sign_shift);
    return f.nan_fixed ? f.nan_code : (sign | f.nan_code);
  }
  auto overflow = [&]() -> uint32_t {
    if (saturate || no_nan) return sign | f.max_code;
    if (f.inf_code) return sign | f.inf_code;
    return f.nan_fixed ? f.nan_code : (sign | f.nan_code);
  };
  if (mag == 0x7ff0000000000000ull) return overflow();
  // Branch-free on the data: q is the significand in units of the target's last place,
  // rounded half to even by adding (half - 1 + lsb) before the shift. Subnormal targets
  // shift further; the exponent field then is 0 and a carry moves into the smallest normal.
  const int biased = static_cast<int>(mag >> 52);
  const int e = std::max(biased, 1) - 1023;
  const uint64_t m = (mag & 0xfffffffffffffull) | (biased ? (1ull << 52) : 0);
  const int field = std::max(e + f.bias - 1, 0);  // exponent field minus 1 (0 if subnormal)
  const int shift = std::min(52 - f.mbits + std::max(1 - f.bias - e, 0), 63);
  const uint64_t q = (m + ((1ull << (shift - 1)) - 1) + ((m >> shift) & 1)) >> shift;
  const uint64_t code = (static_cast<uint64_t>(field) << f.mbits) + q;
  if (code > f.max_code) return overflow();
  if (code == 0 && f.unsigned_zero) return 0;
  return sign | static_cast<uint32_t>(code);
}

inline float decode_minifloat(uint32_t code, const MiniFloat& f) {
  const uint32_t sign_bit = 1u << f.sign_shift;
  const bool neg = (code & sign_bit) != 0;
  const uint32_t mag = code & (sign_bit - 1);
  if (f.nan_fixed) {
    if (code == f.nan_code) return std::numeric_limits<float>::quiet_NaN();
  } else if (f.special_mask) {
    if ((mag & f.special_mask) == f.special_mask) {
      if (mag == f.inf_code) {
        return neg ? -std::numeric_limits<float>::infinity()
                   : std::numeric_limits<float>::infinity();
      }
      return std::numeric_limits<float>::quiet_NaN();
    }
  } else if (f.nan_code && mag == f.nan_code) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  const int exp_field = static_cast<int>(mag >> f.mbits);
  const uint32_t mant = mag & ((1u << f.mbits) - 1);
  float v;
  if (exp_field == 0) {
    v = std::ldexp(static_cast<float>(mant), 1 - f.bias - f.mbits);
  } else {
    v = std::ldexp(static_cast<float>(mant | (1u << f.mbits)), exp_field - f.bias - f.mbits);
  }
  return neg ? -v : v;
}

// float8e8m0: a biased power of two (2^(code-127)), 0xff is NaN; no sign, no zero.
enum class RoundMode { Up, Down, Nearest };

// As onnx.numpy_helper.to_float8e8m0: from the float32 bits, the sign is dropped.
inline uint8_t encode_e8m0(float x, RoundMode mode, bool saturate) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  uint32_t exponent = (bits >> 23) & 0xff;
  if (exponent == 0xff) return 0xff;
  bool round_up = false;
  if (mode == RoundMode::Up) {
    round_up = (bits & 0x7fffff) != 0;
  } else if (mode == RoundMode::Nearest) {
    const bool g = (bits & 0x400000) != 0;
    const bool r = (bits & 0x200000) != 0;
    const bool s = (bits & 0x1fffff) != 0;
    const bool lsb = exponent > 0;
    round_up = g && (r || s || lsb);
  }
  if (round_up && !(saturate && exponent == 0xfe)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

inline float decode_e8m0(uint8_t code) {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  if (code == 0) return std::bit_cast<float>(uint32_t{0x00400000});  // 2^-127, a subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(code) << 23);
}

// All values of an 8-bit (or 4-bit) float type, indexed by code: decoding is a lookup.
inline const float* decode_table(DataType t) {
  struct Tables {
    float v[6][256];
    Tables() {
      const MiniFloat* fmts[5] = {&kE4M3FN, &kE4M3FNUZ, &kE5M2, &kE5M2FNUZ, &kE2M1};
      for (int f = 0; f < 5; ++f) {
        const uint32_t codes = fmts[f] == &kE2M1 ? 16u : 256u;
        for (uint32_t c = 0; c < 256; ++c) v[f][c] = c < codes ? decode_minifloat(c, *fmts[f]) : 0;
      }
      for (uint32_t c = 0; c < 256; ++c) v[5][c] = decode_e8m0(static_cast<uint8_t>(c));
    }
  };
  static const Tables tables;
  switch (t) {
    case DataType::Float8E4M3FN:
      return tables.v[0];
    case DataType::Float8E4M3FNUZ:
      return tables.v[1];
    case DataType::Float8E5M2:
      return tables.v[2];
    case DataType::Float8E5M2FNUZ:
      return tables.v[3];
    case DataType::Float4E2M1:
      return tables.v[4];
    case DataType::Float8E8M0:
      return tables.v[5];
    default:
      return nullptr;
  }
}

// ---- packed sub-byte elements: element i sits at bits (i % per_byte) * bits of byte i / per_byte

inline int packed_bits(DataType t) {
  switch (t) {
    case DataType::Int4:
    case DataType::UInt4:
    case DataType::Float4E2M1:
      return 4;
    case DataType::Int2:
    case DataType::UInt2:
      return 2;
    default:
      return 0;
  }
}

inline uint32_t get_packed(const std::byte* p, int64_t i, int bits) {
  const int per_byte = 8 / bits;
  const auto byte = static_cast<uint32_t>(p[i / per_byte]);
  return (byte >> ((i % per_byte) * bits)) & ((1u << bits) - 1);
}

// Sets element i without touching its neighbours.
inline void set_packed(std::byte* p, int64_t i, int bits, uint32_t v) {
  const int per_byte = 8 / bits;
  const int shift = static_cast<int>(i % per_byte) * bits;
  const uint32_t mask = ((1u << bits) - 1) << shift;
  auto& b = p[i / per_byte];
  b = static_cast<std::byte>((static_cast<uint32_t>(b) & ~mask) | ((v << shift) & mask));
}

// The integer value of a packed int4/uint4/int2/uint2 code (sign-extended for signed types).
inline int32_t packed_int_value(uint32_t code, DataType t) {
  const int bits = packed_bits(t);
  if (t == DataType::Int4 || t == DataType::Int2) {
    const uint32_t sign = 1u << (bits - 1);
    return static_cast<int32_t>(code ^ sign) - static_cast<int32_t>(sign);
  }
  return static_cast<int32_t>(code);
}

// Range of the integer quantization types.
inline bool integer_range(DataType t, int64_t& lo, int64_t& hi) {
  switch (t) {
    case DataType::UInt8:
      lo = 0, hi = 255;
      return true;
    case DataType::Int8:
      lo = -128, hi = 127;
      return true;
    case DataType::UInt16:
      lo = 0, hi = 65535;
      return true;
    case DataType::Int16:
      lo = -32768, hi = 32767;
      return true;
    case DataType::UInt4:
      lo = 0, hi = 15;
      return true;
    case DataType::Int4:
      lo = -8, hi = 7;
      return true;
    case DataType::UInt2:
      lo = 0, hi = 3;
      return true;
    case DataType::Int2:
      lo = -2, hi = 1;
      return true;
    case DataType::Int32:
      lo = INT32_MIN, hi = INT32_MAX;
      return true;
    default:
      return false;
  }
}

// Elements [start, start + n) of a contiguous numeric tensor of any type, as doubles.
inline void read_as_doubles(const Tensor& t, int64_t start, int64_t n, double* out) {
  const std::byte* p = t.raw_data();
  auto typed = [&](auto tag) {
    using T = decltype(tag);
    const T* q = reinterpret_cast<const T*>(p) + start;
    for (int64_t k = 0; k < n; ++k) out[k] = static_cast<double>(q[k]);
  };
  switch (t.dtype()) {
    case DataType::Float:
      return typed(float{});
    case DataType::Double:
      return typed(double{});
    case DataType::Float16: {
      const auto* q = reinterpret_cast<const uint16_t*>(p) + start;
      for (int64_t k = 0; k < n; ++k) out[k] = float16::to_float(q[k]);
      return;
    }
    case DataType::BFloat16: {
      const auto* q = reinterpret_cast<const uint16_t*>(p) + start;
      for (int64_t k = 0; k < n; ++k) out[k] = static_cast<float>(bfloat16::from_bits(q[k]));
      return;
    }
    case DataType::Int8:
      return typed(int8_t{});
    case DataType::UInt8:
      return typed(uint8_t{});
    case DataType::Int16:
      return typed(int16_t{});
    case DataType::UInt16:
      return typed(uint16_t{});
    case DataType::Int32:
      return typed(int32_t{});
    case DataType::UInt32:
      return typed(uint32_t{});
    case DataType::Int64:
      return typed(int64_t{});
    case DataType::UInt64:
      return typed(uint64_t{});
    default:
      break;
  }
  const int bits = packed_bits(t.dtype());
  if (const float* table = decode_table(t.dtype())) {
    if (bits) {
      for (int64_t k = 0; k < n; ++k) out[k] = table[get_packed(p, start + k, bits)];
    } else {
      const auto* q = reinterpret_cast<const uint8_t*>(p) + start;
      for (int64_t k = 0; k < n; ++k) out[k] = table[q[k]];
    }
    return;
  }
  if (bits) {
    for (int64_t k = 0; k < n; ++k)
      out[k] = packed_int_value(get_packed(p, start + k, bits), t.dtype());
    return;
  }
  throw Error(ErrorKind::Unsupported,
              "element type " + std::string(data_type_name(t.dtype())) + " is not numeric");
}

}  // namespace kiln::ops::lowp
