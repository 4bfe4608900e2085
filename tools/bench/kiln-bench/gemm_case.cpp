// kiln-bench gemm M N K: the GEMM layer alone (ops/math/gemm.h) at one shape, with B packed
// ahead (a weight) and unpacked (an activation), beside the machine's measured FMA peak and
// streaming read bandwidth, and beside Eigen's product compiled into this binary (for the
// build's baseline instruction set, as every Eigen product in kiln was before the GEMM layer).
// A one-row product is also timed on weights streamed from memory (a decode step's case).
#include "tools/bench/kiln-bench/gemm_case.h"

#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>
#include <vector>

#include "kiln/version.h"
#include "ops/math/gemm.h"
#include "tools/common/json_output.h"

namespace kiln::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median seconds of `iterations` calls after `warmup` untimed ones, and untimed calls for at
// least a quarter of a second: a fresh arena's worker threads take a while to join its
// parallel loops (docs/performance.md, "Figures cited in code comments"), which a short
// product would otherwise be timed in.
template <typename F>
double median_seconds(int warmup, int iterations, F&& f) {
  const auto start = Clock::now();
  for (int i = 0; i < warmup || seconds_since(start) < 0.25; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// GFLOP/s of independent FMA chains on every thread of the arena.
double fma_peak_gflops(const math::MathKernels& k, int threads) {
  const int64_t iterations = 20'000'000;
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    double flops = 0;
    std::vector<double> per(static_cast<size_t>(threads));
    tbb::parallel_for(
        0, threads, [&](int t) { per[static_cast<size_t>(t)] = k.gemm.fma_peak_loop(iterations); },
        tbb::static_partitioner());
    for (double f : per) flops += f;
    best = std::max(best, flops / seconds_since(t0) / 1e9);
  }
  return best;
}

}  // namespace

// GB/s reading a 1 GiB float array once (the vector sum kernel).
double read_bandwidth_gbps(int threads) {
  const math::MathKernels& k = math::kernels();
  tbb::task_arena arena(threads);
  const int64_t n = int64_t{1} << 28;
  std::vector<float> x(static_cast<size_t>(n), 1.0f);
  double best = 0;
  volatile float sink = 0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    std::vector<float> part(static_cast<size_t>(threads));
    arena.execute([&] {
      tbb::parallel_for(
          0, threads,
          [&](int t) {
            const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
            part[static_cast<size_t>(t)] = k.vec.sum(x.data() + lo, hi - lo);
          },
          tbb::static_partitioner());
    });
    best = std::max(best, static_cast<double>(n) * 4 / seconds_since(t0) / 1e9);
    for (float p : part) sink = sink + p;
  }
  return best;
}

int run_gemm_case(int64_t m, int64_t n, int64_t k, int threads, int warmup, int iterations) {
  tbb::task_arena arena(threads);
  const math::MathKernels& table = math::kernels();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)),
      c(static_cast<size_t>(m * n));
  for (auto& v : a) v = dist(rng);
  for (auto& v : b) v = dist(rng);
  const math::MatrixView av = math::MatrixView::row_major(a.data(), m, k, k);
  const math::MatrixView bv = math::MatrixView::row_major(b.data(), k, n, n);
  const math::PackedB packed(bv);
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);

  // A one-row product as a decode step runs it: its weights come from memory, not from the
  // cache the previous call left them in. Calls cycle through copies of the packed B that
  // together exceed any cache (256 MiB).
  const bool one_row = m <= table.gemm.mr;
  std::vector<math::PackedB> copies;
  if (one_row) {
    const int64_t bytes = k * n * 4;
    const int64_t count = std::max<int64_t>(2, ((int64_t{256} << 20) + bytes - 1) / bytes);
    for (int64_t i = 0; i < count; ++i) copies.emplace_back(bv);
  }

  double t_packed = 0, t_unpacked = 0, t_streamed = 0, t_eigen = 0, peak = 0, bandwidth = 0;
  arena.execute([&] {
    t_packed = median_seconds(warmup, iterations, [&] { math::sgemm(av, packed, c.data(), n); });
    t_unpacked = median_seconds(warmup, iterations, [&] { math::sgemm(av, bv, c.data(), n); });
    size_t next = 0;
    if (one_row) {
      t_streamed = median_seconds(warmup, std::max<int>(iterations, 100), [&] {
        math::sgemm(av, copies[next], c.data(), n);
        next = (next + 1) % copies.size();
      });
    }
    // Eigen's own threading is off in kiln (EIGEN_DONT_PARALLELIZE), so its product runs on
    // one thread whatever --threads says.
    using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const RowMat> ea(a.data(), m, k), eb(b.data(), k, n);
    Eigen::Map<RowMat> ec(c.data(), m, n);
    t_eigen = median_seconds(warmup, iterations, [&] { ec.noalias() = ea * eb; });
    peak = fma_peak_gflops(table, threads);
    bandwidth = read_bandwidth_gbps(threads);
  });

  auto result = [&](const char* name, double t, bool eigen) -> tooling::Json {
    return {{"impl", name},
            {"median_ms", t * 1e3},
            {"gflops", flops / t / 1e9},
            {"share_of_peak", flops / t / 1e9 / (eigen ? peak / threads : peak)},
            // What streaming B once from memory would allow (the bound for M = 1).
            {"b_gbps", static_cast<double>(k * n) * 4 / t / 1e9}};
  };
  tooling::Json j;
  j["engine"] = "kiln";
  j["case"] = "gemm";
  j["kiln_version"] = kiln::version();
  j["isa"] = kiln::isa_level();
  j["m"] = m;
  j["n"] = n;
  j["k"] = k;
  j["threads"] = threads;
  j["fma_peak_gflops"] = peak;
  j["read_bandwidth_gbps"] = bandwidth;
  j["results"] = {result("kiln packed B", t_packed, false),
                  result("kiln unpacked B", t_unpacked, false),
                  result("eigen (one thread, baseline build)", t_eigen, true)};
  if (one_row) j["results"].push_back(result("kiln packed B, streamed", t_streamed, false));
  tooling::write_json(std::cout, j);
  return 0;
}

}  // namespace kiln::bench
