#include "kiln/session.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "engine/ir/graph.h"
#include "engine/passes/passes.h"
#include "engine/plan/buffer_prediction.h"
#include "engine/plan/plan.h"
#include "engine/plan/shape_inference.h"
#include "engine/runtime/arena_state.h"
#include "engine/runtime/buffer_pool.h"
#include "engine/runtime/executor.h"
#include "engine/runtime/scratch_hold.h"
#include "engine/runtime/session_internal.h"
#include "engine/runtime/weight_release.h"
#include "engine/util/float_mode.h"
#include "kiln/error.h"
#include "proto/loader.h"
#include "proto/weights_cache.h"

namespace kiln {

namespace {

// SessionOptions::extra_outputs: values of the main graph returned after the declared outputs.
void add_extra_outputs(ir::Graph& g, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const ir::ValueId id = g.find(name);
    if (id == ir::kNoValue || g.value(id).origin == ir::ValueOrigin::Capture)
      throw Error(ErrorKind::InvalidArgument,
                  "extra output '" + name + "': the main graph has no value of that name");
    if (std::find(g.outputs.begin(), g.outputs.end(), id) != g.outputs.end())
      throw Error(ErrorKind::InvalidArgument,
                  "extra output '" + name + "': already an output of the model");
    g.outputs.push_back(id);
  }
}

IoInfo io_info(const ir::ValueInfo& v) {
  IoInfo io;
  io.name = v.name;
  io.has_default = v.constant.defined();
  io.kind = v.type.kind == Value::Kind::None ? Value::Kind::Tensor : v.type.kind;
  io.dtype = v.type.elem;
  if (v.type.kind == Value::Kind::Optional && v.type.inner) io.optional_kind = v.type.inner->kind;
  // The shape of the tensor, or of the tensor an optional holds.
  const ir::TypeInfo* tensor = v.type.kind == Value::Kind::Tensor ? &v.type : nullptr;
  if (io.optional_kind == Value::Kind::Tensor) tensor = v.type.inner.get();
  if (tensor && tensor->shape) {
    io.has_shape = true;
    for (const ir::Dim& d : *tensor->shape) {
      io.shape.push_back(d.value >= 0 && d.param.empty() ? d.value : -1);
      io.dim_names.push_back(d.param);
    }
  }
  return io;
}

// Identifies an input allocated with allocate_input: its name, element type and shape.
std::string input_key(const std::string& name, DataType dtype, const Shape& shape) {
  std::string k = name + ":" + std::string(data_type_name(dtype)) + "[";
  for (size_t i = 0; i < shape.size(); ++i) k += (i ? "," : "") + std::to_string(shape[i]);
  return k + "];";
}

std::string names_of(const std::vector<IoInfo>& ios) {
  std::string s;
  for (const auto& io : ios) s += (s.empty() ? "" : ", ") + io.name;
  return s;
}

}  // namespace

std::string IoInfo::describe() const {
  std::string s = name + ": ";
  if (kind == Value::Kind::Sequence) s += "sequence<";
  if (kind == Value::Kind::Optional) s += "optional<";
  s += std::string(data_type_name(dtype));
  if (has_shape) {
    s += "[";
    for (size_t i = 0; i < shape.size(); ++i) {
      if (i) s += ",";
      if (!dim_names[i].empty()) {
        s += dim_names[i];
      } else if (shape[i] >= 0) {
        s += std::to_string(shape[i]);
      } else {
        s += "?";
      }
    }
    s += "]";
  }
  if (kind != Value::Kind::Tensor) s += ">";
  return s;
}

namespace {

// Whether every node of `plan` and of its nested plans has a shape rule, and those running
// nested graphs a placement rule that states their runs.
bool plannable_from_shapes(const plan::GraphPlan& plan) {
  for (const plan::Step& step : plan.steps) {
    if (!plan::shape_inference_covers(*step.node)) return false;
    if (!step.subgraphs.empty() && !step.op->place) return false;
    for (const auto& sub : step.subgraphs)
      if (!plannable_from_shapes(*sub)) return false;
  }
  return true;
}

// Prepared forms through the weights cache, counting which weights' readers all use one.
// Nodes of `g` and of every graph nested in it.
uint64_t count_nodes(const ir::Graph& g) {
  uint64_t n = g.nodes.size();
  for (const ir::Node& node : g.nodes) {
    for (const ir::Attribute& a : node.attributes) {
      if (a.g) n += count_nodes(*a.g);
      for (const auto& sub : a.graphs) n += count_nodes(*sub);
    }
  }
  return n;
}

class Preparer final : public ops::WeightPreparer {
 public:
  Preparer(detail::WeightsCache& cache, LoadStats& stats, WeightPrecision gemm_weights)
      : cache_(cache), stats_(stats), gemm_weights_(gemm_weights) {}

