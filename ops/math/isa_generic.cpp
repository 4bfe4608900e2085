// The kernels of the generic level (x86-64-v2, 128-bit SSE): what every x86-64-v2 processor runs.
//
// Compiled with this level's -march (ops/math/CMakeLists.txt). Everything defined here
// lives in namespace kiln::math::generic, so no function compiled for this level can be
// merged with one compiled for another (test/build/check_isa.sh checks both the objects
// and the linked library).
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "ops/math/kernels.h"

namespace kiln::math::generic {

#include "ops/math/simd/sse.h"
// Kernel sources, written once against the vector type above, and level_table().
#include "ops/math/impl/all.h"

const MathKernels& table() {
  static constexpr MathKernels kTable = level_table(Isa::Generic, kInt8GemmKernels);
  return kTable;
}

}  // namespace kiln::math::generic
