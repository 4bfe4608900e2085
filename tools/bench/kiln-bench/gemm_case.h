// kiln-bench gemm M N K (see gemm_case.cpp).
#pragma once

#include <cstdint>

namespace kiln::bench {

// Prints one JSON object; returns the exit status.
int run_gemm_case(int64_t m, int64_t n, int64_t k, int threads, int warmup, int iterations);

}  // namespace kiln::bench
