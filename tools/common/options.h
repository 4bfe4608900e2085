// Command-line names of the session options the tools share (onnx-run, kiln-bench,
// kiln-transcribe, kiln-generate).
#pragma once

#include <optional>
#include <string>

#include "kiln/session.h"

namespace kiln::tooling {

// --optimize none|basic|all; nullopt for any other name.
inline std::optional<GraphOptimization> parse_optimization(const std::string& v) {
  if (v == "none") return GraphOptimization::None;
  if (v == "basic") return GraphOptimization::Basic;
  if (v == "all") return GraphOptimization::All;
  return std::nullopt;
}

// --gemm-weights (kiln-transcribe, kiln-generate: --weights) f32|bf16|f16|int8; nullopt for
// any other name.
inline std::optional<WeightPrecision> parse_gemm_weights(const std::string& v) {
  if (v == "f32") return WeightPrecision::Float32;
  if (v == "bf16") return WeightPrecision::BFloat16;
  if (v == "f16") return WeightPrecision::Float16;
  if (v == "int8") return WeightPrecision::Int8;
  return std::nullopt;
}

// The choices parse_gemm_weights reads, for the tools' help.
inline constexpr const char* kGemmWeightsChoices = "f32, bf16, f16 or int8";

// --denormals flush|keep; nullopt for any other name.
inline std::optional<Denormals> parse_denormals(const std::string& v) {
  if (v == "flush") return Denormals::Flush;
  if (v == "keep") return Denormals::Keep;
  return std::nullopt;
}

// The name parse_denormals reads, for the tools' JSON.
inline const char* denormals_name(Denormals d) {
  return d == Denormals::Keep ? "keep" : "flush";
}

// The name parse_gemm_weights reads, for the tools' JSON.
inline const char* gemm_weights_name(WeightPrecision p) {
  switch (p) {
    case WeightPrecision::BFloat16:
      return "bf16";
    case WeightPrecision::Float16:
      return "f16";
    case WeightPrecision::Int8:
      return "int8";
    case WeightPrecision::Float32:
      break;
  }
  return "f32";
}

}  // namespace kiln::tooling
