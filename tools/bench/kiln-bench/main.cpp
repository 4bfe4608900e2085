// kiln-bench: time one model case the way an application runs it and print one JSON object
// (load time, per-iteration times, peak RSS, kiln's run counters). tools/bench/compare_ort.py
// runs it next to onnxruntime on the same .npy inputs.
//
// Growing KV caches (past_key_values.*, except cross-attention ".encoder." ones) are fed the
// way kiln is meant to be used: tensors made with Tensor::with_capacity and passed by move,
// so the model's Concat appends in place. They are prepared before each timed run; only
// Session::run is timed.
//
// Exit status: 0 ok, 2 any error (bad argument, missing file, model or input mismatch), with
// a one-line message on stderr.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/util/json_file.h"
#include "kiln/error.h"
#include "kiln/generate.h"
#include "kiln/kiln.h"
#include "tools/bench/kiln-bench/gemm_case.h"
#include "tools/common/cli.h"
#include "tools/common/json_output.h"
#include "tools/common/npy.h"
#include "tools/common/options.h"
#include "tools/common/rss.h"

namespace {

namespace fs = std::filesystem;
using kiln::DataType;
using kiln::NamedValue;
using kiln::Tensor;
using kiln::tooling::current_rss_bytes;
using kiln::tooling::Json;
using kiln::tooling::peak_rss_bytes;
using kiln::tooling::UsageError;
using Clock = std::chrono::steady_clock;

// The cases, for --help.
constexpr const char* kCases =
    "cases:\n"
    "  encoder MODEL_DIR       Whisper encoder_model.onnx on input_features [1,80,3000]\n"
    "                          (MODEL_DIR/sample_features.npy when present, else random)\n"
    "  decoder-step MODEL_DIR  one run of decoder_model_merged.onnx with use_cache_branch=true\n"
    "                          and --past-len P tokens in the decoder caches\n"
    "  minilm MODEL            a BERT-style model.onnx (or its folder) on input_ids,\n"
    "                          attention_mask, token_type_ids [--batch, --seq-len]\n"
    "  decode MODEL_DIR        a Whisper decode loop of --steps decoder runs (EOS suppressed)\n"
    "  run MODEL.onnx          any model, every input from --input or --input-dir\n"
    "  gemm M N K              the GEMM layer alone: packed and unpacked B, Eigen, FMA peak\n"
    "                          and read bandwidth (one thread unless --threads)\n";

struct Options {
  std::string kase, model;
  int threads = 0;
  int warmup = -1, iterations = 10;
  int warmup_ms = 0;
  std::vector<std::pair<std::string, std::string>> inputs;
  std::string input_dir, output_dir;
  int64_t past_len = 16, kv_capacity = 0, seq_len = 128, batch = 1, steps = 200;
  int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0;
  bool profile = false, bandwidth = false;
  kiln::WeightPrecision gemm_weights = kiln::WeightPrecision::Float32;
  kiln::GraphOptimization optimization = kiln::GraphOptimization::All;
  kiln::Denormals denormals = kiln::Denormals::Flush;
  std::vector<std::string> positional;  // CASE MODEL, or gemm M N K
};

// The command line into `o`.
void define_options(CLI::App& app, Options& o) {
  using namespace kiln::tooling;
  configure(app);
  app.footer(kCases);
  app.add_option("CASE", o.positional, "the case and its arguments (see below)")->type_name("");
  add_int(app, "--threads", o.threads, 1, "thread pool size (default: one per core)");
  add_int(app, "--warmup", o.warmup, 0,
          "untimed runs first (default 3; decode: whole generations, 1)");
  add_int(app, "--warmup-ms", o.warmup_ms, 0,
          "untimed runs go on until this many milliseconds have passed too (not decode)");
  add_int(app, "--iterations", o.iterations, 1, "timed runs (default 10)");
  add_named_files(app, "--input", o.inputs, "NAME=FILE.npy",
                  "an input from a file (repeatable); others are generated");
  app.add_option("--input-dir", o.input_dir, "inputs from DIR/NAME.npy for every NAME found there")
      ->type_name("DIR");
  add_int<int64_t>(app, "--past-len", o.past_len, 0,
                   "decoder-step: tokens already in the caches (default 16)");
  add_int<int64_t>(app, "--kv-capacity", o.kv_capacity, 1,
                   "room along the sequence axis of past_key_values.* inputs (decoder-step "
                   "default: max_target_positions from config.json)");
  add_int<int64_t>(app, "--seq-len", o.seq_len, 1, "minilm: input length (default 128)");
  add_int<int64_t>(app, "--batch", o.batch, 1, "minilm: batch size (default 1)");
  add_int<int64_t>(app, "--steps", o.steps, 1, "decode: decoder runs (default 200)");
  app.add_option("--output-dir", o.output_dir, "write the last run's outputs as DIR/NAME.npy")
      ->type_name("DIR");
  app.add_flag("--profile", o.profile,
               "after each timed run, the same run on a profiled twin session (untimed): the "
               "last one's time per op type (profile_ms_by_op), each one's summed node times "
               "(kernel_ms) and the timed run's wall time minus them (outside_kernels_ms)");
  app.add_flag("--bandwidth", o.bandwidth,
               "also measure the streaming read bandwidth on --threads threads after the "
               "timed runs and the peak RSS (read_bandwidth_gbps)");
  add_choice(app, "--gemm-weights", o.gemm_weights, parse_gemm_weights, kGemmWeightsChoices,
             "f32 (default), bf16, f16 or int8: MatMul/Gemm weights packed in this precision");
  add_choice(app, "--optimize", o.optimization, parse_optimization, "none, basic or all",
             "graph optimisation: none, basic or all (default)");
  add_choice(app, "--denormals", o.denormals, parse_denormals, "flush or keep",
             "denormal floats in runs: flush (to zero, the default) or keep");
}

// The checks CLI11 cannot express: the case, its arguments, the options that apply to it.
void check_case(const CLI::App& app, Options& o) {
  using kiln::tooling::parse_int;
  const std::vector<std::string>& positional = o.positional;
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  if (positional.empty()) throw UsageError("no case given");
  o.kase = positional[0];
  static const std::map<std::string, std::set<std::string>> kCaseFlags = {
      {"encoder", {}},
      {"decoder-step", {"--past-len", "--kv-capacity"}},
      {"minilm", {"--seq-len", "--batch"}},
      {"decode", {"--steps"}},
      {"run", {"--kv-capacity"}},
      {"gemm", {}},
  };
  const auto flags = kCaseFlags.find(o.kase);
  if (flags == kCaseFlags.end()) {
    throw UsageError("unknown case '" + o.kase +
                     "' (expected encoder, decoder-step, minilm, decode, run or gemm)");
  }
  if (o.kase == "gemm") {
    if (positional.size() != 4) throw UsageError("gemm needs M N K");
    o.gemm_m = parse_int<int64_t>("M", positional[1], 1);
    o.gemm_n = parse_int<int64_t>("N", positional[2], 1);
    o.gemm_k = parse_int<int64_t>("K", positional[3], 1);
    if (given("--input") || given("--input-dir") || given("--output-dir") || given("--profile") ||
        given("--bandwidth"))
      throw UsageError("gemm takes only --threads, --warmup and --iterations");
    if (o.warmup < 0) o.warmup = 3;
    return;
  }
  if (positional.size() < 2) throw UsageError("no model given for case '" + o.kase + "'");
  if (positional.size() > 2) throw UsageError("unexpected argument '" + positional[2] + "'");
  o.model = positional[1];
  for (const char* f : {"--past-len", "--kv-capacity", "--seq-len", "--batch", "--steps"}) {
    if (given(f) && !flags->second.count(f))
      throw UsageError(std::string(f) + " does not apply to case '" + o.kase + "'");
  }
  if (o.kase == "decode" && (given("--iterations") || given("--output-dir") || given("--profile")))
    throw UsageError(
        "decode times one generation: --iterations, --output-dir and --profile do not apply");
  if (o.warmup < 0) o.warmup = o.kase == "decode" ? 1 : 3;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const auto hi = static_cast<size_t>(std::ceil(rank));
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

// Folder cases take MODEL_DIR/FILE; a path to the .onnx file itself is accepted too.
std::string model_file(const std::string& path, const char* file) {
  const fs::path p = path;
  if (fs::is_directory(p)) return (p / file).string();
  return path;
}

void require_file(const std::string& path) {
  if (!fs::is_regular_file(path))
    throw kiln::Error(kiln::ErrorKind::Io, "no such file").with_file(path);
}

// Whisper's config.json values the cases need (encoder length, decoder positions).
int64_t config_int(const std::string& model_dir, const char* key, int64_t fallback) {
  const fs::path cfg = fs::path(model_dir) / "config.json";
  if (!fs::is_regular_file(cfg)) return fallback;
  const kiln::json::Json v = kiln::json::read_file(cfg.string());
  if (!v.is_object() || !v.contains(key) || !v[key].is_number()) return fallback;
  return kiln::json::to_int(v[key], cfg.string(), key);
}

// ---------------------------------------------------------------- inputs

class Inputs {
 public:
  explicit Inputs(const Options& o) : rng_(20261122) {
    for (const auto& [name, file] : o.inputs) files_[name] = file;
    if (!o.input_dir.empty()) {
      if (!fs::is_directory(o.input_dir))
        throw kiln::Error(kiln::ErrorKind::Io, "not a folder").with_file(o.input_dir);
      // DIR/NAME.npy; a name with "/" (gpu_0/data_0) is a file in a subfolder.
      for (const auto& e : fs::recursive_directory_iterator(o.input_dir)) {
        if (e.path().extension() != ".npy") continue;
        fs::path rel = fs::relative(e.path(), o.input_dir);
        rel.replace_extension();
        files_.emplace(rel.generic_string(), e.path().string());  // --input wins
      }
    }
  }

  // The named input from a file when one was given, else nullopt.
  std::optional<Tensor> from_file(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end()) return std::nullopt;
    return kiln::tooling::read_npy(it->second);
  }

  Tensor normal(DataType dtype, const kiln::Shape& shape, float scale = 1.0f) {
    if (dtype != DataType::Float)
      throw kiln::Error(kiln::ErrorKind::Unsupported,
                        "kiln-bench generates float32 inputs only; give this one as a file");
    Tensor t = Tensor::zeros(dtype, shape);
    std::normal_distribution<float> d(0.0f, scale);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng_);
    return t;
  }

