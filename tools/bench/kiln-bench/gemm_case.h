// kiln-bench gemm M N K (see gemm_case.cpp).
#pragma once

#include <cstdint>

namespace kiln::bench {

// GB/s reading a 1 GiB float array once on `threads` threads (the vector sum kernel), the
// best of three passes: the streaming bandwidth a memory-bound step is compared with.
double read_bandwidth_gbps(int threads);

// Prints one JSON object; returns the exit status.
int run_gemm_case(int64_t m, int64_t n, int64_t k, int threads, int warmup, int iterations);

}  // namespace kiln::bench
