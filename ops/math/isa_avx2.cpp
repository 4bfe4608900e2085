// The kernels of the avx2 level (x86-64-v3: AVX2, FMA, F16C), chosen when the processor runs it.
//
// Compiled with this level's -march (ops/math/CMakeLists.txt). Everything defined here
// lives in namespace kiln::math::avx2, so no function compiled for this level can be
// merged with one compiled for another (test/build/check_isa.sh checks both the objects
// and the linked library).
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "ops/math/kernels.h"

namespace kiln::math::avx2 {

#include "ops/math/simd/avx2.h"
// Kernel sources, written once against the vector type above, and level_table().
#include "ops/math/impl/all.h"

const MathKernels& table() {
  static constexpr MathKernels kTable = level_table(Isa::Avx2, kInt8GemmKernels);
  return kTable;
}

}  // namespace kiln::math::avx2
