// The vector type of the generic level (x86-64-v2: SSE4.1/4.2, four floats).
//
// Included by ops/math/isa_generic.cpp inside namespace kiln::math::generic, after
// <immintrin.h>; it includes nothing itself. Kernels in ops/math/impl/ are written once
// against these names (VF, VM, kLanes, vload, vfmadd, ...) and compiled once per level.

using VF = __m128;   // kLanes floats
using VI = __m128i;  // kLanes int32
using VM = __m128;   // a lane mask (all bits set where true)
constexpr int kLanes = 4;
constexpr bool kHasFma = false;

inline VF vzero() {
  return _mm_setzero_ps();
}
inline VF vset1(float x) {
  return _mm_set1_ps(x);
}
inline VF vload(const float* p) {
  return _mm_loadu_ps(p);
}
inline void vstore(float* p, VF v) {
  _mm_storeu_ps(p, v);
}
// The first n (< kLanes) lanes; the others read as zero / are left unwritten.
inline VF vload_partial(const float* p, int n) {
  alignas(16) float t[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; ++i) t[i] = p[i];
  return _mm_load_ps(t);
}
inline void vstore_partial(float* p, VF v, int n) {
  alignas(16) float t[4];
  _mm_store_ps(t, v);
  for (int i = 0; i < n; ++i) p[i] = t[i];
}
inline VF vbroadcast(const float* p) {
  return _mm_load1_ps(p);
}

inline VF vadd(VF a, VF b) {
  return _mm_add_ps(a, b);
}
inline VF vsub(VF a, VF b) {
  return _mm_sub_ps(a, b);
}
inline VF vmul(VF a, VF b) {
  return _mm_mul_ps(a, b);
}
inline VF vdiv(VF a, VF b) {
  return _mm_div_ps(a, b);
}
// a * b + c and c - a * b (two roundings at this level).
inline VF vfmadd(VF a, VF b, VF c) {
  return _mm_add_ps(_mm_mul_ps(a, b), c);
}
inline VF vfnmadd(VF a, VF b, VF c) {
  return _mm_sub_ps(c, _mm_mul_ps(a, b));
}
// The rounding error a * b - p of p = a * b, exactly (Dekker's product: no FMA at this
// level); |a|, |b| < 2^100 so that the splits do not overflow.
inline VF vmul_lo(VF a, VF b, VF p) {
  const VF k = _mm_set1_ps(4097.0f);
  const VF ca = _mm_mul_ps(a, k), cb = _mm_mul_ps(b, k);
  const VF ah = _mm_sub_ps(ca, _mm_sub_ps(ca, a)), bh = _mm_sub_ps(cb, _mm_sub_ps(cb, b));
  const VF al = _mm_sub_ps(a, ah), bl = _mm_sub_ps(b, bh);
  const VF e = _mm_add_ps(_mm_add_ps(_mm_sub_ps(_mm_mul_ps(ah, bh), p), _mm_mul_ps(ah, bl)),
                          _mm_mul_ps(al, bh));
  return _mm_add_ps(e, _mm_mul_ps(al, bl));
}
inline VF vmax(VF a, VF b) {
  return _mm_max_ps(a, b);
}
inline VF vmin(VF a, VF b) {
  return _mm_min_ps(a, b);
}
inline VF vsqrt(VF a) {
  return _mm_sqrt_ps(a);
}
inline VF vabs(VF a) {
  return _mm_and_ps(a, _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff)));
}
inline VF vneg(VF a) {
  return _mm_xor_ps(a, _mm_set1_ps(-0.0f));
}
inline VF vand(VF a, VF b) {
  return _mm_and_ps(a, b);
}
inline VF vor(VF a, VF b) {
  return _mm_or_ps(a, b);
}
inline VF vxor(VF a, VF b) {
  return _mm_xor_ps(a, b);
}
// Round to the nearest integer (ties to even), as a float.
inline VF vround(VF a) {
  return _mm_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline VF vfloor(VF a) {
  return _mm_floor_ps(a);
}

inline VM vlt(VF a, VF b) {
  return _mm_cmplt_ps(a, b);
}
inline VM vle(VF a, VF b) {
  return _mm_cmple_ps(a, b);
}
inline VM vgt(VF a, VF b) {
  return _mm_cmpgt_ps(a, b);
}
inline VM vge(VF a, VF b) {
  return _mm_cmpge_ps(a, b);
}
inline VM veq(VF a, VF b) {
  return _mm_cmpeq_ps(a, b);
}
inline VM visnan(VF a) {
  return _mm_cmpunord_ps(a, a);
}
inline VM vmask_or(VM a, VM b) {
  return _mm_or_ps(a, b);
}
inline VM vmask_and(VM a, VM b) {
  return _mm_and_ps(a, b);
}
// m ? a : b, lane by lane.
inline VF vselect(VM m, VF a, VF b) {
  return _mm_blendv_ps(b, a, m);
}
inline bool vany(VM m) {
  return _mm_movemask_ps(m) != 0;
}

// Lane 0 as a float.
inline float vfirst(VF a) {
  return _mm_cvtss_f32(a);
}
// The lanes below n (n < kLanes) on, the others off: masks a vload_partial tail.
inline VM vlanes_below(int n) {
  return _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3)));
}
// Lanes [lo, hi) on (0 <= lo <= hi <= kLanes), and a load of just those lanes (the others
// zero; memory under the off lanes is not read, so p may point before or past a buffer).
inline VM vlanes_between(int lo, int hi) {
  const __m128i iota = _mm_setr_epi32(0, 1, 2, 3);
  return _mm_castsi128_ps(_mm_andnot_si128(_mm_cmpgt_epi32(_mm_set1_epi32(lo), iota),
                                           _mm_cmpgt_epi32(_mm_set1_epi32(hi), iota)));
}
inline VF vload_masked(const float* p, VM m) {
  const int bits = _mm_movemask_ps(m);
  alignas(16) float t[4] = {0, 0, 0, 0};
  for (int i = 0; i < 4; ++i) {
    if (bits & (1 << i)) t[i] = p[i];
  }
  return _mm_load_ps(t);
}
// p[i] = v[i] for the lanes i in [lo, hi); nothing else is written (or read).
inline void vstore_lanes(float* p, VF v, int lo, int hi) {
  alignas(16) float t[4];
  _mm_store_ps(t, v);
  for (int i = lo; i < hi; ++i) p[i] = t[i];
}
// The even lanes of a then of b: lane i is element 2i of the concatenation a, b.
inline VF vpack_even(VF a, VF b) {
  return _mm_shuffle_ps(a, b, 0x88);
}
// The odd lanes of a then of b: lane i is element 2i + 1 of the concatenation a, b.
inline VF vpack_odd(VF a, VF b) {
  return _mm_shuffle_ps(a, b, 0xDD);
}
// Lanes of a and b interleaved: vzip_lo is a0 b0 a1 b1 from the first halves of a and b,
// vzip_hi the same from their second halves.
inline VF vzip_lo(VF a, VF b) {
  return _mm_unpacklo_ps(a, b);
}
inline VF vzip_hi(VF a, VF b) {
  return _mm_unpackhi_ps(a, b);
}

