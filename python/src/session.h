// The Python-facing session, options and run controls (bound in module.cpp).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::python {

namespace py = pybind11;

// onnxruntime's levels, with its numbers, mapped onto kiln's three.
enum class GraphOptimizationLevel {
  DisableAll = 0,      // kiln: None
  EnableBasic = 1,     // kiln: Basic
  EnableExtended = 2,  // kiln: All (kiln's fusions are its one level above basic)
  EnableLayout = 3,    // kiln: All
  EnableAll = 99,      // kiln: All
};
GraphOptimization kiln_optimization(GraphOptimizationLevel level);

struct PySessionOptions {
  SessionOptions kiln;  // environment: chosen by the Python layer (kiln/__init__.py)
  int intra_op_num_threads = 0;
  GraphOptimizationLevel graph_optimization_level = GraphOptimizationLevel::EnableAll;
  std::string profile_file_prefix = "kiln_profile";
  // kiln writes no log; these are kept so that code written for onnxruntime runs unchanged.
  int log_severity_level = 2;
  int log_verbosity_level = 0;
  std::string logid;

  std::string gemm_weights() const;  // "float32", "bfloat16", "float16" or "int8"
  void set_gemm_weights(const std::string& name);
};

// Controls shared by the runs that use one RunOptions object. Each run gets a kiln::RunOptions
// of its own (its deadline is its own); setting `terminate` cancels every such run in flight
// and stops those started while it stays set, as onnxruntime's flag does.
class PyRunOptions {
 public:
  bool terminate() const;
  void set_terminate(bool value);
  double timeout = 0;  // seconds; 0: none

  // Binds one run's kiln::RunOptions to these controls for the run's duration.
  class Binding {
   public:
    Binding(PyRunOptions* controls, RunOptions& run);
    ~Binding();
    Binding(const Binding&) = delete;
    Binding& operator=(const Binding&) = delete;

   private:
    PyRunOptions* controls_;
    RunOptions& run_;
  };

 private:
  mutable std::mutex mutex_;
  bool terminate_ = false;
  std::set<RunOptions*> active_;
};

class PySession {
 public:
  // `source`: a path (str or os.PathLike) or the model's bytes.
  PySession(const py::object& source, const PySessionOptions& options,
            std::shared_ptr<Environment> environment);

  // Runs with `feed` (name -> array, list for sequences, None for an empty optional) and
  // returns the outputs named (all when None or empty) in that order. `donate` names inputs
  // the run may overwrite or extend in place. Releases the GIL while kiln runs.
  py::list run(const py::object& output_names, const py::dict& feed, PyRunOptions* run_options,
               const std::vector<std::string>& donate);

  // (name, shape, type) per graph input without a default / output / input with a default.
  py::list inputs() const;
  py::list outputs() const;
  py::list overridable_initializers() const;
  py::dict model_info() const;
  py::dict last_run_stats() const;
  py::dict load_stats() const;
  // The node events recorded since the last call (profiling), with start times since the
  // session was created; cleared.
  py::list take_profile();
  std::string path() const { return session_->path(); }
  std::string graph_text() const { return session_->graph_text(); }

 private:
  std::vector<size_t> output_indices(const py::object& names) const;
  void record(const RunStats& stats, uint64_t feed_copies, std::vector<NodeEvent> events,
              double start_us);

  py::object model_bytes_;  // a session made from bytes views them: they go after the session
  std::unique_ptr<Session> session_;
  bool profiling_ = false;
  std::chrono::steady_clock::time_point created_;
  mutable std::mutex mutex_;  // guards what follows, written by runs on any thread
  bool has_run_ = false;
  RunStats last_stats_;
  uint64_t last_feed_copies_ = 0;
  std::vector<NodeEvent> profile_;
};

}  // namespace kiln::python
