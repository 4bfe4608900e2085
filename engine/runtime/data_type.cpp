#include "kiln/data_type.h"

#include <string>

#include "kiln/error.h"

namespace kiln {

int bits_per_element(DataType t) {
  switch (t) {
    case DataType::Bool:
    case DataType::Int8:
    case DataType::UInt8:
    case DataType::Float8E4M3FN:
    case DataType::Float8E4M3FNUZ:
    case DataType::Float8E5M2:
    case DataType::Float8E5M2FNUZ:
    case DataType::Float8E8M0:
      return 8;
    case DataType::Int16:
    case DataType::UInt16:
    case DataType::Float16:
    case DataType::BFloat16:
      return 16;
    case DataType::Int32:
    case DataType::UInt32:
    case DataType::Float:
      return 32;
    case DataType::Int64:
    case DataType::UInt64:
    case DataType::Double:
    case DataType::Complex64:
      return 64;
    case DataType::Complex128:
      return 128;
    case DataType::Int4:
    case DataType::UInt4:
    case DataType::Float4E2M1:
      return 4;
    case DataType::Int2:
    case DataType::UInt2:
      return 2;
    case DataType::String:
      return static_cast<int>(sizeof(std::string) * 8);
    case DataType::Undefined:
      return 0;
  }
  return 0;
}

size_t storage_bytes(DataType t, int64_t count) {
  if (count <= 0) return 0;
  if (count > kMaxElementCount) {
    throw Error(ErrorKind::Memory, std::to_string(count) + " elements of " +
                                       std::string(data_type_name(t)) + " cannot be allocated");
  }
  const uint64_t bits = static_cast<uint64_t>(bits_per_element(t)) * static_cast<uint64_t>(count);
  return static_cast<size_t>((bits + 7) / 8);
}

std::string_view data_type_name(DataType t) {
  switch (t) {
    case DataType::Undefined:
      return "undefined";
    case DataType::Float:
      return "float32";
    case DataType::UInt8:
      return "uint8";
    case DataType::Int8:
      return "int8";
    case DataType::UInt16:
      return "uint16";
    case DataType::Int16:
      return "int16";
    case DataType::Int32:
      return "int32";
    case DataType::Int64:
      return "int64";
    case DataType::String:
      return "string";
    case DataType::Bool:
      return "bool";
    case DataType::Float16:
      return "float16";
    case DataType::Double:
      return "float64";
    case DataType::UInt32:
      return "uint32";
    case DataType::UInt64:
      return "uint64";
    case DataType::Complex64:
      return "complex64";
    case DataType::Complex128:
      return "complex128";
    case DataType::BFloat16:
      return "bfloat16";
    case DataType::Float8E4M3FN:
      return "float8e4m3fn";
    case DataType::Float8E4M3FNUZ:
      return "float8e4m3fnuz";
    case DataType::Float8E5M2:
      return "float8e5m2";
    case DataType::Float8E5M2FNUZ:
      return "float8e5m2fnuz";
    case DataType::UInt4:
      return "uint4";
    case DataType::Int4:
      return "int4";
    case DataType::Float4E2M1:
      return "float4e2m1";
    case DataType::Float8E8M0:
      return "float8e8m0";
    case DataType::UInt2:
      return "uint2";
    case DataType::Int2:
      return "int2";
  }
  return "unknown";
}

bool is_known_data_type(int32_t code) {
  return code >= 1 && code <= 26;
}

bool is_float_type(DataType t) {
  switch (t) {
    case DataType::Float:
    case DataType::Double:
    case DataType::Float16:
    case DataType::BFloat16:
    case DataType::Float8E4M3FN:
    case DataType::Float8E4M3FNUZ:
    case DataType::Float8E5M2:
    case DataType::Float8E5M2FNUZ:
    case DataType::Float8E8M0:
    case DataType::Float4E2M1:
      return true;
    default:
      return false;
  }
}

bool is_signed_integer_type(DataType t) {
  return t == DataType::Int8 || t == DataType::Int16 || t == DataType::Int32 ||
         t == DataType::Int64 || t == DataType::Int4 || t == DataType::Int2;
}

bool is_integer_type(DataType t) {
  return is_signed_integer_type(t) || t == DataType::UInt8 || t == DataType::UInt16 ||
         t == DataType::UInt32 || t == DataType::UInt64 || t == DataType::UInt4 ||
         t == DataType::UInt2;
}

// Round-to-nearest-even conversion, handling subnormals, infinities and NaN.
uint16_t float16::from_float(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {                                               // subnormal half (or zero)
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half of min subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (112 - exp) ... bits to drop
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float float16::to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | static_cast<uint32_t>(112 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | (exp + 112) << 23 | mant << 13;
  }
  return std::bit_cast<float>(out);
}

}  // namespace kiln
