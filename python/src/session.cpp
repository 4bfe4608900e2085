#include "session.h"

#include <algorithm>
#include <utility>

#include "arrays.h"

namespace kiln::python {

GraphOptimization kiln_optimization(GraphOptimizationLevel level) {
  switch (level) {
    case GraphOptimizationLevel::DisableAll:
      return GraphOptimization::None;
    case GraphOptimizationLevel::EnableBasic:
      return GraphOptimization::Basic;
    case GraphOptimizationLevel::EnableExtended:
    case GraphOptimizationLevel::EnableLayout:
    case GraphOptimizationLevel::EnableAll:
      return GraphOptimization::All;
  }
  return GraphOptimization::All;
}

std::string PySessionOptions::gemm_weights() const {
  switch (kiln.gemm_weights) {
    case WeightPrecision::Float32:
      return "float32";
    case WeightPrecision::BFloat16:
      return "bfloat16";
    case WeightPrecision::Float16:
      return "float16";
    case WeightPrecision::Int8:
      return "int8";
  }
  return "float32";
}

void PySessionOptions::set_gemm_weights(const std::string& name) {
  if (name == "float32") {
    kiln.gemm_weights = WeightPrecision::Float32;
  } else if (name == "bfloat16") {
    kiln.gemm_weights = WeightPrecision::BFloat16;
  } else if (name == "float16") {
    kiln.gemm_weights = WeightPrecision::Float16;
  } else if (name == "int8") {
    kiln.gemm_weights = WeightPrecision::Int8;
  } else {
    throw Error(
        ErrorKind::InvalidArgument,
        "gemm_weights must be 'float32', 'bfloat16', 'float16' or 'int8', not '" + name + "'");
  }
}

bool PyRunOptions::terminate() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return terminate_;
}

void PyRunOptions::set_terminate(bool value) {
  std::lock_guard<std::mutex> lock(mutex_);
  terminate_ = value;
  if (value) {
    for (RunOptions* run : active_) run->cancel();
  }
}

PyRunOptions::Binding::Binding(PyRunOptions* controls, RunOptions& run)
    : controls_(controls), run_(run) {
  if (!controls_) return;
  std::lock_guard<std::mutex> lock(controls_->mutex_);
  if (controls_->terminate_) run_.cancel();
  if (controls_->timeout > 0) {
    run_.set_timeout(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(controls_->timeout)));
  }
  controls_->active_.insert(&run_);
}

PyRunOptions::Binding::~Binding() {
  if (!controls_) return;
  std::lock_guard<std::mutex> lock(controls_->mutex_);
  controls_->active_.erase(&run_);
}

