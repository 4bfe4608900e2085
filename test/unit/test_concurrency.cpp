// Session::run from many threads at once on one Session, sessions made and destroyed
// concurrently in one Environment, and runs stopped through RunOptions. `make tsan` runs the
// [concurrency] cases under ThreadSanitizer.
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "ops/core/kernel.h"
#include "test/unit/op_test.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

const std::string kCnn = std::string(KILN_SOURCE_DIR) + "/models/tiny-cnn/model.onnx";
const std::string kGpt2 = std::string(KILN_SOURCE_DIR) + "/models/gpt2-tiny-random/model.onnx";

// Under ThreadSanitizer every access is checked: fewer runs, the same interleavings.
#if defined(__SANITIZE_THREAD__)
constexpr int kRunsPerThread = 100;
#else
constexpr int kRunsPerThread = 300;
#endif
constexpr int kThreads = 8;

// Deterministic float data, different for each `variant`.
Tensor filled(DataType dtype, const Shape& shape, int variant) {
  Tensor t = Tensor::zeros(dtype, shape);
  const int64_t n = t.numel();
  if (dtype == DataType::Float) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((i * 7 + variant * 13) % 23) / 23.0f;
  }
  return t;
}

// The CNN's input, one variant per value of `variant`.
std::vector<NamedValue> cnn_feed(const Session& s, int variant) {
  const IoInfo& io = s.inputs()[0];
  Shape shape;
  for (int64_t d : io.shape) shape.push_back(d < 0 ? 1 : d);
  return {{io.name, filled(io.dtype, shape, variant)}};
}

// A GPT-2 decode step after `past` tokens: one token, the cache of the steps before.
std::vector<NamedValue> decode_feed(const Session& s, int variant, int64_t past) {
  std::vector<NamedValue> feed;
  for (const IoInfo& io : s.inputs()) {
    if (io.name.rfind("past_key_values", 0) == 0) {
      Shape shape;
      for (size_t i = 0; i < io.shape.size(); ++i) {
        shape.push_back(io.shape[i] >= 0 ? io.shape[i] : i == 0 ? 1 : past);
      }
      feed.push_back({io.name, filled(io.dtype, shape, variant)});
    } else if (io.name == "attention_mask") {
      feed.push_back({io.name, Tensor::from_vector<int64_t>({1, past + 1},
                                                            std::vector<int64_t>(past + 1, 1))});
    } else if (io.name == "position_ids") {
      feed.push_back({io.name, Tensor::from_vector<int64_t>({1, 1}, {past})});
    } else if (io.name == "input_ids") {
      feed.push_back({io.name, Tensor::from_vector<int64_t>({1, 1}, {17 + 31 * variant})});
    }
  }
  return feed;
}