  Tensor ints(const kiln::Shape& shape, int64_t lo, int64_t hi) {
    Tensor t = Tensor::zeros(DataType::Int64, shape);
    std::uniform_int_distribution<int64_t> d(lo, hi);
    int64_t* p = t.data<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng_);
    return t;
  }

 private:
  std::map<std::string, std::string> files_;
  std::mt19937 rng_;
};

const kiln::IoInfo& find_input(const kiln::Session& s, const std::string& name) {
  for (const auto& io : s.inputs()) {
    if (io.name == name) return io;
  }
  throw kiln::Error(kiln::ErrorKind::InvalidModel, "has no input '" + name + "'")
      .with_file(s.path());
}

// A growing decoder cache fed by move: `live` is the tensor handed to the next run.
struct KvInput {
  std::string name, present;
  Tensor source;  // the data at the requested past length, contiguous
  Tensor live;
  int64_t capacity = 0;
  const kiln::Storage* storage = nullptr;
  uint64_t refreshed = 0;  // times `live` had to be rebuilt from `source` (outside the timer)

  void refresh() {
    kiln::Shape shape = source.shape();
    live = Tensor::with_capacity(source.dtype(), shape, 2, std::max(capacity, shape[2]));
    kiln::copy_elements(source, live);
    storage = live.storage().get();
  }

