// The vector type of the avx512 level (x86-64-v4: AVX-512 F/BW/CD/DQ/VL, sixteen floats).
//
// Included by ops/math/isa_avx512.cpp inside namespace kiln::math::avx512, after
// <immintrin.h>; it includes nothing itself. The names match simd/sse.h; masks are the
// AVX-512 opmask registers.

using VF = __m512;
using VI = __m512i;
using VM = __mmask16;
constexpr int kLanes = 16;
constexpr bool kHasFma = true;

inline VF vzero() {
  return _mm512_setzero_ps();
}
inline VF vset1(float x) {
  return _mm512_set1_ps(x);
}
inline VF vload(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void vstore(float* p, VF v) {
  _mm512_storeu_ps(p, v);
}
inline __mmask16 vtail_mask(int n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}
inline VF vload_partial(const float* p, int n) {
  return _mm512_maskz_loadu_ps(vtail_mask(n), p);
}
inline void vstore_partial(float* p, VF v, int n) {
  _mm512_mask_storeu_ps(p, vtail_mask(n), v);
}
inline VF vbroadcast(const float* p) {
  return _mm512_set1_ps(*p);
}

inline VF vadd(VF a, VF b) {
  return _mm512_add_ps(a, b);
}
inline VF vsub(VF a, VF b) {
  return _mm512_sub_ps(a, b);
}
inline VF vmul(VF a, VF b) {
  return _mm512_mul_ps(a, b);
}
inline VF vdiv(VF a, VF b) {
  return _mm512_div_ps(a, b);
}
inline VF vfmadd(VF a, VF b, VF c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline VF vfnmadd(VF a, VF b, VF c) {
  return _mm512_fnmadd_ps(a, b, c);
}
// The rounding error a * b - p of p = a * b, exactly.
inline VF vmul_lo(VF a, VF b, VF p) {
  return _mm512_fmsub_ps(a, b, p);
}
inline VF vmax(VF a, VF b) {
  return _mm512_max_ps(a, b);
}
inline VF vmin(VF a, VF b) {
  return _mm512_min_ps(a, b);
}
inline VF vsqrt(VF a) {
  return _mm512_sqrt_ps(a);
}
inline VF vabs(VF a) {
  return _mm512_abs_ps(a);
}
inline VF vneg(VF a) {
  return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f));
}
inline VF vand(VF a, VF b) {
  return _mm512_and_ps(a, b);
}
inline VF vor(VF a, VF b) {
  return _mm512_or_ps(a, b);
}
inline VF vxor(VF a, VF b) {
  return _mm512_xor_ps(a, b);
}
inline VF vround(VF a) {
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline VF vfloor(VF a) {
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}

inline VM vlt(VF a, VF b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);
}
inline VM vle(VF a, VF b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ);
}
inline VM vgt(VF a, VF b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ);
}
inline VM vge(VF a, VF b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ);
}
inline VM veq(VF a, VF b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
}
inline VM visnan(VF a) {
  return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
}
inline VM vmask_or(VM a, VM b) {
  return static_cast<VM>(a | b);
}
inline VM vmask_and(VM a, VM b) {
  return static_cast<VM>(a & b);
}
inline VF vselect(VM m, VF a, VF b) {
  return _mm512_mask_blend_ps(m, b, a);
}
inline bool vany(VM m) {
  return m != 0;
}

inline float vfirst(VF a) {
  return _mm512_cvtss_f32(a);
}
inline VM vlanes_below(int n) {
  return vtail_mask(n);
}
// Lanes [lo, hi) on (0 <= lo <= hi <= kLanes), and a load of just those lanes (the others
// zero; memory under the off lanes is not read, so p may point before or past a buffer).
inline VM vlanes_between(int lo, int hi) {
  return static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}
