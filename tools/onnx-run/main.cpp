// onnx-run: run an ONNX model with kiln, check it against test data, time it, profile it.
//
// Exit status: 0 ok, 1 outputs differ from the test data, 2 any error (bad file, unsupported
// op, bad input), always with a one-line message on stderr.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.h"
#include "proto/loader.h"
#include "tools/common/compare.h"
#include "tools/common/json.h"
#include "tools/common/npy.h"
#include "tools/common/options.h"
#include "tools/common/test_data.h"

namespace {

using kiln::tooling::JsonWriter;
namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: onnx-run MODEL [--input NAME=FILE.npy|.pb ...] [--test-data DIR] [--threads N]\n"
    "                [--warmup N] [--repeat N] [--profile trace.json] [--json]\n"
    "                [--output-dir DIR] [--rtol X] [--atol X] [--no-arena] [--reuse-inputs]\n"
    "                [--inputs-in-arena] [--arena-from-recording] [--gemm-weights f32|bf16|f16]\n"
    "                [--optimize none|basic|all] [--dump-graph]\n"
    "       onnx-run --version\n";

struct Options {
  std::string model;
  std::vector<std::pair<std::string, std::string>> inputs;  // name, file
  std::string test_data;
  int threads = 0;
  int warmup = 0;
  int repeat = 1;
  std::string profile;
  bool json = false;
  bool version = false;
  bool dump_graph = false;
  kiln::WeightPrecision gemm_weights = kiln::WeightPrecision::Float32;
  kiln::GraphOptimization optimization = kiln::GraphOptimization::All;
  bool arena = true, reuse_inputs = false, inputs_in_arena = false, arena_from_shapes = true;
  std::string output_dir;
  double rtol = 1e-3, atol = 1e-5;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int to_int(const std::string& flag, const std::string& v, int min) {
  try {
    size_t used = 0;
    const int n = std::stoi(v, &used);
    if (used != v.size() || n < min) throw UsageError("");
    return n;
  } catch (const std::exception&) {
    throw UsageError(flag + " needs an integer >= " + std::to_string(min) + ", got '" + v + "'");
  }
}

double to_double(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const double d = std::stod(v, &used);
    if (used != v.size() || d < 0) throw UsageError("");
    return d;
  } catch (const std::exception&) {
    throw UsageError(flag + " needs a non-negative number, got '" + v + "'");
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--input") {
      const std::string v = value();
      const size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0)
        throw UsageError("--input needs NAME=FILE, got '" + v + "'");
      o.inputs.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (a == "--test-data") {
      o.test_data = value();
    } else if (a == "--threads") {
      o.threads = to_int(a, value(), 1);
    } else if (a == "--warmup") {
      o.warmup = to_int(a, value(), 0);
    } else if (a == "--repeat") {
      o.repeat = to_int(a, value(), 1);
    } else if (a == "--profile") {
      o.profile = value();
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--no-arena") {
      o.arena = false;
    } else if (a == "--reuse-inputs") {
      o.reuse_inputs = true;
    } else if (a == "--inputs-in-arena") {
      o.inputs_in_arena = true;
    } else if (a == "--arena-from-recording") {
      o.arena_from_shapes = false;
    } else if (a == "--output-dir") {
      o.output_dir = value();
    } else if (a == "--dump-graph") {
      o.dump_graph = true;
    } else if (a == "--optimize") {
      const std::string v = value();
      const auto level = kiln::tooling::parse_optimization(v);
      if (!level) throw UsageError("--optimize takes none, basic or all, got '" + v + "'");
      o.optimization = *level;
    } else if (a == "--gemm-weights") {
      const std::string v = value();
      const auto precision = kiln::tooling::parse_gemm_weights(v);
      if (!precision) throw UsageError("--gemm-weights takes f32, bf16 or f16, got '" + v + "'");
      o.gemm_weights = *precision;
    } else if (a == "--rtol") {
      o.rtol = to_double(a, value());
    } else if (a == "--atol") {
      o.atol = to_double(a, value());
    } else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--version") {
      o.version = true;
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError("unknown option '" + a + "'");
    } else if (o.model.empty()) {
      o.model = a;
    } else {
      throw UsageError("unexpected argument '" + a + "'");
    }
  }
  if (o.model.empty() && !o.version) throw UsageError("no model given");
  return o;
}