namespace {

// onnxruntime's type strings: "tensor(float)", "seq(tensor(int64))", "optional(tensor(float))".
// They use ONNX's element type names, which are kiln's but for float and double.
std::string type_string(const IoInfo& io) {
  std::string element(data_type_name(io.dtype));
  if (io.dtype == DataType::Float) element = "float";
  if (io.dtype == DataType::Double) element = "double";
  const std::string tensor = "tensor(" + element + ")";
  switch (io.kind) {
    case Value::Kind::Sequence:
      return "seq(" + tensor + ")";
    case Value::Kind::Optional:
      return io.optional_kind == Value::Kind::Sequence ? "optional(seq(" + tensor + "))"
                                                       : "optional(" + tensor + ")";
    default:
      return tensor;
  }
}

// onnxruntime's shapes: an int per fixed dimension, the name of a symbolic one, None for one
// that is neither; [] when the model declares no shape.
py::list shape_list(const IoInfo& io) {
  py::list shape;
  for (size_t i = 0; i < io.shape.size(); ++i) {
    if (!io.dim_names[i].empty()) {
      shape.append(io.dim_names[i]);
    } else if (io.shape[i] >= 0) {
      shape.append(io.shape[i]);
    } else {
      shape.append(py::none());
    }
  }
  return shape;
}

py::list describe(const std::vector<IoInfo>& ios, bool defaults) {
  py::list out;
  for (const IoInfo& io : ios) {
    if (io.has_default != defaults) continue;
    out.append(py::make_tuple(io.name, shape_list(io), type_string(io)));
  }
  return out;
}

const IoInfo* find_input(const Session& s, const std::string& name) {
  for (const IoInfo& io : s.inputs()) {
    if (io.name == name) return &io;
  }
  return nullptr;
}

std::string output_names(const Session& s) {
  std::string names;
  for (const IoInfo& io : s.outputs()) names += (names.empty() ? "" : ", ") + io.name;
  return names;
}

// A donated input may be overwritten while the run reads its other inputs, so no other input
// may be in the same memory (a storage's whole extent, which a donated view shares with the
// storage it views).
void check_donations(const std::vector<NamedValue>& inputs, const std::vector<bool>& donated,
                     const std::string& file) {
  auto extent = [](const Value& v) {
    const std::byte* begin = v.is_tensor() && v.tensor().defined() && v.tensor().nbytes() > 0
                                 ? v.tensor().storage()->data()
                                 : nullptr;
    return std::pair(begin, begin ? begin + v.tensor().storage()->capacity() : nullptr);
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto [begin, end] = extent(inputs[i].value);
    if (!donated[i] || !begin) continue;
    for (size_t j = 0; j < inputs.size(); ++j) {
      const auto [other_begin, other_end] = extent(inputs[j].value);
      if (j == i || !other_begin || other_end <= begin || end <= other_begin) continue;
      throw Error(ErrorKind::InvalidArgument, "input '" + inputs[i].name +
                                                  "' is donated but input '" + inputs[j].name +
                                                  "' is in the same memory")
          .with_file(file);
    }
  }
}

// A name the caller gave (a feed's key, an output's name): TypeError when it is not a str,
// InvalidArgumentError when it has no UTF-8 form (lone surrogates).
std::string name_of(py::handle name, const std::string& what) {
  if (!py::isinstance<py::str>(name)) {
    throw py::type_error(what + " must be str, not " +
                         py::str(py::type::of(name).attr("__name__")).cast<std::string>());
  }
  py::ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(name.ptr(), &size);
  if (!utf8) {
    PyErr_Clear();
    throw Error(ErrorKind::InvalidArgument,
                "the name " + py::repr(name).cast<std::string>() + " has no UTF-8 form");
  }
  return std::string(utf8, static_cast<size_t>(size));
}

// One input converted for the run; what is wrong with its value is an InvalidArgumentError
// naming the input (numpy's own complaint, as for ragged lists, included).
Value convert_input(Feed& converter, const py::object& value, const std::string& name, bool donate,
                    const Session& session) {
  const auto named = [&](ErrorKind kind, const std::string& message) {
    return Error(kind, "input '" + name + "': " + message).with_file(session.path());
  };
  try {
    return converter.convert(value, find_input(session, name), donate);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::InvalidArgument && e.kind() != ErrorKind::Unsupported) throw;
    throw named(e.kind(), e.message());
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ValueError) && !e.matches(PyExc_TypeError) &&
        !e.matches(PyExc_OverflowError)) {
      throw;
    }
    throw named(ErrorKind::InvalidArgument,
                "not an array kiln can read: " + py::str(e.value()).cast<std::string>());
  }
}

// Releases the Python references that storages freed without the GIL left behind.
struct ReleasePending {
  ~ReleasePending() { release_pending_references(); }
};

}  // namespace

PySession::PySession(const py::object& source, const PySessionOptions& options,
                     std::shared_ptr<Environment> environment)
    : created_(std::chrono::steady_clock::now()) {
  SessionOptions so = options.kiln;
  so.environment = std::move(environment);
  so.optimization = kiln_optimization(options.graph_optimization_level);
  profiling_ = so.profile;
  if (py::isinstance<py::bytes>(source)) {
    model_bytes_ = source;
    char* data = nullptr;
    py::ssize_t size = 0;
    if (PyBytes_AsStringAndSize(source.ptr(), &data, &size) != 0) throw py::error_already_set();
    py::gil_scoped_release unlocked;
    session_ = std::make_unique<Session>(Session::from_memory(data, static_cast<size_t>(size), so));
    return;
  }
  const auto path = py::module_::import("os").attr("fspath")(source).cast<std::string>();
  py::gil_scoped_release unlocked;
  session_ = std::make_unique<Session>(path, so);
}

