// Internal: the system call behind release_pages, replaceable so tests can exercise the
// failure path deterministically.
#pragma once

#include <cstddef>

namespace kiln::detail {

using MadviseFunction = int (*)(void* addr, size_t length, int advice);

// Makes release_pages call `fn` instead of ::madvise (null restores ::madvise). Returns the
// function used before. For tests only: not meant to be changed while sessions run.
MadviseFunction replace_madvise_for_testing(MadviseFunction fn);

}  // namespace kiln::detail
