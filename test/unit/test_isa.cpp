// The instruction-set levels and the dispatch table: detection, KILN_ISA's decision, and
// that every level's table is complete (a missing entry would be a null call at run time).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "kiln/error.h"
#include "kiln/version.h"
#include "ops/math/kernels.h"
#include "test/unit/isa_test.h"

using namespace kiln;

TEST_CASE("level names parse back and the detected level runs here", "[math][isa]") {
  for (int i = 0; i < math::kIsaCount; ++i) {
    const auto isa = static_cast<math::Isa>(i);
    CHECK(math::parse_isa(math::isa_name(isa)) == isa);
  }
  CHECK(math::parse_isa("AVX512") == math::Isa::Avx512);
  CHECK_FALSE(math::parse_isa("sse9").has_value());
  CHECK_FALSE(math::parse_isa("").has_value());
  CHECK(math::cpu_supports(math::Isa::Generic));
  CHECK(math::cpu_supports(math::detected_isa()));
  // Levels are ordered: running one means running every lower one.
  for (int i = 1; i < math::kIsaCount; ++i) {
    if (math::cpu_supports(static_cast<math::Isa>(i))) {
      CHECK(math::cpu_supports(static_cast<math::Isa>(i - 1)));
    }
  }
}

TEST_CASE("the active level is the detected one capped by KILN_ISA", "[math][isa]") {
  const char* cap = std::getenv("KILN_ISA");
  const math::Isa active = math::active_isa();
  CHECK(std::string(isa_level()) == math::isa_name(active));
  CHECK(math::kernels().isa == active);
  if (cap && *cap) {
    CHECK(active == *math::parse_isa(cap));
  } else {
    CHECK(active == math::detected_isa());
  }
  CHECK(std::string(version()).find('.') != std::string::npos);
}

TEST_CASE("a level the processor lacks is refused", "[math][isa]") {
  for (int i = 0; i < math::kIsaCount; ++i) {
    const auto isa = static_cast<math::Isa>(i);
    if (math::cpu_supports(isa)) {
      CHECK(math::kernels_for(isa).isa == isa);
    } else {
      CHECK_THROWS_AS(math::kernels_for(isa), Error);
    }
  }
}

KILN_ISA_TEST_CASE("every entry of the level's table is filled", "[math][isa]") {
  KILN_REQUIRE_ISA();
  const math::MathKernels& k = isa_kernels;
  CHECK(k.isa == TestType::isa);
  CHECK(k.convert.f16_to_f32);
  CHECK(k.convert.f32_to_f16);
  CHECK(k.convert.bf16_to_f32);
  CHECK(k.convert.f32_to_bf16);
  CHECK(k.gemm.mr > 0);
  CHECK(k.gemm.nr > 0);
  CHECK(k.gemm.kernel);
  CHECK(k.gemm.pack_a);
  CHECK(k.gemm.pack_b);
  CHECK(k.gemm.dot);
  CHECK(k.gemm.fma_peak_loop);
  CHECK(k.gemm.kernel_bf16);
  CHECK(k.gemm.kernel_f16);
  CHECK(k.gemm.pack_b_bf16);
  CHECK(k.gemm.pack_b_f16);
  CHECK(k.gemm.kernel_packed);
  CHECK(k.gemm.kernel_cold_a);
  CHECK(k.gemm.kernel_cold_b);
  CHECK(k.gemm.kernel_rows_a);
  CHECK(k.gemm.dots);
  CHECK(k.gemm.gemv_rows);
  CHECK(k.gemm.epilogue);
  CHECK(k.conv.pad_plane);
  CHECK(k.conv.padded_plane);
  CHECK(k.conv.im2col_panels);
  CHECK(k.conv.pool_plane);
  CHECK(k.int8_gemm.layout);
  CHECK(k.int8_gemm.mr > 0);
  CHECK(k.int8_gemm.nr > 0);
  CHECK(k.int8_gemm.kb > 0);
  CHECK(k.int8_gemm.pack_a);
  CHECK(k.int8_gemm.pack_b);
  CHECK(k.int8_gemm.kernel);
  CHECK(k.int8_gemm.requantize);
  CHECK(k.nbits.max_rows > 0);
  CHECK(k.nbits.prepare_a);
  CHECK(k.nbits.gemv);
  CHECK(k.nbits.dequantize_rows);
  CHECK(k.nbits.quantize_a);
  CHECK(k.nbits.gemv_int8);
  CHECK(k.binary.add);
  CHECK(k.binary.sub);
  CHECK(k.binary.mul);
  CHECK(k.binary.div);
  CHECK(k.binary.affine);
  for (auto fn : {k.vec.exp, k.vec.log, k.vec.erf, k.vec.tanh, k.vec.sigmoid, k.vec.gelu,
                  k.vec.gelu_tanh, k.vec.silu}) {
    CHECK(fn);
  }
  CHECK(k.vec.softmax);
  CHECK(k.vec.log_softmax);
  CHECK(k.vec.layer_norm);
  CHECK(k.vec.rms_norm);
  CHECK(k.vec.sum);
  CHECK(k.vec.max);
}
