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
#include <string>

#include "engine/generate/json_file.h"
#include "kiln/error.h"
#include "kiln/generate.h"
#include "kiln/session.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void bad_model(const std::string& file, const std::string& why) {
  throw Error(ErrorKind::InvalidModel, why).with_file(file);
}

// A JSON file of the model folder: its document and its path, for error messages.
struct JsonFile {
  json::Json doc;  // null when the file is absent
  std::string path;

  // The member `key`, or null when absent (or the document is not an object).
  const json::Json* find(const char* key) const {
    if (!doc.is_object()) return nullptr;
    const auto it = doc.find(key);
    return it == doc.end() ? nullptr : &*it;
  }
};

// `key` as a list of integers: one integer or an array of them; empty when absent or null.
std::vector<int64_t> ints_of(const JsonFile& f, const char* key) {
  std::vector<int64_t> out;
  const json::Json* v = f.find(key);
  if (!v || v->is_null()) return out;
  if (!v->is_array()) return {json::to_int(*v, f.path, key)};
  for (const auto& x : *v) out.push_back(json::to_int(x, f.path, key));
  return out;
}

int64_t int_or(const JsonFile& f, const char* key, int64_t fallback) {
  const json::Json* v = f.find(key);
  return v && v->is_number() ? json::to_int(*v, f.path, key) : fallback;
}

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

