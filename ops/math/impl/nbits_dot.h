// The 32-byte step of impl/nbits_int8.h on levels with AVX2: 4-bit weights (unsigned bytes)
// times int8 activations into eight int32 lanes. pmaddubsw adds pairs of products in
// saturating 16 bits, which is exact here (2 * 15 * 127 < 2^15); pmaddwd then adds pairs.
// The avx512 level compiles nbits_int8.h a second time with vpdpbusd (isa_avx512.cpp).
// Included by each ops/math/isa_*.cpp inside its namespace; includes nothing.
#if defined(__AVX2__)
struct NBitsDot {
  static __m256i dot(__m256i acc, __m256i w, __m256i a) {
    return _mm256_add_epi32(acc,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)));
  }
};
#endif