// Integer lanes: conversions and the bits of a float.
inline VI vcvt_int(VF a) {
  return _mm_cvtps_epi32(a);
}  // rounds to nearest even
inline VF vcvt_float(VI a) {
  return _mm_cvtepi32_ps(a);
}
inline VI vbits(VF a) {
  return _mm_castps_si128(a);
}
inline VF vfrom_bits(VI a) {
  return _mm_castsi128_ps(a);
}
inline VI viadd(VI a, VI b) {
  return _mm_add_epi32(a, b);
}
inline VI visub(VI a, VI b) {
  return _mm_sub_epi32(a, b);
}
inline VI viset1(int x) {
  return _mm_set1_epi32(x);
}
inline VI viand(VI a, VI b) {
  return _mm_and_si128(a, b);
}
template <int S>
inline VI vshl(VI a) {
  return _mm_slli_epi32(a, S);
}
template <int S>
inline VI vshr(VI a) {
  return _mm_srli_epi32(a, S);
}  // logical
template <int S>
inline VI vsra(VI a) {
  return _mm_srai_epi32(a, S);
}  // arithmetic

inline float vreduce_add(VF a) {
  __m128 s = _mm_add_ps(a, _mm_movehl_ps(a, a));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline float vreduce_max(VF a) {
  __m128 s = _mm_max_ps(a, _mm_movehl_ps(a, a));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline VM vicmpgt(VI a, VI b) {
  return _mm_castsi128_ps(_mm_cmpgt_epi32(a, b));
}
inline VI viselect(VM m, VI a, VI b) {
  return _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(b), _mm_castsi128_ps(a), m));
}
inline VI vior(VI a, VI b) {
  return _mm_or_si128(a, b);
}