  // After a run the present output is the cache one token longer in the same storage (the
  // model's Concat appended in place): the next run gets that storage back, viewed at the
  // original length, so every timed run sees the same past length and the same data.
  void recover(std::vector<NamedValue>& outs) {
    for (auto& o : outs) {
      if (o.name != present || !o.value.is_tensor()) continue;
      const Tensor& t = o.value.tensor();
      if (t.storage().get() == storage && t.rank() == 4 && t.dim(2) > source.dim(2)) {
        kiln::Shape shape = t.shape();
        shape[2] = source.dim(2);
        live = t.view(shape, t.strides(), t.byte_offset());
        o.value = kiln::Value();
        return;
      }
    }
    ++refreshed;
    refresh();
  }
};

bool is_growing_cache(const std::string& name) {
  return (name.rfind("past_key_values.", 0) == 0 || name.rfind("past.", 0) == 0) &&
         name.find(".encoder.") == std::string::npos;
}

std::string present_name(const std::string& past) {
  const std::string prefix = past.rfind("past_key_values.", 0) == 0 ? "past_key_values." : "past.";
  return "present." + past.substr(prefix.size());
}

struct Feed {
  std::vector<NamedValue> fixed;  // passed by copy: only read by the run
  std::vector<KvInput> kv;        // passed by move
  std::vector<std::pair<std::string, std::string>> described;  // name, "float32[1,6,16,64]"
};

