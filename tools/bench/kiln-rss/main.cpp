// kiln-rss: loads a model, runs it, and reports resident memory at each stage as one JSON
// object, for tools/bench/memory_rss.py (which also reads the process's peak from outside).
//
//   kiln-rss MODEL [--input NAME=FILE.npy ...] [--runs N] [--threads N]
//            [--release-weights] [--save-output FILE.npy]
//            [--also MODEL2 ...] [--no-share-weights]
//
// --constants-from MANIFEST loads MODEL with defer_missing_weights (its external data file
// absent) and then gives each hollow constant its bytes with Session::set_constant, read one
// at a time from the files the manifest names (lines "name<TAB>file<TAB>offset<TAB>length").
//
// --also loads more sessions in the same Environment after MODEL (they are not run), to
// measure what a second session over the same weights adds.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "tools/common/cli.h"
#include "tools/common/json_output.h"
#include "tools/common/npy.h"
#include "tools/common/rss.h"

using kiln::tooling::current_rss_bytes;
using kiln::tooling::peak_rss_bytes;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  std::vector<std::pair<std::string, std::string>> input_files;
  int runs = 1, threads = 0;
  bool release = false, share = true;
  std::string save_output;
  std::vector<std::string> also;
  std::string manifest;
  CLI::App app("Loads a model, runs it, and reports resident memory at each stage as JSON.",
               "kiln-rss");
  kiln::tooling::configure(app);
  app.add_option("MODEL", model, "the .onnx file")->required()->type_name("");
  kiln::tooling::add_named_files(app, "--input", input_files, "NAME=FILE.npy",
                                 "an input (repeatable)");
  kiln::tooling::add_int(app, "--runs", runs, 1, "runs (default 1)");
  kiln::tooling::add_int(app, "--threads", threads, 1, "thread pool size (default: one per core)");
  app.add_flag("--release-weights", release,
               "SessionOptions::release_weights_after_use: drop weight pages after each use");
  app.add_option("--save-output", save_output, "write the first run's first output (.npy)")
      ->type_name("FILE");
  kiln::tooling::add_repeated(app, "--also", also,
                              "load this model too, in the same Environment (repeatable)")
      ->type_name("MODEL");
  app.add_flag_callback(
      "--no-share-weights", [&share] { share = false; }, "do not share weights between sessions");
  app.add_option("--constants-from", manifest,
                 "load MODEL without its weights, then set them one at a time from the files "
                 "this manifest names")
      ->type_name("MANIFEST");
  if (const auto status = kiln::tooling::parse_command_line(app, argc, argv)) return *status;
  try {
    const uint64_t rss_start = current_rss_bytes();
    std::vector<std::pair<std::string, kiln::Tensor>> inputs;
    for (const auto& [name, file] : input_files) {
      inputs.emplace_back(name, kiln::tooling::read_npy(file));
    }
    const uint64_t rss_inputs = current_rss_bytes();

    kiln::SessionOptions so;
    so.environment = std::make_shared<kiln::Environment>(threads);
    so.release_weights_after_use = release;
    so.share_weights = share;
    so.defer_missing_weights = !manifest.empty();
    auto t0 = std::chrono::steady_clock::now();
    kiln::Session session(model, so);
    const uint64_t rss_hollow = current_rss_bytes();
    uint64_t constants_set = 0, largest_constant = 0;
    if (!manifest.empty()) {
      std::ifstream lines(manifest);
      std::string name, file;
      uint64_t offset = 0, length = 0;
      while (std::getline(lines, name, '\t') && std::getline(lines, file, '\t') &&
             lines >> offset >> length) {
        lines.ignore(1);
        // One weight at a time: the read buffer is the only extra copy, freed after each.
        std::vector<char> bytes(length);
        std::ifstream in(file, std::ios::binary);
        in.seekg(static_cast<std::streamoff>(offset));
        if (!in.read(bytes.data(), static_cast<std::streamsize>(length))) {
          throw kiln::Error(kiln::ErrorKind::InvalidArgument, "cannot read " + file);
        }
        session.set_constant(name, bytes.data(), bytes.size());
        ++constants_set;
        largest_constant = std::max<uint64_t>(largest_constant, length);
      }
      if (!session.missing_constants().empty()) {
        throw kiln::Error(
            kiln::ErrorKind::InvalidArgument,
            std::to_string(session.missing_constants().size()) + " constants not in the manifest");
      }
    }
    const double load_ms = ms_since(t0);
    const uint64_t rss_loaded = current_rss_bytes(), peak_loaded = peak_rss_bytes();
    std::vector<kiln::Session> others;
    for (const std::string& path : also) others.emplace_back(path, so);
    const uint64_t rss_all_loaded = current_rss_bytes(), peak_all_loaded = peak_rss_bytes();

    struct RunRecord {
      double ms;
      uint64_t rss_after, peak, pool_peak, release_calls, released, failures;
    };
    std::vector<RunRecord> records;
    for (int r = 0; r < runs; ++r) {
      std::vector<kiln::NamedValue> feeds;
      for (const auto& [name, t] : inputs) feeds.push_back({name, t});
      t0 = std::chrono::steady_clock::now();
      auto outputs = session.run(std::move(feeds));
      const double run_ms = ms_since(t0);
      const kiln::RunStats& st = session.last_run_stats();
      records.push_back({run_ms, current_rss_bytes(), peak_rss_bytes(), st.peak_bytes_in_use,
                         st.weight_pages.calls, st.weight_pages.bytes_released,
                         st.weight_pages.failures});
      if (r == 0 && !save_output.empty() && !outputs.empty() && outputs[0].value.is_tensor()) {
        kiln::tooling::write_npy(save_output, outputs[0].value.tensor());
      }
    }

    using kiln::tooling::Json;
    Json j;
    j["model"] = model;
    j["release_weights_after_use"] = release;
    j["threads"] = so.environment->threads();
    j["rss_start_bytes"] = rss_start;
    j["rss_inputs_bytes"] = rss_inputs;
    j["load_ms"] = load_ms;
    j["rss_after_load_bytes"] = rss_loaded;
    j["peak_rss_after_load_bytes"] = peak_loaded;
    j["weights_bytes"] = session.load_stats().weights_bytes;
    j["weights_mapped_bytes"] = session.load_stats().weights_mapped_bytes;
    j["weights_copied_bytes"] = session.load_stats().weights_copied_bytes;
    j["weights_prepared_count"] = session.load_stats().weights_prepared_count;
    j["rss_hollow_bytes"] = rss_hollow;
    j["constants_set"] = constants_set;
    j["largest_constant_bytes"] = largest_constant;
    j["share_weights"] = share;
    j["also"] = Json::array();
    for (const kiln::Session& o : others) {
      const kiln::LoadStats& l = o.load_stats();
      j["also"].push_back({{"model", o.path()},
                           {"weights_bytes", l.weights_bytes},
                           {"weights_shared_bytes", l.weights_shared_bytes},
                           {"weights_mapped_bytes", l.weights_mapped_bytes},
                           {"weights_copied_bytes", l.weights_copied_bytes},
                           {"weights_source_bytes_released", l.weights_source_bytes_released},
                           {"weights_prepared_count", l.weights_prepared_count},
                           {"weights_prepared_shared", l.weights_prepared_shared}});
    }
    j["rss_after_all_loaded_bytes"] = rss_all_loaded;
    j["peak_rss_after_all_loaded_bytes"] = peak_all_loaded;
    const kiln::WeightsCacheStats cs = so.environment->weights_cache_stats();
    j["cache_entries"] = cs.entries;
    j["cache_bytes"] = cs.bytes;
    j["cache_references"] = cs.references;
    j["runs"] = Json::array();
    for (const RunRecord& r : records) {
      j["runs"].push_back({{"ms", r.ms},
                           {"rss_after_bytes", r.rss_after},
                           {"peak_rss_bytes", r.peak},
                           {"pool_peak_bytes", r.pool_peak},
                           {"weight_release_calls", r.release_calls},
                           {"weight_bytes_released", r.released},
                           {"weight_release_failures", r.failures}});
    }
    j["peak_rss_end_bytes"] = peak_rss_bytes();
    kiln::tooling::write_json(std::cout, j);
  } catch (const std::exception& e) {
    std::cerr << "kiln-rss: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