// Integer lanes for the int8 GEMM (impl/qgemm.h): kLanes int32 from / to memory, and the
// first n (< kLanes) of them (the others read as zero / are left unwritten).
inline VI viload(const int32_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline void vistore(int32_t* p, VI v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}
inline VI viload_partial(const int32_t* p, int n) {
  alignas(16) int32_t t[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; ++i) t[i] = p[i];
  return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}
inline void vistore_partial(int32_t* p, VI v, int n) {
  alignas(16) int32_t t[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), v);
  for (int i = 0; i < n; ++i) p[i] = t[i];
}
// One 32-bit value in every lane.
inline VI vibroadcast(const int32_t* p) {
  return _mm_set1_epi32(*p);
}
// The low 32 bits of the lane products.
inline VI vimul(VI a, VI b) {
  return _mm_mullo_epi32(a, b);
}
// 2 * kLanes int8 values sign-extended to int16, two to a 32-bit lane.
inline VI vload_s8_as_s16(const uint8_t* p) {
  return _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// Lane i: the sum of the products of its two signed 16-bit halves in a and b (exact: it
// overflows only for -32768 * -32768 twice).
inline VI vmadd_s16(VI a, VI b) {
  return _mm_madd_epi16(a, b);
}
// The low byte of every lane to kLanes bytes at p, or to the first n (< kLanes).
inline void vstore_lo8(uint8_t* p, VI v) {
  const __m128i bytes = _mm_shuffle_epi8(
      v, _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
  const int32_t word = _mm_cvtsi128_si32(bytes);
  __builtin_memcpy(p, &word, 4);
}
inline void vstore_lo8_partial(uint8_t* p, VI v, int n) {
  alignas(16) int32_t t[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), v);
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(t[i]);
}

// kLanes bytes zero-extended to int32 lanes.
inline VI vload_u8(const uint8_t* p) {
  int32_t w;
  __builtin_memcpy(&w, p, 4);
  return _mm_cvtepu8_epi32(_mm_cvtsi32_si128(w));
}
// kLanes 16-bit values widened to int32 lanes, and int32 lanes (each in 0..65535) narrowed.
inline VI vload_u16(const uint16_t* p) {
  return _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline void vstore_u16(uint16_t* p, VI v) {
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(v, v));
}

// float16 bits (in int32 lanes) to float: exact, subnormals, inf and NaN included. No F16C at
// this level: a normal half's exponent and mantissa are moved into place and rescaled by
// 2^112; a subnormal half is its mantissa converted to float times 2^-24, since moved into
// place it would be a denormal float, which reads as 0 on a thread that flushes denormals
// (SessionOptions::denormals).
inline VF vf16_to_f32(VI h) {
  const VI expmant = _mm_and_si128(h, _mm_set1_epi32(0x7fff));
  const VI sign = _mm_slli_epi32(_mm_xor_si128(h, expmant), 16);
  const VF scaled = _mm_mul_ps(_mm_castsi128_ps(_mm_slli_epi32(expmant, 13)),
                               _mm_castsi128_ps(_mm_set1_epi32((254 - 15) << 23)));
  const VF subnormal =
      _mm_mul_ps(_mm_cvtepi32_ps(expmant), _mm_castsi128_ps(_mm_set1_epi32((127 - 24) << 23)));
  const VF finite = _mm_blendv_ps(
      scaled, subnormal, _mm_castsi128_ps(_mm_cmplt_epi32(expmant, _mm_set1_epi32(0x400))));
  const VI infnan =
      _mm_and_si128(_mm_cmpgt_epi32(expmant, _mm_set1_epi32(0x7bff)), _mm_set1_epi32(255 << 23));
  return _mm_or_ps(finite, _mm_castsi128_ps(_mm_or_si128(infnan, sign)));
}

// float to float16 bits (in int32 lanes), rounding to nearest even; NaN becomes 0x7e00.
inline VI vf32_to_f16(VF f) {
  const VI bits = _mm_castps_si128(f);
  const VI sign = _mm_srli_epi32(_mm_and_si128(bits, _mm_set1_epi32(int(0x80000000u))), 16);
  const VI a = _mm_and_si128(bits, _mm_set1_epi32(0x7fffffff));
  const VF af = _mm_castsi128_ps(a);
  // Results below the smallest normal half: let the float adder round the mantissa.
  const VI sub =
      _mm_sub_epi32(_mm_castps_si128(_mm_add_ps(af, _mm_castsi128_ps(_mm_set1_epi32(126 << 23)))),
                    _mm_set1_epi32(126 << 23));
  // Normal results: rebias the exponent and round at bit 13, ties to even.
  const VI odd = _mm_and_si128(_mm_srli_epi32(a, 13), _mm_set1_epi32(1));
  const VI normal =
      _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(int(0xc8000fffu))), odd), 13);
  const VI finite = _mm_blendv_epi8(normal, sub, _mm_cmpgt_epi32(_mm_set1_epi32(113 << 23), a));
  const VI nan = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x7f800000));
  const VI special = _mm_blendv_epi8(_mm_set1_epi32(0x7c00), _mm_set1_epi32(0x7e00), nan);
  const VI big = _mm_cmpgt_epi32(a, _mm_set1_epi32((143 << 23) - 1));  // |f| >= 65536 or NaN
  return _mm_or_si128(_mm_blendv_epi8(finite, special, big), sign);
}

// kLanes float16 values from / to memory.
inline VF vload_f16(const uint16_t* p) {
  return vf16_to_f32(vload_u16(p));
}
inline void vstore_f16(uint16_t* p, VF v) {
  vstore_u16(p, vf32_to_f16(v));
}