  WeightPrecision gemm_weights() const override { return gemm_weights_; }

  std::shared_ptr<const Tensor> prepare(const ir::Graph& graph, ir::ValueId weight,
                                        const Tensor& constant, const std::string& packing,
                                        const std::function<Tensor(const Tensor&)>& make) override {
    bool made = false;
    auto lease = cache_.prepared(constant, packing, make, &made);
    if (made) {
      ++stats_.weights_prepared_count;
      stats_.weights_prepared_bytes += lease->tensor.nbytes();
    } else {
      ++stats_.weights_prepared_shared;
    }
    ++prepared_reads_[{&graph, weight}];
    return {lease, &lease->tensor};
  }

  // Gives back the pages of mapped weights that no reader of `plan` (nested plans
  // included) reads in their original form.
  void release_unread_originals(const plan::GraphPlan& plan) {
    for (const auto& [key, reads] : prepared_reads_) {
      if (key.first != plan.graph) continue;
      const ir::ValueInfo& v = plan.graph->value(key.second);
      if (reads != plan.use_counts[static_cast<size_t>(key.second)]) continue;
      if (!released_.insert(key).second || !pages_releasable(v.constant)) continue;
      const PageRelease r = release_pages(v.constant);
      if (r.status == PageRelease::Status::Released)
        stats_.weights_original_released_bytes += r.bytes;
    }
    for (const plan::Step& step : plan.steps) {
      for (const auto& sub : step.subgraphs) release_unread_originals(*sub);
    }
  }

 private:
  detail::WeightsCache& cache_;
  LoadStats& stats_;
  WeightPrecision gemm_weights_;
  std::map<std::pair<const ir::Graph*, ir::ValueId>, int32_t> prepared_reads_;
  std::set<std::pair<const ir::Graph*, ir::ValueId>> released_;
};

}  // namespace

struct Session::Impl {
  // The environment and the weights cache come first: loading shares weights through it.
  std::shared_ptr<Environment> env;
  std::shared_ptr<detail::WeightsCache> private_cache;  // share_weights off
  detail::WeightsCache* cache = nullptr;
  std::vector<detail::WeightsCache::Lease> leases;  // loaded weights this session uses
  std::unique_ptr<Preparer> preparer;
  ir::Model model;
  std::unique_ptr<plan::GraphPlan> plan;
  BufferPool pool;
  std::vector<IoInfo> inputs, outputs;
  std::vector<std::string> input_names;  // of `inputs`
  LoadStats load_stats;
  bool profile = false;
  // Guards what runs share below: the free scratch and the last run's counters and profile
  // (`arena` guards its own state). Never held while a run executes.
  std::mutex mutex;
  RunStats run_stats;             // of the last run to finish
  std::vector<NodeEvent> events;  // its profile
  // The executor's frame buffers, kept warm between runs: one per run in progress, taken at
  // its start and given back at its end, so one thread running the session reuses one.
  std::vector<std::unique_ptr<ExecutorScratch>> free_scratch;
  // release_weights_after_use counts the readers of weights per run: such runs take turns.
  std::mutex weight_release_mutex;
  bool reuse_inputs = false;
  bool flush_denormals = true;  // SessionOptions::denormals
  bool count_denormals = false;
  std::unique_ptr<detail::ArenaState> arena;  // made once the plan is known

