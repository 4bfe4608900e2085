// Force-included before every kiln source by GCC < 13 (see CMakeLists.txt).
//
// GCC 12's AVX-512 intrinsics build their "undefined" vectors as `__m512 __Y = __Y;`
// (GCC bug 105593), and once inlined into an optimised caller that self-initialisation is
// reported as -Wmaybe-uninitialized / -Wuninitialized at the intrinsic header's line, in our
// code and in Eigen's. Diagnostics are classified by the location they point at, so
// including <immintrin.h> first, with those two warnings off, silences exactly the
// intrinsic headers' lines and nothing else; every later include of it is a no-op.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
