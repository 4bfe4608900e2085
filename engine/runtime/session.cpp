#include "kiln/session.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "engine/ir/graph.h"
#include "engine/passes/passes.h"
#include "engine/plan/buffer_prediction.h"
#include "engine/plan/memory_plan.h"
#include "engine/plan/plan.h"
#include "engine/plan/shape_inference.h"
#include "engine/runtime/buffer_pool.h"
#include "engine/runtime/executor.h"
#include "engine/runtime/session_internal.h"
#include "engine/runtime/weight_release.h"
#include "engine/runtime/weights_cache.h"
#include "kiln/error.h"
#include "proto/loader.h"

namespace kiln {

namespace {

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
  LoadStats load_stats;
  bool profile = false;
  // Guards what runs share below: the allocate_input cycle, the arena planning state, the
  // free scratch and the last run's counters and profile. Never held while a run executes.
  std::mutex mutex;
  RunStats run_stats;             // of the last run to finish
  std::vector<NodeEvent> events;  // its profile
  // The executor's frame buffers, kept warm between runs: one per run in progress, taken at
  // its start and given back at its end, so one thread running the session reuses one.
  std::vector<std::unique_ptr<ExecutorScratch>> free_scratch;
  // release_weights_after_use counts the readers of weights per run: such runs take turns.
  std::mutex weight_release_mutex;
  bool memory_arena = true, reuse_inputs = false, inputs_in_arena = false;
  // A run's signature is the shapes of its inputs, then (inputs_in_arena) the keys of the
  // inputs it was given by move from allocate_input, in allocation order.
  std::string last_signature;             // of the previous run
  std::string arena_signature;            // of the run `arena` was planned from
  std::string arena_shapes;               // the shapes part of arena_signature
  std::vector<std::string> arena_inputs;  // keys of the layout's first entries (graph inputs)
  std::shared_ptr<const detail::ArenaLayout> arena;
  // Plan the arena from inferred shapes (SessionOptions::arena_from_shapes, and shape
  // inference covers every node of the main graph, which has no nested graphs).
  bool shape_planning = false;
  std::string shapes_not_planned;  // the last input shapes shape planning failed for

  // Inputs handed out by allocate_input since the last run (the next run's "cycle").
  struct AllocatedInput {
    std::string name, key;
    std::weak_ptr<Storage> storage;  // weak: passing it by move must leave it uniquely owned
    uint64_t bytes = 0;              // requested
    // Bytes taken in the arena (0: a pool buffer). The i-th allocation of a cycle is placed
    // at the layout's i-th entry.
    uint64_t arena_bytes = 0;
  };
  std::vector<AllocatedInput> allocated;
  bool cycle_open = false;
  bool allocated_match = true;  // every allocation of the cycle matched arena_inputs so far
  // The pool counters of the cycle's allocations: the run's counters include them.
  detail::PoolRun cycle_counts;

  // Called with `mutex` held.
  void open_cycle() {
    if (cycle_open) return;
    cycle_open = true;
    allocated.clear();
    allocated_match = true;
    cycle_counts.allocations = 0;
    cycle_counts.bytes_allocated = 0;
    cycle_counts.reuses = 0;
  }

  // Plans the arena from the buffers of a run (recorded, or predicted from shapes); the
  // first `input_keys.size()` of them are the graph inputs with those keys.
  void plan_arena(const std::vector<detail::RecordedBuffer>& recorded, std::string signature,
                  std::string shapes, std::vector<std::string> input_keys) {
    std::vector<plan::BufferLifetime> lifetimes;
    std::vector<size_t> index;
    for (size_t i = 0; i < recorded.size(); ++i) {
      // Outlived the run, or empty (an empty range could not be told from a buffer at
      // the same offset when released): stays in the pool.
      if (recorded[i].last < 0 || recorded[i].bytes == 0) continue;
      lifetimes.push_back({recorded[i].bytes, recorded[i].first, recorded[i].last});
      index.push_back(i);
    }
    const plan::MemoryPlan mp = plan::plan_memory(lifetimes);
    auto layout = std::make_shared<detail::ArenaLayout>();
    layout->bytes.resize(recorded.size());
    layout->offsets.resize(recorded.size());
    layout->in_arena.assign(recorded.size(), false);
    for (const detail::RecordedBuffer& b : recorded) layout->steps.push_back(b.first);
    for (size_t k = 0; k < index.size(); ++k) {
      layout->bytes[index[k]] = (lifetimes[k].bytes + 63) / 64 * 64;
      layout->offsets[index[k]] = mp.offsets[k];
      layout->in_arena[index[k]] = true;
    }
    layout->arena_bytes = mp.arena_bytes;
    layout->lower_bound = mp.lower_bound;
    arena = std::move(layout);
    arena_signature = std::move(signature);
    arena_shapes = std::move(shapes);
    arena_inputs = std::move(input_keys);
  }