std::vector<size_t> PySession::output_indices(const py::object& names) const {
  const std::vector<IoInfo>& outputs = session_->outputs();
  std::vector<size_t> indices;
  if (names.is_none() || py::len(names) == 0) {
    for (size_t i = 0; i < outputs.size(); ++i) indices.push_back(i);
    return indices;
  }
  for (py::handle n : names) {
    const std::string name = name_of(n, "output names");
    auto it = std::find_if(outputs.begin(), outputs.end(),
                           [&](const IoInfo& io) { return io.name == name; });
    if (it == outputs.end()) {
      throw Error(ErrorKind::InvalidArgument,
                  "unknown output '" + name + "' (model outputs: " + output_names(*session_) + ")")
          .with_file(session_->path());
    }
    indices.push_back(static_cast<size_t>(it - outputs.begin()));
  }
  return indices;
}

py::list PySession::run(const py::object& output_names, const py::dict& feed,
                        PyRunOptions* run_options, const std::vector<std::string>& donate) {
  const std::vector<size_t> wanted = output_indices(output_names);
  for (const std::string& name : donate) {
    if (!feed.contains(name)) {
      throw Error(ErrorKind::InvalidArgument,
                  "donate names '" + name + "', which is not in the input feed");
    }
  }
  ReleasePending release_pending;
  // The feed's items, held: converting a value may run Python code (an object's __array__)
  // that changes the dict, which must not pull keys or values from under the loop.
  std::vector<std::pair<std::string, py::object>> items;
  for (auto [key, value] : feed) {
    items.emplace_back(name_of(key, "input_feed keys"), py::reinterpret_borrow<py::object>(value));
  }
  Feed converter;
  std::vector<NamedValue> inputs;
  std::vector<bool> donated;
  for (const auto& [name, value] : items) {
    donated.push_back(std::find(donate.begin(), donate.end(), name) != donate.end());
    inputs.push_back({name, convert_input(converter, value, name, donated.back(), *session_)});
  }
  if (!donate.empty()) check_donations(inputs, donated, session_->path());
  RunStats stats;
  std::vector<NodeEvent> events;
  std::vector<NamedValue> outputs;
  double start_us = 0;
  {
    RunOptions per_run;
    PyRunOptions::Binding binding(run_options, per_run);
    py::gil_scoped_release unlocked;
    start_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - created_)
            .count();
    outputs = session_->run(std::move(inputs), per_run, &stats, profiling_ ? &events : nullptr);
  }
  record(stats, converter.bytes_copied(), std::move(events), start_us);
  const auto* bytes =
      model_bytes_ ? reinterpret_cast<const void*>(PyBytes_AS_STRING(model_bytes_.ptr())) : nullptr;
  const size_t size = model_bytes_ ? static_cast<size_t>(PyBytes_GET_SIZE(model_bytes_.ptr())) : 0;
  py::list result;
  for (size_t i : wanted) {
    result.append(to_python(outputs[i].value, converter, model_bytes_, bytes, size));
  }
  return result;
}

void PySession::record(const RunStats& stats, uint64_t feed_copies, std::vector<NodeEvent> events,
                       double start_us) {
  std::lock_guard<std::mutex> lock(mutex_);
  has_run_ = true;
  last_stats_ = stats;
  last_feed_copies_ = feed_copies;
  for (NodeEvent& e : events) {
    e.start_us += start_us;
    profile_.push_back(std::move(e));
  }
}

py::list PySession::inputs() const {
  return describe(session_->inputs(), false);
}
py::list PySession::outputs() const {
  return describe(session_->outputs(), false);
}
py::list PySession::overridable_initializers() const {
  return describe(session_->inputs(), true);
}