bool same_bytes(const Value& a, const Value& b) {
  if (!a.is_tensor() || !b.is_tensor()) return false;
  const Tensor x = a.tensor().contiguous(), y = b.tensor().contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() && x.nbytes() == y.nbytes() &&
         std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// `n_threads` threads each run `s` `runs` times on the feeds in turn; every output must
// equal, byte for byte, the one a single thread got for the same feed. Returns the mismatches.
// `kept_vectors`: each thread runs in its own input and output vectors, kept from run to run
// (Session::run's reusing form).
int run_concurrently(Session& s, const std::vector<std::vector<NamedValue>>& feeds,
                     int n_threads = kThreads, int runs = kRunsPerThread,
                     bool kept_vectors = false) {
  std::vector<std::vector<NamedValue>> expected;
  std::vector<uint64_t> expected_nodes;
  for (const auto& feed : feeds) {
    RunStats stats;
    expected.push_back(s.run(feed, RunOptions{}, &stats));
    expected_nodes.push_back(stats.nodes_run);
  }
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      const RunOptions options;
      std::vector<NamedValue> in, out;
      try {
        for (int i = 0; i < runs; ++i) {
          const size_t k = static_cast<size_t>(t + i) % feeds.size();
          RunStats stats;
          if (kept_vectors) {
            in.resize(feeds[k].size());
            for (size_t j = 0; j < in.size(); ++j) {
              in[j].name = feeds[k][j].name;
              in[j].value = feeds[k][j].value;
            }
            s.run(in, out, options, &stats);
          } else {
            out = s.run(feeds[k], options, &stats);
          }
          bool ok = out.size() == expected[k].size() && stats.nodes_run == expected_nodes[k];
          for (size_t j = 0; ok && j < out.size(); ++j) {
            ok = same_bytes(out[j].value, expected[k][j].value);
          }
          if (!ok) ++mismatches;
        }
      } catch (const std::exception&) {
        ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  return mismatches;
}

}  // namespace

TEST_CASE("runs of a CNN on one Session from 8 threads equal single-threaded runs",
          "[concurrency]") {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(2);
  Session s(kCnn, so);
  std::vector<std::vector<NamedValue>> feeds;
  for (int v = 0; v < 3; ++v) feeds.push_back(cnn_feed(s, v));
  CHECK(run_concurrently(s, feeds) == 0);
  // The session is as usable from one thread afterwards: the warm run allocates nothing.
  s.run(feeds[0]);
  s.run(feeds[0]);
  CHECK(s.last_run_stats().allocations == 0);
}

TEST_CASE("decode steps of GPT-2 on one Session from 8 threads equal single-threaded runs",
          "[concurrency]") {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(2);
  Session s(kGpt2, so);
  // Two cache lengths: runs keep changing shapes, so the arena is planned, recorded and
  // taken by turns while other runs are served by the pool.
  std::vector<std::vector<NamedValue>> feeds;
  for (int v = 0; v < 4; ++v) feeds.push_back(decode_feed(s, v, v % 2 == 0 ? 6 : 9));
  CHECK(run_concurrently(s, feeds) == 0);
}

TEST_CASE("decode steps of GPT-2 in each thread's kept vectors equal single-threaded runs",
          "[concurrency]") {
  SessionOptions so;
  so.environment = std::make_shared<Environment>(2);
  Session s(kGpt2, so);
  std::vector<std::vector<NamedValue>> feeds;
  for (int v = 0; v < 4; ++v) feeds.push_back(decode_feed(s, v, v % 2 == 0 ? 6 : 9));
  CHECK(run_concurrently(s, feeds, kThreads, kRunsPerThread, true) == 0);
}

TEST_CASE("runs whose kernels split across the arena's threads, from 4 threads at once",
          "[concurrency]") {
  // A product big enough for the GEMM layer to split (run_tasks) and a broadcast Add over
  // 512 rows (ops::parallel_for), on an environment of two threads.
  GraphBuilder b;
  b.input("x", DataType::Float, {192, 192}, true);
  b.input("col", DataType::Float, {512, 1}, true);
  b.input("row", DataType::Float, {1, 512}, true);
  b.initializer("w", filled(DataType::Float, {192, 192}, 5));
  b.node("MatMul", {"x", "w"}, {"y"});
  b.node("Add", {"col", "row"}, {"grid"});
  b.output("y");
  b.output("grid");
  Session s = make_session(b.build(), 18, 2);
  std::vector<std::vector<NamedValue>> feeds;
  for (int v = 0; v < 2; ++v) {
    feeds.push_back({{"x", filled(DataType::Float, {192, 192}, v)},
                     {"col", filled(DataType::Float, {512, 1}, v)},
                     {"row", filled(DataType::Float, {1, 512}, v + 1)}});
  }
  CHECK(run_concurrently(s, feeds, 4, 20) == 0);
}

TEST_CASE("sessions are made, run and destroyed on several threads in one Environment",
          "[concurrency]") {
  auto env = std::make_shared<Environment>(2);
  std::vector<NamedValue> expected;
  std::vector<NamedValue> feed;
  {
    SessionOptions so;
    so.environment = env;
    Session s(kCnn, so);
    feed = cnn_feed(s, 1);
    expected = s.run(feed);
  }
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      try {
        for (int i = 0; i < 10; ++i) {
          SessionOptions so;
          so.environment = env;  // weights shared through the environment's cache
          Session s(kCnn, so);
          const auto out = s.run(feed);
          if (out.size() != expected.size() || !same_bytes(out[0].value, expected[0].value)) {
            ++mismatches;
          }
        }
      } catch (const std::exception&) {
        ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  CHECK(mismatches == 0);
}

namespace {

// kiln.test.Tick: y = x, counting its runs in `ticks`; when the count reaches `cancel_at`
// it calls `on_tick` (a test cancels its RunOptions from inside the run there). The tests
// count what a run did after cancel() with it, not how long it took.
std::atomic<int64_t> ticks{0};
std::atomic<int64_t> cancel_at{-1};
std::function<void()> on_tick;

class Tick final : public ops::Kernel {
 public:
  explicit Tick(const ops::NodeInfo&) {}
  void run(ops::OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor& y = ctx.output(0, DataType::Float, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = x.data<const float>()[i];
    if (++ticks == cancel_at.load()) on_tick();
  }
};

KILN_REGISTER_OP({.domain = "kiln.test",
                  .op = "Tick",
                  .since = 1,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "float",
                  .shape = [](ops::ShapeContext& c) { c.same(0, 0); },
                  .create = ops::make<Tick>});

// A Loop of `trips` iterations whose body ticks and adds one to a counter.
Session counting_loop(int64_t trips) {
  GraphBuilder body("body");
  body.input("i", DataType::Int64, {}, true);
  body.input("cond_in", DataType::Bool, {}, true);
  body.input("n_in", DataType::Float, {1}, true);
  body.initializer("one", Tensor::from_vector<float>({1}, {1.0f}));
  body.node("Identity", {"cond_in"}, {"cond_out"});
  body.node("Tick", {"n_in"}, {"t"}, {}, "kiln.test");
  body.node("Add", {"t", "one"}, {"n_out"});
  body.output("cond_out");
  body.output("n_out");
  GraphBuilder b;
  b.input("n", DataType::Float, {1}, true);
  b.initializer("trips", Tensor::from_vector<int64_t>({1}, {trips}));
  b.initializer("cond", Tensor::from_vector<bool>({1}, {true}));
  b.node("Loop", {"trips", "cond", "n"}, {"count"}, {graph_attr("body", body.build())});
  b.output("count");
  return make_session(b.build(), 18, 2);
}

const std::vector<NamedValue> zero_feed() {
  return {{"n", Tensor::from_vector<float>({1}, {0.0f})}};
}

// Waits until `done` holds, for as long as a hung run could take to show itself: this
// bounds a test that would otherwise never end, and is no latency target.
template <typename F>
bool wait_for(F done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// Nodes a run of the counting loop completes per iteration (the passes may drop the body's
// Identity), from a short run: trips * per_iteration + 1 (the Loop node).
uint64_t nodes_per_iteration() {
  Session s = counting_loop(5);
  RunOptions options;
  RunStats stats;
  s.run(zero_feed(), options, &stats);
  REQUIRE((stats.nodes_run - 1) % 5 == 0);
  return (stats.nodes_run - 1) / 5;
}

}  // namespace

TEST_CASE("a run cancelled from inside its Loop starts no node after cancel()",
          "[concurrency][cancel]") {
  const uint64_t per_iteration = nodes_per_iteration();
  Session s = counting_loop(1'000'000'000'000);
  RunOptions options;
  ticks = 0;
  on_tick = [&options] { options.cancel(); };
  cancel_at = 1000;
  RunStats stats;
  std::string error;
  try {
    s.run(zero_feed(), options, &stats);
  } catch (const RunCancelled& e) {
    error = e.what();
  }
  cancel_at = -1;
  CHECK_THAT(error, Catch::Contains("cancelled"));
  CHECK_THAT(error, Catch::Contains("node"));
  // The 1000th Tick cancelled; the run stopped before its next node: no Tick after it, and
  // the nodes completed are those of 999 whole iterations and part of the 1000th.
  CHECK(ticks == 1000);
  CHECK(stats.nodes_run > 999 * per_iteration);
  CHECK(stats.nodes_run <= 1000 * per_iteration);
}

TEST_CASE("a Loop of 10^12 iterations cancelled from another thread runs at most one node more",
          "[concurrency][cancel]") {
  Session s = counting_loop(1'000'000'000'000);
  RunOptions options;
  ticks = 0;
  std::atomic<bool> cancelled{false};
  std::atomic<int64_t> ticks_at_cancel{-1};
  std::thread canceller([&] {
    // Let the run go some way first, so that cancel() meets it in the middle of the Loop.
    if (!wait_for([] { return ticks.load() >= 200; })) return;
    options.cancel();
    ticks_at_cancel = ticks.load();
    cancelled = true;
  });
  std::string error;
  RunStats stats;
  try {
    s.run(zero_feed(), options, &stats);
  } catch (const RunCancelled& e) {
    error = e.what();
  }
  canceller.join();
  REQUIRE(cancelled);
  CHECK_THAT(error, Catch::Contains("cancelled"));
  // After cancel() returned, the run finished at most the Tick it was in: the executor
  // checks the flag before every node (RunOptions::cancel's bound).
  CHECK(ticks - ticks_at_cancel <= 1);
  CHECK(stats.nodes_run >= 200);

  // The session stays usable: a short loop runs to the end, and a cancelled RunOptions
  // stops the next run before its first node until reset.
  Session short_loop = counting_loop(5);
  RunStats stopped;
  const int64_t before = ticks;
  CHECK_THROWS_AS(short_loop.run(zero_feed(), options, &stopped), RunCancelled);
  CHECK(stopped.nodes_run == 0);
  CHECK(ticks == before);
  options.reset();
  const auto out = short_loop.run(zero_feed(), options);
  CHECK(out[0].value.tensor().data<float>()[0] == 5.0f);
}

TEST_CASE("a deadline stops a run: one already past before its first node, a near one in its Loop",
          "[concurrency][cancel]") {
  Session s = counting_loop(1'000'000'000'000);
  // Past: nothing runs.
  RunOptions past;
  past.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  RunStats stats;
  ticks = 0;
  CHECK_THROWS_WITH(s.run(zero_feed(), past, &stats), Catch::Contains("deadline"));
  CHECK(stats.nodes_run == 0);
  CHECK(ticks == 0);

  // 20 ms ahead: the same session, after the stopped run, stops in the Loop at the deadline.
  // A watchdog cancels instead if the deadline never fires, which then fails the message
  // check rather than hanging the suite.
  RunOptions timed;
  timed.set_timeout(std::chrono::milliseconds(20));
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    if (!wait_for([&] { return finished.load(); })) timed.cancel();
  });
  std::string error;
  try {
    s.run(zero_feed(), timed, &stats);
  } catch (const RunCancelled& e) {
    error = e.what();
  }
  finished = true;
  watchdog.join();
  CHECK_THAT(error, Catch::Contains("deadline"));
  CHECK(stats.nodes_run > 0);
}