// Builds every input of `s`: a file when one was given, else what `generate` makes; growing
// caches become with_capacity tensors when kv_capacity > 0.
template <typename Generate>
Feed build_feed(const kiln::Session& s, Inputs& in, int64_t kv_capacity, Generate generate) {
  Feed f;
  for (const kiln::IoInfo& io : s.inputs()) {
    std::optional<Tensor> t = in.from_file(io.name);
    if (!t) t = generate(io);
    if (!t) {
      if (io.has_default) continue;
      throw UsageError("no value for input '" + io.describe() +
                       "': give it with --input NAME=FILE.npy or --input-dir");
    }
    f.described.emplace_back(io.name, t->describe());
    if (kv_capacity > 0 && is_growing_cache(io.name) && t->rank() == 4) {
      KvInput kv;
      kv.name = io.name;
      kv.present = present_name(io.name);
      kv.source = t->contiguous();
      kv.capacity = kv_capacity;
      kv.refresh();
      f.kv.push_back(std::move(kv));
    } else {
      f.fixed.push_back({io.name, *t});
    }
  }
  return f;
}

// ---------------------------------------------------------------- timed runs

struct RunResult {
  std::vector<double> ms;
  std::vector<uint64_t> bytes_copied, allocations;
  std::vector<double> kernel_ms;  // per timed run with --profile: the summed node times
  kiln::RunStats last;
  uint64_t kv_refreshed = 0;
  std::map<std::string, double> ms_by_op;  // last timed run, main graph and nested graphs
};

// One run of `s` on the feed (caches by move, recovered afterwards); returns its wall time.
double run_once(kiln::Session& s, Feed& f, const std::string& output_dir) {
  std::vector<NamedValue> feed = f.fixed;
  for (auto& kv : f.kv) feed.push_back({kv.name, std::move(kv.live)});
  const auto t0 = Clock::now();
  std::vector<NamedValue> outs = s.run(std::move(feed));
  const double ms = ms_since(t0);
  if (!output_dir.empty()) {
    fs::create_directories(output_dir);
    for (const auto& out : outs) {
      if (out.value.is_tensor())
        kiln::tooling::write_npy((fs::path(output_dir) / (out.name + ".npy")).string(),
                                 out.value.tensor());
    }
  }
  for (auto& kv : f.kv) kv.recover(outs);
  return ms;
}

// The timed runs of `s`. With `profiled` (a twin of `s` made with SessionOptions::profile),
// each timed run is followed by the same run on the twin, untimed, whose node events give
// the time per op type and the summed node times: the timed runs pay nothing for the
// profile, and each wall time has node times measured right after it.
RunResult time_runs(kiln::Session& s, kiln::Session* profiled, Feed& f, const Options& o) {
  RunResult r;
  // Untimed runs: --warmup of them, and more until --warmup-ms have passed (a pool's threads
  // and the processor's clocks take a while to settle: docs/performance.md, "Figures cited in
  // code comments").
  const auto start = Clock::now();
  for (int it = 0; it < o.warmup || Clock::now() - start < std::chrono::milliseconds(o.warmup_ms);
       ++it) {
    run_once(s, f, std::string());
  }
  for (int it = 0; it < o.iterations; ++it) {
    const bool last = it + 1 == o.iterations;
    const double ms = run_once(s, f, last ? o.output_dir : std::string());
    const kiln::RunStats& st = s.last_run_stats();
    r.ms.push_back(ms);
    r.bytes_copied.push_back(st.bytes_copied);
    r.allocations.push_back(st.allocations);
    r.last = st;
    if (profiled) {
      run_once(*profiled, f, std::string());
      r.ms_by_op.clear();
      double kernel_ms = 0;
      // If/Loop events include their nested graphs' nodes, which have events of their own.
      for (const kiln::NodeEvent& e : profiled->last_profile()) {
        if (e.op_type != "If" && e.op_type != "Loop" && e.op_type != "Scan") {
          r.ms_by_op[e.op_type] += e.duration_us / 1000.0;
          kernel_ms += e.duration_us / 1000.0;
        }
      }
      r.kernel_ms.push_back(kernel_ms);
    }
  }
  for (const auto& kv : f.kv) r.kv_refreshed += kv.refreshed;
  return r;
}

