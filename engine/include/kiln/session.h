// Session: one loaded model, planned once, run many times.
//
//   kiln::Session s("model.onnx");
//   auto out = s.run({{"x", std::move(x)}});   // moved inputs may be reused in place
//
// Inputs passed by copy are only read; an input passed by move (the caller keeps no other
// handle to its storage) belongs to the run and may be overwritten or extended in place.
//
// Threads: run() may be called from any number of threads at once on one Session. Each run
// has its own state (buffers, counters, profile); concurrent runs share only read-only
// weights and the session's buffer pool, which is thread-safe, and never share live memory:
// one run at a time uses the activation arena, the others are served by the pool. The rest
// of the interface (set_constant, moving or destroying the session) must not overlap a run.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/environment.h"
#include "kiln/error.h"
#include "kiln/memory.h"
#include "kiln/value.h"

namespace kiln {

// Exact counters for one run (or one load). They are facts, not estimates: tests assert them.
struct RunStats {
  uint64_t allocations = 0;              // buffers the pool had to obtain from the system
  uint64_t bytes_allocated = 0;          // their total size
  uint64_t pool_reuses = 0;              // requests served from buffers returned earlier
  uint64_t unplanned_scratch = 0;        // kernels' scratch requests outside the planned sequence
  uint64_t peak_bytes_in_use = 0;        // most pool bytes handed out at once during the run
                                         // (to it and to runs beside it on other threads)
  uint64_t bytes_copied = 0;             // sum of the causes below
  uint64_t bytes_copied_contiguous = 0;  // strided inputs made contiguous for a kernel
  uint64_t bytes_copied_concat = 0;      // Concat that could not append in place
  uint64_t bytes_copied_capture = 0;     // captured values copied into a subgraph
  uint64_t bytes_copied_kernels = 0;     // other data movement (Transpose, Slice, Expand, ...)
  uint64_t in_place_ops = 0;             // nodes that wrote into an input's storage
  // Activation arena (SessionOptions::memory_arena): the layout this run used or recorded
  // (0 when none), the most bytes alive at once in its plan (no layout can be smaller), and
  // the requests of this run served from the arena or, diverging from the plan, by the
  // pool. arena_from_shapes: the layout was planned before this run from the shapes
  // inferred for its inputs (the first run with these shapes), not from a recorded run.
  uint64_t arena_bytes = 0;
  uint64_t arena_lower_bound = 0;
  uint64_t arena_served = 0;
  uint64_t arena_missed = 0;
  bool arena_from_shapes = false;
  // With SessionOptions::inputs_in_arena: the arena bytes taken by the graph inputs of this
  // run that Session::allocate_input placed in it (each rounded up to 64, as in
  // arena_bytes; they are counted in arena_served too).
  uint64_t arena_input_bytes = 0;
  // The pool after the run (SessionOptions::pool_keep_runs): the bytes of the buffers it
  // keeps cached for later runs, the arena's bytes, and what the end of this run gave back
  // (buffers no run of the last pool_keep_runs took or returned; the arena when no recent
  // run used a layout as large).
  uint64_t pool_bytes_cached = 0;
  uint64_t arena_capacity = 0;
  uint64_t pool_bytes_freed = 0;
  uint64_t nodes_run = 0;  // nodes executed, subgraph nodes included
  // With SessionOptions::count_denormals: float32 elements of the nodes' outputs that are
  // denormal (nonzero, below 2^-126), subnormal results the kernels produced (a view of an
  // input counts its elements again). 0 otherwise.
  uint64_t denormals_produced = 0;
  // With SessionOptions::release_weights_after_use: mapped weights whose pages were given
  // back after their last use. A failure leaves the pages resident and the run going; the
  // first one is described in weight_release_error ("" when none).
  PageReleaseCounters weight_pages;
  std::string weight_release_error;
};

// What a run stopped by its RunOptions throws (cancelled, or past its deadline): a
// kiln::Error of kind Runtime, naming the node it stopped before.
class RunCancelled : public Error {
 public:
  explicit RunCancelled(std::string message) : Error(ErrorKind::Runtime, std::move(message)) {}
};

// Per-run controls for Session::run. One RunOptions may serve several runs, at once or one
// after another; cancel() may be called from any thread at any time.
class RunOptions {
 public:
  RunOptions() = default;
  RunOptions(const RunOptions&) = delete;
  RunOptions& operator=(const RunOptions&) = delete;