inline VF vload_masked(const float* p, VM m) {
  return _mm512_maskz_loadu_ps(m, p);
}
// p[i] = v[i] for the lanes i in [lo, hi); nothing else is written (or read).
inline void vstore_lanes(float* p, VF v, int lo, int hi) {
  _mm512_mask_storeu_ps(p, vlanes_between(lo, hi), v);
}
// The even lanes of a then of b: lane i is element 2i of the concatenation a, b.
inline VF vpack_even(VF a, VF b) {
  const __m512i idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return _mm512_permutex2var_ps(a, idx, b);
}
// The odd lanes of a then of b: lane i is element 2i + 1 of the concatenation a, b.
inline VF vpack_odd(VF a, VF b) {
  const __m512i idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return _mm512_permutex2var_ps(a, idx, b);
}
// Lanes of a and b interleaved: vzip_lo is a0 b0 a1 b1 ... from the first halves of a and
// b, vzip_hi the same from their second halves.
inline VF vzip_lo(VF a, VF b) {
  const __m512i idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  return _mm512_permutex2var_ps(a, idx, b);
}
inline VF vzip_hi(VF a, VF b) {
  const __m512i idx =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  return _mm512_permutex2var_ps(a, idx, b);
}

inline VI vcvt_int(VF a) {
  return _mm512_cvtps_epi32(a);
}
inline VF vcvt_float(VI a) {
  return _mm512_cvtepi32_ps(a);
}
inline VI vbits(VF a) {
  return _mm512_castps_si512(a);
}
inline VF vfrom_bits(VI a) {
  return _mm512_castsi512_ps(a);
}
inline VI viadd(VI a, VI b) {
  return _mm512_add_epi32(a, b);
}
inline VI visub(VI a, VI b) {
  return _mm512_sub_epi32(a, b);
}
inline VI viset1(int x) {
  return _mm512_set1_epi32(x);
}
inline VI viand(VI a, VI b) {
  return _mm512_and_si512(a, b);
}
template <int S>
inline VI vshl(VI a) {
  return _mm512_slli_epi32(a, S);
}
template <int S>
inline VI vshr(VI a) {
  return _mm512_srli_epi32(a, S);
}
template <int S>
inline VI vsra(VI a) {
  return _mm512_srai_epi32(a, S);
}

inline float vreduce_add(VF a) {
  return _mm512_reduce_add_ps(a);
}
inline float vreduce_max(VF a) {
  return _mm512_reduce_max_ps(a);
}

inline VM vicmpgt(VI a, VI b) {
  return _mm512_cmpgt_epi32_mask(a, b);
}
inline VI viselect(VM m, VI a, VI b) {
  return _mm512_mask_blend_epi32(m, b, a);
}
inline VI vior(VI a, VI b) {
  return _mm512_or_si512(a, b);
}

// Integer lanes for the int8 GEMM (impl/qgemm.h); see simd/sse.h.
inline VI viload(const int32_t* p) {
  return _mm512_loadu_si512(p);
}
inline void vistore(int32_t* p, VI v) {
  _mm512_storeu_si512(p, v);
}
inline VI viload_partial(const int32_t* p, int n) {
  return _mm512_maskz_loadu_epi32(vtail_mask(n), p);
}
inline void vistore_partial(int32_t* p, VI v, int n) {
  _mm512_mask_storeu_epi32(p, vtail_mask(n), v);
}
inline VI vibroadcast(const int32_t* p) {
  return _mm512_set1_epi32(*p);
}
inline VI vimul(VI a, VI b) {
  return _mm512_mullo_epi32(a, b);
}
inline VI vload_s8_as_s16(const uint8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline VI vmadd_s16(VI a, VI b) {
  return _mm512_madd_epi16(a, b);
}
inline void vstore_lo8(uint8_t* p, VI v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
}
inline void vstore_lo8_partial(uint8_t* p, VI v, int n) {
  _mm512_mask_cvtepi32_storeu_epi8(p, vtail_mask(n), v);
}

// kLanes bytes zero-extended to int32 lanes.
inline VI vload_u8(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VI vload_u16(const uint16_t* p) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void vstore_u16(uint16_t* p, VI v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
}

inline VF vf16_to_f32(VI h) {
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
}
inline VI vf32_to_f16(VF f) {
  return _mm512_cvtepu16_epi32(_mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline VF vload_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void vstore_f16(uint16_t* p, VF v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