Json run_stats_json(const kiln::RunStats& s) {
  return {{"allocations", s.allocations},
          {"bytes_allocated", s.bytes_allocated},
          {"pool_reuses", s.pool_reuses},
          {"peak_bytes_in_use", s.peak_bytes_in_use},
          {"bytes_copied", s.bytes_copied},
          {"bytes_copied_contiguous", s.bytes_copied_contiguous},
          {"bytes_copied_concat", s.bytes_copied_concat},
          {"bytes_copied_capture", s.bytes_copied_capture},
          {"bytes_copied_kernels", s.bytes_copied_kernels},
          {"in_place_ops", s.in_place_ops},
          {"nodes_run", s.nodes_run}};
}

// With --bandwidth: the machine's streaming read bandwidth on the run's threads, measured
// after the peak RSS was read (its 1 GiB array must not count against the model).
void add_bandwidth(Json& j, const Options& o, const kiln::Environment& env) {
  if (o.bandwidth) j["read_bandwidth_gbps"] = kiln::bench::read_bandwidth_gbps(env.threads());
}

// ---------------------------------------------------------------- cases

int run_session_case(const Options& o, const std::shared_ptr<kiln::Environment>& env) {
  std::string file;
  if (o.kase == "encoder") {
    file = model_file(o.model, "encoder_model.onnx");
  } else if (o.kase == "decoder-step") {
    file = model_file(o.model, "decoder_model_merged.onnx");
  } else if (o.kase == "minilm") {
    file = model_file(o.model, "model.onnx");
  } else {
    file = o.model;
  }
  require_file(file);
  const std::string dir = fs::path(file).parent_path().string();

  const uint64_t rss_before = current_rss_bytes();
  kiln::SessionOptions so;
  so.environment = env;
  so.gemm_weights = o.gemm_weights;
  so.optimization = o.optimization;
  so.denormals = o.denormals;
  const auto t0 = Clock::now();
  kiln::Session s(file, so);
  const double load_ms = ms_since(t0);
  std::optional<kiln::Session> profiled;
  if (o.profile) {
    so.profile = true;
    profiled.emplace(file, so);
  }

  // --input names must be the model's; files in --input-dir that are not are ignored.
  for (const auto& [name, ignored] : o.inputs) {
    const bool known = std::any_of(s.inputs().begin(), s.inputs().end(),
                                   [&](const kiln::IoInfo& io) { return io.name == name; });
    if (!known) throw UsageError("the model has no input '" + name + "' (--input " + name + ")");
  }
  Inputs in(o);
  int64_t kv_capacity = o.kv_capacity;
  const int64_t encoder_len = config_int(dir, "max_source_positions", 1500);
  if (o.kase == "decoder-step") {
    find_input(s, "use_cache_branch");
    if (kv_capacity == 0) kv_capacity = config_int(dir, "max_target_positions", 448);
    kv_capacity = std::max(kv_capacity, o.past_len + 1);
  }
  auto generate = [&](const kiln::IoInfo& io) -> std::optional<Tensor> {
    if (o.kase == "encoder" && io.name == s.inputs()[0].name) {
      const fs::path sample = fs::path(dir) / "sample_features.npy";
      if (fs::is_regular_file(sample)) return kiln::tooling::read_npy(sample.string());
      return in.normal(io.dtype, {1, 80, 2 * encoder_len}, 0.5f);
    }
    if (o.kase == "decoder-step") {
      const auto dim = [&](size_t i) {
        if (!io.has_shape || io.shape.size() <= i || io.shape[i] < 0)
          throw kiln::Error(
              kiln::ErrorKind::InvalidModel,
              "input '" + io.describe() + "' needs a fixed dimension " + std::to_string(i))
              .with_file(file);
        return io.shape[i];
      };
      if (io.name == "input_ids") return in.ints({1, 1}, 1, 1000);
      if (io.name == "use_cache_branch") return Tensor::from_vector<bool>({1}, {true});
      if (io.name == "encoder_hidden_states") return in.normal(io.dtype, {1, encoder_len, dim(2)});
      if (io.name.rfind("past_key_values.", 0) == 0) {
        const bool cross = io.name.find(".encoder.") != std::string::npos;
        return in.normal(io.dtype, {1, dim(1), cross ? encoder_len : o.past_len, dim(3)});
      }
    }
    if (o.kase == "minilm") {
      const kiln::Shape shape = {o.batch, o.seq_len};
      if (io.name == "input_ids") {
        // [CLS] random word pieces [SEP], as BERT tokenizers produce.
        Tensor t = in.ints(shape, 1000, 29000);
        int64_t* p = t.data<int64_t>();
        for (int64_t b = 0; b < o.batch; ++b) {
          p[b * o.seq_len] = 101;
          p[b * o.seq_len + o.seq_len - 1] = 102;
        }
        return t;
      }
      if (io.name == "attention_mask") return in.ints(shape, 1, 1);
      if (io.name == "token_type_ids") return in.ints(shape, 0, 0);
    }
    return std::nullopt;
  };
  Feed feed = build_feed(s, in, kv_capacity, generate);

  const RunResult r = time_runs(s, profiled ? &*profiled : nullptr, feed, o);

  Json j;
  j["engine"] = "kiln";
  j["case"] = o.kase;
  j["model"] = file;
  j["kiln_version"] = kiln::version();
  j["isa"] = kiln::isa_level();
  j["gemm_weights"] = kiln::tooling::gemm_weights_name(o.gemm_weights);
  j["denormals"] = kiln::tooling::denormals_name(o.denormals);
  j["threads"] = env->threads();
  j["warmup"] = o.warmup;
  j["warmup_ms"] = o.warmup_ms;
  j["iterations"] = o.iterations;
  if (o.kase == "decoder-step") j["past_len"] = o.past_len;
  if (!feed.kv.empty()) j["kv_capacity"] = kv_capacity;
  j["inputs"] = Json::object();
  for (const auto& [name, d] : feed.described) j["inputs"][name] = d;
  j["load_ms"] = load_ms;
  j["iterations_ms"] = r.ms;
  j["median_ms"] = percentile(r.ms, 0.5);
  j["p90_ms"] = percentile(r.ms, 0.9);
  j["min_ms"] = *std::min_element(r.ms.begin(), r.ms.end());
  j["bytes_copied"] = r.bytes_copied;
  j["allocations"] = r.allocations;
  j["last_run_stats"] = run_stats_json(r.last);
  if (!feed.kv.empty()) j["kv_rebuilt_outside_timer"] = r.kv_refreshed;
  if (o.profile) {
    j["profile_ms_by_op"] = r.ms_by_op;
    j["kernel_ms"] = r.kernel_ms;
    j["median_kernel_ms"] = percentile(r.kernel_ms, 0.5);
    j["min_kernel_ms"] = *std::min_element(r.kernel_ms.begin(), r.kernel_ms.end());
    // Each timed run's wall time minus its twin's node times: the time outside the kernels.
    std::vector<double> outside;
    for (size_t i = 0; i < r.kernel_ms.size(); ++i) outside.push_back(r.ms[i] - r.kernel_ms[i]);
    j["outside_kernels_ms"] = outside;
    j["median_outside_kernels_ms"] = percentile(outside, 0.5);
  }
  const kiln::LoadStats& ls = s.load_stats();
  j["load_stats"] = {{"weights_bytes", ls.weights_bytes},
                     {"weights_mapped_bytes", ls.weights_mapped_bytes},
                     {"weights_copied_bytes", ls.weights_copied_bytes},
                     {"nodes_loaded", ls.nodes_loaded},
                     {"nodes_planned", ls.nodes_planned}};
  j["rss_before_load_bytes"] = rss_before;
  j["peak_rss_bytes"] = peak_rss_bytes();
  add_bandwidth(j, o, *env);
  kiln::tooling::write_json(std::cout, j);
  return 0;
}

