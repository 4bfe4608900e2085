// The dispatched float16 / bfloat16 conversions against kiln's scalar conversions
// (kiln::float16, kiln::bfloat16), at every instruction-set level.
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kiln/data_type.h"
#include "test/unit/isa_test.h"

using namespace kiln;

namespace {

// Floats that exercise every rounding path: random bit patterns (all exponents), values near
// the float16 limits (max, overflow threshold, smallest normal and subnormal, ties), signed
// zeros, infinities and NaNs.
std::vector<float> conversion_sweep() {
  std::vector<float> v = {0.0f,          -0.0f,    1.0f,     -1.0f,         65504.0f,
                          65519.99f,     65520.0f, 65536.0f, -65520.0f,     6.1035156e-5f,
                          6.1035152e-5f, 5.96e-8f, 2.98e-8f, 2.9802322e-8f, 2.9802326e-8f,
                          1e-10f,        1e30f,    -1e30f,   INFINITY,      -INFINITY,
                          NAN,           -NAN,     3.38e38f, 1.0009765625f, 1.00048828125f,
                          1.00146484375f};
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  std::uniform_real_distribution<float> near(-70000.0f, 70000.0f);
  for (int i = 0; i < 50000; ++i) v.push_back(near(rng));
  std::uniform_real_distribution<float> tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 50000; ++i) v.push_back(tiny(rng));
  v.push_back(0.5f);  // an odd count leaves a tail at every vector width
  return v;
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

bool same_half(uint16_t a, uint16_t b) {
  const bool nan_a = (a & 0x7c00) == 0x7c00 && (a & 0x3ff);
  const bool nan_b = (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
  return (nan_a && nan_b) || a == b;
}

}  // namespace

KILN_ISA_TEST_CASE("float16 to float is exact for all 65536 values", "[math][convert]") {
  KILN_REQUIRE_ISA();
  std::vector<uint16_t> in(65536 + 3);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i);
  std::vector<float> out(in.size());
  isa_kernels.convert.f16_to_f32(in.data(), out.data(), static_cast<int64_t>(in.size()));
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!same_float(out[i], float16::to_float(in[i])) && bad++ < 5) {
      FAIL_CHECK("half 0x" << std::hex << in[i] << " -> " << out[i] << ", expected "
                           << float16::to_float(in[i]));
    }
  }
  CHECK(bad == 0);
}

KILN_ISA_TEST_CASE("float to float16 rounds to nearest even like the scalar conversion",
                   "[math][convert]") {
  KILN_REQUIRE_ISA();
  const std::vector<float> in = conversion_sweep();
  std::vector<uint16_t> out(in.size());
  isa_kernels.convert.f32_to_f16(in.data(), out.data(), static_cast<int64_t>(in.size()));
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = float16::from_float(in[i]);
    if (!same_half(out[i], want) && bad++ < 5) {
      FAIL_CHECK(in[i] << " (0x" << std::hex << std::bit_cast<uint32_t>(in[i]) << ") -> 0x"
                       << out[i] << ", expected 0x" << want);
    }
  }
  CHECK(bad == 0);
}

KILN_ISA_TEST_CASE("bfloat16 conversions match the scalar ones", "[math][convert]") {
  KILN_REQUIRE_ISA();
  const std::vector<float> in = conversion_sweep();
  std::vector<uint16_t> narrow(in.size());
  isa_kernels.convert.f32_to_bf16(in.data(), narrow.data(), static_cast<int64_t>(in.size()));
  std::vector<float> wide(in.size());
  isa_kernels.convert.bf16_to_f32(narrow.data(), wide.data(), static_cast<int64_t>(in.size()));
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = bfloat16::from_float(in[i]);
    if ((narrow[i] != want ||
         !same_float(wide[i], static_cast<float>(bfloat16::from_bits(want)))) &&
        bad++ < 5) {
      FAIL_CHECK(in[i] << " -> 0x" << std::hex << narrow[i] << ", expected 0x" << want);
    }
  }
  CHECK(bad == 0);
}
