// What this build of kiln is, and which instruction-set level it runs with.
#pragma once

#include <cstdint>

namespace kiln {

// The library version, "MAJOR.MINOR.PATCH".
const char* version();

// The newest ONNX formats kiln reads: models with a later IR version or a later default-domain
// (ai.onnx) opset are refused at load with an error naming these.
inline constexpr int64_t kMaxIrVersion = 14;
inline constexpr int64_t kMaxOnnxOpset = 28;

// The instruction-set level kiln's kernels use in this process: "generic" (x86-64-v2),
// "avx2" (x86-64-v3) or "avx512" (x86-64-v4). The highest the processor runs, capped by the
// KILN_ISA environment variable; decided on first use. Throws kiln::Error when KILN_ISA is
// not a level name or names a level the processor lacks (creating an Environment checks it).
const char* isa_level();

}  // namespace kiln