  // The pool requests a run on `ordered` will make, predicted before the run from the shapes
  // inferred for its inputs and the values of its small integer and bool inputs (an If's
  // condition, a trip count, a Reshape target given as inputs), as the shape rules read them
  // (arena planning), or nullopt when some cannot be known. Such values are part of the
  // plan's key: it holds for runs with those values.
  std::optional<detail::ArenaState::Predicted> predict_buffers(
      const std::vector<Value>& ordered) const {
    const ir::Graph& g = *model.graph;
    std::string values;
    for (size_t i = 0; i < g.inputs.size() && i < ordered.size(); ++i) {
      if (!ordered[i].is_tensor() || !ordered[i].tensor().defined()) continue;
      const ops::ValueFacts v = plan::inferred_from(ordered[i].tensor());
      if (!v.has_data) continue;
      values += g.value(g.inputs[i]).name + "=";
      for (int64_t x : v.data) values += std::to_string(x) + ",";
      values += ";";
    }
    if (auto buffers = predicted_requests(ordered)) return {{std::move(*buffers), values}};
    return std::nullopt;
  }

  std::optional<std::vector<detail::RecordedBuffer>> predicted_requests(
      const std::vector<Value>& ordered) const {
    const ir::Graph& g = *model.graph;
    std::vector<ops::ValueFacts> given(g.inputs.size());
    std::vector<bool> owned(g.inputs.size(), false);
    for (size_t i = 0; i < g.inputs.size() && i < ordered.size(); ++i) {
      if (!ordered[i].is_tensor() || !ordered[i].tensor().defined()) continue;
      // Given by move and held by nothing else: kernels may write over it (the executor's
      // can_overwrite), so the plan must say so.
      const Tensor& t = ordered[i].tensor();
      owned[i] = t.storage()->writable() && t.storage().use_count() == 1;
      given[i] = plan::inferred_from(t);
    }
    std::vector<int32_t> order;
    for (const plan::Step& step : plan->steps) order.push_back(step.node_index);
    const plan::ShapeInference inferred = plan::infer_shapes(g, order, given);
    plan::BufferPrediction predicted;
    if (inferred.first_unknown.empty())
      predicted = plan::predict_buffers(*plan, inferred.values, owned, env->threads());
    if (!predicted.complete) return std::nullopt;
    std::vector<detail::RecordedBuffer> buffers;
    for (const plan::PredictedBuffer& b : predicted.buffers)
      buffers.push_back({b.bytes, b.first, b.last});
    return buffers;
  }
  std::unique_ptr<WeightRelease> weight_release;  // release_weights_after_use only
  std::vector<ir::ValueId> hollow;                // main-graph hollow constants
  size_t hollow_missing = 0;                      // of which still without data

  // Before loading: the environment, and the cache weights are shared through.
  proto::LoadOptions begin(const SessionOptions& options) {
    env = options.environment ? options.environment : std::make_shared<Environment>(0);
    if (options.share_weights) {
      cache = &detail::weights_cache(*env);
    } else {
      private_cache = std::make_shared<detail::WeightsCache>();
      cache = private_cache.get();
    }
    preparer = std::make_unique<Preparer>(*cache, load_stats, options.gemm_weights);
    return {.defer_missing_external = options.defer_missing_weights,
            .weights_cache = cache,
            .leases = &leases};
  }

  // Folded constants go through the weights cache like loaded weights, so sessions of one
  // Environment that fold the same values keep one copy.
  std::function<Tensor(Tensor)> shared_folded() {
    return [this](Tensor t) {
      const size_t n = t.nbytes();
      if (n == 0 || t.dtype() == DataType::String) return t;
      const std::byte* bytes = t.raw_data();
      const uint64_t fingerprint = detail::weight_fingerprint(t.dtype(), t.shape(), bytes, n);
      auto equal = [&](const std::byte* cached) { return std::memcmp(cached, bytes, n) == 0; };
      if (auto lease = cache->find_loaded(fingerprint, t.dtype(), t.shape(), n, equal)) {
        load_stats.folded_shared_bytes += n;
        leases.push_back(lease);
        return lease->tensor;
      }
      t.storage()->set_read_only();
      auto lease = cache->add_loaded(fingerprint, t);
      leases.push_back(lease);
      return lease->tensor;
    };
  }

