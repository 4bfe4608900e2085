// Conversions between float and the 16-bit float types, written once against the level's
// vector type (ops/math/simd/). Included by each ops/math/isa_*.cpp inside its namespace;
// it includes nothing itself.

// One element, for the tails: the same rounding as the vector code.
inline float f16_to_f32_one(uint16_t h) {
  alignas(64) uint16_t in[kLanes] = {};
  alignas(64) float out[kLanes];
  in[0] = h;
  vstore(out, vload_f16(in));
  return out[0];
}

inline uint16_t f32_to_f16_one(float f) {
  alignas(64) float in[kLanes] = {};
  alignas(64) uint16_t out[kLanes];
  in[0] = f;
  vstore_f16(out, vload(in));
  return out[0];
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_from_bits(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(dst + i, vload_f16(src + i));
  for (; i < n; ++i) dst[i] = f16_to_f32_one(src[i]);
}

void f32_to_f16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore_f16(dst + i, vload(src + i));
  for (; i < n; ++i) dst[i] = f32_to_f16_one(src[i]);
}

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(dst + i, vfrom_bits(vshl<16>(vload_u16(src + i))));
  for (; i < n; ++i) dst[i] = float_from_bits(static_cast<uint32_t>(src[i]) << 16);
}

// Round to nearest even; NaN keeps its sign and upper payload and is made quiet.
inline VI bf16_bits(VF f) {
  const VI u = vbits(f);
  const VI odd = viand(vshr<16>(u), viset1(1));
  const VI rounded = vshr<16>(viadd(viadd(u, viset1(0x7fff)), odd));
  const VI quiet_nan = vior(vshr<16>(u), viset1(0x40));
  const VM nan = vicmpgt(viand(u, viset1(0x7fffffff)), viset1(0x7f800000));
  return viselect(nan, quiet_nan, rounded);
}

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore_u16(dst + i, bf16_bits(vload(src + i)));
  for (; i < n; ++i) {
    uint32_t u = float_bits(src[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = static_cast<uint16_t>((u >> 16) | 0x40u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      dst[i] = static_cast<uint16_t>(u >> 16);
    }
  }
}

constexpr ConvertKernels kConvertKernels{.f16_to_f32 = f16_to_f32,
                                         .f32_to_f16 = f32_to_f16,
                                         .bf16_to_f32 = bf16_to_f32,
                                         .f32_to_bf16 = f32_to_bf16};
