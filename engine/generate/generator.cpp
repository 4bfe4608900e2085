// Decode loops over Optimum exports. Each step feeds the KV caches by move: they were
// allocated with room along the sequence axis, so the model's Concat appends the new token
// in place and the present.* outputs come back as the same buffers, one token longer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>

#include "engine/generate/decoding.h"
#include "kiln/error.h"
#include "kiln/generate.h"
#include "kiln/session.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

using namespace detail;

// What the generation configs say about decoding.
struct DecodeConfig {
  std::vector<int64_t> eos;
  std::vector<int64_t> suppress, begin_suppress;
  int64_t max_length = 0;  // total tokens including the prompt; 0: unknown
};

DecodeConfig read_decode_config(const JsonFile& config, const JsonFile& gen) {
  DecodeConfig d;
  d.eos = ints_of(config, "eos_token_id");
  if (auto g = ints_of(gen, "eos_token_id"); !g.empty()) d.eos = g;
  d.suppress = ints_of(gen, "suppress_tokens");
  d.begin_suppress = ints_of(gen, "begin_suppress_tokens");
  d.max_length = int_or(gen, "max_length", 0);
  return d;
}

// Token selection: suppression, then greedy or temperature / top-k / top-p sampling.
class TokenPicker {
 public:
  TokenPicker(const GenerationOptions& o, const DecodeConfig& d)
      : opts_(o), cfg_(d), rng_(o.seed), stops_(o.stop_tokens.empty() ? d.eos : o.stop_tokens) {
    if (o.do_sample && !(o.temperature > 0))
      throw Error(ErrorKind::InvalidArgument, "temperature must be > 0");
    if (o.top_k < 0) throw Error(ErrorKind::InvalidArgument, "top_k must be >= 0");
    if (!(o.top_p > 0 && o.top_p <= 1))
      throw Error(ErrorKind::InvalidArgument, "top_p must be in (0, 1]");
  }

  bool is_stop(int64_t t) const {
    return std::find(stops_.begin(), stops_.end(), t) != stops_.end();
  }

  // `logits` is one row over the vocabulary; suppressed tokens are set to -inf in it.
  int64_t pick(std::span<float> logits, int64_t generated_so_far) {
    const auto vocab = static_cast<int64_t>(logits.size());
    const float ninf = -std::numeric_limits<float>::infinity();
    auto suppress = [&](int64_t t) {
      if (t >= 0 && t < vocab) logits[static_cast<size_t>(t)] = ninf;
    };
    for (int64_t t : cfg_.suppress) suppress(t);
    if (generated_so_far == 0) {
      for (int64_t t : cfg_.begin_suppress) suppress(t);
    }
    if (generated_so_far < opts_.min_new_tokens) {
      for (int64_t t : stops_) suppress(t);
    }
    if (!opts_.do_sample) {
      return argmax(logits);  // the first maximum
    }
    // Sampling over the candidates that survive top-k and top-p.
    std::vector<int64_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
    });
    size_t keep = order.size();
    if (opts_.top_k > 0) keep = std::min(keep, static_cast<size_t>(opts_.top_k));
    std::vector<double> probs(keep);
    const double top = logits[static_cast<size_t>(order[0])] / opts_.temperature;
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) {
      const double l = logits[static_cast<size_t>(order[i])];
      probs[i] = std::isinf(l) ? 0.0 : std::exp(l / opts_.temperature - top);
      sum += probs[i];
    }
    if (!(sum > 0)) return order[0];
    if (opts_.top_p < 1.0f) {
      double cum = 0;
      size_t cut = keep;
      for (size_t i = 0; i < keep; ++i) {
        cum += probs[i] / sum;
        if (cum >= opts_.top_p) {
          cut = i + 1;
          break;
        }
      }
      keep = cut;
      probs.resize(keep);
    }
    std::discrete_distribution<size_t> dist(probs.begin(), probs.end());
    return order[dist(rng_)];
  }

 private:
  const GenerationOptions& opts_;
  const DecodeConfig& cfg_;
  std::mt19937_64 rng_;
  std::vector<int64_t> stops_;
};

}  // namespace

// ---------------------------------------------------------------- Seq2SeqGenerator