  void prepare(SessionOptions options) {
    if (!cache) begin(options);
    flush_denormals = options.denormals == Denormals::Flush;
    count_denormals = options.count_denormals;
    // Constant folding runs kernels: in the mode the runs will have.
    const fp::ModeScope float_mode(fp::mode_with_flush(flush_denormals));
    try {
      load_stats.nodes_loaded = count_nodes(*model.graph);
      plan::check_arities(*model.graph);
      add_extra_outputs(*model.graph, options.extra_outputs);
      passes::fold_constant_nodes(*model.graph);
      if (options.optimization != GraphOptimization::None) {
        const uint64_t fold_limit = options.memory_limit > 0
                                        ? std::min(options.memory_limit, passes::kMaxFoldedBytes)
                                        : passes::kMaxFoldedBytes;
        const passes::FoldStats folded =
            passes::fold_constants(*model.graph, shared_folded(), fold_limit);
        load_stats.folded_nodes += static_cast<uint64_t>(folded.nodes);
        load_stats.folded_bytes += folded.bytes;
        const passes::OptimizeStats opt = passes::optimize(*model.graph, options.optimization);
        load_stats.identities_removed += static_cast<uint64_t>(opt.identities_removed);
        load_stats.fusions += static_cast<uint64_t>(opt.fused);
      }
      load_stats.nodes_planned = count_nodes(*model.graph);
      if (!options.optimized_model_path.empty())
        proto::save_model(model, options.optimized_model_path);
      plan = plan::build_plan(*model.graph, preparer.get());
    } catch (Error& e) {
      e.with_file(model.path);
      throw;
    }
    preparer->release_unread_originals(*plan);
    profile = options.profile;
    pool.core().memory_limit = options.memory_limit;
    pool.core().set_keep_runs(options.pool_keep_runs);
    // Plan the arena from inferred shapes (SessionOptions::arena_from_shapes) when shape
    // inference covers every node, nested graphs' included, and every node running nested
    // graphs states its runs (a placement rule).
    const bool shape_planning =
        options.memory_arena && options.arena_from_shapes && plannable_from_shapes(*plan);
    detail::ArenaState::Predict predict;
    if (shape_planning)
      predict = [this](const std::vector<Value>& in) { return predict_buffers(in); };
    arena = std::make_unique<detail::ArenaState>(
        pool,
        detail::ArenaState::Options{.enabled = options.memory_arena,
                                    .inputs_in_arena = options.inputs_in_arena},
        std::move(predict));
    reuse_inputs = options.reuse_input_buffers;
    const ir::Graph& g = *model.graph;
    for (ir::ValueId id : g.inputs) inputs.push_back(io_info(g.value(id)));
    for (const IoInfo& io : inputs) input_names.push_back(io.name);
    for (ir::ValueId id : g.outputs) outputs.push_back(io_info(g.value(id)));
    for (ir::ValueId id : g.initializers) {
      if (!g.value(id).hollow) continue;
      const IoInfo io = io_info(g.value(id));
      const bool fixed = io.has_shape && std::none_of(io.shape.begin(), io.shape.end(),
                                                      [](int64_t d) { return d < 0; });
      if (!fixed || io.dtype == DataType::Undefined || io.dtype == DataType::String) {
        throw Error(ErrorKind::InvalidModel, "hollow constant '" + io.describe() +
                                                 "' needs a fixed shape and a numeric type")
            .with_file(model.path);
      }
      hollow.push_back(id);
    }
    for (ir::ValueId id : hollow) hollow_missing += g.value(id).constant.defined() ? 0 : 1;
    if (options.release_weights_after_use) weight_release = std::make_unique<WeightRelease>(g);
  }

  void recreate_kernels_reading(ir::ValueId id) {
    const ir::Graph& g = *model.graph;
    for (plan::Step& step : plan->steps) {
      const auto& in = step.node->inputs;
      if (std::find(in.begin(), in.end(), id) == in.end()) continue;
      step.kernel = step.op->create(
          ops::NodeInfo(g, *step.node, *step.op, preparer.get(), &plan->shape_hints));
    }
    preparer->release_unread_originals(*plan);
  }

