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
#include "tools/common/cli.h"
#include "tools/common/compare.h"
#include "tools/common/json_output.h"
#include "tools/common/npy.h"
#include "tools/common/options.h"
#include "tools/common/test_data.h"

namespace {

using kiln::tooling::Json;
namespace fs = std::filesystem;

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
  std::string save_optimized;
  std::vector<std::string> extra_outputs;
  kiln::WeightPrecision gemm_weights = kiln::WeightPrecision::Float32;
  kiln::GraphOptimization optimization = kiln::GraphOptimization::All;
  kiln::Denormals denormals = kiln::Denormals::Flush;
  bool count_denormals = false;
  bool arena = true, reuse_inputs = false, inputs_in_arena = false, arena_from_shapes = true;
  std::string output_dir;
  double rtol = 1e-3, atol = 1e-5;
  int64_t memory_limit_mb = -1;  // -1: the machine's physical memory; 0: none
  double timeout_s = 0;          // 0: none
};

// The bytes of physical memory (0 when unknown).
uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// The command line into `o`.
void define_options(CLI::App& app, Options& o) {
  using namespace kiln::tooling;
  configure(app);
  app.add_option("MODEL", o.model, "the .onnx file to run")->type_name("");
  add_named_files(app, "--input", o.inputs, "NAME=FILE",
                  "an input from a .npy or .pb file (repeatable); overrides --test-data");
  app.add_option("--test-data", o.test_data,
                 "an ONNX test_data_set folder: inputs, and outputs to compare with")
      ->type_name("DIR");
  add_int(app, "--threads", o.threads, 1, "thread pool size (default: one per core)");
  add_int(app, "--warmup", o.warmup, 0, "untimed runs first (default 0)");
  add_int(app, "--repeat", o.repeat, 1, "timed runs (default 1)");
  app.add_option("--profile", o.profile, "write a Chrome trace of the last run to this file")
      ->type_name("FILE");
  app.add_flag("--json", o.json, "print one JSON object instead of text");
  app.add_option("--output-dir", o.output_dir, "write the outputs as DIR/NAME.npy")
      ->type_name("DIR");
  add_number(app, "--rtol", o.rtol, 0, "relative tolerance of the comparison (default 1e-3)");
  add_number(app, "--atol", o.atol, 0, "absolute tolerance of the comparison (default 1e-5)");
  app.add_flag_callback(
      "--no-arena", [&o] { o.arena = false; }, "no memory arena: every buffer from the pool");
  app.add_flag("--reuse-inputs", o.reuse_inputs, "let ops write into the given input buffers");
  app.add_flag("--inputs-in-arena", o.inputs_in_arena,
               "give the inputs buffers from the arena (Session::allocate_input)");
  app.add_flag_callback(
      "--arena-from-recording", [&o] { o.arena_from_shapes = false; },
      "plan the arena from a recorded run instead of inferred shapes");
  add_choice(app, "--gemm-weights", o.gemm_weights, parse_gemm_weights, kGemmWeightsChoices,
             "precision of packed MatMul/Gemm weights: f32 (default), bf16, f16 or int8 "
             "(per-column int8 weights, activations quantized per row)");
  add_choice(app, "--optimize", o.optimization, parse_optimization, "none, basic or all",
             "graph optimisation: none, basic or all (default)");
  add_choice(app, "--denormals", o.denormals, parse_denormals, "flush or keep",
             "denormal floats in runs: flush (to zero, the default) or keep");
  app.add_flag("--count-denormals", o.count_denormals,
               "count the denormal floats the nodes output (denormals_produced; per node in "
               "--profile)");
  app.add_flag("--dump-graph", o.dump_graph, "print the optimised graph on stderr");
  app.add_option("--extra-output", o.extra_outputs,
                 "also return this value of the graph as an output (repeatable)")
      ->type_name("NAME");
  app.add_option("--save-optimized", o.save_optimized,
                 "write the optimised graph to this ONNX file (weights embedded, or in FILE.data "
                 "beyond 1 GiB)");
  add_number(app, "--timeout", o.timeout_s, 0,
             "stop any run taking longer than this many seconds (default 0: no limit)");
  add_int(app, "--memory-limit", o.memory_limit_mb, int64_t{0},
          "most MiB a run's tensors may hold (default: the machine's memory; 0: no limit)");
  app.add_flag("--version", o.version, "print the version and the kernels in use");
}