JsonFile read_json(const fs::path& p, bool required) {
  if (!fs::exists(p)) {
    if (required) throw Error(ErrorKind::Io, "missing from the model folder").with_file(p.string());
    return {nullptr, p.string()};
  }
  return {json::read_file(p.string()), p.string()};
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

  // `logits` is one row over the vocabulary (any float layout already flattened).
  int64_t pick(std::vector<float> logits, int64_t generated_so_far) {
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
      return std::max_element(logits.begin(), logits.end()) - logits.begin();  // first maximum
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

// The last position's logits of a [batch=1, seq, vocab] tensor.
std::vector<float> last_logits(const Tensor& logits, const std::string& file) {
  if (logits.rank() != 3 || logits.dim(0) != 1 || logits.dim(1) < 1) {
    bad_model(file, "logits must be [1, sequence, vocab], got " + logits.describe());
  }
  const Tensor c = logits.contiguous();
  const int64_t vocab = c.dim(2), pos = c.dim(1) - 1;
  std::vector<float> row(static_cast<size_t>(vocab));
  if (c.dtype() == DataType::Float) {
    const float* p = c.data<const float>() + pos * vocab;
    std::copy(p, p + vocab, row.begin());
  } else if (c.dtype() == DataType::Float16) {
    const float16* p = c.data<const float16>() + pos * vocab;
    for (int64_t i = 0; i < vocab; ++i) row[static_cast<size_t>(i)] = static_cast<float>(p[i]);
  } else {
    bad_model(file, "logits must be float32 or float16, got " + logits.describe());
  }
  return row;
}

// One KV input of a decoder ("past_key_values.3.decoder.key") and its output name.
struct CacheSlot {
  std::string past, present;
  bool cross = false;  // encoder (cross-attention) cache: fixed after the first step
  int64_t heads = 0, head_dim = 0;
  DataType dtype = DataType::Float;
};

std::vector<CacheSlot> cache_slots(const Session& s, const std::string& file) {
  std::vector<CacheSlot> slots;
  for (const IoInfo& io : s.inputs()) {
    if (io.name.rfind("past_key_values.", 0) != 0) continue;
    CacheSlot c;
    c.past = io.name;
    c.present = "present." + io.name.substr(std::string("past_key_values.").size());
    c.cross = io.name.find(".encoder.") != std::string::npos;
    if (!io.has_shape || io.shape.size() != 4 || io.shape[1] < 0 || io.shape[3] < 0) {
      bad_model(file,
                "input '" + io.name +
                    "' must be [batch, heads, sequence, head_dim] with fixed heads and head_dim");
    }
    c.heads = io.shape[1];
    c.head_dim = io.shape[3];
    c.dtype = io.dtype;
    slots.push_back(c);
  }
  return slots;
}

bool has_input(const Session& s, const std::string& name) {
  return std::any_of(s.inputs().begin(), s.inputs().end(),
                     [&](const IoInfo& io) { return io.name == name; });
}

void require_inputs(const Session& s, const std::string& file,
                    const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (!has_input(s, n)) bad_model(file, "has no input '" + n + "' (expected an Optimum export)");
  }
  for (const IoInfo& io : s.inputs()) {
    if (io.name.rfind("past_key_values.", 0) == 0) continue;
    if (std::find(names.begin(), names.end(), io.name) == names.end()) {
      bad_model(file, "has an input kiln's generator does not know how to feed: '" + io.name + "'");
    }
  }
}

Value named_output(std::vector<NamedValue>& outs, const std::string& name,
                   const std::string& file) {
  for (auto& o : outs) {
    if (o.name == name) return std::move(o.value);
  }
  bad_model(file, "has no output '" + name + "'");
}

// The KV caches of a run: decoder caches move into each step and come back grown; cross
// caches are computed at the first step and then only read.
class KvCaches {
 public:
  KvCaches(std::vector<CacheSlot> slots, int64_t capacity)
      : slots_(std::move(slots)), capacity_(capacity) {}

  // Empty caches with room for `capacity_` tokens (first step of a model that reads them).
  void init_empty() {
    values_.clear();
    for (const CacheSlot& c : slots_) {
      values_[c.past] = Tensor::with_capacity(c.dtype, {1, c.heads, 0, c.head_dim}, 2, capacity_);
    }
  }

  // Feeds for the next run: decoder caches by move, cross caches by shared handle.
  void feed(std::vector<NamedValue>& inputs, bool include_cross = true) {
    for (const CacheSlot& c : slots_) {
      if (c.cross && !include_cross) continue;
      auto it = values_.find(c.past);
      if (it == values_.end()) continue;
      if (c.cross) {
        inputs.push_back({c.past, it->second});
      } else {
        inputs.push_back({c.past, std::move(it->second)});
      }
    }
  }

  // Takes the present.* outputs. A decoder cache without room for the next token is moved
  // once into a buffer with room (capacity, or twice the old capacity when longer); the
  // cross-attention caches of the first step are made contiguous if they are views. These
  // are the only cache copies a generation makes. Returns the bytes it copied.
  uint64_t take(std::vector<NamedValue>& outs, const std::string& file, bool first_step) {
    uint64_t copied = 0;
    for (const CacheSlot& c : slots_) {
      if (c.cross && !first_step) continue;
      bool found = false;
      for (auto& o : outs) {
        if (o.name != c.present) continue;
        found = true;
        Tensor t = o.value.tensor();
        o.value = Value();
        if (!c.cross && room(t) < 1) {
          const int64_t len = t.dim(2);
          const int64_t cap = std::max(capacity_, 2 * std::max<int64_t>(len, 1));
          Tensor grown = Tensor::with_capacity(t.dtype(), t.shape(), 2, cap);
          copy_elements(t, grown);
          copied += t.nbytes();
          t = grown;
        } else if (c.cross && !t.is_contiguous()) {
          // The cross-attention cache is read by every later step; a strided view (the
          // export's transposes) would make each of those reads strided, so it is laid out
          // contiguously once.
          copied += t.nbytes();
          t = t.contiguous();
        }
        values_[c.past] = std::move(t);
      }
      if (!found && (!c.cross || first_step)) bad_model(file, "has no output '" + c.present + "'");
    }
    return copied;
  }

  int64_t past_len() const {
    for (const CacheSlot& c : slots_) {
      if (c.cross) continue;
      auto it = values_.find(c.past);
      if (it != values_.end()) return it->second.dim(2);
    }
    return 0;
  }

 private:
  // Free positions after the end along the sequence axis of a [1, H, S, D] cache.
  static int64_t room(const Tensor& t) {
    if (t.rank() != 4 || t.strides()[3] != 1 || t.strides()[2] != t.dim(3)) return 0;
    if (t.dim(1) > 1) return t.strides()[1] / t.dim(3) - t.dim(2);
    const int64_t avail = static_cast<int64_t>(t.storage()->capacity() - t.byte_offset()) /
                          (bits_per_element(t.dtype()) / 8);
    return avail / t.dim(3) - t.dim(2);
  }

  std::vector<CacheSlot> slots_;
  int64_t capacity_;
  std::map<std::string, Tensor> values_;
};

Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return Tensor::from_vector<int64_t>({1, static_cast<int64_t>(ids.size())}, ids);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

SessionOptions session_options(const GeneratorOptions& o, std::shared_ptr<Environment>& env) {
  if (!env) env = o.environment ? o.environment : std::make_shared<Environment>(0);
  SessionOptions so;
  so.gemm_weights = o.gemm_weights;
  so.optimization = o.optimization;
  so.environment = env;
  return so;
}

}  // namespace

