// How long random sweeps run. The sanitizer builds check memory and races, not arithmetic,
// and run each case 10-50x slower: there a sweep runs a quarter of its iterations (at least
// two); the release build runs it whole at every instruction-set level.
#pragma once

namespace kiln::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

constexpr int sweep_iterations(int n) {
  return kSanitized ? (n / 4 > 2 ? n / 4 : 2) : n;
}

}  // namespace kiln::testing
