// The kernels of the generic level (x86-64-v2, 128-bit SSE): what every x86-64-v2 processor runs.
//
// Compiled with this level's -march (ops/math/CMakeLists.txt). Everything defined here
// lives in namespace kiln::math::generic, so no function compiled for this level can be
// merged with one compiled for another (test/build/check_isa.sh checks both the objects
// and the linked library).
#include <immintrin.h>

#include <cstdint>

#include "ops/math/kernels.h"

namespace kiln::math::generic {

#include "ops/math/simd/sse.h"
// Kernel sources, written once against the vector type above. The GEMM tile uses the
// conversions, and the convolution lowering the tile's width, so these two come first.
#include "ops/math/impl/convert.h"

#include "ops/math/impl/sgemm.h"

#include "ops/math/impl/binary.h"
#include "ops/math/impl/conv.h"
#include "ops/math/impl/vecmath.h"
#include "ops/math/impl/vecmath_rows.h"

// The int8 GEMM, with the dot-product step it is compiled with defined first.
#include "ops/math/impl/qgemm_widen.h"
// (after its step)
#include "ops/math/impl/qgemm.h"

const MathKernels& table() {
  static constexpr MathKernels kTable{.isa = Isa::Generic,
                                      .convert = kConvertKernels,
                                      .gemm = kGemmKernels,
                                      .conv = kConvKernels,
                                      .binary = kBinaryKernels,
                                      .vec = kVecMathKernels,
                                      .int8_gemm = kInt8GemmKernels};
  return kTable;
}

}  // namespace kiln::math::generic
