// Test cases run once per instruction-set level, so every dispatched kernel is compared
// with its reference at every level within one process, whatever KILN_ISA says:
//
//   KILN_ISA_TEST_CASE("exp matches a double-precision reference", "[math]") {
//     const math::MathKernels& k = isa_kernels();  // this level's table
//     ...
//   }
//
// Each level is its own Catch2 test case ("name - isa_avx512", ...). On a processor without a
// level its case prints a "KILN-SKIP:" line with the reason and runs nothing; CTest marks
// such a case skipped (SKIP_REGULAR_EXPRESSION in test/CMakeLists.txt), never passed.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "ops/math/kernels.h"

// The levels, named for the test case names.
struct isa_generic {
  static constexpr kiln::math::Isa isa = kiln::math::Isa::Generic;
};
struct isa_avx2 {
  static constexpr kiln::math::Isa isa = kiln::math::Isa::Avx2;
};
struct isa_avx512 {
  static constexpr kiln::math::Isa isa = kiln::math::Isa::Avx512;
};

namespace kiln::testing {

// True when this processor runs `isa`; otherwise reports the case skipped.
inline bool isa_available(math::Isa isa) {
  if (math::cpu_supports(isa)) return true;
  WARN("KILN-SKIP: this processor does not run the "
       << math::isa_name(isa) << " kernels (it has: " << math::cpu_feature_list() << ")");
  return false;
}

}  // namespace kiln::testing

// Tagged [isa] as well: the whole-suite runs at each lower level (test/CMakeLists.txt) leave
// these cases out, as every run already takes them at every level.
#define KILN_ISA_TEST_CASE(name, tags) \
  TEMPLATE_TEST_CASE(name, tags "[isa]", isa_generic, isa_avx2, isa_avx512)

// Inside a KILN_ISA_TEST_CASE: returns from the case when the level is not available.
#define KILN_REQUIRE_ISA()                                    \
  if (!::kiln::testing::isa_available(TestType::isa)) return; \
  const ::kiln::math::MathKernels& isa_kernels = ::kiln::math::kernels_for(TestType::isa)
