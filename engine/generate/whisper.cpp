// Whisper transcription, following transformers' WhisperForConditionalGeneration.generate
// (models/whisper/generation_whisper.py) step for step so the tokens are the same: the
// decoder prompt, the logits processors (begin-suppress, suppress, timestamps, no-speech),
// greedy / sampling / beam search per 30-s window, temperature fallback, and segments cut at
// timestamp pairs with seeking to the last complete one.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <span>

#include "engine/generate/decoding.h"
#include "engine/generate/whisper_config.h"
#include "engine/generate/whisper_logits.h"
#include "kiln/audio.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "kiln/transcribe.h"

namespace kiln {

namespace fs = std::filesystem;
using namespace detail;
using namespace detail::whisper;

namespace {

constexpr double kTimePrecision = 0.02;         // seconds per timestamp token
constexpr double kFeatureTimePrecision = 0.01;  // seconds per log-mel frame
constexpr int64_t kTopK = 50;                   // transformers' sampling default

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// One decode of one window: generated tokens (end-of-text included when produced) and what
// the fallback rules look at.
struct Decoded {
  std::vector<int64_t> tokens;
  std::vector<float> token_logprobs;
  double score = 0;  // average log-probability (greedy, sampling) or beam score
  double no_speech_prob = 0;
  int64_t steps = 0;
  double ms = 0;
};

}  // namespace

// ---------------------------------------------------------------- WhisperTranscriber

struct WhisperTranscriber::Impl {
  WhisperConfig cfg;
  std::unique_ptr<Seq2SeqModels> models;
  std::optional<Tokenizer> tokenizer;
  bool clean_up_spaces = false;  // tokenizer_config.json's clean_up_tokenization_spaces

  // transformers' WhisperTokenizer.decode(skip_special_tokens=True): no special or timestamp
  // tokens, then the clean-up of spaces before punctuation when the config asks for it.
  std::string text_of(const std::vector<int64_t>& tokens) const;
  std::vector<int64_t> prompt_ids(const TranscribeOptions& o) const;

