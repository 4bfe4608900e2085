// The vector type of the avx2 level (x86-64-v3: AVX2 + FMA + F16C, eight floats).
//
// Included by ops/math/isa_avx2.cpp inside namespace kiln::math::avx2, after
// <immintrin.h>; it includes nothing itself. The names match simd/sse.h.

using VF = __m256;
using VI = __m256i;
using VM = __m256;
constexpr int kLanes = 8;
constexpr bool kHasFma = true;

inline VF vzero() {
  return _mm256_setzero_ps();
}
inline VF vset1(float x) {
  return _mm256_set1_ps(x);
}
inline VF vload(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void vstore(float* p, VF v) {
  _mm256_storeu_ps(p, v);
}
// Lane i is on when i < n.
inline VI vtail_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline VF vload_partial(const float* p, int n) {
  return _mm256_maskload_ps(p, vtail_mask(n));
}
inline void vstore_partial(float* p, VF v, int n) {
  _mm256_maskstore_ps(p, vtail_mask(n), v);
}
inline VF vbroadcast(const float* p) {
  return _mm256_broadcast_ss(p);
}

inline VF vadd(VF a, VF b) {
  return _mm256_add_ps(a, b);
}
inline VF vsub(VF a, VF b) {
  return _mm256_sub_ps(a, b);
}
inline VF vmul(VF a, VF b) {
  return _mm256_mul_ps(a, b);
}
inline VF vdiv(VF a, VF b) {
  return _mm256_div_ps(a, b);
}
inline VF vfmadd(VF a, VF b, VF c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline VF vfnmadd(VF a, VF b, VF c) {
  return _mm256_fnmadd_ps(a, b, c);
}
// The rounding error a * b - p of p = a * b, exactly.
inline VF vmul_lo(VF a, VF b, VF p) {
  return _mm256_fmsub_ps(a, b, p);
}
inline VF vmax(VF a, VF b) {
  return _mm256_max_ps(a, b);
}
inline VF vmin(VF a, VF b) {
  return _mm256_min_ps(a, b);
}
inline VF vsqrt(VF a) {
  return _mm256_sqrt_ps(a);
}
inline VF vabs(VF a) {
  return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}
inline VF vneg(VF a) {
  return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f));
}
inline VF vand(VF a, VF b) {
  return _mm256_and_ps(a, b);
}
inline VF vor(VF a, VF b) {
  return _mm256_or_ps(a, b);
}
inline VF vxor(VF a, VF b) {
  return _mm256_xor_ps(a, b);
}
inline VF vround(VF a) {
  return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline VF vfloor(VF a) {
  return _mm256_floor_ps(a);
}

inline VM vlt(VF a, VF b) {
  return _mm256_cmp_ps(a, b, _CMP_LT_OQ);
}
inline VM vle(VF a, VF b) {
  return _mm256_cmp_ps(a, b, _CMP_LE_OQ);
}
inline VM vgt(VF a, VF b) {
  return _mm256_cmp_ps(a, b, _CMP_GT_OQ);
}
inline VM vge(VF a, VF b) {
  return _mm256_cmp_ps(a, b, _CMP_GE_OQ);
}
inline VM veq(VF a, VF b) {
  return _mm256_cmp_ps(a, b, _CMP_EQ_OQ);
}
inline VM visnan(VF a) {
  return _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
}
inline VM vmask_or(VM a, VM b) {
  return _mm256_or_ps(a, b);
}
inline VM vmask_and(VM a, VM b) {
  return _mm256_and_ps(a, b);
}
inline VF vselect(VM m, VF a, VF b) {
  return _mm256_blendv_ps(b, a, m);
}
inline bool vany(VM m) {
  return _mm256_movemask_ps(m) != 0;
}

inline float vfirst(VF a) {
  return _mm256_cvtss_f32(a);
}
inline VM vlanes_below(int n) {
  return _mm256_castsi256_ps(vtail_mask(n));
}
// Lanes [lo, hi) on (0 <= lo <= hi <= kLanes), and a load of just those lanes (the others
// zero; memory under the off lanes is not read, so p may point before or past a buffer).
inline VM vlanes_between(int lo, int hi) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(lo), iota),
                                                 _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), iota)));
}
inline VF vload_masked(const float* p, VM m) {
  return _mm256_maskload_ps(p, _mm256_castps_si256(m));
}
// p[i] = v[i] for the lanes i in [lo, hi); nothing else is written (or read).
inline void vstore_lanes(float* p, VF v, int lo, int hi) {
  _mm256_maskstore_ps(p, _mm256_castps_si256(vlanes_between(lo, hi)), v);
}
// The even lanes of a then of b: lane i is element 2i of the concatenation a, b.
inline VF vpack_even(VF a, VF b) {
  const __m256 t = _mm256_shuffle_ps(a, b, 0x88);  // a0 a2 b0 b2 | a4 a6 b4 b6
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xD8));
}
// The odd lanes of a then of b: lane i is element 2i + 1 of the concatenation a, b.
inline VF vpack_odd(VF a, VF b) {
  const __m256 t = _mm256_shuffle_ps(a, b, 0xDD);  // a1 a3 b1 b3 | a5 a7 b5 b7
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xD8));
}
// Lanes of a and b interleaved: vzip_lo is a0 b0 a1 b1 ... from the first halves of a and
// b, vzip_hi the same from their second halves.
inline VF vzip_lo(VF a, VF b) {
  const __m256 lo = _mm256_unpacklo_ps(a, b);  // a0 b0 a1 b1 | a4 b4 a5 b5
  const __m256 hi = _mm256_unpackhi_ps(a, b);  // a2 b2 a3 b3 | a6 b6 a7 b7
  return _mm256_permute2f128_ps(lo, hi, 0x20);
}
inline VF vzip_hi(VF a, VF b) {
  const __m256 lo = _mm256_unpacklo_ps(a, b);
  const __m256 hi = _mm256_unpackhi_ps(a, b);
  return _mm256_permute2f128_ps(lo, hi, 0x31);
}

