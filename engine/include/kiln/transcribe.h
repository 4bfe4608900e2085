// Whisper transcription as transformers' WhisperForConditionalGeneration.generate does it:
// the decoder prompt (start token, language given or detected, task, <|notimestamps|> unless
// timestamps are asked for), suppressed tokens, the timestamp rules, greedy decoding or beam
// search, temperature fallback on the compression-ratio and log-probability thresholds, and
// audio longer than 30 s transcribed window by window with timestamp-based seeking.
//
//   kiln::WhisperTranscriber whisper("models/whisper-tiny.en");
//   kiln::Transcript t = whisper.transcribe(kiln::read_audio("speech.flac"), {});
//   std::cout << t.text;
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/generate.h"
#include "kiln/tensor.h"
#include "kiln/vad.h"

namespace kiln {

struct TranscriptSegment {
  double start = 0, end = 0;          // seconds from the start of the audio
  std::vector<int64_t> tokens;        // as generated, timestamp tokens included
  std::vector<float> token_logprobs;  // log-probability of each token when it was chosen
  std::string text;                   // decoded without special tokens (empty: no tokenizer)
  // Of the decode that produced the segment (shared by the segments of one 30-s window).
  float temperature = 0;
  double avg_logprob = 0;
  double compression_ratio = 0;
  double no_speech_prob = 0;  // only computed when a no-speech threshold is set
};

struct Transcript {
  std::string text;  // every segment's text (empty: the model folder has no tokenizer)
  std::vector<TranscriptSegment> segments;
  // The generated tokens of every segment, in order, as transformers' generate() returns them
  // (without the decoder prompt and the end-of-text token).
  std::vector<int64_t> tokens;
  std::vector<int64_t> prompt;  // what the first window's decoder run was fed
  std::string language;         // "en": given, forced by the model's config, or detected
  // With TranscribeOptions::vad: the regions of the audio that were transcribed.
  std::vector<SpeechRegion> speech_regions;
  // Work done: encoder runs (one per window and per language detection), decoder steps.
  int64_t encoder_runs = 0, decoder_steps = 0, fallbacks = 0;
  double encoder_ms = 0, decoder_ms = 0;
};

struct TranscribeOptions {
  // A language code ("de") or name ("german"); empty: what the model's config forces, or
  // detection from the first window for a multilingual model; "auto": always detect.
  std::string language;
  std::string task;         // "transcribe" or "translate"; empty: the model's default
  bool timestamps = false;  // segments with times; always on for audio over 30 s
  int64_t num_beams = 1;    // beam search when > 1 (at temperature 0)
  float length_penalty = 1.0f;
  bool early_stopping = false;
  // Tried in order while a window's result fails the thresholds; 0 decodes greedily (or by
  // beam search), a positive temperature samples (top-k 50, as transformers).
  std::vector<float> temperatures = {0.0f};
  int64_t best_of = 1;  // samples drawn at each positive temperature; the most likely is kept
  std::optional<double> compression_ratio_threshold;  // e.g. 2.4 (openai-whisper: 2.4)
  std::optional<double> logprob_threshold;            // e.g. -1.0
  std::optional<double> no_speech_threshold;          // e.g. 0.6; needs logprob_threshold
  bool condition_on_prev_tokens = false;
  // The initial prompt as transformers' prompt_ids (<|startofprev|> then the text's tokens),
  // or as text (needs the tokenizer); at most one of the two.
  std::vector<int64_t> prompt_ids;
  std::string prompt;
  int64_t max_new_tokens = -1;  // per window; -1: up to the config's max_length
  uint64_t seed = 0;            // for sampling
  // Voice-activity filtering, as faster-whisper's vad_filter: only the speech regions `vad`
  // finds are transcribed, laid end to end, and segment times are mapped back to the original
  // audio. Null: the whole audio. Applies to transcribe(samples), not to features.
  std::shared_ptr<const VoiceActivityDetector> vad;
  VadOptions vad_options;
  // Called with each segment once it is final; return false to stop.
  std::function<bool(const TranscriptSegment&)> on_segment;
  // Text as it becomes final (needs the tokenizer): token by token for one greedy window
  // without timestamps or fallback, else each segment's text; return false to stop. Pieces
  // are whole UTF-8 characters, before transformers' clean-up of spaces before punctuation.
  std::function<bool(const std::string&)> on_text;
};

class WhisperTranscriber {
 public:
  // MODEL_DIR: an Optimum Whisper export (see Seq2SeqGenerator) with config.json,
  // generation_config.json and, for text, the tokenizer files.
  explicit WhisperTranscriber(const std::string& model_dir, GeneratorOptions options = {});
  ~WhisperTranscriber();
  WhisperTranscriber(WhisperTranscriber&&) noexcept;

  // 16 kHz mono samples (read_audio), any length.
  Transcript transcribe(const std::vector<float>& samples, const TranscribeOptions& options = {});
  // Log-mel features [1, mels, frames] as WhisperFeatureExtractor makes them; more than 3000
  // frames is long-form transcription.
  Transcript transcribe_features(const Tensor& features, const TranscribeOptions& options = {});

  bool multilingual() const;
  bool has_tokenizer() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
