// The int8 GEMM's kernel levels for templated test cases: each ISA level with its extensions,
// and AVX-512 without VNNI (its 16-bit multiply-add path). QGEMM_TEST_CASE runs a case once per
// variant; kernels_of() is null where the processor lacks the level (the case returns).
#pragma once

#include "ops/math/kernels.h"
#include "test/unit/isa_test.h"

namespace kiln::testing {

struct qgemm_generic {
  static constexpr math::Isa isa = math::Isa::Generic;
  static constexpr bool extensions = true;
};
struct qgemm_avx2 {
  static constexpr math::Isa isa = math::Isa::Avx2;
  static constexpr bool extensions = true;
};
struct qgemm_avx512 {
  static constexpr math::Isa isa = math::Isa::Avx512;
  static constexpr bool extensions = true;
};
struct qgemm_avx512_without_vnni {
  static constexpr math::Isa isa = math::Isa::Avx512;
  static constexpr bool extensions = false;
};

inline const math::MathKernels* kernels_of(math::Isa isa, bool extensions) {
  if (!isa_available(isa)) return nullptr;
  return extensions ? &math::kernels_for(isa) : &math::kernels_without_extensions(isa);
}

}  // namespace kiln::testing

#define QGEMM_TEST_CASE(name, tags)                                                           \
  TEMPLATE_TEST_CASE(name, tags, ::kiln::testing::qgemm_generic, ::kiln::testing::qgemm_avx2, \
                     ::kiln::testing::qgemm_avx512, ::kiln::testing::qgemm_avx512_without_vnni)