kiln::Value read_input_file(const std::string& path, const kiln::IoInfo& io) {
  if (path.size() >= 4 && path.substr(path.size() - 4) == ".npy")
    return kiln::tooling::read_npy(path);
  return kiln::read_value_file(path, io);
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

// Element `i` (row-major) of `t`, whatever its strides, as a one-element view: an output may
// be a broadcast view standing for far more bytes than exist (Expand's), never copied whole
// for a preview.
kiln::Tensor element(const kiln::Tensor& t, int64_t i) {
  int64_t offset = 0;
  for (size_t d = t.rank(); d-- > 0;) {
    offset += (i % t.dim(d)) * t.strides()[d];
    i /= t.dim(d);
  }
  const size_t size = kiln::storage_bytes(t.dtype(), 1);
  return t.view({}, {}, t.byte_offset() + static_cast<size_t>(offset) * size);
}

std::string preview(const kiln::Value& v) {
  if (!v.is_tensor()) return v.describe();
  const kiln::Tensor& t = v.tensor();
  std::ostringstream os;
  os << t.describe() << " [";
  const int64_t n = std::min<int64_t>(t.numel(), 8);
  for (int64_t i = 0; i < n; ++i) {
    if (i) os << ", ";
    const kiln::Tensor e = element(t, i);
    switch (t.dtype()) {
      case kiln::DataType::Float:
        os << e.data<const float>()[0];
        break;
      case kiln::DataType::Double:
        os << e.data<const double>()[0];
        break;
      case kiln::DataType::Int64:
        os << e.data<const int64_t>()[0];
        break;
      case kiln::DataType::Int32:
        os << e.data<const int32_t>()[0];
        break;
      case kiln::DataType::Bool:
        os << (e.data<const bool>()[0] ? "true" : "false");
        break;
      case kiln::DataType::String:
        os << '"' << e.data<const std::string>()[0] << '"';
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
  const int pid = static_cast<int>(getpid());
  Json trace = Json::array();
  auto session_event = [&](const char* name, double ts, double dur) {
    trace.push_back({{"cat", "Session"},
                     {"pid", pid},
                     {"tid", 0},
                     {"ph", "X"},
                     {"name", name},
                     {"ts", ts},
                     {"dur", dur},
                     {"args", Json::object()}});
  };
  session_event("session_initialization", 0, load_us);
  session_event("model_run", run_start_us, run_us);
  for (const auto& ev : events) {
    trace.push_back({{"cat", "Node"},
                     {"pid", pid},
                     {"tid", 0},
                     {"ph", "X"},
                     {"name", ev.name + "_kernel_time"},
                     {"ts", run_start_us + ev.start_us},
                     {"dur", ev.duration_us},
                     {"args",
                      {{"op_name", ev.op_type},
                       {"provider", "kiln"},
                       {"depth", ev.depth},
                       {"bytes_copied", ev.bytes_copied},
                       {"denormals", ev.denormals},
                       {"input_type_shape", ev.input_shapes},
                       {"output_type_shape", ev.output_shapes}}}});
  }
  kiln::tooling::write_json(out, trace);
}

// "onnx-run (kiln) 0.1.0, kernels: avx512 (...)": the version and the instruction-set
// level in use (see KILN_ISA in README.md).
int print_version(const Options& o) {
  const char* isa = kiln::isa_level();  // throws on a bad KILN_ISA before anything is printed
  if (o.json) {
    kiln::tooling::write_json(std::cout, {{"kiln_version", kiln::version()}, {"isa", isa}});
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
  so.denormals = o.denormals;
  so.count_denormals = o.count_denormals;
  so.optimized_model_path = o.save_optimized;
  so.extra_outputs = o.extra_outputs;
  so.memory_limit = o.memory_limit_mb < 0 ? physical_memory_bytes()
                                          : static_cast<uint64_t>(o.memory_limit_mb) << 20;
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
    auto set = kiln::tooling::read_test_data_set(o.test_data, session, o.extra_outputs.size());
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
  // --timeout: each run gets its own deadline.
  kiln::RunOptions run_options;
  auto run_once = [&](std::vector<kiln::NamedValue> given) {
    if (o.timeout_s > 0) {
      run_options.set_timeout(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(o.timeout_s)));
    }
    return session.run(std::move(given), run_options);
  };
  std::vector<kiln::NamedValue> outputs;
  for (int i = 0; i < o.warmup; ++i) outputs = run_once(run_inputs());
  std::vector<double> times;
  double run_start_us = 0, last_run_us = 0;
  for (int i = 0; i < o.repeat; ++i) {
    std::vector<kiln::NamedValue> given = run_inputs();
    const auto t0 = clock::now();
    outputs = run_once(std::move(given));
    const auto t1 = clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    run_start_us = std::chrono::duration<double, std::micro>(t0 - t_load).count();
    last_run_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
  }
  const kiln::RunStats& stats = session.last_run_stats();

  bool passed = true;
  std::vector<kiln::tooling::Comparison> comparisons;
  if (!expected.empty()) {
    for (size_t k = 0; k < expected.size() && k < outputs.size(); ++k) {
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
    Json j;
    j["model"] = o.model;
    j["kiln_version"] = kiln::version();
    j["isa"] = kiln::isa_level();
    j["gemm_weights"] = kiln::tooling::gemm_weights_name(o.gemm_weights);
    j["denormals"] = kiln::tooling::denormals_name(o.denormals);
    j["passed"] = expected.empty() ? Json(nullptr) : Json(passed);
    j["threads"] = so.environment->threads();
    j["load_ms"] = load_ms;
    j["latency_ms"] = {{"median", median},
                       {"p90", p90},
                       {"min", *std::min_element(times.begin(), times.end())},
                       {"max", *std::max_element(times.begin(), times.end())},
                       {"runs", times.size()}};
    j["peak_rss_bytes"] = peak_rss_bytes();
    j["bytes_copied"] = stats.bytes_copied;
    j["run_stats"] = {{"allocations", stats.allocations},
                      {"bytes_allocated", stats.bytes_allocated},
                      {"pool_reuses", stats.pool_reuses},
                      {"peak_bytes_in_use", stats.peak_bytes_in_use},
                      {"bytes_copied_contiguous", stats.bytes_copied_contiguous},
                      {"bytes_copied_concat", stats.bytes_copied_concat},
                      {"bytes_copied_capture", stats.bytes_copied_capture},
                      {"bytes_copied_kernels", stats.bytes_copied_kernels},
                      {"in_place_ops", stats.in_place_ops},
                      {"nodes_run", stats.nodes_run},
                      {"denormals_produced", stats.denormals_produced},
                      {"arena_bytes", stats.arena_bytes},
                      {"arena_lower_bound", stats.arena_lower_bound},
                      {"arena_served", stats.arena_served},
                      {"arena_missed", stats.arena_missed},
                      {"arena_input_bytes", stats.arena_input_bytes},
                      {"arena_from_shapes", stats.arena_from_shapes},
                      {"arena_capacity", stats.arena_capacity},
                      {"pool_bytes_cached", stats.pool_bytes_cached},
                      {"pool_bytes_freed", stats.pool_bytes_freed}};
    const kiln::LoadStats& ls = session.load_stats();
    j["load_stats"] = {{"weights_bytes", ls.weights_bytes},
                       {"weights_mapped_bytes", ls.weights_mapped_bytes},
                       {"weights_copied_bytes", ls.weights_copied_bytes},
                       {"folded_nodes", ls.folded_nodes},
                       {"folded_bytes", ls.folded_bytes},
                       {"nodes_loaded", ls.nodes_loaded},
                       {"nodes_planned", ls.nodes_planned},
                       {"identities_removed", ls.identities_removed},
                       {"fusions", ls.fusions}};
    Json outs = Json::array();
    for (size_t k = 0; k < outputs.size(); ++k) {
      Json out;
      out["name"] = outputs[k].name;
      const kiln::Value& v = outputs[k].value;
      if (v.is_tensor()) {
        out["dtype"] = std::string(kiln::data_type_name(v.tensor().dtype()));
        out["shape"] = v.tensor().shape();
      } else {
        out["value"] = v.describe();
      }
      if (k < comparisons.size()) {
        out["max_abs_err"] = comparisons[k].max_abs_err;
        out["passed"] = comparisons[k].ok;
        if (!comparisons[k].ok) out["error"] = comparisons[k].message;
      } else {
        out["max_abs_err"] = nullptr;
      }
      outs.push_back(std::move(out));
    }
    j["outputs"] = std::move(outs);
    kiln::tooling::write_json(std::cout, j);
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
    if (o.count_denormals) {
      std::cout << "denormals: " << stats.denormals_produced << " produced by the last run ("
                << kiln::tooling::denormals_name(o.denormals) << ")\n";
    }
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
  Options o;
  CLI::App app("Runs an ONNX model with kiln, checks it against test data, times and profiles it.",
               "onnx-run");
  define_options(app, o);
  if (const auto status = kiln::tooling::parse_command_line(app, argc, argv)) return *status;
  if (o.model.empty() && !o.version) return kiln::tooling::usage_error(app, "no model given");
  try {
    return run(o);
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
