#include "kiln/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "engine/runtime/page_release.h"
#include "kiln/error.h"

namespace kiln {
namespace {

int system_madvise(void* addr, size_t length, int advice) {
  return ::madvise(addr, length, advice);
}

std::atomic<detail::MadviseFunction> g_madvise{&system_madvise};

// Why a tensor's pages cannot be released, or "" when they can.
std::string not_releasable_reason(const Tensor& t) {
  if (!t.defined()) return "it has no data";
  const Storage& s = *t.storage();
  switch (s.kind()) {
    case Storage::Kind::Pool:
      return "its bytes are a pooled buffer";
    case Storage::Kind::Heap:
      return "its bytes are heap memory (a copied weight)";
    case Storage::Kind::Strings:
      return "it holds strings";
    case Storage::Kind::View:
      break;
  }
  if (!s.file_mapped() || s.writable()) return "its bytes are not a read-only file mapping";
  if (!t.is_contiguous()) return "it is not contiguous";
  if (t.byte_offset() > s.capacity() || t.nbytes() > s.capacity() - t.byte_offset()) {
    return "it reaches past the end of its storage";
  }
  return "";
}

}  // namespace

namespace detail {

MadviseFunction replace_madvise_for_testing(MadviseFunction fn) {
  return g_madvise.exchange(fn ? fn : &system_madvise);
}

}  // namespace detail

std::string PageRelease::describe() const {
  switch (status) {
    case Status::Released:
      return "released " + std::to_string(bytes) + " bytes";
    case Status::NoWholePage:
      return "no whole page in the range";
    case Status::Failed:
      break;
  }
  return "madvise(MADV_DONTNEED) of " + std::to_string(bytes) +
         " bytes failed: " + std::strerror(error);
}

size_t page_size() {
  static const size_t size = [] {
    const long n = ::sysconf(_SC_PAGESIZE);
    return n > 0 ? static_cast<size_t>(n) : size_t{4096};
  }();
  return size;
}

bool pages_releasable(const Tensor& t) {
  return not_releasable_reason(t).empty();
}

PageRelease release_pages(const Tensor& weight, PageReleaseCounters* counters) {
  const std::string why = not_releasable_reason(weight);
  if (!why.empty()) {
    throw Error(ErrorKind::InvalidArgument,
                "release_pages: cannot release the pages of " + weight.describe() + ": " + why);
  }
  const uintptr_t begin = reinterpret_cast<uintptr_t>(weight.raw_data());
  const uintptr_t end = begin + weight.nbytes();
  const uintptr_t page = page_size();
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = end / page * page;
  PageRelease result;
  if (last <= first) return result;
  result.bytes = last - first;
  if (counters) ++counters->calls;
  // The pages are clean copies of the file (PROT_READ, MAP_PRIVATE): dropping them loses
  // nothing, and the next access faults them in from the file again.
  if (g_madvise.load()(reinterpret_cast<void*>(first), result.bytes, MADV_DONTNEED) != 0) {
    result.status = PageRelease::Status::Failed;
    result.error = errno;
    if (counters) ++counters->failures;
    return result;
  }
  result.status = PageRelease::Status::Released;
  if (counters) counters->bytes_released += result.bytes;
  return result;
}

}  // namespace kiln
