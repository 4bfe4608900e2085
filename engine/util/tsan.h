// ThreadSanitizer annotations for hand-offs through oneTBB. The packaged oneTBB is not
// instrumented, so the happens-before edges its scheduler provides (a task sees what the
// thread that spawned it wrote; the spawner sees what its tasks wrote once they are waited
// for) are invisible to ThreadSanitizer. kiln states them at its own hand-offs: release
// before handing work over, acquire where the work starts, and the same back on completion.
// Without -fsanitize=thread these compile to nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace kiln::tsan {

inline void release(const void* sync) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(const_cast<void*>(sync));
#else
  (void)sync;
#endif
}

inline void acquire(const void* sync) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(const_cast<void*>(sync));
#else
  (void)sync;
#endif
}

}  // namespace kiln::tsan