  void check_constants_given() const {
    if (hollow_missing == 0) return;
    const ir::Graph& g = *model.graph;
    std::string names;
    size_t listed = 0;
    for (ir::ValueId id : hollow) {
      if (g.value(id).constant.defined()) continue;
      if (listed == 8) {
        names += ", and " + std::to_string(hollow_missing - listed) + " more";
        break;
      }
      names += (listed++ ? ", " : "") + io_info(g.value(id)).describe();
    }
    throw Error(ErrorKind::InvalidArgument,
                std::to_string(hollow_missing) +
                    " constant(s) have no data yet (give them with Session::set_constant "
                    "before running): " +
                    names)
        .with_file(model.path);
  }

  // A run (Session::run), in the vectors of its executor scratch: the caller's inputs moved
  // into `scratch.inputs` in graph-input order, checked; the graph run on them, leaving its
  // outputs in `scratch.results`; these moved into `out`, named and checked against the
  // declared types (names already in place are kept).
  void run(std::span<NamedValue> named, std::vector<NamedValue>& out, const RunOptions& options,
           RunStats* stats_out, std::vector<NodeEvent>* profile_out);
  void bind_inputs(std::span<NamedValue> named, ExecutorScratch& scratch) const;
  void execute(ExecutorScratch& scratch, const RunOptions& options, detail::ArenaRun& arena_run,
               RunStats& run_stats, std::vector<NodeEvent>& events);
  void hand_outputs(std::vector<Value>& results, std::vector<NamedValue>& out) const;
  // After a run's buffers went back to the pool: the pool's end-of-run sweep, into its stats.
  void end_run(RunStats& run_stats) {
    const detail::PoolCore::Sweep sweep = pool.core().end_run();
    run_stats.pool_bytes_cached = sweep.bytes_cached;
    run_stats.arena_capacity = sweep.arena_capacity;
    run_stats.pool_bytes_freed = sweep.bytes_freed;
  }

  void check_input(const IoInfo& io, const Value& v) const {
    auto fail = [&](const std::string& why) {
      throw Error(ErrorKind::InvalidArgument, "input '" + io.name + "': " + why +
                                                  " (model expects " + io.describe() + ", got " +
                                                  v.describe() + ")")
          .with_file(model.path);
    };
    if (io.kind == Value::Kind::Tensor && !v.is_tensor()) fail("expected a tensor");
    if (io.kind == Value::Kind::Sequence && !v.is_sequence()) fail("expected a sequence");
    if (io.kind == Value::Kind::Optional && !v.is_optional()) fail("expected an optional");
    if (!v.is_tensor()) return;
    const Tensor& t = v.tensor();
    if (!t.defined()) fail("undefined tensor");
    if (io.dtype != DataType::Undefined && t.dtype() != io.dtype) fail("wrong element type");
    if (io.has_shape) {
      if (t.rank() != io.shape.size()) fail("wrong rank");
      for (size_t i = 0; i < io.shape.size(); ++i) {
        if (io.shape[i] >= 0 && t.dim(i) != io.shape[i]) {
          fail("dimension " + std::to_string(i) + " must be " + std::to_string(io.shape[i]));
        }
      }
    }
  }
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Session::Session(const std::string& path, SessionOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->model = proto::load_model_file(path, impl_->load_stats, impl_->begin(options));
  impl_->prepare(std::move(options));
}

Session Session::from_memory(const void* data, size_t size, SessionOptions options,
                             const std::string& base_dir) {
  auto impl = std::make_unique<Impl>();
  impl->model =
      proto::load_model_buffer(data, size, base_dir, impl->load_stats, impl->begin(options));
  impl->prepare(std::move(options));
  return Session(std::move(impl));
}

Session session_from_model(ir::Model model, SessionOptions options) {
  auto impl = std::make_unique<Session::Impl>();
  if (model.path.empty()) model.path = "<built in code>";
  try {
    ir::validate(model);
  } catch (Error& e) {
    e.with_file(model.path);
    throw;
  }
  impl->model = std::move(model);
  impl->prepare(std::move(options));
  return Session(std::move(impl));
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

const std::vector<IoInfo>& Session::inputs() const {
  return impl_->inputs;
}
const std::vector<IoInfo>& Session::outputs() const {
  return impl_->outputs;
}
const std::string& Session::path() const {
  return impl_->model.path;
}
namespace {

void graph_text(const ir::Graph& g, int depth, std::string& out) {
  const std::string indent(static_cast<size_t>(depth) * 2, ' ');
  auto names = [&](const std::vector<ir::ValueId>& ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) s += ", ";
      s += ids[i] == ir::kNoValue ? "" : g.value(ids[i]).name;
    }
    return s;
  };
  for (int32_t ni : ir::topological_order(g)) {
    const ir::Node& node = g.nodes[static_cast<size_t>(ni)];
    out += indent + node.name + ": " + (node.domain.empty() ? "" : node.domain + ".") +
           node.op_type + "(" + names(node.inputs) + ") -> " + names(node.outputs) + "\n";
    for (const ir::Attribute& a : node.attributes) {
      if (a.g) {
        out += indent + "  " + a.name + ":\n";
        graph_text(*a.g, depth + 2, out);
      }
      for (const auto& sub : a.graphs) graph_text(*sub, depth + 2, out);
    }
  }
}

}  // namespace