kiln::Value read_input_file(const std::string& path, const kiln::IoInfo& io) {
  if (path.size() >= 4 && path.substr(path.size() - 4) == ".npy")
    return kiln::tooling::read_npy(path);
  kiln::ir::TypeInfo t;
  t.kind = io.kind;
  t.elem = io.dtype;
  return kiln::proto::read_value_file(path, t, nullptr);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const auto hi = static_cast<size_t>(std::ceil(rank));
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

std::string preview(const kiln::Value& v) {
  if (!v.is_tensor()) return v.describe();
  const kiln::Tensor t = v.tensor().contiguous();
  std::ostringstream os;
  os << t.describe() << " [";
  const int64_t n = std::min<int64_t>(t.numel(), 8);
  for (int64_t i = 0; i < n; ++i) {
    if (i) os << ", ";
    switch (t.dtype()) {
      case kiln::DataType::Float:
        os << t.data<const float>()[i];
        break;
      case kiln::DataType::Double:
        os << t.data<const double>()[i];
        break;
      case kiln::DataType::Int64:
        os << t.data<const int64_t>()[i];
        break;
      case kiln::DataType::Int32:
        os << t.data<const int32_t>()[i];
        break;
      case kiln::DataType::Bool:
        os << (t.data<const bool>()[i] ? "true" : "false");
        break;
      case kiln::DataType::String:
        os << '"' << t.data<const std::string>()[i] << '"';
        break;
      default:
        os << "?";
        break;
    }
  }
  if (t.numel() > n) os << ", ...";
  os << "]";
  return os.str();
}

void write_profile(const std::string& path, const std::vector<kiln::NodeEvent>& events,
                   double load_us, double run_start_us, double run_us) {
  std::ofstream out(path);
  if (!out) throw kiln::Error(kiln::ErrorKind::Io, "cannot write profile").with_file(path);
  JsonWriter j(out);
  const int pid = static_cast<int>(getpid());
  j.begin_array();
  auto session_event = [&](const char* name, double ts, double dur) {
    j.begin_object();
    j.field("cat", "Session").field("pid", pid).field("tid", 0).field("ph", "X");
    j.field("name", name).field("ts", ts).field("dur", dur);
    j.key("args").begin_object().end_object();
    j.end_object();
  };
  session_event("session_initialization", 0, load_us);
  session_event("model_run", run_start_us, run_us);
  for (const auto& ev : events) {
    j.begin_object();
    j.field("cat", "Node").field("pid", pid).field("tid", 0).field("ph", "X");
    j.field("name", ev.name + "_kernel_time");
    j.field("ts", run_start_us + ev.start_us).field("dur", ev.duration_us);
    j.key("args").begin_object();
    j.field("op_name", ev.op_type).field("provider", "kiln").field("depth", ev.depth);
    j.field("bytes_copied", ev.bytes_copied);
    j.key("input_type_shape").begin_array();
    for (const auto& s : ev.input_shapes) j.value(s);
    j.end_array();
    j.key("output_type_shape").begin_array();
    for (const auto& s : ev.output_shapes) j.value(s);
    j.end_array();
    j.end_object();
    j.end_object();
  }
  j.end_array();
  out << "\n";
}

// "onnx-run (kiln) 0.1.0, kernels: avx512 (...)": the version and the instruction-set
// level in use (see KILN_ISA in README.md).
int print_version(const Options& o) {
  const char* isa = kiln::isa_level();  // throws on a bad KILN_ISA before anything is printed
  if (o.json) {
    JsonWriter j(std::cout);
    j.begin_object();
    j.field("kiln_version", kiln::version()).field("isa", isa);
    j.end_object();
    std::cout << "\n";
  } else {
    std::cout << "onnx-run (kiln) " << kiln::version() << "\nkernels: " << isa;
    const char* cap = std::getenv("KILN_ISA");
    std::cout << (cap && *cap ? " (capped by KILN_ISA)" : " (the highest this processor runs)")
              << "\n";
  }
  return 0;
}

int run(const Options& o) {
  if (o.version) return print_version(o);
  using clock = std::chrono::steady_clock;
  const auto t_load = clock::now();
  kiln::SessionOptions so;
  so.environment = std::make_shared<kiln::Environment>(o.threads);
  so.profile = !o.profile.empty();
  so.memory_arena = o.arena;
  so.reuse_input_buffers = o.reuse_inputs;
  so.inputs_in_arena = o.inputs_in_arena;
  so.arena_from_shapes = o.arena_from_shapes;
  so.gemm_weights = o.gemm_weights;
  so.optimization = o.optimization;
  kiln::Session session(o.model, so);
  if (o.dump_graph) {
    // The graph after optimisation, on stderr so that --json output stays one object.
    const kiln::LoadStats& ls = session.load_stats();
    std::cerr << "# " << o.model << ": " << ls.nodes_loaded << " nodes loaded, " << ls.nodes_planned
              << " planned (" << ls.folded_nodes << " folded, " << ls.identities_removed
              << " pass-through removed, " << ls.fusions << " fusions)\n"
              << session.graph_text();
  }
  const double load_ms = std::chrono::duration<double, std::milli>(clock::now() - t_load).count();

  std::vector<kiln::NamedValue> inputs;
  std::vector<kiln::Value> expected;
  if (!o.test_data.empty()) {
    auto set = kiln::tooling::read_test_data_set(o.test_data, session);
    inputs = std::move(set.inputs);
    expected = std::move(set.outputs);
  }
  for (const auto& [name, file] : o.inputs) {
    const auto& ins = session.inputs();
    auto it = std::find_if(ins.begin(), ins.end(),
                           [&](const kiln::IoInfo& io) { return io.name == name; });
    if (it == ins.end()) {
      throw kiln::Error(kiln::ErrorKind::InvalidArgument,
                        "--input: the model has no input '" + name + "'")
          .with_file(o.model);
    }
    std::erase_if(inputs, [&](const kiln::NamedValue& nv) { return nv.name == name; });
    inputs.push_back({name, read_input_file(file, *it)});
  }

  // --inputs-in-arena: every run gets its tensor inputs in buffers from allocate_input,
  // filled (outside the timed region) and passed by move; other inputs are passed as they are.
  auto run_inputs = [&] {
    std::vector<kiln::NamedValue> given = inputs;
    if (!o.inputs_in_arena) return given;
    for (kiln::NamedValue& nv : given) {
      if (!nv.value.is_tensor() || nv.value.tensor().dtype() == kiln::DataType::String) continue;
      const kiln::Tensor src = nv.value.tensor().contiguous();
      kiln::Tensor t = session.allocate_input(nv.name, src.dtype(), src.shape());
      if (src.nbytes() > 0) std::memcpy(t.raw_data(), src.raw_data(), src.nbytes());
      nv.value = kiln::Value(std::move(t));
    }
    return given;
  };
  std::vector<kiln::NamedValue> outputs;
  for (int i = 0; i < o.warmup; ++i) outputs = session.run(run_inputs());
  std::vector<double> times;
  double run_start_us = 0, last_run_us = 0;
  for (int i = 0; i < o.repeat; ++i) {
    std::vector<kiln::NamedValue> given = run_inputs();
    const auto t0 = clock::now();
    outputs = session.run(std::move(given));
    const auto t1 = clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    run_start_us = std::chrono::duration<double, std::micro>(t0 - t_load).count();
    last_run_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  const kiln::RunStats& stats = session.last_run_stats();

  bool passed = true;
  std::vector<kiln::tooling::Comparison> comparisons;
  if (!expected.empty()) {
    for (size_t k = 0; k < outputs.size(); ++k) {
      comparisons.push_back(
          kiln::tooling::compare_values(outputs[k].value, expected[k], o.rtol, o.atol));
      passed = passed && comparisons.back().ok;
    }
  }
  if (!o.output_dir.empty()) {
    fs::create_directories(o.output_dir);
    for (const auto& out : outputs) {
      if (!out.value.is_tensor()) continue;
      std::string file = out.name;
      for (char& c : file) {
        if (c == '/' || c == '\\' || c == ':') c = '_';
      }
      kiln::tooling::write_npy((fs::path(o.output_dir) / (file + ".npy")).string(),
                               out.value.tensor());
    }
  }
  if (!o.profile.empty()) {
    write_profile(o.profile, session.last_profile(), load_ms * 1000, run_start_us, last_run_us);
  }

  const double median = percentile(times, 0.5), p90 = percentile(times, 0.9);
  if (o.json) {
    JsonWriter j(std::cout);
    j.begin_object();
    j.field("model", o.model);
    j.field("kiln_version", kiln::version()).field("isa", kiln::isa_level());
    j.field("gemm_weights", kiln::tooling::gemm_weights_name(o.gemm_weights));
    if (expected.empty()) {
      j.key("passed").null();
    } else {
      j.field("passed", passed);
    }
    j.field("threads", so.environment->threads());
    j.field("load_ms", load_ms);
    j.key("latency_ms").begin_object();
    j.field("median", median).field("p90", p90);
    j.field("min", *std::min_element(times.begin(), times.end()));
    j.field("max", *std::max_element(times.begin(), times.end()));
    j.field("runs", static_cast<int64_t>(times.size()));
    j.end_object();
    j.field("peak_rss_bytes", peak_rss_bytes());
    j.field("bytes_copied", stats.bytes_copied);
    j.key("run_stats").begin_object();
    j.field("allocations", stats.allocations).field("bytes_allocated", stats.bytes_allocated);
    j.field("pool_reuses", stats.pool_reuses).field("peak_bytes_in_use", stats.peak_bytes_in_use);
    j.field("bytes_copied_contiguous", stats.bytes_copied_contiguous);
    j.field("bytes_copied_concat", stats.bytes_copied_concat);
    j.field("bytes_copied_capture", stats.bytes_copied_capture);
    j.field("bytes_copied_kernels", stats.bytes_copied_kernels);
    j.field("in_place_ops", stats.in_place_ops).field("nodes_run", stats.nodes_run);
    j.field("arena_bytes", stats.arena_bytes).field("arena_lower_bound", stats.arena_lower_bound);
    j.field("arena_served", stats.arena_served).field("arena_missed", stats.arena_missed);
    j.field("arena_input_bytes", stats.arena_input_bytes);
    j.field("arena_from_shapes", stats.arena_from_shapes);
    j.end_object();
    const kiln::LoadStats& ls = session.load_stats();
    j.key("load_stats").begin_object();
    j.field("weights_bytes", ls.weights_bytes)
        .field("weights_mapped_bytes", ls.weights_mapped_bytes);
    j.field("weights_copied_bytes", ls.weights_copied_bytes);
    j.field("folded_nodes", ls.folded_nodes).field("folded_bytes", ls.folded_bytes);
    j.field("nodes_loaded", ls.nodes_loaded).field("nodes_planned", ls.nodes_planned);
    j.field("identities_removed", ls.identities_removed).field("fusions", ls.fusions);
    j.end_object();
    j.key("outputs").begin_array();
    for (size_t k = 0; k < outputs.size(); ++k) {
      j.begin_object();
      j.field("name", outputs[k].name);
      const kiln::Value& v = outputs[k].value;
      if (v.is_tensor()) {
        j.field("dtype", std::string(kiln::data_type_name(v.tensor().dtype())));
        j.key("shape").begin_array();
        for (int64_t d : v.tensor().shape()) j.value(d);
        j.end_array();
      } else {
        j.field("value", v.describe());
      }
      if (k < comparisons.size()) {
        j.field("max_abs_err", comparisons[k].max_abs_err);
        j.field("passed", comparisons[k].ok);
        if (!comparisons[k].ok) j.field("error", comparisons[k].message);
      } else {
        j.key("max_abs_err").null();
      }
      j.end_object();
    }
    j.end_array();
    j.end_object();
    std::cout << "\n";
  } else {
    std::cout << "model: " << o.model << " (loaded in " << load_ms << " ms)\n";
    for (size_t k = 0; k < outputs.size(); ++k) {
      std::cout << "  " << outputs[k].name << ": " << preview(outputs[k].value);
      if (k < comparisons.size()) {
        std::cout << (comparisons[k].ok ? "  ok" : "  MISMATCH") << " (max abs error "
                  << comparisons[k].max_abs_err << ")";
        if (!comparisons[k].ok) std::cout << ": " << comparisons[k].message;
      }
      std::cout << "\n";
    }
    std::cout << "latency: median " << median << " ms, p90 " << p90 << " ms over " << times.size()
              << " run(s), " << so.environment->threads() << " thread(s), kiln " << kiln::version()
              << " (" << kiln::isa_level() << ")\n";
    std::cout << "memory: peak RSS " << peak_rss_bytes() / 1024 << " KiB, pool peak "
              << stats.peak_bytes_in_use << " bytes, " << stats.allocations << " allocations, "
              << stats.bytes_copied << " bytes copied\n";
    if (stats.arena_bytes > 0) {
      std::cout << "arena: " << stats.arena_bytes << " bytes (lower bound "
                << stats.arena_lower_bound << "), " << stats.arena_served << " buffers served, "
                << stats.arena_missed << " missed"
                << (stats.arena_from_shapes ? ", planned from inferred shapes" : "");
      if (stats.arena_input_bytes > 0) {
        std::cout << ", " << stats.arena_input_bytes << " bytes of inputs in it";
      }
      std::cout << "\n";
    }
    if (!expected.empty()) std::cout << (passed ? "PASSED" : "FAILED") << "\n";
  }
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const UsageError& e) {
    std::cerr << "onnx-run: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const kiln::Error& e) {
    std::cerr << "onnx-run: " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "onnx-run: out of memory\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "onnx-run: " << e.what() << "\n";
    return 2;
  } catch (...) {
    std::cerr << "onnx-run: unknown error\n";
    return 2;
  }
}