py::dict PySession::model_info() const {
  const ModelInfo info = session_->model_info();
  py::dict d;
  d["ir_version"] = info.ir_version;
  d["producer_name"] = info.producer_name;
  d["producer_version"] = info.producer_version;
  d["domain"] = info.domain;
  d["description"] = info.description;
  d["graph_name"] = info.graph_name;
  d["graph_description"] = info.graph_description;
  d["model_version"] =
      info.has_model_version ? py::object(py::int_(info.model_version)) : py::object(py::none());
  d["metadata"] = info.metadata;
  return d;
}

py::dict PySession::last_run_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  py::dict d;
  if (!has_run_) return d;
  const RunStats& s = last_stats_;
  d["bytes_copied"] = s.bytes_copied + last_feed_copies_;
  d["bytes_copied_inputs"] = last_feed_copies_;
  d["bytes_copied_contiguous"] = s.bytes_copied_contiguous;
  d["bytes_copied_concat"] = s.bytes_copied_concat;
  d["bytes_copied_capture"] = s.bytes_copied_capture;
  d["bytes_copied_kernels"] = s.bytes_copied_kernels;
  d["allocations"] = s.allocations;
  d["bytes_allocated"] = s.bytes_allocated;
  d["pool_reuses"] = s.pool_reuses;
  d["peak_bytes_in_use"] = s.peak_bytes_in_use;
  d["in_place_ops"] = s.in_place_ops;
  d["arena_bytes"] = s.arena_bytes;
  d["arena_lower_bound"] = s.arena_lower_bound;
  d["arena_capacity"] = s.arena_capacity;
  d["pool_bytes_cached"] = s.pool_bytes_cached;
  d["pool_bytes_freed"] = s.pool_bytes_freed;
  d["arena_served"] = s.arena_served;
  d["arena_missed"] = s.arena_missed;
  d["arena_from_shapes"] = s.arena_from_shapes;
  d["nodes_run"] = s.nodes_run;
  d["weight_release_calls"] = s.weight_pages.calls;
  d["weight_bytes_released"] = s.weight_pages.bytes_released;
  d["weight_release_failures"] = s.weight_pages.failures;
  d["weight_release_error"] = s.weight_release_error;
  return d;
}

py::dict PySession::load_stats() const {
  const LoadStats& s = session_->load_stats();
  py::dict d;
  d["weights_bytes"] = s.weights_bytes;
  d["weights_mapped_bytes"] = s.weights_mapped_bytes;
  d["weights_copied_bytes"] = s.weights_copied_bytes;
  d["weights_copied_count"] = s.weights_copied_count;
  d["weights_source_bytes_released"] = s.weights_source_bytes_released;
  d["weights_shared_count"] = s.weights_shared_count;
  d["weights_shared_bytes"] = s.weights_shared_bytes;
  d["weights_prepared_count"] = s.weights_prepared_count;
  d["weights_prepared_bytes"] = s.weights_prepared_bytes;
  d["weights_prepared_shared"] = s.weights_prepared_shared;
  d["weights_original_released_bytes"] = s.weights_original_released_bytes;
  d["folded_nodes"] = s.folded_nodes;
  d["folded_bytes"] = s.folded_bytes;
  d["folded_shared_bytes"] = s.folded_shared_bytes;
  d["nodes_loaded"] = s.nodes_loaded;
  d["nodes_planned"] = s.nodes_planned;
  d["identities_removed"] = s.identities_removed;
  d["fusions"] = s.fusions;
  return d;
}

py::list PySession::take_profile() {
  std::vector<NodeEvent> events;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events.swap(profile_);
  }
  py::list out;
  for (const NodeEvent& e : events) {
    py::dict d;
    d["name"] = e.name;
    d["op_type"] = e.op_type;
    d["start_us"] = e.start_us;
    d["duration_us"] = e.duration_us;
    d["input_shapes"] = e.input_shapes;
    d["output_shapes"] = e.output_shapes;
    d["depth"] = e.depth;
    d["bytes_copied"] = e.bytes_copied;
    out.append(d);
  }
  return out;
}

}  // namespace kiln::python
