// Shared pieces of the decode loops: model-folder JSON, KV caches fed by move (so the model's
// Concat appends the new token in place), and a seq2seq decoder run of one or more rows.
#include "engine/generate/decoding.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/error.h"

namespace kiln::detail {

namespace fs = std::filesystem;

void bad_model(const std::string& file, const std::string& why) {
  throw Error(ErrorKind::InvalidModel, why).with_file(file);
}

const json::Json* JsonFile::find(const char* key) const {
  if (!doc.is_object()) return nullptr;
  const auto it = doc.find(key);
  return it == doc.end() ? nullptr : &*it;
}

JsonFile read_json(const fs::path& p, bool required) {
  if (!fs::exists(p)) {
    if (required) throw Error(ErrorKind::Io, "missing from the model folder").with_file(p.string());
    return {nullptr, p.string()};
  }
  return {json::read_file(p.string()), p.string()};
}

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

std::vector<float> logits_row(const Tensor& logits, int64_t row, int64_t pos,
                              const std::string& file) {
  if (logits.rank() != 3 || row >= logits.dim(0) || pos >= logits.dim(1)) {
    bad_model(file, "logits must be [batch, sequence, vocab], got " + logits.describe());
  }
  const int64_t vocab = logits.dim(2);
  const Shape& st = logits.strides();
  const int64_t base = row * st[0] + pos * st[1];
  std::vector<float> out(static_cast<size_t>(vocab));
  if (logits.dtype() == DataType::Float) {
    const float* p = logits.data<const float>() + base;
    for (int64_t i = 0; i < vocab; ++i) out[static_cast<size_t>(i)] = p[i * st[2]];
  } else if (logits.dtype() == DataType::Float16) {
    const float16* p = logits.data<const float16>() + base;
    for (int64_t i = 0; i < vocab; ++i)
      out[static_cast<size_t>(i)] = static_cast<float>(p[i * st[2]]);
  } else {
    bad_model(file, "logits must be float32 or float16, got " + logits.describe());
  }
  return out;
}

std::span<float> logits_span(Tensor& logits, int64_t row, int64_t pos, const std::string& file,
                             std::vector<float>& scratch) {
  const bool own = logits.defined() && logits.dtype() == DataType::Float && logits.rank() == 3 &&
                   logits.strides()[2] == 1 && logits.storage()->writable() &&
                   logits.storage().use_count() == 1;
  if (!own || row >= logits.dim(0) || pos >= logits.dim(1)) {
    scratch = logits_row(logits, row, pos, file);
    return scratch;
  }
  const Shape& st = logits.strides();
  return {logits.data<float>() + row * st[0] + pos * st[1], static_cast<size_t>(logits.dim(2))};
}

int64_t argmax(std::span<const float> x) {
  const auto n = static_cast<int64_t>(x.size());
  if (n == 0 || std::isnan(x[0])) return 0;
  // Blocks of kBlock with eight running maxima each (`v > m ? v : m` is one vector max
  // instruction, NaN-skipping like the comparison max_element makes); then the first block
  // holding the largest, searched element by element.
  constexpr int64_t kBlock = 512, kLanes = 8;
  float best = x[0];
  int64_t best_block = 0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = std::min(kBlock, n - b);
    const float* p = x.data() + b;
    float lane[kLanes];
    for (float& l : lane) l = x[0];
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes) {
      for (int64_t j = 0; j < kLanes; ++j) lane[j] = p[i + j] > lane[j] ? p[i + j] : lane[j];
    }
    for (; i < len; ++i) lane[0] = p[i] > lane[0] ? p[i] : lane[0];
    float m = lane[0];
    for (float l : lane) m = l > m ? l : m;
    if (m > best) {
      best = m;
      best_block = b;
    }
  }
  for (int64_t i = best_block; i < n; ++i) {
    if (x[static_cast<size_t>(i)] == best) return i;
  }
  return 0;  // not reached: best is one of the elements
}

