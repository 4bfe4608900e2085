// The 32-byte step of impl/nbits_int8.h on levels with AVX2: 4-bit weights (unsigned bytes)
// times int8 activations into eight int32 lanes (sixteen on 512 bits). pmaddubsw adds pairs of
// products in saturating 16 bits, which is exact here (2 * 15 * 127 < 2^15); pmaddwd then adds
// pairs. The avx512 level compiles nbits_int8.h a second time with vpdpbusd (isa_avx512.cpp).
// Included by each ops/math/isa_*.cpp inside its namespace; includes nothing.
#if defined(__AVX2__)
struct NBitsDot {
  static __m256i dot(__m256i acc, __m256i w, __m256i a) {
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
  }
#if defined(__AVX512BW__)
  // The same on 512 bits: sixteen int32 lanes.
  static __m512i dot512(__m512i acc, __m512i w, __m512i a) {
    return _mm512_add_epi32(acc,
                            _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), _mm512_set1_epi16(1)));
  }
#endif
};
#endif