  // Stops the runs using these options: checked before every node and every iteration of a
  // Loop or Scan, a cancelled run throws kiln::RunCancelled naming the node it stopped
  // before, and the session stays usable. Once cancel() has returned, no run using these
  // options starts another node: a kernel already running finishes, so each run executes at
  // most the one node it is in (and the nodes enclosing it: a Loop, If or Scan) after the
  // call. Runs started after cancel() stop before their first node, until reset().
  // (Sequentially consistent, so the bound holds against any counter the caller reads after
  // cancel() returns; on x86 the check before each node is a plain load.)
  void cancel() noexcept { cancelled_.store(true); }
  void reset() noexcept { cancelled_.store(false); }
  bool cancelled() const noexcept { return cancelled_.load(); }

  // A run still going at `deadline` stops as if cancelled (checked at the same points); a
  // deadline already past when the run starts stops it before its first node.
  // The default, time_point::max(), is none; the clock is read only when one is set.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  void set_timeout(std::chrono::steady_clock::duration timeout) {
    deadline = std::chrono::steady_clock::now() + timeout;
  }

 private:
  std::atomic<bool> cancelled_{false};
};

struct LoadStats {
  uint64_t weights_bytes = 0;         // bytes of all initializers and Constant values
  uint64_t weights_mapped_bytes = 0;  // of which used in place from a mapping or caller memory
  uint64_t weights_copied_bytes = 0;  // of which copied (misaligned, typed fields, byte order)
  uint64_t weights_copied_count = 0;  // number of tensors copied (set_constant included)
  // Whole pages of the file behind copied weights, given back once copied (never read again).
  uint64_t weights_source_bytes_released = 0;
  // Hollow constants (SessionOptions::defer_missing_weights): declared, data not loaded.
  uint64_t weights_deferred_count = 0;
  uint64_t weights_deferred_bytes = 0;
  // Weights equal to ones already loaded in the environment's weights cache (by another
  // session, or earlier in this model), used from there instead of loaded again
  // (SessionOptions::share_weights). Not counted as mapped or copied.
  uint64_t weights_shared_count = 0;
  uint64_t weights_shared_bytes = 0;
  // Prepared forms of weights (packed, widened, ...) kernels asked for: made by this session,
  // or found made by another session of the environment; and the bytes of mapped originals
  // given back because every reader uses a prepared form.
  uint64_t weights_prepared_count = 0;
  uint64_t weights_prepared_bytes = 0;
  uint64_t weights_prepared_shared = 0;
  uint64_t weights_original_released_bytes = 0;
  // Graph optimisation (SessionOptions::optimization): nodes evaluated at load because all
  // their inputs are constants, and the bytes of the initializers they became (of which
  // shared with an equal one already in the environment's weights cache).
  uint64_t folded_nodes = 0;
  uint64_t folded_bytes = 0;
  uint64_t folded_shared_bytes = 0;
  // Nodes in the model (all graph levels, Constant nodes included) and in the graph planned
  // after optimisation; pass-through nodes removed and fusions made.
  uint64_t nodes_loaded = 0;
  uint64_t nodes_planned = 0;
  uint64_t identities_removed = 0;
  uint64_t fusions = 0;
};

// One node's execution, for profiles.
struct NodeEvent {
  std::string name, op_type;
  double start_us = 0, duration_us = 0;                  // since the start of the run
  std::vector<std::string> input_shapes, output_shapes;  // "float32[1,3]"
  int depth = 0;                                         // 0 for the main graph
  uint64_t bytes_copied = 0;  // by this node (and, for If/Loop/Scan, its nested graphs)
  uint64_t denormals = 0;     // its outputs' denormal floats (SessionOptions::count_denormals)
};