int run_decode_case(const Options& o, const std::shared_ptr<kiln::Environment>& env) {
  if (!fs::is_directory(o.model))
    throw kiln::Error(kiln::ErrorKind::Io, "not a folder").with_file(o.model);
  const uint64_t rss_before = current_rss_bytes();
  kiln::GeneratorOptions go;
  go.environment = env;
  go.gemm_weights = o.gemm_weights;
  go.optimization = o.optimization;
  go.denormals = o.denormals;
  const auto t0 = Clock::now();
  kiln::Seq2SeqGenerator g(o.model, go);
  const double load_ms = ms_since(t0);

  Inputs in(o);
  std::optional<Tensor> features = in.from_file("input_features");
  if (!features) {
    const fs::path sample = fs::path(o.model) / "sample_features.npy";
    if (fs::is_regular_file(sample)) {
      features = kiln::tooling::read_npy(sample.string());
    } else {
      const int64_t frames = 2 * config_int(o.model, "max_source_positions", 1500);
      features = in.normal(DataType::Float, {1, 80, frames}, 0.5f);
    }
  }
  for (const auto& [name, file] : o.inputs) {
    if (name != "input_features")
      throw UsageError("decode takes only --input input_features=FILE.npy, got '" + name + "'");
  }

  kiln::GenerationOptions gen;
  gen.max_new_tokens = o.steps;
  gen.min_new_tokens = o.steps;  // no early stop: every run is a timed decoder step
  for (int i = 0; i < o.warmup; ++i) g.generate(*features, gen);
  const kiln::GenerationResult r = g.generate(*features, gen);

  double decode_ms = 0;
  uint64_t bytes = 0;
  Json steps = Json::array();
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const kiln::StepStats& st = r.steps[i];
    decode_ms += st.ms;
    bytes += st.bytes_copied;
    steps.push_back({{"step", i},
                     {"past_len", st.past_len},
                     {"ms", st.ms},
                     {"run_ms", st.run_ms},
                     {"bytes_copied", st.bytes_copied},
                     {"allocations", st.allocations}});
  }
  Json j;
  j["engine"] = "kiln";
  j["case"] = "decode";
  j["model"] = o.model;
  j["kiln_version"] = kiln::version();
  j["isa"] = kiln::isa_level();
  j["gemm_weights"] = kiln::tooling::gemm_weights_name(o.gemm_weights);
  j["denormals"] = kiln::tooling::denormals_name(o.denormals);
  j["threads"] = env->threads();
  j["warmup"] = o.warmup;
  j["steps_requested"] = o.steps;
  j["load_ms"] = load_ms;
  j["encoder_ms"] = r.encoder_ms;
  j["decode_ms"] = decode_ms;
  j["bytes_copied_total"] = bytes;
  j["prompt"] = r.prompt;
  j["tokens"] = r.tokens;
  j["steps"] = std::move(steps);
  j["rss_before_load_bytes"] = rss_before;
  j["peak_rss_bytes"] = peak_rss_bytes();
  add_bandwidth(j, o, *env);
  kiln::tooling::write_json(std::cout, j);
  return 0;
}

int run(const Options& o) {
  if (o.kase == "gemm") {
    return kiln::bench::run_gemm_case(o.gemm_m, o.gemm_n, o.gemm_k, o.threads > 0 ? o.threads : 1,
                                      o.warmup, o.iterations);
  }
  auto env = std::make_shared<kiln::Environment>(o.threads);
  if (o.kase == "decode") return run_decode_case(o, env);
  return run_session_case(o, env);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Times one model case the way an application runs it; prints one JSON object.",
               "kiln-bench");
  define_options(app, o);
  if (const auto status = kiln::tooling::parse_command_line(app, argc, argv)) return *status;
  try {
    check_case(app, o);
    return run(o);
  } catch (const UsageError& e) {
    return kiln::tooling::usage_error(app, e.what());
  } catch (const std::exception& e) {
    std::cerr << "kiln-bench: " << e.what() << "\n";
    return 2;
  }
}
