// Element types of kiln tensors, numbered as ONNX's TensorProto.DataType so that
// converting from a model file is the identity.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kiln {

enum class DataType : int32_t {
  Undefined = 0,
  Float = 1,
  UInt8 = 2,
  Int8 = 3,
  UInt16 = 4,
  Int16 = 5,
  Int32 = 6,
  Int64 = 7,
  String = 8,
  Bool = 9,
  Float16 = 10,
  Double = 11,
  UInt32 = 12,
  UInt64 = 13,
  Complex64 = 14,
  Complex128 = 15,
  BFloat16 = 16,
  Float8E4M3FN = 17,
  Float8E4M3FNUZ = 18,
  Float8E5M2 = 19,
  Float8E5M2FNUZ = 20,
  UInt4 = 21,
  Int4 = 22,
  Float4E2M1 = 23,
  Float8E8M0 = 24,
  UInt2 = 25,
  Int2 = 26,
};

// Storage bits per element (4 for int4/uint4/float4e2m1, 2 for int2/uint2; 0 for
// Undefined). Strings report sizeof(std::string): they are stored as std::string objects.
int bits_per_element(DataType t);
// Element counts above 2^56 and allocations above 2^60 bytes cannot be real tensors: refusing
// them keeps every byte size computed from a shape free of overflow.
inline constexpr int64_t kMaxElementCount = int64_t{1} << 56;
inline constexpr size_t kMaxAllocationBytes = size_t{1} << 60;
// Bytes needed for `count` elements, rounding sub-byte types up to whole bytes. Throws
// kiln::Error (Memory) for a count above kMaxElementCount.
size_t storage_bytes(DataType t, int64_t count);
// ONNX's lower-case name ("float", "int64", "float16", ...).
std::string_view data_type_name(DataType t);
// True for the enumerators above (a model may carry numbers kiln has never heard of).
bool is_known_data_type(int32_t code);
bool is_float_type(DataType t);  // float, double, float16, bfloat16, float8 variants
bool is_integer_type(DataType t);
bool is_signed_integer_type(DataType t);

// IEEE 754 binary16, stored as bits; arithmetic goes through float.
struct float16 {
  uint16_t bits = 0;
  float16() = default;
  explicit float16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }
  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
  static float16 from_bits(uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }
};

// bfloat16: the upper half of a float32, rounded to nearest even.
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) : bits(from_float(f)) {}
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    return std::bit_cast<float>(u);
  }
  static uint16_t from_float(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

// The C++ type that stores one element of each DataType, for the types kernels compute on.
template <typename T>
constexpr DataType data_type_of();
template <>
constexpr DataType data_type_of<float>() {
  return DataType::Float;
}
template <>
constexpr DataType data_type_of<double>() {
  return DataType::Double;
}
template <>
constexpr DataType data_type_of<float16>() {
  return DataType::Float16;
}
template <>
constexpr DataType data_type_of<bfloat16>() {
  return DataType::BFloat16;
}
template <>
constexpr DataType data_type_of<int8_t>() {
  return DataType::Int8;
}
template <>
constexpr DataType data_type_of<int16_t>() {
  return DataType::Int16;
}
template <>
constexpr DataType data_type_of<int32_t>() {
  return DataType::Int32;
}
template <>
constexpr DataType data_type_of<int64_t>() {
  return DataType::Int64;
}
template <>
constexpr DataType data_type_of<uint8_t>() {
  return DataType::UInt8;
}
template <>
constexpr DataType data_type_of<uint16_t>() {
  return DataType::UInt16;
}
template <>
constexpr DataType data_type_of<uint32_t>() {
  return DataType::UInt32;
}
template <>
constexpr DataType data_type_of<uint64_t>() {
  return DataType::UInt64;
}
template <>
constexpr DataType data_type_of<bool>() {
  return DataType::Bool;
}
template <>
constexpr DataType data_type_of<std::string>() {
  return DataType::String;
}

}  // namespace kiln
