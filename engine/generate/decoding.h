// The pieces every decode loop shares (internal to the generate layer): the model folder's
// JSON files, the KV caches fed by move so the model's Concat appends in place, and a
// seq2seq decoder run of one or more rows (beams) over one encoder output.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/util/json_file.h"
#include "kiln/generate.h"
#include "kiln/session.h"

namespace kiln::detail {

[[noreturn]] void bad_model(const std::string& file, const std::string& why);

// A JSON file of the model folder: its document and its path, for error messages.
struct JsonFile {
  json::Json doc;  // null when the file is absent
  std::string path;

  // The member `key`, or null when absent (or the document is not an object).
  const json::Json* find(const char* key) const;
};

JsonFile read_json(const std::filesystem::path& p, bool required);
// `key` as a list of integers: one integer or an array of them; empty when absent or null.
std::vector<int64_t> ints_of(const JsonFile& f, const char* key);
int64_t int_or(const JsonFile& f, const char* key, int64_t fallback);

bool has_input(const Session& s, const std::string& name);
// The session takes `names` (and past_key_values.*) and nothing else.
void require_inputs(const Session& s, const std::string& file,
                    const std::vector<std::string>& names);
Value named_output(std::vector<NamedValue>& outs, const std::string& name, const std::string& file);
// Row `row`, position `pos` of a [batch, sequence, vocab] float32/float16 logits tensor.
std::vector<float> logits_row(const Tensor& logits, int64_t row, int64_t pos,
                              const std::string& file);
// Row `row`, position `pos` of the logits as one writable span: the tensor's own elements
// when it is float32, contiguous along the vocabulary and owned by the caller alone (no
// copy: the picker's suppressions write -inf into them), else a float copy in `scratch`.
std::span<float> logits_span(Tensor& logits, int64_t row, int64_t pos, const std::string& file,
                             std::vector<float>& scratch);
// The index of the first largest of x (std::max_element's answer: index 0 when x[0] is NaN,
// later NaNs skipped), in one pass the compiler vectorises.
int64_t argmax(std::span<const float> x);
Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows);
double ms_since(std::chrono::steady_clock::time_point t0);
SessionOptions session_options(const GeneratorOptions& o, std::shared_ptr<Environment>& env);

// The inputs of a decoder's runs, kept from step to step for Session::run's reusing form:
// each step sets them in order, and a name already in its place stays, so a decode loop makes
// no new names or vectors.
class Feeds {
 public:
  // Starts the next run's inputs.
  void clear() { count_ = 0; }
  void add(std::string_view name, Value value);
  // The inputs added since clear().
  std::vector<NamedValue>& items();

 private:
  std::vector<NamedValue> items_;
  size_t count_ = 0;
};

// One KV input of a decoder ("past_key_values.3.decoder.key") and its output name.
struct CacheSlot {
  std::string past, present;
  bool cross = false;  // encoder (cross-attention) cache: fixed after the first step
  int64_t heads = 0, head_dim = 0;
  DataType dtype = DataType::Float;
};

std::vector<CacheSlot> cache_slots(const Session& s, const std::string& file);

// The KV caches of a run: decoder caches move into each step and come back grown; cross
// caches are computed at the first step and then only read.
class KvCaches {
 public:
  KvCaches(std::vector<CacheSlot> slots, int64_t capacity)
      : slots_(std::move(slots)), capacity_(capacity) {}

  // Empty caches of `batch` rows with room for `capacity_` tokens (first step of a model
  // that reads them).
  void init_empty(int64_t batch = 1);
  // Feeds for the next run: decoder caches by move, cross caches by shared handle.
  void feed(Feeds& inputs);
  // Takes the present.* outputs. A decoder cache without room for the next token is moved
  // once into a buffer with room (capacity, or twice the old capacity when longer); the
  // cross-attention caches of the first step are made contiguous if they are views. These
  // are the only cache copies a generation makes, with reorder's. Returns the bytes copied.
  uint64_t take(std::vector<NamedValue>& outs, const std::string& file, bool first_step);
  // Beam search: row r of every decoder cache becomes what row rows[r] was, in place (the
  // rows that move go through one scratch buffer kept across steps). Cross caches are the
  // same in every row and stay. Returns the bytes copied.
  uint64_t reorder(const std::vector<int64_t>& rows);
  // Beam search after a first step run once for the prompt all beams share: every decoder
  // cache of one row becomes `batch` rows (copies, with the same room); the cross caches
  // stay one row, which the decoder's products broadcast over the beams. Returns the bytes
  // copied.
  uint64_t expand(int64_t batch);
  int64_t past_len() const;

 private:
  // Calls f(tensor) for every decoder (self-attention) cache held.
  template <typename F>
  void each_decoder_cache(F&& f) {
    for (const CacheSlot& c : slots_) {
      if (c.cross) continue;
      if (auto it = values_.find(c.past); it != values_.end()) f(it->second);
    }
  }

  std::vector<CacheSlot> slots_;
  int64_t capacity_;
  std::map<std::string, Tensor> values_;
  std::vector<std::byte> scratch_;
};

// The sessions of a seq2seq export folder (Optimum's Whisper layout): the encoder, and the
// merged decoder or the decoder / decoder-with-past pair.
struct Seq2SeqModels {
  std::filesystem::path dir;
  std::shared_ptr<Environment> env;
  std::unique_ptr<Session> encoder, merged, first, with_past;
  std::string encoder_file, merged_file, first_file, with_past_file;

  Seq2SeqModels(const std::filesystem::path& dir, const GeneratorOptions& options);
  // last_hidden_state for `features` [batch, mels, frames].
  Tensor encode(const Tensor& features) const;
};

// One decode of `batch` rows over one encoder output: step() feeds each row's new tokens
// (all rows the same length) and returns the logits of every fed position.
class Seq2SeqDecoding {
 public:
  // `hidden`: the encoder output of one input [1, frames, d]; repeated for each row.
  Seq2SeqDecoding(const Seq2SeqModels& models, const Tensor& hidden, int64_t batch,
                  int64_t capacity);
  // Logits [batch, fed, vocab] of this step; `stats` gets the run's counters.
  Tensor step(const std::vector<std::vector<int64_t>>& ids, StepStats& stats);
  // Beam search: row r continues from what row rows[r] was.
  uint64_t reorder(const std::vector<int64_t>& rows) { return caches_.reorder(rows); }
  // Beam search: the decoding was made for one row, whose first step is done; it goes on
  // with `batch` rows continuing from it (KvCaches::expand). Returns the bytes copied.
  uint64_t expand(int64_t batch);
  const std::string& file() const { return steps_ == 0 ? file0_ : filen_; }

 private:
  // input_ids for `rows`: the last step's tensor rewritten when the run let go of it.
  Value ids_input(const std::vector<std::vector<int64_t>>& rows);

  const Seq2SeqModels& models_;
  Tensor hidden_, hidden_row_;  // the input's encoder output repeated for each row; one row
  KvCaches caches_;
  int64_t batch_;
  int64_t steps_ = 0;
  std::string file0_, filen_;
  bool hidden0_ = false, hiddenn_ = false;  // the first and later runs take the encoder output
  Tensor ids_;
  Tensor use_cache_[2];  // use_cache_branch false, true (merged decoder)
  Feeds feeds_;
  std::vector<NamedValue> outs_;
};

}  // namespace kiln::detail