struct IoInfo {
  std::string name;
  Value::Kind kind = Value::Kind::Tensor;
  DataType dtype = DataType::Undefined;           // element type (of the sequence/optional element)
  Value::Kind optional_kind = Value::Kind::None;  // an optional's content: Tensor or Sequence
  // The declared shape of the tensor (or of the tensor an optional holds); has_shape is false
  // when the model declares none.
  bool has_shape = false;
  std::vector<int64_t> shape;          // -1 where the dimension is not fixed
  std::vector<std::string> dim_names;  // symbolic name, or "" for fixed/unknown
  bool has_default = false;            // an initializer backs it: feeding it is optional
  std::string describe() const;        // "input_ids: int64[batch,sequence]"
};

// How MatMul and Gemm keep their constant float weights once packed for the GEMM.
enum class WeightPrecision {
  Float32,   // as given (the default: results as onnxruntime's)
  BFloat16,  // rounded to bfloat16: half the memory and bandwidth, products still in float
  Float16,   // rounded to float16 (more mantissa than bfloat16, range up to 65504)
  // Quantized to int8, symmetric, one scale per output column (max |column| / 127): a quarter
  // of the memory. Each run quantizes A's rows to uint8, each row with its own scale and zero
  // point (its range / 255), multiplies in int32 (AVX512-VNNI where present, AVX2 and SSE
  // otherwise) and scales each sum by its row's and column's scales. Results differ from
  // float by both quantizations: about 1% of the products' magnitude (docs/kernels.md).
  Int8,
};

// What a run does with denormal floats (nonzero magnitudes below 2^-126, FLT_MIN).
enum class Denormals {
  // Flushed to zero as results and read as zero as inputs (FTZ and DAZ in MXCSR on every
  // thread that runs the session's kernels, for the run's duration; the caller's thread gets
  // its own mode back when run() returns). The default: some processors (Intel's among them)
  // take a microcode assist of a hundred cycles or more for each operation that meets a
  // denormal, which random or small weights and softmax's tails produce, while the values
  // lost are below every float output's rounding except next to zero.
  Flush,
  // IEEE gradual underflow, as onnxruntime and OpenVINO do by default.
  Keep,
};

// How much the graph is rewritten before it is planned (as onnxruntime's optimisation levels).
enum class GraphOptimization {
  None,   // run the graph exactly as given (Constant nodes still become initializers)
  Basic,  // + constant folding: nodes whose inputs are all constants run once at load
  All,    // + fusions (the default)
};

// What a model file says about itself: ModelProto's descriptive fields and metadata_props.
struct ModelInfo {
  int64_t ir_version = 0;
  std::string producer_name, producer_version, domain;
  std::string description;                    // the model's doc_string
  std::string graph_name, graph_description;  // the main graph's name and doc_string
  int64_t model_version = 0;
  bool has_model_version = false;  // false when the file leaves it unset
  std::map<std::string, std::string> metadata;
};