  int64_t language_id(const std::string& language) const;
  int64_t detect_language(const Tensor& hidden, Transcript& t) const;
  std::vector<int64_t> init_tokens(const TranscribeOptions& o, bool timestamps,
                                   const Tensor& first_hidden, Transcript& t) const;
  Decoded decode(const Tensor& hidden, const std::vector<int64_t>& prompt, size_t init_len,
                 int64_t max_length, bool timestamps, float temperature, int64_t beams,
                 const TranscribeOptions& o, std::mt19937_64& rng,
                 const std::function<bool(int64_t)>& on_token = {}) const;
  Decoded decode_beams(const Tensor& hidden, const std::vector<int64_t>& prompt, size_t init_len,
                       const Processors& proc, int64_t max_length, int64_t beams,
                       const TranscribeOptions& o) const;
  double no_speech(const Tensor& logits, int64_t pos, const std::string& file) const;
};

int64_t WhisperTranscriber::Impl::language_id(const std::string& language) const {
  const std::string l = lower(language);
  std::string token;
  if (cfg.lang_to_id.count(l)) {
    token = l;
  } else {
    for (const auto& [code, name] : kLanguages) {
      if (l == name || l == code) token = std::string("<|") + code + "|>";
    }
  }
  if (token.empty()) throw Error(ErrorKind::InvalidArgument, "unknown language '" + language + "'");
  const auto it = cfg.lang_to_id.find(token);
  if (it == cfg.lang_to_id.end())
    throw Error(ErrorKind::InvalidArgument,
                "language '" + language + "' (" + token + ") is not one this model knows")
        .with_file(cfg.gen_path);
  return it->second;
}

// The language token the first step scores highest, as transformers' detect_language.
int64_t WhisperTranscriber::Impl::detect_language(const Tensor& hidden, Transcript& t) const {
  Seq2SeqDecoding d(*models, hidden, 1, 1);
  StepStats st;
  const std::string file = d.file();
  const Tensor logits = d.step({{cfg.start}}, st);
  ++t.decoder_steps;
  const std::vector<float> row = logits_row(logits, 0, logits.dim(1) - 1, file);
  int64_t best = -1;
  for (const auto& [token, id] : cfg.lang_to_id) {
    if (id < 0 || id >= static_cast<int64_t>(row.size())) continue;
    if (best < 0 || row[static_cast<size_t>(id)] > row[static_cast<size_t>(best)] ||
        (row[static_cast<size_t>(id)] == row[static_cast<size_t>(best)] && id < best))
      best = id;
  }
  if (best < 0) bad_model(cfg.gen_path, "lang_to_id has no token inside the vocabulary");
  return best;
}

// transformers' _retrieve_init_tokens: start token, language, task, <|notimestamps|>.
std::vector<int64_t> WhisperTranscriber::Impl::init_tokens(const TranscribeOptions& o,
                                                           bool timestamps,
                                                           const Tensor& first_hidden,
                                                           Transcript& t) const {
  const bool detect = o.language == "auto";
  const std::string language = detect ? "" : o.language;
  if (!cfg.multilingual() && (!language.empty() || !o.task.empty()))
    throw Error(ErrorKind::InvalidArgument,
                "this is an English-only model: no language or task can be given")
        .with_file(cfg.gen_path);
  std::vector<std::optional<int64_t>> init = {cfg.start};
  if (o.task.empty() && language.empty()) {
    for (const auto& f : cfg.forced) init.push_back(f);
  }
  const bool lang_undefined = init.size() <= 1 || !init[1].has_value() || detect;
  std::optional<int64_t> lang;
  if (!language.empty()) {
    lang = language_id(language);
  } else if (!cfg.lang_to_id.empty() && cfg.multilingual() && lang_undefined) {
    lang = detect_language(first_hidden, t);
  }
  if (lang) {
    if (init.size() > 1) {
      init[1] = lang;
    } else {
      init.push_back(lang);
    }
  }
  auto is_task = [&](const std::optional<int64_t>& id) {
    if (!id) return false;
    for (const auto& [name, tid] : cfg.task_to_id) {
      if (tid == *id) return true;
    }
    return false;
  };
  if (!o.task.empty()) {
    const auto it = cfg.task_to_id.find(o.task);
    if (o.task != "transcribe" && o.task != "translate")
      throw Error(ErrorKind::InvalidArgument,
                  "unknown task '" + o.task + "' (transcribe or translate)");
    if (it == cfg.task_to_id.end())
      throw Error(ErrorKind::InvalidArgument, "the model has no '" + o.task + "' task token")
          .with_file(cfg.gen_path);
    init.push_back(it->second);
    for (auto& id : init) {
      if (is_task(id)) id = it->second;
    }
  } else if (!language.empty() && !cfg.task_to_id.empty()) {
    if (std::none_of(init.begin(), init.end(), is_task)) {
      const auto it = cfg.task_to_id.find("transcribe");
      if (it != cfg.task_to_id.end()) init.push_back(it->second);
    }
  }
  if (!timestamps && cfg.no_timestamps >= 0 && init.back() != cfg.no_timestamps) {
    init.push_back(cfg.no_timestamps);
  } else if (timestamps && init.back() == cfg.no_timestamps) {
    init.pop_back();
  }
  std::vector<int64_t> out;
  for (const auto& id : init) {
    if (id) out.push_back(*id);
  }
  // The language the prompt names.
  for (const auto& [token, id] : cfg.lang_to_id) {
    if (out.size() > 1 && out[1] == id && token.size() > 4)
      t.language = token.substr(2, token.size() - 4);
  }
  if (t.language.empty() && !cfg.multilingual()) t.language = "en";
  return out;
}

double WhisperTranscriber::Impl::no_speech(const Tensor& logits, int64_t pos,
                                           const std::string& file) const {
  std::vector<float> row = logits_row(logits, 0, pos, file);
  log_softmax(row);
  const int64_t token = cfg.no_timestamps - 1;  // <|nocaptions|>
  if (token < 0 || token >= static_cast<int64_t>(row.size())) return 0;
  return std::exp(static_cast<double>(row[static_cast<size_t>(token)]));
}

// Greedy or sampled decoding of one window (beam search goes to decode_beams).
Decoded WhisperTranscriber::Impl::decode(const Tensor& hidden, const std::vector<int64_t>& prompt,
                                         size_t init_len, int64_t max_length, bool timestamps,
                                         float temperature, int64_t beams,
                                         const TranscribeOptions& o, std::mt19937_64& rng,
                                         const std::function<bool(int64_t)>& on_token) const {
  const Processors proc(cfg, timestamps, prompt.size());
  const bool sample = temperature > 0;
  if (!sample && beams > 1)
    return decode_beams(hidden, prompt, init_len, proc, max_length, beams, o);
  const auto t0 = std::chrono::steady_clock::now();
  Decoded d;
  Seq2SeqDecoding run(*models, hidden, 1, max_length);
  std::vector<int64_t> seq = prompt;
  std::vector<int64_t> next = prompt;
  double sum = 0;
  while (static_cast<int64_t>(seq.size()) < max_length) {
    StepStats st;
    const std::string file = run.file();
    const Tensor logits = run.step({next}, st);
    ++d.steps;
    if (d.steps == 1 && o.no_speech_threshold) {
      d.no_speech_prob = no_speech(logits, static_cast<int64_t>(prompt.size() - init_len), file);
    }
    std::vector<float> scores = logits_row(logits, 0, logits.dim(1) - 1, file);
    proc.apply(seq, scores);
    int64_t token = 0;
    if (!sample) {
      token = argmax(scores);
    } else {
      // Temperature, then top-k (ties at the k-th value kept, as torch.topk's threshold).
      for (float& v : scores) v /= temperature;
      std::vector<float> sorted = scores;
      const auto k = std::min<size_t>(kTopK, sorted.size());
      std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k - 1),
                       sorted.end(), std::greater<float>());
      const float kth = sorted[k - 1];
      for (float& v : scores) {
        if (v < kth) v = kNegInf;
      }
      std::vector<double> p(scores.size());
      const double m = *std::max_element(scores.begin(), scores.end());
      for (size_t i = 0; i < scores.size(); ++i) p[i] = std::exp(scores[i] - m);
      std::discrete_distribution<int64_t> dist(p.begin(), p.end());
      token = dist(rng);
      for (float& v : scores) v *= temperature;  // the scores the log-probability uses
    }
    log_softmax(scores);
    const float lp = scores[static_cast<size_t>(token)];
    sum += lp;
    d.tokens.push_back(token);
    d.token_logprobs.push_back(lp);
    seq.push_back(token);
    if (token == cfg.eos) break;
    if (on_token && !on_token(token)) break;
    next = {token};
  }
  d.score = d.tokens.empty() ? 0 : sum / static_cast<double>(d.tokens.size());
  d.ms = ms_since(t0);
  return d;
}

