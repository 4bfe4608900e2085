// The floating-point control mode of a thread (MXCSR on x86: rounding, exception masks,
// flush-to-zero and denormals-are-zero), so that a run's denormal setting
// (SessionOptions::denormals) holds on every thread that runs its kernels: the thread running
// the graph sets it for the run and restores its own afterwards, and the tasks it hands to
// the pool's workers take the mode of the thread that made them (threading.h, common.h).
// Elsewhere than x86 these do nothing.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define KILN_HAS_MXCSR 1
#else
#define KILN_HAS_MXCSR 0
#endif

namespace kiln::fp {

// Flush-to-zero (bit 15: a denormal result becomes 0) and denormals-are-zero (bit 6: a denormal
// input reads as 0). Some processors take a microcode assist of a hundred cycles or more for
// an operation that meets a denormal; with both set no instruction does.
constexpr unsigned kFlushBits = 0x8040u;
// MXCSR's low six bits are sticky status flags: they stay the thread's own.
constexpr unsigned kStatusBits = 0x3Fu;

// This thread's control mode (the status flags left out).
inline unsigned mode() {
#if KILN_HAS_MXCSR
  return _mm_getcsr() & ~kStatusBits;
#else
  return 0;
#endif
}

// This thread's mode with flushing on or off.
inline unsigned mode_with_flush(bool flush) {
  return flush ? (mode() | kFlushBits) : (mode() & ~kFlushBits);
}

// Whether this thread flushes denormals (both bits set).
inline bool flushing() {
  return (mode() & kFlushBits) == kFlushBits;
}

// Whether `v` is a denormal float (a zero exponent field, a nonzero fraction), by its bits:
// a comparison would read it as zero on a thread that flushes.
inline bool is_denormal(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  return (bits & 0x7F800000u) == 0 && (bits & 0x007FFFFFu) != 0;
}

// MXCSR's sticky status flags for a denormal operand (bit 1) and an underflow, a result
// too small for a normal float (bit 4): the operations an Intel processor may take an
// assist on. Set by any instruction of this thread since they were last cleared.
constexpr unsigned kDenormalFlags = 0x12u;

inline unsigned denormal_flags() {
#if KILN_HAS_MXCSR
  return _mm_getcsr() & kDenormalFlags;
#else
  return 0;
#endif
}

inline void clear_status_flags() {
#if KILN_HAS_MXCSR
  _mm_setcsr(_mm_getcsr() & ~kStatusBits);
#endif
}

// Puts `mode` on this thread for the scope's lifetime and then restores the thread's own; costs
// one read of the register when the two agree.
class ModeScope {
 public:
  explicit ModeScope(unsigned mode) {
#if KILN_HAS_MXCSR
    const unsigned csr = _mm_getcsr();
    saved_ = csr & ~kStatusBits;
    if (saved_ != mode) {
      _mm_setcsr(mode | (csr & kStatusBits));
      changed_ = true;
    }
#else
    (void)mode;
#endif
  }
  ~ModeScope() {
#if KILN_HAS_MXCSR
    if (changed_) _mm_setcsr(saved_ | (_mm_getcsr() & kStatusBits));
#endif
  }
  ModeScope(const ModeScope&) = delete;
  ModeScope& operator=(const ModeScope&) = delete;

 private:
  unsigned saved_ = 0;
  bool changed_ = false;
};

}  // namespace kiln::fp
