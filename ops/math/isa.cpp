#include "ops/math/isa.h"

#include <cctype>
#if defined(__clang__)
#include <cpuid.h>
#endif
#include <cstdlib>
#include <variant>

#include "kiln/error.h"
#include "kiln/version.h"

namespace kiln::math {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Generic:
      return "generic";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "unknown";
}

std::optional<Isa> parse_isa(std::string_view name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (int i = 0; i < kIsaCount; ++i) {
    if (lower == isa_name(static_cast<Isa>(i))) return static_cast<Isa>(i);
  }
  return std::nullopt;
}

// __builtin_cpu_supports checks the OS too (XCR0 must enable the YMM / ZMM state), and its
// level names are exactly the -march levels the units are compiled with.
#if defined(__clang__)
// Clang before 16 knows neither the level names nor "f16c": the levels from their features
// (F16C from CPUID leaf 1, ECX bit 29; AVX-512 state is checked by the avx512 names).
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
bool cpu_supports(Isa isa) {
  __builtin_cpu_init();
  const bool v2 = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt") &&
                  __builtin_cpu_supports("ssse3");
  const bool v3 = v2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") && has_f16c();
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                  __builtin_cpu_supports("avx512cd");
  switch (isa) {
    case Isa::Generic:
      return v2;
    case Isa::Avx2:
      return v3;
    case Isa::Avx512:
      return v4;
  }
  return false;
}
#else
bool cpu_supports(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::Generic:
      return __builtin_cpu_supports("x86-64-v2");
    case Isa::Avx2:
      return __builtin_cpu_supports("x86-64-v3");
    case Isa::Avx512:
      return __builtin_cpu_supports("x86-64-v4");
  }
  return false;
}
#endif

Isa detected_isa() {
  Isa best = Isa::Generic;
  for (int i = 1; i < kIsaCount; ++i) {
    if (cpu_supports(static_cast<Isa>(i))) best = static_cast<Isa>(i);
  }
  return best;
}

namespace {

std::string supported_list() {
  std::string s;
  for (int i = 0; i < kIsaCount; ++i) {
    if (!cpu_supports(static_cast<Isa>(i))) continue;
    if (!s.empty()) s += ", ";
    s += isa_name(static_cast<Isa>(i));
  }
  return s;
}

const char* level_features(Isa isa) {
  switch (isa) {
    case Isa::Generic:
      return "x86-64-v2: SSE4.2, POPCNT";
    case Isa::Avx2:
      return "x86-64-v3: AVX2, FMA, F16C, BMI2";
    case Isa::Avx512:
      return "x86-64-v4: AVX-512 F/BW/CD/DQ/VL";
  }
  return "";
}

// The decision, or the error message to throw.
std::variant<Isa, Error> decide() {
  const Isa detected = detected_isa();
  const char* env = std::getenv("KILN_ISA");
  if (!env || !*env) return detected;
  const std::optional<Isa> cap = parse_isa(env);
  if (!cap) {
    return Error(ErrorKind::InvalidArgument, std::string("KILN_ISA=") + env +
                                                 " is not an instruction-set level; use "
                                                 "generic, avx2 or avx512");
  }
  if (!cpu_supports(*cap)) {
    return Error(ErrorKind::Unsupported,
                 std::string("KILN_ISA=") + env + " asks for " + level_features(*cap) +
                     ", which this processor lacks (it runs: " + supported_list() + ")");
  }
  return *cap;
}

}  // namespace

Isa active_isa() {
  static const std::variant<Isa, Error> decision = decide();
  if (const Error* e = std::get_if<Error>(&decision)) throw *e;
  return std::get<Isa>(decision);
}

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return cpu_supports(Isa::Avx512) && __builtin_cpu_supports("avx512bf16");
}

bool cpu_has_avx512_vnni() {
  __builtin_cpu_init();
  return cpu_supports(Isa::Avx512) && __builtin_cpu_supports("avx512vnni");
}

std::string cpu_feature_list() {
  __builtin_cpu_init();
  std::string s;
  auto add = [&](const char* name, bool on) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add("sse4.2", __builtin_cpu_supports("sse4.2"));
  add("avx", __builtin_cpu_supports("avx"));
  add("avx2", __builtin_cpu_supports("avx2"));
  add("fma", __builtin_cpu_supports("fma"));
#if defined(__clang__)
  add("f16c", has_f16c());
#else
  add("f16c", __builtin_cpu_supports("f16c"));
#endif
  add("avx512f", __builtin_cpu_supports("avx512f"));
  add("avx512bw", __builtin_cpu_supports("avx512bw"));
  add("avx512dq", __builtin_cpu_supports("avx512dq"));
  add("avx512vl", __builtin_cpu_supports("avx512vl"));
  add("avx512vnni", __builtin_cpu_supports("avx512vnni"));
  add("avx512bf16", __builtin_cpu_supports("avx512bf16"));
  return s;
}

}  // namespace kiln::math

namespace kiln {

const char* version() {
  return KILN_VERSION_STRING;
}

const char* isa_level() {
  return math::isa_name(math::active_isa());
}

}  // namespace kiln