// transformers' beam search (generation/utils.py _beam_search) for one input: 2 x beams
// candidates per step, finished hypotheses scored by sum log-prob / length^length_penalty,
// the same early-stop heuristic. The KV-cache rows follow their beams in place.
Decoded WhisperTranscriber::Impl::decode_beams(const Tensor& hidden,
                                               const std::vector<int64_t>& prompt, size_t init_len,
                                               const Processors& proc, int64_t max_length,
                                               int64_t beams, const TranscribeOptions& o) const {
  const auto t0 = std::chrono::steady_clock::now();
  const auto B = static_cast<size_t>(beams);
  const size_t K = 2 * B;
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  struct Hyp {
    std::vector<int64_t> seq;
    std::vector<float> lps;  // per generated token
    float score = -1e9f;
    bool finished = false;
  };
  std::vector<Hyp> running(B), done(B);
  for (size_t b = 0; b < B; ++b) {
    running[b].seq = prompt;
    running[b].score = b == 0 ? 0.0f : -1e9f;
    done[b].seq = prompt;
  }
  bool improvable = true;
  // The first step runs once for the prompt every beam shares; the decoding then goes on with
  // B rows, the encoder's cross-attention caches kept as one row for all of them.
  Seq2SeqDecoding run(*models, hidden, 1, max_length);
  Decoded d;
  int64_t cur_len = prompt_len;
  std::vector<std::vector<int64_t>> feed(B, prompt);
  auto penalised = [&](float s, int64_t len) {
    return static_cast<float>(s / std::pow(static_cast<double>(len), o.length_penalty));
  };
  while (true) {
    StepStats st;
    const std::string file = run.file();
    const bool first_step = d.steps == 0;
    const Tensor logits =
        run.step(first_step ? std::vector<std::vector<int64_t>>{feed[0]} : feed, st);
    ++d.steps;
    if (d.steps == 1 && o.no_speech_threshold) {
      d.no_speech_prob = no_speech(logits, prompt_len - static_cast<int64_t>(init_len), file);
    }
    const int64_t V = logits.dim(2);
    // Candidates: accumulated log-probabilities over every (beam, token).
    std::vector<float> acc(B * static_cast<size_t>(V));
    std::vector<std::vector<float>> lprows(B);
    for (size_t b = 0; b < B; ++b) {
      // The first step's one row serves every beam (they share the prompt).
      const int64_t r = first_step ? 0 : static_cast<int64_t>(b);
      std::vector<float> row = logits_row(logits, r, logits.dim(1) - 1, file);
      log_softmax(row);
      proc.apply(running[b].seq, row);
      for (int64_t v = 0; v < V; ++v)
        acc[b * static_cast<size_t>(V) + static_cast<size_t>(v)] =
            row[static_cast<size_t>(v)] + running[b].score;
      lprows[b] = std::move(row);
    }
    std::vector<size_t> top(acc.size());
    std::iota(top.begin(), top.end(), 0);
    std::partial_sort(
        top.begin(), top.begin() + static_cast<std::ptrdiff_t>(K), top.end(),
        [&](size_t a, size_t b) { return acc[a] > acc[b] || (acc[a] == acc[b] && a < b); });
    top.resize(K);
    struct Cand {
      size_t beam;
      int64_t token;
      float logprob;
      bool stops;
    };
    std::vector<Cand> cands;
    for (size_t k = 0; k < K; ++k) {
      const size_t beam = top[k] / static_cast<size_t>(V);
      const auto token = static_cast<int64_t>(top[k] % static_cast<size_t>(V));
      cands.push_back({beam, token, acc[top[k]], token == cfg.eos || cur_len + 1 >= max_length});
    }
    // Finished hypotheses: the first B candidates that stop, merged with the earlier ones.
    const bool all_done =
        std::all_of(done.begin(), done.end(), [](const Hyp& h) { return h.finished; });
    std::vector<Hyp> merged = done;
    for (size_t k = 0; k < K; ++k) {
      const Cand& c = cands[k];
      Hyp h;
      h.seq = running[c.beam].seq;
      h.seq.push_back(c.token);
      h.lps = running[c.beam].lps;
      h.lps.push_back(lprows[c.beam][static_cast<size_t>(c.token)]);
      h.score = penalised(c.logprob, cur_len + 1 - prompt_len);
      if (all_done && o.early_stopping) h.score += -1e9f;
      if (!improvable) h.score += -1e9f;
      const bool just_finished = c.stops && k < B;
      if (!just_finished) h.score += -1e9f;
      h.finished = just_finished;
      merged.push_back(std::move(h));
    }
    std::stable_sort(merged.begin(), merged.end(),
                     [](const Hyp& a, const Hyp& b) { return a.score > b.score; });
    merged.resize(B);
    done = std::move(merged);
    // Running beams: the best B candidates that do not stop.
    std::vector<size_t> order(K);
    std::iota(order.begin(), order.end(), 0);
    auto run_score = [&](size_t k) { return cands[k].logprob + (cands[k].stops ? -1e9f : 0.0f); };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return run_score(a) > run_score(b); });
    std::vector<Hyp> next(B);
    std::vector<int64_t> rows(B);
    for (size_t b = 0; b < B; ++b) {
      const Cand& c = cands[order[b]];
      next[b].seq = running[c.beam].seq;
      next[b].seq.push_back(c.token);
      next[b].lps = running[c.beam].lps;
      next[b].lps.push_back(lprows[c.beam][static_cast<size_t>(c.token)]);
      next[b].score = run_score(order[b]);
      rows[b] = static_cast<int64_t>(c.beam);
      feed[b] = {c.token};
    }
    running = std::move(next);
    ++cur_len;
    // The early-stop heuristic (early_stopping false): can a running beam still beat the
    // worst finished one at the current length?
    const bool every_done =
        std::all_of(done.begin(), done.end(), [](const Hyp& h) { return h.finished; });
    float worst = done[0].score;
    for (const Hyp& h : done) worst = std::min(worst, h.score);
    const float best_possible = penalised(running[0].score, cur_len - prompt_len);
    improvable = improvable && std::any_of(done.begin(), done.end(), [&](const Hyp& h) {
                   return best_possible > (h.finished ? worst : -1e9f);
                 });
    const bool all_stop =
        std::all_of(cands.begin(), cands.end(), [](const Cand& c) { return c.stops; });
    if (!improvable || (every_done && o.early_stopping) || all_stop) break;
    if (first_step) {
      run.expand(beams);  // every row continues from the one the first step ran
    } else {
      run.reorder(rows);
    }
  }
  const Hyp& best = done[0];
  d.tokens.assign(best.seq.begin() + prompt_len, best.seq.end());
  d.token_logprobs = best.lps;
  d.score = best.score;
  d.ms = ms_since(t0);
  return d;
}