Tensor ids_tensor(const std::vector<std::vector<int64_t>>& rows) {
  const auto batch = static_cast<int64_t>(rows.size());
  const auto len = static_cast<int64_t>(rows.at(0).size());
  std::vector<int64_t> flat;
  flat.reserve(static_cast<size_t>(batch * len));
  for (const auto& r : rows) {
    if (static_cast<int64_t>(r.size()) != len)
      throw Error(ErrorKind::InvalidArgument, "decoder rows of different lengths");
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return Tensor::from_vector<int64_t>({batch, len}, flat);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

SessionOptions session_options(const GeneratorOptions& o, std::shared_ptr<Environment>& env) {
  if (!env) env = o.environment ? o.environment : std::make_shared<Environment>(0);
  SessionOptions so;
  so.gemm_weights = o.gemm_weights;
  so.optimization = o.optimization;
  so.denormals = o.denormals;
  so.environment = env;
  return so;
}

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

// ---------------------------------------------------------------- Feeds

void Feeds::add(std::string_view name, Value value) {
  if (count_ == items_.size()) items_.emplace_back();
  NamedValue& nv = items_[count_++];
  if (nv.name != name) nv.name.assign(name);
  nv.value = std::move(value);
}

std::vector<NamedValue>& Feeds::items() {
  items_.resize(count_);
  return items_;
}

// ---------------------------------------------------------------- KvCaches

namespace {

// Free positions after the end along the sequence axis of a [B, H, S, D] cache whose rows
// are laid out as Tensor::with_capacity along axis 2 makes them.
int64_t room(const Tensor& t) {
  if (t.rank() != 4 || t.strides()[3] != 1 || t.strides()[2] != t.dim(3)) return 0;
  const int64_t row = t.dim(3);
  if (t.dim(1) > 1) return t.strides()[1] / row - t.dim(2);
  if (t.dim(0) > 1) return t.strides()[0] / row - t.dim(2);
  const int64_t avail = static_cast<int64_t>(t.storage()->capacity() - t.byte_offset()) /
                        (bits_per_element(t.dtype()) / 8);
  return avail / row - t.dim(2);
}

// Row `b` of a [B, H, S, D] tensor as a [1, H, S, D] view.
Tensor batch_row(const Tensor& t, int64_t b) {
  Shape shape = t.shape();
  shape[0] = 1;
  const size_t es = bits_per_element(t.dtype()) / 8;
  return t.view(shape, t.strides(), t.byte_offset() + static_cast<size_t>(b * t.strides()[0]) * es);
}

}  // namespace

void KvCaches::init_empty(int64_t batch) {
  values_.clear();
  for (const CacheSlot& c : slots_) {
    values_[c.past] = Tensor::with_capacity(c.dtype, {batch, c.heads, 0, c.head_dim}, 2, capacity_);
  }
}

void KvCaches::feed(Feeds& inputs) {
  for (const CacheSlot& c : slots_) {
    auto it = values_.find(c.past);
    if (it == values_.end()) continue;
    if (c.cross) {
      inputs.add(c.past, it->second);
    } else {
      inputs.add(c.past, std::move(it->second));
    }
  }
}

uint64_t KvCaches::take(std::vector<NamedValue>& outs, const std::string& file, bool first_step) {
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
    if (!found) bad_model(file, "has no output '" + c.present + "'");
  }
  return copied;
}

uint64_t KvCaches::reorder(const std::vector<int64_t>& rows) {
  uint64_t copied = 0;
  each_decoder_cache([&](Tensor& t) {
    const auto batch = static_cast<int64_t>(rows.size());
    if (t.dim(0) != batch) throw Error(ErrorKind::Runtime, "beam reorder: batch mismatch");
    // Rows that change are saved first (their sources may be overwritten), then written.
    std::vector<int64_t> moved;
    for (int64_t r = 0; r < batch; ++r) {
      if (rows[static_cast<size_t>(r)] != r) moved.push_back(r);
    }
    if (moved.empty()) return;
    Shape row_shape = t.shape();
    row_shape[0] = 1;
    const size_t row_bytes = storage_bytes(t.dtype(), shape_numel(row_shape));
    if (scratch_.size() < row_bytes * moved.size()) scratch_.resize(row_bytes * moved.size());
    for (size_t i = 0; i < moved.size(); ++i) {
      const Tensor src = batch_row(t, rows[static_cast<size_t>(moved[i])]);
      const Tensor dst = Tensor::borrow(t.dtype(), row_shape, scratch_.data() + i * row_bytes);
      copy_elements(src, dst);
    }
    for (size_t i = 0; i < moved.size(); ++i) {
      const Tensor src = Tensor::borrow(t.dtype(), row_shape, scratch_.data() + i * row_bytes);
      copy_elements(src, batch_row(t, moved[i]));
    }
    copied += 2 * row_bytes * moved.size();
  });
  return copied;
}

uint64_t KvCaches::expand(int64_t batch) {
  uint64_t copied = 0;
  each_decoder_cache([&](Tensor& t) {
    if (t.dim(0) != 1) throw Error(ErrorKind::Runtime, "cache expand: more than one row");
    Shape shape = t.shape();
    shape[0] = batch;
    Tensor rows =
        Tensor::with_capacity(t.dtype(), shape, 2, t.dim(2) + std::max<int64_t>(room(t), 1));
    for (int64_t b = 0; b < batch; ++b) copy_elements(t, batch_row(rows, b));
    copied += t.nbytes() * static_cast<uint64_t>(batch);
    t = std::move(rows);
  });
  return copied;
}

int64_t KvCaches::past_len() const {
  for (const CacheSlot& c : slots_) {
    if (c.cross) continue;
    auto it = values_.find(c.past);
    if (it != values_.end()) return it->second.dim(2);
  }
  return 0;
}

// ---------------------------------------------------------------- Seq2SeqModels

Seq2SeqModels::Seq2SeqModels(const fs::path& d, const GeneratorOptions& options) : dir(d) {
  SessionOptions so = session_options(options, env);
  encoder_file = (dir / "encoder_model.onnx").string();
  if (!fs::exists(encoder_file))
    throw Error(ErrorKind::Io, "missing from the model folder").with_file(encoder_file);
  encoder = std::make_unique<Session>(encoder_file, so);
  if (encoder->inputs().size() != 1 || encoder->outputs().empty()) {
    bad_model(encoder_file,
              "the encoder must take one input (input_features) and produce last_hidden_state");
  }
  const fs::path m = dir / "decoder_model_merged.onnx";
  if (!options.use_decoder_pair && fs::exists(m)) {
    merged_file = m.string();
    merged = std::make_unique<Session>(merged_file, so);
    require_inputs(*merged, merged_file,
                   {"input_ids", "encoder_hidden_states", "use_cache_branch"});
  } else {
    first_file = (dir / "decoder_model.onnx").string();
    with_past_file = (dir / "decoder_with_past_model.onnx").string();
    for (const auto& f : {first_file, with_past_file}) {
      if (!fs::exists(f)) throw Error(ErrorKind::Io, "missing from the model folder").with_file(f);
    }
    first = std::make_unique<Session>(first_file, so);
    with_past = std::make_unique<Session>(with_past_file, so);
    require_inputs(*first, first_file, {"input_ids", "encoder_hidden_states"});
    std::vector<std::string> wp = {"input_ids"};
    if (has_input(*with_past, "encoder_hidden_states")) wp.push_back("encoder_hidden_states");
    require_inputs(*with_past, with_past_file, wp);
  }
}

Tensor Seq2SeqModels::encode(const Tensor& features) const {
  auto out = encoder->run({{encoder->inputs()[0].name, features}});
  return out[0].value.tensor();
}

// ---------------------------------------------------------------- Seq2SeqDecoding

namespace {

// `hidden` [1, T, d] repeated `batch` times along axis 0.
Tensor repeat_rows(const Tensor& hidden, int64_t batch) {
  if (batch == 1) return hidden;
  Shape shape = hidden.shape();
  shape[0] = batch;
  Tensor out = Tensor::zeros(hidden.dtype(), shape);
  for (int64_t b = 0; b < batch; ++b) copy_elements(hidden, batch_row(out, b));
  return out;
}

}  // namespace

Seq2SeqDecoding::Seq2SeqDecoding(const Seq2SeqModels& models, const Tensor& hidden, int64_t batch,
                                 int64_t capacity)
    : models_(models),
      hidden_(repeat_rows(hidden, batch)),
      hidden_row_(hidden),
      caches_(cache_slots(models.merged ? *models.merged : *models.with_past,
                          models.merged ? models.merged_file : models.with_past_file),
              capacity),
      batch_(batch),
      file0_(models.merged ? models.merged_file : models.first_file),
      filen_(models.merged ? models.merged_file : models.with_past_file),
      hidden0_(has_input(models.merged ? *models.merged : *models.first, "encoder_hidden_states")),
      hiddenn_(
          has_input(models.merged ? *models.merged : *models.with_past, "encoder_hidden_states")),
      use_cache_{Tensor::from_vector<bool>({1}, {false}), Tensor::from_vector<bool>({1}, {true})} {}

uint64_t Seq2SeqDecoding::expand(int64_t batch) {
  if (batch_ != 1 || steps_ != 1)
    throw Error(ErrorKind::Runtime, "decoder expand: only after the first step of one row");
  batch_ = batch;
  hidden_ = repeat_rows(hidden_row_, batch);
  return caches_.expand(batch);
}

Value Seq2SeqDecoding::ids_input(const std::vector<std::vector<int64_t>>& rows) {
  const auto batch = static_cast<int64_t>(rows.size());
  const auto len = static_cast<int64_t>(rows.at(0).size());
  // Only this handle left: the last run is over and no output shares the bytes.
  if (!ids_.defined() || ids_.storage().use_count() != 1 || ids_.shape() != Shape{batch, len}) {
    ids_ = ids_tensor(rows);
    return ids_;
  }
  int64_t* p = ids_.data<int64_t>();
  for (const auto& r : rows) {
    if (static_cast<int64_t>(r.size()) != len)
      throw Error(ErrorKind::InvalidArgument, "decoder rows of different lengths");
    p = std::copy(r.begin(), r.end(), p);
  }
  return ids_;  // a shared handle: the run only reads it
}

Tensor Seq2SeqDecoding::step(const std::vector<std::vector<int64_t>>& ids, StepStats& stats) {
  if (static_cast<int64_t>(ids.size()) != batch_)
    throw Error(ErrorKind::Runtime, "decoder step: wrong number of rows");
  const bool first = steps_ == 0;
  Session& s = models_.merged ? *models_.merged : (first ? *models_.first : *models_.with_past);
  const std::string& file = first ? file0_ : filen_;
  stats.past_len = first ? 0 : caches_.past_len();
  feeds_.clear();
  feeds_.add("input_ids", ids_input(ids));
  if (first ? hidden0_ : hiddenn_) feeds_.add("encoder_hidden_states", hidden_);
  if (models_.merged) {
    // The merged decoder reads every input at every step: empty caches first.
    if (first) caches_.init_empty(batch_);
    feeds_.add("use_cache_branch", use_cache_[first ? 0 : 1]);
  }
  caches_.feed(feeds_);
  const auto t0 = std::chrono::steady_clock::now();
  s.run(feeds_.items(), outs_);
  stats.run_ms = ms_since(t0);
  stats.bytes_copied = s.last_run_stats().bytes_copied;
  stats.allocations = s.last_run_stats().allocations;
  Tensor logits = named_output(outs_, "logits", file).tensor();
  stats.bytes_copied += caches_.take(outs_, file, first);
  ++steps_;
  return logits;
}

}  // namespace kiln::detail