// ---------------------------------------------------------------- Seq2SeqGenerator

struct Seq2SeqGenerator::Impl {
  fs::path dir;
  std::shared_ptr<Environment> env;
  std::unique_ptr<Session> encoder, merged, first, with_past;
  std::string merged_file, first_file, with_past_file;
  std::vector<int64_t> prompt;
  DecodeConfig decode;
  int64_t max_target_positions = 448;
};

Seq2SeqGenerator::Seq2SeqGenerator(const std::string& model_dir, GeneratorOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.dir = model_dir;
  if (!fs::is_directory(m.dir)) throw Error(ErrorKind::Io, "not a folder").with_file(model_dir);
  const JsonFile config = read_json(m.dir / "config.json", true);
  const JsonFile gen = read_json(m.dir / "generation_config.json", false);
  m.decode = read_decode_config(config, gen);
  m.max_target_positions = int_or(config, "max_target_positions", 448);
  if (m.decode.max_length <= 0) m.decode.max_length = m.max_target_positions;
  // Decoder prompt: start token, then forced tokens by position (language, task, ...).
  int64_t start = int_or(config, "decoder_start_token_id", -1);
  start = int_or(gen, "decoder_start_token_id", start);
  if (start < 0)
    throw Error(ErrorKind::InvalidModel, "no decoder_start_token_id")
        .with_file((m.dir / "config.json").string());
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
      m.prompt.push_back(json::to_int(p[1], gen.path, "forced_decoder_ids"));
    }
  }
  SessionOptions so = session_options(options, m.env);
  const fs::path enc = m.dir / "encoder_model.onnx";
  if (!fs::exists(enc))
    throw Error(ErrorKind::Io, "missing from the model folder").with_file(enc.string());
  m.encoder = std::make_unique<Session>(enc.string(), so);
  if (m.encoder->inputs().size() != 1 || m.encoder->outputs().empty()) {
    bad_model(enc.string(),
              "the encoder must take one input (input_features) and produce last_hidden_state");
  }
  const fs::path merged = m.dir / "decoder_model_merged.onnx";
  if (!options.use_decoder_pair && fs::exists(merged)) {
    m.merged_file = merged.string();
    m.merged = std::make_unique<Session>(m.merged_file, so);
    require_inputs(*m.merged, m.merged_file,
                   {"input_ids", "encoder_hidden_states", "use_cache_branch"});
  } else {
    m.first_file = (m.dir / "decoder_model.onnx").string();
    m.with_past_file = (m.dir / "decoder_with_past_model.onnx").string();
    for (const auto& f : {m.first_file, m.with_past_file}) {
      if (!fs::exists(f)) throw Error(ErrorKind::Io, "missing from the model folder").with_file(f);
    }
    m.first = std::make_unique<Session>(m.first_file, so);
    m.with_past = std::make_unique<Session>(m.with_past_file, so);
    require_inputs(*m.first, m.first_file, {"input_ids", "encoder_hidden_states"});
    std::vector<std::string> wp = {"input_ids"};
    if (has_input(*m.with_past, "encoder_hidden_states")) wp.push_back("encoder_hidden_states");
    require_inputs(*m.with_past, m.with_past_file, wp);
  }
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
  auto enc_out = m.encoder->run({{m.encoder->inputs()[0].name, features}});
  const Tensor hidden = enc_out[0].value.tensor();
  result.encoder_ms = ms_since(t0);

  Session& dec0 = m.merged ? *m.merged : *m.first;
  Session& decn = m.merged ? *m.merged : *m.with_past;
  const std::string& file0 = m.merged ? m.merged_file : m.first_file;
  const std::string& filen = m.merged ? m.merged_file : m.with_past_file;
  KvCaches caches(cache_slots(decn, filen), capacity);
  TokenPicker picker(options, m.decode);
  std::vector<int64_t> next = m.prompt;
  for (int64_t step = 0; step < max_new; ++step) {
    t0 = std::chrono::steady_clock::now();
    Session& s = step == 0 ? dec0 : decn;
    const std::string& file = step == 0 ? file0 : filen;
    StepStats st;
    st.past_len = step == 0 ? 0 : caches.past_len();
    std::vector<NamedValue> in;
    in.push_back({"input_ids", ids_tensor(next)});
    if (has_input(s, "encoder_hidden_states")) in.push_back({"encoder_hidden_states", hidden});
    if (m.merged) {
      // The merged decoder reads every input at every step: empty caches first.
      if (step == 0) caches.init_empty();
      in.push_back({"use_cache_branch", Tensor::from_vector<bool>({1}, {step > 0})});
    }
    caches.feed(in);
    std::vector<NamedValue> outs = s.run(std::move(in));
    st.bytes_copied = s.last_run_stats().bytes_copied;
    st.allocations = s.last_run_stats().allocations;
    const std::vector<float> logits =
        last_logits(named_output(outs, "logits", file).tensor(), file);
    st.bytes_copied += caches.take(outs, file, step == 0);
    const int64_t token = picker.pick(logits, step);
    result.tokens.push_back(token);
    st.ms = ms_since(t0);
    result.steps.push_back(st);
    if (options.on_token && !options.on_token(token, st)) break;
    if (picker.is_stop(token)) break;
    next = {token};
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
  int64_t past = 0;
  for (int64_t step = 0; step < max_new; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    StepStats st;
    st.past_len = past;
    const auto cur = static_cast<int64_t>(next.size());
    std::vector<NamedValue> in;
    in.push_back({"input_ids", ids_tensor(next)});
    if (m.attention_mask) {
      in.push_back(
          {"attention_mask",
           Tensor::from_vector<int64_t>({1, past + cur},
                                        std::vector<int64_t>(static_cast<size_t>(past + cur), 1))});
    }
    if (m.position_ids) {
      std::vector<int64_t> pos(static_cast<size_t>(cur));
      std::iota(pos.begin(), pos.end(), past);
      in.push_back({"position_ids", Tensor::from_vector<int64_t>({1, cur}, pos)});
    }
    caches.feed(in);
    std::vector<NamedValue> outs = m.model->run(std::move(in));
    st.bytes_copied = m.model->last_run_stats().bytes_copied;
    st.allocations = m.model->last_run_stats().allocations;
    const std::vector<float> logits =
        last_logits(named_output(outs, "logits", m.file).tensor(), m.file);
    st.bytes_copied += caches.take(outs, m.file, true);
    past += cur;
    const int64_t token = picker.pick(logits, step);
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
