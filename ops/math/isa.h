// Instruction-set levels and the choice among them.
//
// kiln is built for the x86-64-v2 baseline; the hot kernels are compiled once per level
// below (ops/math/isa_*.cpp) and chosen at run time from cpuid. KILN_ISA caps the level,
// as oneDNN's ONEDNN_MAX_CPU_ISA does, so every path can be run on one machine.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kiln::math {

enum class Isa : int {
  Generic = 0,  // x86-64-v2: SSE4.2, 128-bit vectors
  Avx2 = 1,     // x86-64-v3: AVX2, FMA, F16C, 256-bit vectors
  Avx512 = 2,   // x86-64-v4: AVX-512 F/BW/CD/DQ/VL, 512-bit vectors
};
constexpr int kIsaCount = 3;

// "generic", "avx2", "avx512".
const char* isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view name);

// Whether this processor (and the OS, which must save the wider registers) runs `isa`.
bool cpu_supports(Isa isa);
// The highest level this processor runs.
Isa detected_isa();
// The level kernels use in this process: detected_isa(), capped by KILN_ISA when set.
// Decided once; throws kiln::Error when KILN_ISA is not a level name or asks for a level
// this processor lacks (on every call, so the error reaches whoever asks first).
Isa active_isa();

// Extensions the AVX-512 kernels use when present.
bool cpu_has_avx512_bf16();
bool cpu_has_avx512_vnni();

// The processor's relevant features, for reports: "sse4.2 avx2 fma f16c avx512f ...".
std::string cpu_feature_list();

}  // namespace kiln::math