struct SessionOptions {
  std::shared_ptr<Environment> environment;  // null: a new one, one thread per core
  bool profile = false;                      // record a NodeEvent per node per run
  // Liveness-planned activation arena: the buffers of a run and their lifetimes are laid
  // out in one arena (largest first, each at the lowest offset free over its lifetime) and
  // served from it. For graphs whose shapes follow from the input shapes (static shape
  // inference covers their ops, nested graphs' included; the values of small integer and
  // bool inputs, such as an If's condition, count) the arena is planned before the first run
  // with those shapes (arena_from_shapes); that run is also recorded, and later runs with
  // those shapes use the recorded layout; when more than two runs in a row each bring new
  // shapes (a decode loop's growing caches), the pool serves them instead, until a run
  // repeats the shapes before it, since such a plan would serve one run only and predicting
  // it costs more than it saves. Other graphs are recorded when a run repeats the
  // input shapes of the run before it, and served from the third such run. A run that
  // diverges from the plan falls back to the pool for the requests concerned, never
  // sharing live memory.
  bool memory_arena = true;
  // Off: plan the arena only from recorded runs, as above for other graphs.
  bool arena_from_shapes = true;
  // Graph inputs passed by move join the pool after their last read, so later buffers
  // reuse their memory. Off by default: the caller's buffers are overwritten.
  bool reuse_input_buffers = false;
  // Graph inputs made with Session::allocate_input and passed to run() by move take part in
  // the arena: they are recorded as alive from the start of the run to their last read,
  // and once an arena is planned for the run's shapes, allocate_input places them at their
  // planned offsets, so later intermediates reuse their bytes after their last read. Off by
  // default: the data of such inputs is overwritten during the run.
  bool inputs_in_arena = false;
  // Low-memory runs: after each weight's last use in a run (a nested graph reading it counts
  // as a use by its If/Loop/Scan node), give its pages back to the OS, so that about one
  // layer's weights are resident at a time. Applies to the main graph's weights viewed in
  // place from a file mapping (copied weights stay); they are re-read from the file on the
  // next run. Counted in RunStats::weight_pages.
  bool release_weights_after_use = false;
  // "Graph first, weights later": an initializer of the main graph whose external data file
  // does not exist loads as a hollow constant (its type and shape only), and so does every
  // external initializer of a model given to from_memory without a base_dir. The session is
  // planned from shapes; Session::set_constant gives each one its data before the first run.
  // Off: a missing external data file is a load error.
  bool defer_missing_weights = false;
  // Share weights and their prepared forms through the environment's weights cache: a weight
  // equal byte for byte to one a session of the same Environment has loaded (or to an
  // earlier weight of this model) is used from there, and the pages of this file's copy are
  // given back after the comparison. Off: the session keeps a cache of its own.
  bool share_weights = true;
  // Lower-precision weights for MatMul and Gemm: constant float (or float16/bfloat16) B
  // operands are packed in this precision, so decode steps, which stream every weight once
  // per token, read half the bytes (a quarter with Int8). Half types are widened to float in
  // registers, products and sums staying in float, so outputs differ from float weights by
  // the weights' rounding; Int8 also quantizes the activations per row (see WeightPrecision).
  // Off (Float32) by default.
  WeightPrecision gemm_weights = WeightPrecision::Float32;
  GraphOptimization optimization = GraphOptimization::All;
  // Denormal floats in runs (and in constant folding at load); on processors other than x86
  // both settings keep them.
  Denormals denormals = Denormals::Flush;
  // Count the denormal float32 values in every node's outputs after it runs
  // (RunStats::denormals_produced, NodeEvent::denormals): a diagnostic that reads every
  // output once more, off by default.
  bool count_denormals = false;
  // When set, the graph as the session runs it (after the passes of `optimization`; fused
  // nodes in the com.microsoft and kiln domains) is written there as an ONNX file at
  // creation, as onnxruntime's optimized_model_filepath does. Weights are embedded unless
  // they exceed 1 GiB (then large ones go to PATH.data beside it).
  std::string optimized_model_path;
  // Values of the main graph to return as outputs after the declared ones, by name: planned
  // like outputs, and kept by the passes (a fusion never swallows a value a caller reads; the
  // rest of the graph is optimized as usual). For values a model computes but does not output
  // (attention weights, a layer's activations) and for debugging. A name the graph lacks, or
  // one already an output, fails the session's creation naming it.
  std::vector<std::string> extra_outputs;
  // Memory that stays flat under changing shapes: at the end of each run, the session's pool
  // frees the cached buffers that no run took or returned during the last pool_keep_runs
  // runs, and the arena when none of those runs used a layout as large as it. Between runs a
  // session holds what its recent runs used, not every shape it has seen (RunStats::
  // pool_bytes_cached, arena_capacity). 0: buffers stay cached until the session ends.
  uint32_t pool_keep_runs = 64;
  // The most bytes a run's tensors may hold at once (0: no limit). An output that would go
  // over it fails the run with a kiln::Error (Memory) naming the node, the output's shape and
  // the bytes, before anything is allocated.
  uint64_t memory_limit = 0;
};