std::string Session::graph_text() const {
  std::string out;
  kiln::graph_text(*impl_->model.graph, 0, out);
  return out;
}

std::map<std::string, std::string> Session::metadata() const {
  return impl_->model.metadata;
}
ModelInfo Session::model_info() const {
  const ir::Model& m = impl_->model;
  ModelInfo info;
  info.ir_version = m.ir_version;
  info.producer_name = m.producer_name;
  info.producer_version = m.producer_version;
  info.domain = m.domain;
  info.description = m.doc_string;
  info.graph_name = m.graph->name;
  info.graph_description = m.graph_doc_string;
  info.model_version = m.model_version;
  info.has_model_version = m.has_model_version;
  info.metadata = m.metadata;
  return info;
}
int64_t Session::opset(const std::string& domain) const {
  auto it = impl_->model.opsets.find(domain);
  return it == impl_->model.opsets.end() ? 0 : it->second;
}
void Session::set_constant(const std::string& name, const void* data, size_t size) {
  Impl& s = *impl_;
  ir::Graph& g = *s.model.graph;
  auto fail = [&](const std::string& why) {
    throw Error(ErrorKind::InvalidArgument, "set_constant('" + name + "'): " + why)
        .with_file(s.model.path);
  };
  const ir::ValueId id = g.find(name);
  if (id == ir::kNoValue) fail("the model has no value of that name");
  ir::ValueInfo& v = g.value(id);
  if (!v.hollow) {
    fail(v.origin == ir::ValueOrigin::Initializer
             ? "not a hollow constant: its data was loaded with the model"
             : "not a hollow constant but a graph input or a computed value");
  }
  const IoInfo io = io_info(v);
  if (v.constant.defined()) fail("its data was already given");
  const Shape shape(io.shape.begin(), io.shape.end());
  const size_t expected = storage_bytes(io.dtype, checked_numel(shape));
  if (size != expected) {
    fail(io.describe() + " takes " + std::to_string(expected) + " bytes, given " +
         std::to_string(size));
  }
  if (size > 0 && !data) fail("no data given");
  const auto* bytes = static_cast<const std::byte*>(data);
  const uint64_t fingerprint =
      size > 0 ? detail::weight_fingerprint(io.dtype, shape, bytes, size) : 0;
  detail::WeightsCache::Lease lease;
  if (size > 0) {
    lease = s.cache->find_loaded(fingerprint, io.dtype, shape, size, [&](const std::byte* c) {
      return std::memcmp(c, bytes, size) == 0;
    });
  }
  s.load_stats.weights_bytes += size;
  if (lease) {
    s.load_stats.weights_shared_bytes += size;
    ++s.load_stats.weights_shared_count;
  } else {
    // One copy, straight into the buffer the weight keeps for the session's lifetime.
    std::shared_ptr<Storage> storage = Storage::heap_uninitialized(size);
    if (size > 0) std::memcpy(storage->data(), data, size);
    storage->set_read_only();
    const Tensor t(io.dtype, shape, std::move(storage));
    if (size > 0) lease = s.cache->add_loaded(fingerprint, t);
    v.constant = t;
    s.load_stats.weights_copied_bytes += size;
    ++s.load_stats.weights_copied_count;
  }
  if (lease) {
    v.constant = lease->tensor;
    s.leases.push_back(std::move(lease));
  }
  --s.hollow_missing;
  // Kernels reading the constant are made again, now that they can prepare its final form.
  s.recreate_kernels_reading(id);
}

