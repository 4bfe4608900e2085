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
#include "tools/common/json.h"
#include "tools/common/npy.h"
#include "tools/common/rss.h"

using kiln::tooling::current_rss_bytes;
using kiln::tooling::peak_rss_bytes;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int usage() {
  std::cerr << "usage: kiln-rss MODEL [--input NAME=FILE.npy ...] [--runs N] [--threads N]\n"
               "                [--release-weights] [--save-output FILE.npy]\n"
               "                [--also MODEL2 ...] [--no-share-weights]\n"
               "                [--constants-from MANIFEST]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string model = argv[1];
  std::vector<std::pair<std::string, std::string>> input_files;
  int runs = 1, threads = 0;
  bool release = false, share = true;
  std::string save_output;
  std::vector<std::string> also;
  std::string manifest;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw kiln::Error(kiln::ErrorKind::InvalidArgument, a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--input") {
        const std::string spec = next();
        const size_t eq = spec.find('=');
        if (eq == std::string::npos) return usage();
        input_files.emplace_back(spec.substr(0, eq), spec.substr(eq + 1));
      } else if (a == "--runs") {
        runs = std::stoi(next());
      } else if (a == "--threads") {
        threads = std::stoi(next());
      } else if (a == "--release-weights") {
        release = true;
      } else if (a == "--also") {
        also.push_back(next());
      } else if (a == "--constants-from") {
        manifest = next();
      } else if (a == "--no-share-weights") {
        share = false;
      } else if (a == "--save-output") {
        save_output = next();
      } else {
        return usage();
      }
    } catch (const std::exception& e) {
      std::cerr << "kiln-rss: " << e.what() << "\n";
      return 2;
    }
  }

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

    kiln::tooling::JsonWriter j(std::cout);
    j.begin_object();
    j.field("model", model);
    j.field("release_weights_after_use", release);
    j.field("threads", so.environment->threads());
    j.field("rss_start_bytes", rss_start);
    j.field("rss_inputs_bytes", rss_inputs);
    j.field("load_ms", load_ms);
    j.field("rss_after_load_bytes", rss_loaded);
    j.field("peak_rss_after_load_bytes", peak_loaded);
    j.field("weights_bytes", session.load_stats().weights_bytes);
    j.field("weights_mapped_bytes", session.load_stats().weights_mapped_bytes);
    j.field("weights_copied_bytes", session.load_stats().weights_copied_bytes);
    j.field("weights_prepared_count", session.load_stats().weights_prepared_count);
    j.field("rss_hollow_bytes", rss_hollow);
    j.field("constants_set", constants_set);
    j.field("largest_constant_bytes", largest_constant);
    j.field("share_weights", share);
    j.key("also").begin_array();
    for (const kiln::Session& o : others) {
      const kiln::LoadStats& l = o.load_stats();
      j.begin_object();
      j.field("model", o.path());
      j.field("weights_bytes", l.weights_bytes);
      j.field("weights_shared_bytes", l.weights_shared_bytes);
      j.field("weights_mapped_bytes", l.weights_mapped_bytes);
      j.field("weights_copied_bytes", l.weights_copied_bytes);
      j.field("weights_source_bytes_released", l.weights_source_bytes_released);
      j.field("weights_prepared_count", l.weights_prepared_count);
      j.field("weights_prepared_shared", l.weights_prepared_shared);
      j.end_object();
    }
    j.end_array();
    j.field("rss_after_all_loaded_bytes", rss_all_loaded);
    j.field("peak_rss_after_all_loaded_bytes", peak_all_loaded);
    const kiln::WeightsCacheStats cs = so.environment->weights_cache_stats();
    j.field("cache_entries", cs.entries);
    j.field("cache_bytes", cs.bytes);
    j.field("cache_references", cs.references);
    j.key("runs").begin_array();
    for (const RunRecord& r : records) {
      j.begin_object();
      j.field("ms", r.ms);
      j.field("rss_after_bytes", r.rss_after);
      j.field("peak_rss_bytes", r.peak);
      j.field("pool_peak_bytes", r.pool_peak);
      j.field("weight_release_calls", r.release_calls);
      j.field("weight_bytes_released", r.released);
      j.field("weight_release_failures", r.failures);
      j.end_object();
    }
    j.end_array();
    j.field("peak_rss_end_bytes", peak_rss_bytes());
    j.end_object();
    std::cout << "\n";
  } catch (const kiln::Error& e) {
    std::cerr << "kiln-rss: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