struct Seq2SeqGenerator::Impl {
  std::unique_ptr<Seq2SeqModels> models;
  std::vector<int64_t> prompt;
  DecodeConfig decode;
  int64_t max_target_positions = 448;
};

Seq2SeqGenerator::Seq2SeqGenerator(const std::string& model_dir, GeneratorOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const fs::path dir = model_dir;
  if (!fs::is_directory(dir)) throw Error(ErrorKind::Io, "not a folder").with_file(model_dir);
  const JsonFile config = read_json(dir / "config.json", true);
  const JsonFile gen = read_json(dir / "generation_config.json", false);
  m.decode = read_decode_config(config, gen);
  m.max_target_positions = int_or(config, "max_target_positions", 448);
  if (m.decode.max_length <= 0) m.decode.max_length = m.max_target_positions;
  // Decoder prompt: start token, then forced tokens by position (language, task, ...).
  int64_t start = int_or(config, "decoder_start_token_id", -1);
  start = int_or(gen, "decoder_start_token_id", start);
  if (start < 0)
    throw Error(ErrorKind::InvalidModel, "no decoder_start_token_id")
        .with_file((dir / "config.json").string());
  m.prompt = {start};
  if (const json::Json* forced = gen.find("forced_decoder_ids"); forced && forced->is_array()) {
    for (const auto& p : *forced) {
      if (!p.is_array() || p.size() != 2 ||
          json::to_int(p[0], gen.path, "forced_decoder_ids") !=
              static_cast<int64_t>(m.prompt.size())) {
        throw Error(ErrorKind::Unsupported,
                    "forced_decoder_ids must force consecutive positions from 1")
            .with_file(gen.path);
      }
      if (p[1].is_null()) break;  // a multilingual model's "detect the language"
      m.prompt.push_back(json::to_int(p[1], gen.path, "forced_decoder_ids"));
    }
  }
  m.models = std::make_unique<Seq2SeqModels>(dir, options);
}

Seq2SeqGenerator::~Seq2SeqGenerator() = default;
Seq2SeqGenerator::Seq2SeqGenerator(Seq2SeqGenerator&&) noexcept = default;
const std::vector<int64_t>& Seq2SeqGenerator::decoder_prompt() const {
  return impl_->prompt;
}

GenerationResult Seq2SeqGenerator::generate(const Tensor& features,
                                            const GenerationOptions& options) {
  Impl& m = *impl_;
  GenerationResult result;
  result.prompt = m.prompt;
  const int64_t prompt_len = static_cast<int64_t>(m.prompt.size());
  int64_t max_new = m.decode.max_length - prompt_len;
  if (options.max_new_tokens >= 0) max_new = options.max_new_tokens;
  max_new = std::min(max_new, m.max_target_positions - prompt_len);
  if (max_new <= 0) return result;
  const int64_t capacity = options.kv_capacity > 0 ? options.kv_capacity : prompt_len + max_new;

  auto t0 = std::chrono::steady_clock::now();
  const Tensor hidden = m.models->encode(features);
  result.encoder_ms = ms_since(t0);

  Seq2SeqDecoding decoding(*m.models, hidden, 1, capacity);
  TokenPicker picker(options, m.decode);
  std::vector<std::vector<int64_t>> next = {m.prompt};
  std::vector<float> scratch;
  result.tokens.reserve(static_cast<size_t>(max_new));
  result.steps.reserve(static_cast<size_t>(max_new));
  for (int64_t step = 0; step < max_new; ++step) {
    t0 = std::chrono::steady_clock::now();
    StepStats st;
    const std::string& file = decoding.file();
    Tensor logits = decoding.step(next, st);
    const int64_t token =
        picker.pick(logits_span(logits, 0, logits.dim(1) - 1, file, scratch), step);
    result.tokens.push_back(token);
    st.ms = ms_since(t0);
    result.steps.push_back(st);
    if (options.on_token && !options.on_token(token, st)) break;
    if (picker.is_stop(token)) break;
    next[0].assign(1, token);
  }
  return result;
}

// ---------------------------------------------------------------- CausalLmGenerator

struct CausalLmGenerator::Impl {
  std::string file;
  std::shared_ptr<Environment> env;
  std::unique_ptr<Session> model;
  DecodeConfig decode;
  int64_t max_positions = 0;
  bool attention_mask = false, position_ids = false;
};