WhisperTranscriber::WhisperTranscriber(const std::string& model_dir, GeneratorOptions options)
    : impl_(std::make_unique<Impl>()) {
  const fs::path dir = model_dir;
  if (!fs::is_directory(dir)) throw Error(ErrorKind::Io, "not a folder").with_file(model_dir);
  impl_->cfg = read_whisper_config(dir);
  impl_->models = std::make_unique<Seq2SeqModels>(dir, options);
  if (Tokenizer::exists_in(model_dir)) {
    impl_->tokenizer = Tokenizer::from_dir(model_dir);
    const JsonFile tc = read_json(dir / "tokenizer_config.json", false);
    if (const json::Json* v = tc.find("clean_up_tokenization_spaces"); v && v->is_boolean())
      impl_->clean_up_spaces = v->get<bool>();
  }
}

std::string WhisperTranscriber::Impl::text_of(const std::vector<int64_t>& tokens) const {
  if (!tokenizer) return "";
  std::vector<int64_t> ids;
  for (int64_t id : tokens) {
    if (id < cfg.timestamp_begin && !tokenizer->is_special(id)) ids.push_back(id);
  }
  std::string text = tokenizer->decode(ids, true);
  if (!clean_up_spaces) return text;
  // transformers' clean_up_tokenization.
  static const std::pair<const char*, const char*> kCleanUps[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kCleanUps) {
    const std::string f = from, t = to;
    for (size_t at = text.find(f); at != std::string::npos; at = text.find(f, at + t.size()))
      text.replace(at, f.size(), t);
  }
  return text;
}

