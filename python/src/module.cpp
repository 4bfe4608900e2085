// kiln._kiln: the extension module under the kiln package (kiln/__init__.py builds the
// onnxruntime-style API on it).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "arrays.h"
#include "errors.h"
#include "generate.h"
#include "session.h"

namespace py = pybind11;
using namespace kiln;
using namespace kiln::python;

namespace {

py::dict weights_cache_stats(const Environment& env) {
  const WeightsCacheStats s = env.weights_cache_stats();
  py::dict d;
  d["entries"] = s.entries;
  d["bytes"] = s.bytes;
  d["loaded_entries"] = s.loaded_entries;
  d["prepared_entries"] = s.prepared_entries;
  d["references"] = s.references;
  d["prepared_made"] = s.prepared_made;
  d["prepared_hits"] = s.prepared_hits;
  return d;
}

void bind_options(py::module_& m) {
  py::enum_<GraphOptimizationLevel>(m, "GraphOptimizationLevel",
                                    "onnxruntime's optimisation levels, mapped onto kiln's: "
                                    "DISABLE_ALL runs the graph as given, BASIC folds constants "
                                    "and removes pass-through nodes, the others also fuse.")
      .value("ORT_DISABLE_ALL", GraphOptimizationLevel::DisableAll)
      .value("ORT_ENABLE_BASIC", GraphOptimizationLevel::EnableBasic)
      .value("ORT_ENABLE_EXTENDED", GraphOptimizationLevel::EnableExtended)
      .value("ORT_ENABLE_LAYOUT", GraphOptimizationLevel::EnableLayout)
      .value("ORT_ENABLE_ALL", GraphOptimizationLevel::EnableAll);

  using O = PySessionOptions;
  py::class_<O>(m, "SessionOptions",
                "How a session is loaded and run (onnxruntime's names where "
                "onnxruntime has the setting, kiln's otherwise).")
      .def(py::init<>())
      .def_readwrite("intra_op_num_threads", &O::intra_op_num_threads,
                     "Threads of the session's kernels (0: one per core).")
      .def_readwrite("graph_optimization_level", &O::graph_optimization_level)
      .def_property(
          "optimized_model_filepath", [](const O& o) { return o.kiln.optimized_model_path; },
          [](O& o, const std::string& v) { o.kiln.optimized_model_path = v; },
          "Write the graph as the session runs it (after optimisation) to this ONNX file.")
      .def_property(
          "extra_outputs", [](const O& o) { return o.kiln.extra_outputs; },
          [](O& o, const std::vector<std::string>& v) { o.kiln.extra_outputs = v; },
          "Values of the graph returned after its outputs, by name (kept by the optimizer).")
      .def_property(
          "enable_profiling", [](const O& o) { return o.kiln.profile; },
          [](O& o, bool v) { o.kiln.profile = v; },
          "Record one event per node per run; InferenceSession.end_profiling() writes them.")
      .def_readwrite("profile_file_prefix", &O::profile_file_prefix)
      .def_property(
          "enable_cpu_mem_arena", [](const O& o) { return o.kiln.memory_arena; },
          [](O& o, bool v) { o.kiln.memory_arena = v; }, "onnxruntime's name for memory_arena.")
      .def_property(
          "memory_arena", [](const O& o) { return o.kiln.memory_arena; },
          [](O& o, bool v) { o.kiln.memory_arena = v; },
          "Serve each run's buffers from a liveness-planned activation arena.")
      .def_property(
          "arena_from_shapes", [](const O& o) { return o.kiln.arena_from_shapes; },
          [](O& o, bool v) { o.kiln.arena_from_shapes = v; },
          "Plan the arena from inferred shapes before the first run (off: from recorded runs).")
      .def_property(
          "reuse_input_buffers", [](const O& o) { return o.kiln.reuse_input_buffers; },
          [](O& o, bool v) { o.kiln.reuse_input_buffers = v; },
          "Donated inputs join the pool after their last read (their memory is overwritten).")
      .def_property(
          "release_weights_after_use", [](const O& o) { return o.kiln.release_weights_after_use; },
          [](O& o, bool v) { o.kiln.release_weights_after_use = v; },
          "Give mapped weights' pages back to the OS after each one's last use in a run.")
      .def_property(
          "share_weights", [](const O& o) { return o.kiln.share_weights; },
          [](O& o, bool v) { o.kiln.share_weights = v; },
          "Keep one copy of identical weights for the sessions of one Environment.")
      .def_property("gemm_weights", &O::gemm_weights, &O::set_gemm_weights,
                    "Precision of packed MatMul/Gemm weights: 'float32', 'bfloat16', 'float16', "
                    "'int8'.")
      .def_property(
          "denormals",
          [](const O& o) {
            return std::string(o.kiln.denormals == Denormals::Keep ? "keep" : "flush");
          },
          [](O& o, const std::string& v) {
            if (v != "flush" && v != "keep") {
              throw Error(ErrorKind::InvalidArgument,
                          "denormals must be 'flush' or 'keep', not '" + v + "'");
            }
            o.kiln.denormals = v == "keep" ? Denormals::Keep : Denormals::Flush;
          },
          "Denormal floats in runs: 'flush' (to zero; the default) or 'keep' (IEEE).")
      .def_property(
          "memory_limit", [](const O& o) { return o.kiln.memory_limit; },
          [](O& o, uint64_t v) { o.kiln.memory_limit = v; },
          "Most bytes a run's tensors may hold at once (0: no limit).")
      .def_property(
          "pool_keep_runs", [](const O& o) { return o.kiln.pool_keep_runs; },
          [](O& o, uint32_t v) { o.kiln.pool_keep_runs = v; },
          "Cached buffers no run took or returned during the last this many runs are freed "
          "at the end of each run (0: kept until the session ends).")
      .def_readwrite("log_severity_level", &O::log_severity_level, "Accepted; kiln writes no log.")
      .def_readwrite("log_verbosity_level", &O::log_verbosity_level,
                     "Accepted; kiln writes no log.")
      .def_readwrite("logid", &O::logid, "Accepted; kiln writes no log.");

  py::class_<PyRunOptions>(m, "RunOptions", "Per-run controls; one object may serve many runs.")
      .def(py::init<>())
      .def_property("terminate", &PyRunOptions::terminate, &PyRunOptions::set_terminate,
                    "Set: runs using these options stop with RunCancelledError (those in flight "
                    "before their next node, later ones at once) until it is cleared.")
      .def_readwrite("timeout", &PyRunOptions::timeout,
                     "Seconds after which each run using these options stops (0: none).");
}

void bind_session(py::module_& m) {
  py::class_<Environment, std::shared_ptr<Environment>>(
      m, "Environment",
      "A thread pool and weights cache that sessions share (SessionOptions.share_weights).")
      .def(py::init<int>(), py::arg("threads") = 0)
      .def_property_readonly("threads", &Environment::threads)
      .def("weights_cache_stats", &weights_cache_stats);

  py::class_<PySession>(m, "Session")
      .def(py::init<const py::object&, const PySessionOptions&, std::shared_ptr<Environment>>(),
           py::arg("source"), py::arg("options"), py::arg("environment"))
      .def("run", &PySession::run, py::arg("output_names"), py::arg("feed"),
           py::arg("run_options") = nullptr, py::arg("donate") = std::vector<std::string>())
      .def("inputs", &PySession::inputs)
      .def("outputs", &PySession::outputs)
      .def("overridable_initializers", &PySession::overridable_initializers)
      .def("model_info", &PySession::model_info)
      .def("last_run_stats", &PySession::last_run_stats)
      .def("load_stats", &PySession::load_stats)
      .def("take_profile", &PySession::take_profile)
      .def("graph_text", &PySession::graph_text)
      .def_property_readonly("path", &PySession::path);

  py::class_<StorageRef>(m, "Storage",
                         "The kiln memory a numpy array views (its base): kept alive as long "
                         "as any array viewing it.")
      .def_property_readonly("capacity",
                             [](const StorageRef& r) { return r.storage()->capacity(); })
      .def_property_readonly("writable",
                             [](const StorageRef& r) { return r.storage()->writable(); })
      .def("__repr__", [](const StorageRef& r) {
        return "<kiln.Storage of " + std::to_string(r.storage()->capacity()) + " bytes>";
      });
}

}  // namespace

PYBIND11_MODULE(_kiln, m) {
  m.doc() = "kiln's extension module; use the kiln package.";
  register_errors(m);
  bind_options(m);
  bind_session(m);
  bind_generate(m);
  m.def("with_capacity", &with_capacity, py::arg("shape"), py::arg("dtype"), py::arg("axis"),
        py::arg("capacity"));
  m.def("version", [] { return std::string(kiln::version()); });
  m.def("isa_level", [] { return std::string(kiln::isa_level()); });
}
