// Giving the pages of mapped weights back to the OS.
//
// Weights loaded from a file are views into a read-only private mapping: their pages are
// clean copies of the file, so dropping them loses nothing (the next access reads them from
// the file, usually from the page cache). Releasing each weight after its last use lets a
// model run with about one layer's weights resident at a time
// (SessionOptions::release_weights_after_use).
#pragma once

#include <cstdint>
#include <string>

#include "kiln/tensor.h"

namespace kiln {

// Running totals over release_pages calls.
struct PageReleaseCounters {
  uint64_t calls = 0;           // madvise calls made (ranges holding at least one whole page)
  uint64_t bytes_released = 0;  // bytes of the calls that succeeded
  uint64_t failures = 0;        // calls that failed (the pages simply stay resident)
};

// The outcome of one release_pages call.
struct PageRelease {
  enum class Status {
    Released,     // `bytes` (whole pages) were given back
    NoWholePage,  // the range holds no whole page: nothing to do
    Failed,       // madvise failed with `error` (errno); the data is untouched
  };
  Status status = Status::NoWholePage;
  uint64_t bytes = 0;  // whole-page bytes inside the range (attempted when Failed)
  int error = 0;
  bool ok() const { return status != Status::Failed; }
  // "released 8192 bytes", "no whole page", "madvise(MADV_DONTNEED) of 8192 bytes failed: ..."
  std::string describe() const;
};

// The page size release_pages rounds to.
size_t page_size();

// True when `t` is a contiguous view of a read-only file mapping (Storage::file_mapped),
// the only memory whose pages can be dropped without losing data.
bool pages_releasable(const Tensor& t);

// madvise(MADV_DONTNEED) on the whole pages inside `weight`'s bytes: the start is rounded up
// and the end down to the page size, so pages shared with neighbouring data are kept. The
// data reads back unchanged afterwards. A failed madvise is reported in the result (and
// counted in `counters`), never thrown. Throws kiln::Error (InvalidArgument) when the tensor
// is not releasable (see pages_releasable): heap, pooled or caller memory would lose its data.
PageRelease release_pages(const Tensor& weight, PageReleaseCounters* counters = nullptr);

}  // namespace kiln