// transformers' get_prompt_ids: <|startofprev|> then the tokens of " " + the stripped text.
std::vector<int64_t> WhisperTranscriber::Impl::prompt_ids(const TranscribeOptions& o) const {
  if (o.prompt.empty()) return o.prompt_ids;
  if (!o.prompt_ids.empty())
    throw Error(ErrorKind::InvalidArgument, "give a prompt as text or as ids, not both");
  if (!tokenizer)
    throw Error(ErrorKind::InvalidArgument, "a text prompt needs the model folder's tokenizer")
        .with_file(models->dir.string());
  if (cfg.prev_sot < 0)
    throw Error(ErrorKind::InvalidModel, "no <|startofprev|> token for a prompt")
        .with_file(cfg.gen_path);
  const size_t a = o.prompt.find_first_not_of(" \t\n\r");
  const size_t b = o.prompt.find_last_not_of(" \t\n\r");
  const std::string text = a == std::string::npos ? "" : o.prompt.substr(a, b - a + 1);
  std::vector<int64_t> ids = {cfg.prev_sot};
  for (int64_t id : tokenizer->encode(" " + text)) {
    if (tokenizer->is_special(id))
      throw Error(ErrorKind::InvalidArgument, "the prompt contains a special token");
    ids.push_back(id);
  }
  return ids;
}