std::vector<IoInfo> Session::missing_constants() const {
  std::vector<IoInfo> out;
  const ir::Graph& g = *impl_->model.graph;
  for (ir::ValueId id : impl_->hollow) {
    if (!g.value(id).constant.defined()) out.push_back(io_info(g.value(id)));
  }
  return out;
}

const RunStats& Session::last_run_stats() const {
  return impl_->run_stats;
}
const LoadStats& Session::load_stats() const {
  return impl_->load_stats;
}
const std::vector<NodeEvent>& Session::last_profile() const {
  return impl_->events;
}

Tensor Session::allocate_input(const std::string& name, DataType dtype, const Shape& shape) {
  Impl& s = *impl_;
  auto fail = [&](const std::string& why) {
    throw Error(ErrorKind::InvalidArgument, "allocate_input('" + name + "'): " + why)
        .with_file(s.model.path);
  };
  auto it = std::find_if(s.inputs.begin(), s.inputs.end(),
                         [&](const IoInfo& io) { return io.name == name; });
  if (it == s.inputs.end()) fail("not a graph input (model inputs: " + names_of(s.inputs) + ")");
  const IoInfo& io = *it;
  const std::string declared = " (model expects " + io.describe() + ")";
  if (io.kind != Value::Kind::Tensor) fail("not a tensor input" + declared);
  if (dtype == DataType::Undefined) fail("undefined element type");
  if (io.dtype != DataType::Undefined && dtype != io.dtype) {
    fail("element type " + std::string(data_type_name(dtype)) + declared);
  }
  if (io.has_shape) {
    if (shape.size() != io.shape.size()) fail("rank " + std::to_string(shape.size()) + declared);
    for (size_t i = 0; i < shape.size(); ++i) {
      if (io.shape[i] >= 0 && shape[i] != io.shape[i]) {
        fail("dimension " + std::to_string(i) + " is " + std::to_string(shape[i]) + declared);
      }
    }
  }
  const int64_t count = checked_numel(shape);
  if (dtype == DataType::String) return Tensor::zeros(dtype, shape);  // strings are not pooled
  const uint64_t bytes = storage_bytes(dtype, count);

  return Tensor(dtype, shape, s.arena->allocate_input(name, input_key(name, dtype, shape), bytes));
}

std::vector<NamedValue> Session::run(std::initializer_list<NamedValue> inputs) {
  std::vector<NamedValue> named;
  named.reserve(inputs.size());
  for (const NamedValue& nv : inputs) named.push_back({nv.name, std::move(nv.value)});
  return run(std::move(named));
}

std::vector<NamedValue> Session::run(std::vector<NamedValue> named) {
  static const RunOptions defaults;
  return run(std::move(named), defaults);
}

std::vector<NamedValue> Session::run(std::vector<NamedValue> named, const RunOptions& options,
                                     RunStats* stats_out, std::vector<NodeEvent>* profile_out) {
  std::vector<NamedValue> out;
  impl_->run(named, out, options, stats_out, profile_out);
  return out;  // `named` (the caller's moved-from handles) goes: moved inputs are ours
}

void Session::run(std::vector<NamedValue>& inputs, std::vector<NamedValue>& outputs,
                  const RunOptions& options, RunStats* stats, std::vector<NodeEvent>* profile) {
  impl_->run(inputs, outputs, options, stats, profile);
}