CausalLmGenerator::CausalLmGenerator(const std::string& model_dir, GeneratorOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const fs::path dir = model_dir;
  if (!fs::is_directory(dir)) throw Error(ErrorKind::Io, "not a folder").with_file(model_dir);
  const JsonFile config = read_json(dir / "config.json", true);
  const JsonFile gen = read_json(dir / "generation_config.json", false);
  m.decode = read_decode_config(config, gen);
  m.max_positions = int_or(config, "n_positions", int_or(config, "max_position_embeddings", 0));
  m.file = (dir / "model.onnx").string();
  if (!fs::exists(m.file))
    throw Error(ErrorKind::Io, "missing from the model folder").with_file(m.file);
  m.model = std::make_unique<Session>(m.file, session_options(options, m.env));
  m.attention_mask = has_input(*m.model, "attention_mask");
  m.position_ids = has_input(*m.model, "position_ids");
  std::vector<std::string> names = {"input_ids"};
  if (m.attention_mask) names.push_back("attention_mask");
  if (m.position_ids) names.push_back("position_ids");
  require_inputs(*m.model, m.file, names);
  if (cache_slots(*m.model, m.file).empty()) bad_model(m.file, "has no past_key_values inputs");
}

CausalLmGenerator::~CausalLmGenerator() = default;
CausalLmGenerator::CausalLmGenerator(CausalLmGenerator&&) noexcept = default;

GenerationResult CausalLmGenerator::generate(const std::vector<int64_t>& prompt,
                                             const GenerationOptions& options) {
  Impl& m = *impl_;
  if (prompt.empty()) throw Error(ErrorKind::InvalidArgument, "the prompt is empty");
  GenerationResult result;
  result.prompt = prompt;
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  int64_t limit = m.decode.max_length > 0 ? m.decode.max_length
                                          : (m.max_positions > 0 ? m.max_positions : 1024);
  int64_t max_new = options.max_new_tokens >= 0 ? options.max_new_tokens : limit - prompt_len;
  if (m.max_positions > 0) max_new = std::min(max_new, m.max_positions - prompt_len);
  if (max_new <= 0) return result;
  const int64_t capacity = options.kv_capacity > 0 ? options.kv_capacity : prompt_len + max_new;
  KvCaches caches(cache_slots(*m.model, m.file), capacity);
  caches.init_empty();  // the model concatenates past and new: the prompt lands in place
  TokenPicker picker(options, m.decode);
  std::vector<int64_t> next = prompt;
  std::vector<float> scratch;
  Feeds in;
  std::vector<NamedValue> outs;
  int64_t past = 0;
  for (int64_t step = 0; step < max_new; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    StepStats st;
    st.past_len = past;
    const auto cur = static_cast<int64_t>(next.size());
    in.clear();
    in.add("input_ids", ids_tensor({next}));
    if (m.attention_mask) {
      in.add("attention_mask",
             Tensor::from_vector<int64_t>(
                 {1, past + cur}, std::vector<int64_t>(static_cast<size_t>(past + cur), 1)));
    }
    if (m.position_ids) {
      std::vector<int64_t> pos(static_cast<size_t>(cur));
      std::iota(pos.begin(), pos.end(), past);
      in.add("position_ids", Tensor::from_vector<int64_t>({1, cur}, pos));
    }
    caches.feed(in);
    const auto run_start = std::chrono::steady_clock::now();
    m.model->run(in.items(), outs);
    st.run_ms = ms_since(run_start);
    st.bytes_copied = m.model->last_run_stats().bytes_copied;
    st.allocations = m.model->last_run_stats().allocations;
    Tensor out_logits = named_output(outs, "logits", m.file).tensor();
    st.bytes_copied += caches.take(outs, m.file, true);
    past += cur;
    const int64_t token =
        picker.pick(logits_span(out_logits, 0, out_logits.dim(1) - 1, m.file, scratch), step);
    result.tokens.push_back(token);
    st.ms = ms_since(t0);
    result.steps.push_back(st);
    if (options.on_token && !options.on_token(token, st)) break;
    if (picker.is_stop(token)) break;
    next = {token};
  }
  return result;
}

}  // namespace kiln
