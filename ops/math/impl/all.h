// Every kernel source, written once against the level's vector type, and the table of them.
// Included by each ops/math/isa_*.cpp inside its namespace, after its vector type
// (simd/*.h); includes nothing outside impl/.

// The GEMM tile uses the conversions, and the convolution lowering the tile's width, so
// these two come first.
#include "ops/math/impl/convert.h"

#include "ops/math/impl/sgemm.h"

#include "ops/math/impl/binary.h"
#include "ops/math/impl/conv.h"
#include "ops/math/impl/vecmath.h"
#include "ops/math/impl/vecmath_rows.h"
#include "ops/math/impl/winograd.h"

#include "ops/math/impl/nbits_dot.h"
#include "ops/math/impl/nbits_int8.h"

#include "ops/math/impl/nbits.h"

// The int8 GEMM, with the dot-product step it is compiled with defined first.
#include "ops/math/impl/qgemm_widen.h"
// (after its step)
#include "ops/math/impl/qgemm.h"

// This level's table, with `int8` as its int8 GEMM (a level may compile that one twice).
constexpr MathKernels level_table(Isa isa, const Int8GemmKernels& int8) {
  return MathKernels{.isa = isa,
                     .convert = kConvertKernels,
                     .gemm = kGemmKernels,
                     .conv = kConvKernels,
                     .winograd = kWinogradKernels,
                     .binary = kBinaryKernels,
                     .vec = kVecMathKernels,
                     .int8_gemm = int8,
                     .nbits = kNBitsKernels};
}