  // Plans the arena for a run on `ordered` before it starts, from the shapes inferred for
  // its inputs. False when some shape or buffer cannot be known before the run.
  bool plan_arena_from_shapes(const std::vector<Value>& ordered, const std::string& shapes) {
    if (!shape_planning || shapes == shapes_not_planned) return false;
    const ir::Graph& g = *model.graph;
    std::vector<plan::InferredValue> given(g.inputs.size());
    for (size_t i = 0; i < g.inputs.size() && i < ordered.size(); ++i) {
      if (!ordered[i].is_tensor() || !ordered[i].tensor().defined()) continue;
      // Shapes only: the plan must hold for any data of these shapes.
      given[i].known = true;
      given[i].dtype = ordered[i].tensor().dtype();
      given[i].shape = ordered[i].tensor().shape();
    }
    std::vector<int32_t> order;
    for (const plan::Step& step : plan->steps) order.push_back(step.node_index);
    const plan::ShapeInference inferred = plan::infer_shapes(g, order, given);
    plan::BufferPrediction predicted;
    if (inferred.first_unknown.empty()) predicted = plan::predict_buffers(*plan, inferred.values);
    if (!predicted.complete) {
      shapes_not_planned = shapes;
      return false;
    }
    std::vector<detail::RecordedBuffer> buffers;
    for (const plan::PredictedBuffer& b : predicted.buffers)
      buffers.push_back({b.bytes, b.first, b.last});
    plan_arena(buffers, shapes + "|", shapes, {});
    return true;
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
    try {
      load_stats.nodes_loaded = count_nodes(*model.graph);
      passes::fold_constant_nodes(*model.graph);
      if (options.optimization != GraphOptimization::None) {
        const passes::FoldStats folded = passes::fold_constants(*model.graph, shared_folded());
        load_stats.folded_nodes += static_cast<uint64_t>(folded.nodes);
        load_stats.folded_bytes += folded.bytes;
        const passes::OptimizeStats opt = passes::optimize(*model.graph, options.optimization);
        load_stats.identities_removed += static_cast<uint64_t>(opt.identities_removed);
        load_stats.fusions += static_cast<uint64_t>(opt.fused);
      }
      load_stats.nodes_planned = count_nodes(*model.graph);
      plan = plan::build_plan(*model.graph, preparer.get());
    } catch (Error& e) {
      e.with_file(model.path);
      throw;
    }
    preparer->release_unread_originals(*plan);
    profile = options.profile;
    pool.core().memory_limit = options.memory_limit;
    memory_arena = options.memory_arena;
    shape_planning = memory_arena && options.arena_from_shapes;
    for (const plan::Step& step : plan->steps) {
      shape_planning =
          shape_planning && step.subgraphs.empty() && plan::shape_inference_covers(*step.node);
    }
    reuse_inputs = options.reuse_input_buffers;
    inputs_in_arena = options.inputs_in_arena;
    const ir::Graph& g = *model.graph;
    for (ir::ValueId id : g.inputs) inputs.push_back(io_info(g.value(id)));
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
      step.kernel = step.op->create(ops::NodeInfo(g, *step.node, *step.op, preparer.get()));
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

  std::lock_guard<std::mutex> lock(s.mutex);
  s.open_cycle();
  const size_t position = s.allocated.size();
  const std::string key = input_key(name, dtype, shape);
  std::shared_ptr<Storage> storage;
  if (s.inputs_in_arena && s.memory_arena && s.arena) {
    // The layout's entry `position` is meant for this input only if every allocation of
    // the cycle so far repeated the planned run's.
    s.allocated_match =
        s.allocated_match && position < s.arena_inputs.size() && s.arena_inputs[position] == key;
    if (s.allocated_match) {
      storage = s.pool.core().acquire_arena_input(s.arena, position, bytes, &s.cycle_counts);
    }
  }
  const uint64_t arena_bytes = storage ? storage->capacity() : 0;
  if (!storage) storage = s.pool.acquire(bytes, &s.cycle_counts);
  s.allocated.push_back({name, key, storage, bytes, arena_bytes});
  return Tensor(dtype, shape, std::move(storage));
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

namespace {

// Ends what a run holds when it ends, normally or by an exception: its use of the pool's
// recording and arena, and its scratch, given back to the session.
struct RunHold {
  detail::PoolCore& pool;
  detail::PoolRun& run;
  std::mutex& mutex;
  std::vector<std::unique_ptr<ExecutorScratch>>& free_scratch;
  std::unique_ptr<ExecutorScratch> scratch;
  ~RunHold() {
    if (run.recording) pool.end_recording(run);
    if (run.in_arena) pool.end_arena(run);
    if (scratch) {
      std::lock_guard<std::mutex> lock(mutex);
      free_scratch.push_back(std::move(scratch));
    }
  }
};

}  // namespace

std::vector<NamedValue> Session::run(std::vector<NamedValue> named, const RunOptions& options,
                                     RunStats* stats_out, std::vector<NodeEvent>* profile_out) {
  Impl& s = *impl_;
  detail::PoolCore& pool = s.pool.core();
  // This run's counters, from the allocations of its inputs (allocate_input) on.
  detail::PoolRun counts;
  RunStats run_stats;
  std::vector<Impl::AllocatedInput> allocated;
  {
    // The inputs allocated since the last run belong to this run, whatever becomes of it.
    std::lock_guard<std::mutex> lock(s.mutex);
    s.open_cycle();
    s.cycle_open = false;
    allocated = std::move(s.allocated);
    s.allocated.clear();
    counts.allocations = s.cycle_counts.allocations.load();
    counts.bytes_allocated = s.cycle_counts.bytes_allocated.load();
    counts.reuses = s.cycle_counts.reuses.load();
  }

  s.check_constants_given();
  const ir::Graph& g = *s.model.graph;
  std::vector<Value> ordered(g.inputs.size());
  std::vector<bool> given(g.inputs.size(), false);
  for (NamedValue& nv : named) {
    auto it = std::find_if(s.inputs.begin(), s.inputs.end(),
                           [&](const IoInfo& io) { return io.name == nv.name; });
    if (it == s.inputs.end()) {
      throw Error(ErrorKind::InvalidArgument,
                  "unknown input '" + nv.name + "' (model inputs: " + names_of(s.inputs) + ")")
          .with_file(s.model.path);
    }
    const auto i = static_cast<size_t>(it - s.inputs.begin());
    if (given[i]) {
      throw Error(ErrorKind::InvalidArgument, "input '" + nv.name + "' given twice")
          .with_file(s.model.path);
    }
    s.check_input(*it, nv.value);
    given[i] = true;
    ordered[i] = std::move(nv.value);
  }
  named.clear();  // drop the caller's (moved-from) handles so moved inputs are owned here
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    if (!given[i] && !g.value(g.inputs[i]).constant.defined()) {
      throw Error(ErrorKind::InvalidArgument, "missing input '" + s.inputs[i].describe() + "'")
          .with_file(s.model.path);
    }
  }

  counts.peak_bytes_in_use = pool.bytes_in_use.load();
  std::vector<NodeEvent> events;

  // inputs_in_arena: the allocated inputs this run owns (given by move under their own
  // name), in allocation order. Only they may join the recorded lifetimes.
  std::vector<bool> held(allocated.size(), false);
  std::vector<std::pair<const std::byte*, uint64_t>> held_buffers;
  std::vector<std::string> held_keys;
  if (s.memory_arena && s.inputs_in_arena) {
    for (size_t j = 0; j < allocated.size(); ++j) {
      const Impl::AllocatedInput& a = allocated[j];
      for (size_t i = 0; i < ordered.size(); ++i) {
        if (s.inputs[i].name != a.name || !ordered[i].is_tensor()) continue;
        const std::shared_ptr<Storage>& st = ordered[i].tensor().storage();
        const bool same = !a.storage.owner_before(st) && !st.owner_before(a.storage);
        if (same && st && st.use_count() == 1) {
          held[j] = true;
          held_buffers.push_back({st->data(), a.bytes});
          held_keys.push_back(a.key);
        }
      }
    }
  }

  // A graph whose shapes follow from its input shapes gets its arena before the first run
  // with those shapes; that run is recorded too, and the exact recorded layout serves the
  // later ones. Otherwise the arena is planned from the second run with the same signature
  // and used from the third, so a decode loop whose shapes change every step never pays
  // for recording. One run at a time records or uses the arena: a run that finds either
  // taken by a run on another thread is served by the pool.
  RunHold hold{pool, counts, s.mutex, s.free_scratch, nullptr};
  std::string shapes, signature;
  bool from_shapes = false;
  std::shared_ptr<const detail::ArenaLayout> used;
  size_t arena_inputs = 0;
  if (s.memory_arena) {
    for (const Value& v : ordered) shapes += v.defined() ? v.describe() + ";" : "-;";
    signature = shapes + "|";
    for (const std::string& k : held_keys) signature += k;
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.memory_arena) {
      // Inputs are alive from before the first step (counts.step is 0).
      if (s.arena && signature == s.arena_signature) {
        if (pool.begin_arena(counts, s.arena, s.arena_inputs.size())) used = s.arena;
      } else if (held_keys.empty() && s.plan_arena_from_shapes(ordered, shapes)) {
        if (pool.begin_arena(counts, s.arena, 0)) {
          used = s.arena;
          from_shapes = true;
        }
        pool.begin_recording(counts);
      } else if (signature == s.last_signature) {
        pool.begin_recording(counts, held_buffers);
      } else if (s.arena && shapes == s.arena_shapes) {
        // Planned for other inputs from allocate_input: the intermediates may still use it.
        if (pool.begin_arena(counts, s.arena, s.arena_inputs.size())) used = s.arena;
      }
      arena_inputs = used ? s.arena_inputs.size() : 0;
    }
    if (!s.free_scratch.empty()) {
      hold.scratch = std::move(s.free_scratch.back());
      s.free_scratch.pop_back();
    }
  }
  if (!hold.scratch) hold.scratch = std::make_unique<ExecutorScratch>();
  const bool recording = counts.recording;
  for (size_t j = 0; j < allocated.size(); ++j) {
    if (held[j] && allocated[j].arena_bytes > 0) {
      ++run_stats.arena_served;
      run_stats.arena_input_bytes += allocated[j].arena_bytes;
    }
  }
  if (used) {
    // Planned inputs not in their place: made otherwise, not given by move, or diverging.
    for (size_t j = 0; j < arena_inputs; ++j) {
      const bool placed = j < allocated.size() && held[j] && allocated[j].arena_bytes > 0;
      if (used->in_arena[j] && !placed) ++run_stats.arena_missed;
    }
  }
  std::vector<Value> results;
  Executor ex(s.pool, run_stats, s.profile ? &events : nullptr, hold.scratch.get(), &counts);
  ex.set_adopt_inputs(s.reuse_inputs);
  ex.set_run_options(&options);
  std::unique_lock<std::mutex> weight_turn;
  if (s.weight_release) {
    weight_turn = std::unique_lock<std::mutex>(s.weight_release_mutex);
    s.weight_release->start_run(run_stats);
    ex.set_weight_release(s.weight_release.get());
  }
  try {
    s.env->execute([&] { results = ex.run(*s.plan, std::move(ordered), {}); });
  } catch (Error& e) {
    e.with_file(s.model.path);
    throw;
  }
  std::vector<detail::RecordedBuffer> recorded;
  if (recording) recorded = pool.end_recording(counts);
  if (used) pool.end_arena(counts);
  if (weight_turn.owns_lock()) weight_turn.unlock();
  run_stats.arena_from_shapes = from_shapes;
  run_stats.arena_served += counts.arena_served;
  run_stats.arena_missed += counts.arena_missed;
  run_stats.allocations = counts.allocations;
  run_stats.bytes_allocated = counts.bytes_allocated;
  run_stats.pool_reuses = counts.reuses;
  run_stats.peak_bytes_in_use = counts.peak_bytes_in_use;