class Session {
 public:
  // Maps `path` (and any external data beside it); weights stay in the mapping.
  explicit Session(const std::string& path, SessionOptions options = {});
  // From a caller's buffer, which must outlive the session: weights are views into it.
  // External data, if any, is resolved relative to `base_dir`.
  static Session from_memory(const void* data, size_t size, SessionOptions options = {},
                             const std::string& base_dir = "");
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  const std::vector<IoInfo>& inputs() const;
  const std::vector<IoInfo>& outputs() const;
  const std::string& path() const;
  std::map<std::string, std::string> metadata() const;
  ModelInfo model_info() const;
  int64_t opset(const std::string& domain = "") const;
  // The graph as it runs, after optimisation: one line per node ("name: Op(inputs) ->
  // outputs", domain-qualified outside ai.onnx), nested graphs indented under their node.
  std::string graph_text() const;

  // Runs the model. Every graph input without a default must be given; outputs are
  // returned in the model's declared order. Safe to call from several threads at once.
  std::vector<NamedValue> run(std::vector<NamedValue> inputs);
  // The same, with per-run controls, and this run's counters in `stats` and (with
  // SessionOptions::profile) its node events in `profile`, when given: the form for runs
  // on several threads, where "the last run" is not a meaningful question. A run that
  // throws (cancelled, past its deadline, or failing in a node) still leaves its counters up
  // to that point in `stats`: RunStats::nodes_run counts the nodes it completed.
  std::vector<NamedValue> run(std::vector<NamedValue> inputs, const RunOptions& options,
                              RunStats* stats = nullptr, std::vector<NodeEvent>* profile = nullptr);
  // The same for a braced list: values moved into the list are owned by the run.
  std::vector<NamedValue> run(std::initializer_list<NamedValue> inputs);
  // The same, in the caller's vectors, for a loop that runs the session again and again (a
  // decoder's steps): the run takes every value of `inputs` as if moved in (a value the
  // caller still shares is only read) and leaves each empty, names kept; `outputs` receives
  // the outputs in the model's order, keeping its elements' names and its capacity. Kept
  // from one run to the next, neither vector nor the names allocate again.
  void run(std::vector<NamedValue>& inputs, std::vector<NamedValue>& outputs,
           const RunOptions& options = RunOptions(), RunStats* stats = nullptr,
           std::vector<NodeEvent>* profile = nullptr);

  // A tensor for graph input `name`, to fill and pass to the next run() by move: its storage
  // comes from the session's buffer pool (uninitialized) and, with
  // SessionOptions::inputs_in_arena, from the activation arena once one is planned for the
  // shapes of the inputs allocated since the last run (in the same order). Any run stays
  // correct whatever it is given: a tensor not passed, passed by copy or under other shapes
  // only costs arena reuse. Throws kiln::Error (InvalidArgument) when `name` is not a graph
  // input, or `dtype` or `shape` contradict its declared type. Thread-safe; the inputs allocated
  // belong to the next run to start on any thread, so allocate and run on one thread to get
  // the arena placement.
  Tensor allocate_input(const std::string& name, DataType dtype, const Shape& shape);

  // Gives the hollow constant `name` its data: exactly the tensor's byte size, in kiln's
  // layout (row-major, native byte order, as ONNX raw_data on little-endian machines). The
  // bytes are copied once into a 64-byte aligned buffer the session owns (counted in
  // LoadStats). Throws kiln::Error (InvalidArgument) for an unknown name, a name that is not
  // a hollow constant (or was already given), or a wrong size.
  void set_constant(const std::string& name, const void* data, size_t size);
  // Hollow constants still waiting for set_constant; run() refuses to start until it is empty.
  std::vector<IoInfo> missing_constants() const;

  // The counters and profile of the last run to finish (successfully). For one thread
  // running the session; with runs on several threads, ask run() for each run's own (these
  // references must not be read while another run may finish).
  const RunStats& last_run_stats() const;
  const LoadStats& load_stats() const;
  const std::vector<NodeEvent>& last_profile() const;

  // Internal: sessions are built by the constructor above, from_memory, or (for graphs made
  // in code) kiln::session_from_model; Impl is opaque outside the engine.
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