void Session::Impl::bind_inputs(std::span<NamedValue> named, ExecutorScratch& scratch) const {
  const ir::Graph& g = *model.graph;
  std::vector<Value>& ordered = scratch.inputs;
  std::vector<bool>& given = scratch.given;
  ordered.clear();
  ordered.resize(g.inputs.size());
  given.assign(g.inputs.size(), false);
  for (NamedValue& nv : named) {
    auto it = std::find_if(inputs.begin(), inputs.end(),
                           [&](const IoInfo& io) { return io.name == nv.name; });
    if (it == inputs.end()) {
      throw Error(ErrorKind::InvalidArgument,
                  "unknown input '" + nv.name + "' (model inputs: " + names_of(inputs) + ")")
          .with_file(model.path);
    }
    const auto i = static_cast<size_t>(it - inputs.begin());
    if (given[i]) {
      throw Error(ErrorKind::InvalidArgument, "input '" + nv.name + "' given twice")
          .with_file(model.path);
    }
    check_input(*it, nv.value);
    given[i] = true;
    // The caller keeps the name and an empty value: what was moved in is the run's alone.
    ordered[i] = std::move(nv.value);
    nv.value = Value();
  }
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (!given[i] && !g.value(g.inputs[i]).constant.defined()) {
      throw Error(ErrorKind::InvalidArgument, "missing input '" + inputs[i].describe() + "'")
          .with_file(model.path);
    }
  }
}

void Session::Impl::hand_outputs(std::vector<Value>& results, std::vector<NamedValue>& out) const {
  out.resize(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    // An output whose element type differs from the model's declaration is an error, never a
    // value handed over under the wrong type.
    const IoInfo& io = outputs[i];
    if (io.kind == Value::Kind::Tensor && io.dtype != DataType::Undefined &&
        results[i].is_tensor() && results[i].tensor().dtype() != io.dtype) {
      throw Error(ErrorKind::Runtime, "graph output '" + io.name + "' is declared " +
                                          std::string(data_type_name(io.dtype)) + " but is " +
                                          results[i].tensor().describe())
          .with_file(model.path);
    }
    if (out[i].name != io.name) out[i].name = io.name;
    out[i].value = std::move(results[i]);
  }
}

void Session::Impl::execute(ExecutorScratch& scratch, const RunOptions& options,
                            detail::ArenaRun& arena_run, RunStats& run_stats,
                            std::vector<NodeEvent>& events) {
  Executor ex(pool, run_stats, profile ? &events : nullptr, &scratch, &arena_run.counts);
  ex.set_adopt_inputs(reuse_inputs);
  ex.set_run_options(&options);
  ex.set_count_denormals(count_denormals);
  std::unique_lock<std::mutex> weight_turn;
  if (weight_release) {
    weight_turn = std::unique_lock<std::mutex>(weight_release_mutex);
    weight_release->start_run(run_stats);
    ex.set_weight_release(weight_release.get());
  }
  // Two references, so that the std::function holds the lambda inline (no allocation). The
  // denormal mode is set on the thread the arena runs the graph on (not always the caller's)
  // and given back when it returns; the tasks it hands out take it along (float_mode.h).
  const auto graph_run = [&] {
    const fp::ModeScope float_mode(fp::mode_with_flush(flush_denormals));
    ex.run(*plan, scratch.inputs, {}, scratch.results);
  };
  try {
    env->execute([&graph_run] { graph_run(); });
  } catch (Error& e) {
    e.with_file(model.path);
    throw;
  }
  arena->end(arena_run, run_stats);  // before the next run may take its turn with the weights
}

void Session::Impl::run(std::span<NamedValue> named, std::vector<NamedValue>& out,
                        const RunOptions& options, RunStats* stats_out,
                        std::vector<NodeEvent>* profile_out) {
  // This run's pool counters and arena use, from the allocations of its inputs on.
  detail::ArenaRun arena_run(pool.core());
  arena->take_inputs(arena_run);
  RunStats run_stats;
  std::vector<NodeEvent> events;

  check_constants_given();
  ScratchHold hold(mutex, free_scratch);
  ExecutorScratch& scratch = *hold.scratch;
  try {
    bind_inputs(named, scratch);
    arena->begin(arena_run, scratch.inputs, input_names, run_stats);
    execute(scratch, options, arena_run, run_stats, events);
  } catch (...) {
    hold.release();
    end_run(run_stats);
    if (stats_out) *stats_out = run_stats;  // the counters up to the failure
    throw;
  }
  hand_outputs(scratch.results, out);
  arena->finish(arena_run, run_stats);
  hold.release();
  end_run(run_stats);

  if (stats_out) *stats_out = run_stats;
  if (profile_out) *profile_out = events;
  std::lock_guard<std::mutex> lock(mutex);
  this->run_stats = std::move(run_stats);
  this->events = std::move(events);
}

}  // namespace kiln