  std::vector<NamedValue> out;
  out.reserve(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    // An output whose element type differs from the model's declaration is an error, never a
    // value handed over under the wrong type.
    const IoInfo& io = s.outputs[i];
    if (io.kind == Value::Kind::Tensor && io.dtype != DataType::Undefined &&
        results[i].is_tensor() && results[i].tensor().dtype() != io.dtype) {
      throw Error(ErrorKind::Runtime, "graph output '" + io.name + "' is declared " +
                                          std::string(data_type_name(io.dtype)) + " but is " +
                                          results[i].tensor().describe())
          .with_file(s.model.path);
    }
    out.push_back({io.name, std::move(results[i])});
  }

  std::lock_guard<std::mutex> lock(s.mutex);
  if (recording) s.plan_arena(recorded, signature, shapes, std::move(held_keys));
  if (s.memory_arena) s.last_signature = std::move(signature);
  // The layout this run used, or the one it recorded.
  const detail::ArenaLayout* layout = used ? used.get() : recording ? s.arena.get() : nullptr;
  if (layout) {
    run_stats.arena_bytes = layout->arena_bytes;
    run_stats.arena_lower_bound = layout->lower_bound;
  }
  if (stats_out) *stats_out = run_stats;
  if (profile_out) *profile_out = events;
  s.run_stats = std::move(run_stats);
  s.events = std::move(events);
  return out;
}
}  // namespace kiln
