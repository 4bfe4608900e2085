// The kernels of the avx512 level (x86-64-v4: AVX-512 F/BW/CD/DQ/VL), chosen when the processor
// runs it.
//
// Compiled with this level's -march (ops/math/CMakeLists.txt). Everything defined here
// lives in namespace kiln::math::avx512, so no function compiled for this level can be
// merged with one compiled for another (test/build/check_isa.sh checks both the objects
// and the linked library).
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "ops/math/kernels.h"

namespace kiln::math::avx512 {

#include "ops/math/simd/avx512.h"
// Kernel sources, written once against the vector type above, and level_table().
#include "ops/math/impl/all.h"

// AVX512-VNNI (Ice Lake, Cascade Lake, Zen 4 and later) multiplies four uint8 by four int8 and
// adds them to an int32 lane exactly (vpdpbusd). The int8 GEMM is compiled a second time
// with that step; only this region may use the extension, and its table is chosen only
// where the processor has it.
namespace vnni {
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512vnni")
#endif

struct QDot {
  static constexpr int kb = 4;
  static constexpr const char* kName = "vnni-k4";
  static constexpr int mr = 12;
  static VI load_b(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static VI madd(VI acc, VI a, VI b) { return _mm512_dpbusd_epi32(acc, a, b); }
};

#include "ops/math/impl/qgemm.h"

// MatMulNBits' int8 blocks: four products a lane per instruction, exact in int32.
struct NBitsDot {
  static __m256i dot(__m256i acc, __m256i w, __m256i a) { return _mm256_dpbusd_epi32(acc, w, a); }
  static __m512i dot512(__m512i acc, __m512i w, __m512i a) {
    return _mm512_dpbusd_epi32(acc, w, a);
  }
};

#include "ops/math/impl/nbits_int8.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
}  // namespace vnni

constexpr MathKernels kTable = level_table(Isa::Avx512, kInt8GemmKernels);
// The level's table with the VNNI int8 GEMM and MatMulNBits int8 step.
constexpr MathKernels vnni_table() {
  MathKernels t = level_table(Isa::Avx512, vnni::kInt8GemmKernels);
  t.nbits.gemv_int8 = vnni::nbits_gemv_int8;
  return t;
}
constexpr MathKernels kVnniTable = vnni_table();

const MathKernels& table() {
  return cpu_has_avx512_vnni() ? kVnniTable : kTable;
}

const MathKernels& table_without_extensions() {
  return kTable;
}

}  // namespace kiln::math::avx512