inline VI vcvt_int(VF a) {
  return _mm256_cvtps_epi32(a);
}
inline VF vcvt_float(VI a) {
  return _mm256_cvtepi32_ps(a);
}
inline VI vbits(VF a) {
  return _mm256_castps_si256(a);
}
inline VF vfrom_bits(VI a) {
  return _mm256_castsi256_ps(a);
}
inline VI viadd(VI a, VI b) {
  return _mm256_add_epi32(a, b);
}
inline VI visub(VI a, VI b) {
  return _mm256_sub_epi32(a, b);
}
inline VI viset1(int x) {
  return _mm256_set1_epi32(x);
}
inline VI viand(VI a, VI b) {
  return _mm256_and_si256(a, b);
}
template <int S>
inline VI vshl(VI a) {
  return _mm256_slli_epi32(a, S);
}
template <int S>
inline VI vshr(VI a) {
  return _mm256_srli_epi32(a, S);
}
template <int S>
inline VI vsra(VI a) {
  return _mm256_srai_epi32(a, S);
}

inline float vreduce_add(VF a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline float vreduce_max(VF a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline VM vicmpgt(VI a, VI b) {
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b));
}
inline VI viselect(VM m, VI a, VI b) {
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(b), _mm256_castsi256_ps(a), m));
}
inline VI vior(VI a, VI b) {
  return _mm256_or_si256(a, b);
}

// Integer lanes for the int8 GEMM (impl/qgemm.h); see simd/sse.h.
inline VI viload(const int32_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline void vistore(int32_t* p, VI v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
inline VI viload_partial(const int32_t* p, int n) {
  return _mm256_maskload_epi32(p, vtail_mask(n));
}
inline void vistore_partial(int32_t* p, VI v, int n) {
  _mm256_maskstore_epi32(p, vtail_mask(n), v);
}
inline VI vibroadcast(const int32_t* p) {
  return _mm256_set1_epi32(*p);
}
inline VI vimul(VI a, VI b) {
  return _mm256_mullo_epi32(a, b);
}
inline VI vload_s8_as_s16(const uint8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VI vmadd_s16(VI a, VI b) {
  return _mm256_madd_epi16(a, b);
}
// The low bytes of each 128-bit half gathered, then the two halves joined.
inline void vstore_lo8(uint8_t* p, VI v) {
  const __m256i idx = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                       0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i bytes = _mm256_shuffle_epi8(v, idx);
  const __m128i joined =
      _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), joined);
}
inline void vstore_lo8_partial(uint8_t* p, VI v, int n) {
  alignas(32) int32_t t[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(t), v);
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(t[i]);
}

// kLanes bytes zero-extended to int32 lanes.
inline VI vload_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline VI vload_u16(const uint16_t* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void vstore_u16(uint16_t* p, VI v) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0xd8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// F16C: exact widening, and narrowing with round to nearest even.
inline VF vf16_to_f32(VI h) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0xd8);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}
inline VI vf32_to_f16(VF f) {
  return _mm256_cvtepu16_epi32(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline VF vload_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void vstore_f16(uint16_t* p, VF v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