WhisperTranscriber::~WhisperTranscriber() = default;
WhisperTranscriber::WhisperTranscriber(WhisperTranscriber&&) noexcept = default;

bool WhisperTranscriber::multilingual() const {
  return impl_->cfg.multilingual();
}
bool WhisperTranscriber::has_tokenizer() const {
  return impl_->tokenizer.has_value();
}

Transcript WhisperTranscriber::transcribe(const std::vector<float>& samples,
                                          const TranscribeOptions& options) {
  if (options.vad) {
    // The speech regions laid end to end, transcribed as one signal; times mapped back.
    const std::vector<SpeechRegion> regions =
        options.vad->speech_regions(samples, options.vad_options);
    if (regions.empty()) return Transcript{};  // nothing but silence: no text
    std::vector<float> speech;
    for (const SpeechRegion& r : regions)
      speech.insert(speech.end(), samples.begin() + r.start, samples.begin() + r.end);
    const SpeechTimeMap map(regions);
    auto map_times = [&](TranscriptSegment& seg) {
      seg.start = map.original_time(seg.start);
      seg.end = map.original_time(seg.end, true);
    };
    TranscribeOptions inner = options;
    inner.vad = nullptr;
    if (options.on_segment) {
      inner.on_segment = [&](const TranscriptSegment& seg) {
        TranscriptSegment mapped = seg;
        map_times(mapped);
        return options.on_segment(mapped);
      };
    }
    Transcript t = transcribe(speech, inner);
    t.speech_regions = regions;
    for (TranscriptSegment& seg : t.segments) map_times(seg);
    return t;
  }
  // As transformers' ASR pipeline: up to 30 s, the features of one padded window; longer,
  // the features of the whole signal (floor over all of it), decoded window by window.
  constexpr size_t kWindowSamples = 30 * 16000;
  if (samples.size() <= kWindowSamples)
    return transcribe_features(whisper_log_mel(samples), options);
  return transcribe_features(whisper_log_mel_long(samples), options);
}

