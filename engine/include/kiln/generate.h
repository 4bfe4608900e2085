// Decode loops for Hugging Face Optimum exports: a seq2seq generator (Whisper: encoder once,
// then the merged decoder or the decoder / decoder-with-past pair) and a causal-LM generator
// (GPT-2's decoder-only model.onnx).
//
//   kiln::Seq2SeqGenerator whisper("models/whisper-tiny-random");
//   auto result = whisper.generate(features, {});   // greedy, lengths from the configs
//
// KV caches are allocated once with room for max_length tokens along the sequence axis and
// passed to each step by move, so the model's own Concat appends the new token in place;
// the present.* outputs come back sharing those buffers and are passed again the next step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/audio.h"  // the Whisper front end (read_audio, whisper_log_mel)
#include "kiln/environment.h"
#include "kiln/session.h"
#include "kiln/tensor.h"

namespace kiln {

struct StepStats {
  int64_t past_len = 0;       // tokens in the KV cache when the step started
  double ms = 0;              // wall time of the step (model run + token selection)
  double run_ms = 0;          // of which inside the decoder's Session::run
  uint64_t bytes_copied = 0;  // by the model run and by the generator itself
  uint64_t allocations = 0;   // pool allocations during the model run
};

struct GenerationOptions {
  int64_t max_new_tokens = -1;  // -1: the generation config's max_length limit
  int64_t min_new_tokens = 0;   // stop tokens are suppressed until this many are produced
  // Sampling: greedy unless do_sample; then temperature, top-k (0 = off), top-p (1 = off).
  bool do_sample = false;
  float temperature = 1.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::vector<int64_t> stop_tokens;  // empty: the configs' eos_token_id(s)
  // Called after each token; return false to stop early (streaming).
  std::function<bool(int64_t token, const StepStats& step)> on_token;
  // KV capacity along the sequence axis; 0: max_length from the configs.
  int64_t kv_capacity = 0;
};

struct GenerationResult {
  std::vector<int64_t> tokens;   // generated tokens (the decoder prompt is not included)
  std::vector<int64_t> prompt;   // the decoder prompt that was fed first
  double encoder_ms = 0;         // seq2seq only
  std::vector<StepStats> steps;  // one per decoder run
};

struct GeneratorOptions {
  std::shared_ptr<Environment> environment;  // null: one shared by the generator's sessions
  // Seq2seq: use decoder_model.onnx + decoder_with_past_model.onnx instead of the merged
  // decoder (the default when decoder_model_merged.onnx exists).
  bool use_decoder_pair = false;
  // The precision of the decoders' and encoder's packed MatMul/Gemm weights
  // (SessionOptions::gemm_weights).
  WeightPrecision gemm_weights = WeightPrecision::Float32;
  GraphOptimization optimization = GraphOptimization::All;  // SessionOptions::optimization
  Denormals denormals = Denormals::Flush;                   // SessionOptions::denormals
};

// Whisper-style encoder-decoder. MODEL_DIR holds encoder_model.onnx, decoder_model_merged.onnx
// (or the decoder pair), config.json and generation_config.json. Throws kiln::Error naming
// the file when something is missing or the models do not follow Optimum's naming.
class Seq2SeqGenerator {
 public:
  explicit Seq2SeqGenerator(const std::string& model_dir, GeneratorOptions options = {});
  ~Seq2SeqGenerator();
  Seq2SeqGenerator(Seq2SeqGenerator&&) noexcept;

  // `features`: the encoder input, e.g. float32[1, 80, 3000] log-mel features.
  GenerationResult generate(const Tensor& features, const GenerationOptions& options = {});
  // The prompt fed at the first decoder step: decoder start token + forced tokens.
  const std::vector<int64_t>& decoder_prompt() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Decoder-only language model (Optimum's model.onnx with past inputs).
class CausalLmGenerator {
 public:
  explicit CausalLmGenerator(const std::string& model_dir, GeneratorOptions options = {});
  ~CausalLmGenerator();
  CausalLmGenerator(CausalLmGenerator&&) noexcept;

  GenerationResult generate(const std::vector<int64_t>& prompt,
                            const GenerationOptions& options = {});

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