Transcript WhisperTranscriber::transcribe_features(const Tensor& features,
                                                   const TranscribeOptions& o) {
  Impl& m = *impl_;
  const WhisperConfig& c = m.cfg;
  if (features.rank() != 3 || features.dim(0) != 1 || features.dtype() != DataType::Float)
    throw Error(ErrorKind::InvalidArgument,
                "features must be float32[1, mels, frames], got " + features.describe());
  if (o.num_beams < 1) throw Error(ErrorKind::InvalidArgument, "num_beams must be >= 1");
  if (o.best_of < 1) throw Error(ErrorKind::InvalidArgument, "best_of must be >= 1");
  if (o.temperatures.empty()) throw Error(ErrorKind::InvalidArgument, "no temperature given");
  for (float t : o.temperatures) {
    if (!(t >= 0)) throw Error(ErrorKind::InvalidArgument, "temperatures must be >= 0");
  }
  if (o.no_speech_threshold && !o.logprob_threshold)
    throw Error(ErrorKind::InvalidArgument,
                "a no-speech threshold needs a log-probability threshold");
  const std::vector<int64_t> prompt_ids = m.prompt_ids(o);
  Transcript t;
  const int64_t total = features.dim(2);
  const bool shortform = total <= c.num_segment_frames;
  const bool timestamps = o.timestamps || c.return_timestamps || !shortform;
  if (timestamps && c.no_timestamps < 0)
    throw Error(ErrorKind::InvalidModel,
                "timestamps need no_timestamps_token_id in the generation config")
        .with_file(c.gen_path);

  // The encoder output of the window at frame `seek`, zero-padded past the end.
  auto encode = [&](int64_t seek) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor h = m.models->encode(whisper_log_mel_window(features, seek, c.num_segment_frames));
    t.encoder_ms += ms_since(t0);
    ++t.encoder_runs;
    return h;
  };
  int64_t seek = 0;
  Tensor hidden = encode(seek);
  const std::vector<int64_t> init = m.init_tokens(o, timestamps, hidden, t);
  const auto cut_off = c.max_target_positions / 2 - 1;
  const bool first_segment_prompt = !prompt_ids.empty();
  // The prompt counts as the first segment (transformers' prompt_condition_type
  // "first-segment"), dropped from the result.
  std::vector<TranscriptSegment> segments;
  if (first_segment_prompt) {
    TranscriptSegment p;
    p.tokens = prompt_ids;
    if (!p.tokens.empty() && p.tokens[0] == c.prev_sot) p.tokens.erase(p.tokens.begin());
    segments.push_back(std::move(p));
  }
  bool condition = o.condition_on_prev_tokens;
  std::mt19937_64 rng(o.seed);
  // Text streams token by token when nothing decoded can be taken back (one window, one
  // greedy pass, no timestamp seeking); otherwise a segment at a time once it is final.
  const bool token_stream = o.on_text && m.tokenizer && shortform && !timestamps &&
                            o.temperatures.size() == 1 && o.temperatures[0] == 0 &&
                            o.num_beams == 1;
  std::optional<TextStream> stream;
  if (token_stream) stream.emplace(*m.tokenizer);
  bool stopped = false;
  const std::function<bool(int64_t)> on_token = [&](int64_t id) {
    if (id >= c.timestamp_begin || m.tokenizer->is_special(id)) return true;
    const std::string piece = stream->push(id);
    if (!piece.empty() && !o.on_text(piece)) stopped = true;
    return !stopped;
  };
  bool first_window = true;
  while (seek < total) {
    const int64_t frames = std::min(total - seek, c.num_segment_frames);
    if (!first_window) hidden = encode(seek);
    first_window = false;
    const double time_offset = static_cast<double>(seek) * kTimePrecision / kInputStride;
    // The decoder prompt: previous text or the initial prompt, then the init tokens.
    std::vector<int64_t> prompt;
    if (condition && !segments.empty()) {
      std::vector<int64_t> prev;
      for (const auto& s : segments) {
        const auto& tk = s.tokens;
        const bool double_end = tk.size() > 2 && tk[tk.size() - 2] >= c.timestamp_begin;
        prev.insert(prev.end(), tk.begin(), tk.end() - (double_end ? 1 : 0));
      }
      if (static_cast<int64_t>(prev.size()) > cut_off)
        prev.erase(prev.begin(), prev.end() - cut_off);
      prompt.push_back(c.prev_sot);
      prompt.insert(prompt.end(), prev.begin(), prev.end());
    } else if (!prompt_ids.empty()) {
      prompt = prompt_ids;
    }
    prompt.insert(prompt.end(), init.begin(), init.end());
    if (t.prompt.empty()) t.prompt = prompt;
    const auto prompt_len = static_cast<int64_t>(prompt.size());
    int64_t max_length = c.max_length;
    if (o.max_new_tokens >= 0) {
      if (o.max_new_tokens + prompt_len > c.max_target_positions)
        throw Error(ErrorKind::InvalidArgument,
                    "the decoder prompt (" + std::to_string(prompt_len) + " tokens) and " +
                        std::to_string(o.max_new_tokens) + " new tokens exceed the model's " +
                        std::to_string(c.max_target_positions) + " positions");
      max_length = prompt_len + o.max_new_tokens;
    }
    // Decode with temperature fallback.
    Decoded best;
    float used_temperature = 0;
    bool skip = false;
    double ratio = 0;
    for (size_t ti = 0; ti < o.temperatures.size(); ++ti) {
      const float temp = o.temperatures[ti];
      const int64_t draws = temp > 0 ? o.best_of : 1;
      Decoded d;
      for (int64_t draw = 0; draw < draws; ++draw) {
        Decoded cand = m.decode(hidden, prompt, init.size(), max_length, timestamps, temp,
                                temp > 0 ? 1 : o.num_beams, o, rng,
                                token_stream ? on_token : std::function<bool(int64_t)>{});
        t.decoder_steps += cand.steps;
        t.decoder_ms += cand.ms;
        if (draw == 0 || cand.score > d.score) d = std::move(cand);
      }
      bool fallback = false;
      skip = false;
      ratio = compression_ratio(d.tokens, c.vocab);
      if (o.compression_ratio_threshold && ratio > *o.compression_ratio_threshold) fallback = true;
      if (o.logprob_threshold && d.score < *o.logprob_threshold) fallback = true;
      if (o.no_speech_threshold && d.score < *o.logprob_threshold &&
          d.no_speech_prob > *o.no_speech_threshold) {
        fallback = false;
        skip = true;
      }
      if (!d.tokens.empty() && d.tokens.back() == c.eos) {
        d.tokens.pop_back();
        d.token_logprobs.pop_back();
      }
      best = std::move(d);
      used_temperature = temp;
      condition = o.condition_on_prev_tokens && temp < 0.5f;
      if (!fallback || ti + 1 == o.temperatures.size()) break;
      ++t.fallbacks;
    }
    if (skip) {
      seek += frames;
      continue;
    }
    // Segments: cut at consecutive timestamp tokens; seek to the last complete one.
    const std::vector<int64_t>& seq = best.tokens;
    const size_t n = seq.size();
    auto is_ts = [&](size_t i) { return seq[i] >= c.timestamp_begin; };
    const bool single_ending = n >= 2 && !is_ts(n - 2) && is_ts(n - 1);
    std::vector<size_t> cuts;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (is_ts(i) && is_ts(i + 1)) cuts.push_back(i + 1);
    }
    auto make = [&](size_t from, size_t to, double start, double end) {
      TranscriptSegment s;
      s.start = start;
      s.end = end;
      s.tokens.assign(seq.begin() + static_cast<std::ptrdiff_t>(from),
                      seq.begin() + static_cast<std::ptrdiff_t>(to));
      s.token_logprobs.assign(best.token_logprobs.begin() + static_cast<std::ptrdiff_t>(from),
                              best.token_logprobs.begin() + static_cast<std::ptrdiff_t>(to));
      s.temperature = used_temperature;
      s.avg_logprob = best.score;
      s.compression_ratio = ratio;
      s.no_speech_prob = best.no_speech_prob;
      s.text = m.text_of(s.tokens);
      return s;
    };
    std::vector<TranscriptSegment> found;
    int64_t offset = 0;
    if (!cuts.empty()) {
      if (single_ending) {
        cuts.push_back(n);
      } else {
        cuts.back() += 1;
      }
      size_t last = 0;
      for (size_t i = 0; i < cuts.size(); ++i) {
        const bool is_last = i + 1 == cuts.size();
        const size_t cut = cuts[i];
        const int64_t start_pos = seq[last] - c.timestamp_begin;
        const int64_t end_pos =
            seq[cut - ((!is_last || single_ending) ? 1 : 2)] - c.timestamp_begin;
        found.push_back(make(last, cut,
                             time_offset + static_cast<double>(start_pos) * kTimePrecision,
                             time_offset + static_cast<double>(end_pos) * kTimePrecision));
        last = cut;
      }
      offset = single_ending ? frames : (seq[last - 2] - c.timestamp_begin) * kInputStride;
    } else {
      double last_pos =
          std::floor(static_cast<double>(frames) * kFeatureTimePrecision / kTimePrecision);
      int64_t last_ts = -1;
      for (size_t i = 0; i < n; ++i) {
        if (is_ts(i)) last_ts = seq[i];
      }
      if (last_ts >= 0 && last_ts != c.timestamp_begin)
        last_pos = static_cast<double>(last_ts - c.timestamp_begin);
      found.push_back(make(0, n, time_offset, time_offset + last_pos * kTimePrecision));
      offset = frames;
    }
    seek += offset;
    for (auto& s : found) {
      if (o.on_segment && !o.on_segment(s)) seek = total;
      if (o.on_text && !token_stream && !s.text.empty() && !o.on_text(s.text)) seek = total;
      segments.push_back(std::move(s));
    }
    if (stopped) seek = total;
  }
  if (first_segment_prompt) segments.erase(segments.begin());
  for (const auto& s : segments) t.tokens.insert(t.tokens.end(), s.tokens.begin(), s.tokens.end());
  t.segments = std::move(segments);
  t.text = m.text_of(t.tokens);
  if (stream && !stopped) {
    if (const std::string tail = stream->finish(); !tail.empty()) o.on_text(tail);
  }
  return t;
}

}  // namespace kiln
