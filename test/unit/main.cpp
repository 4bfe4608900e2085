// Catch2 v2 provides main() through this definition.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cstdlib>
#include <iostream>

#include "engine/util/float_mode.h"

namespace {

// With KILN_REPORT_DENORMALS set, each test case whose main thread met a denormal operand or
// produced an underflow (MXCSR's sticky flags, cleared as the case starts) is named on
// stderr: the cases an Intel processor runs slowly, found on any x86 processor.
struct DenormalReport : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  static bool on() {
    static const bool enabled = std::getenv("KILN_REPORT_DENORMALS") != nullptr;
    return enabled;
  }
  void testCaseStarting(const Catch::TestCaseInfo&) override {
    if (on()) kiln::fp::clear_status_flags();
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (!on()) return;
    const unsigned flags = kiln::fp::denormal_flags();
    if (flags != 0) {
      std::cerr << "KILN-DENORMALS: " << stats.testInfo.name << ((flags & 0x2u) ? " [operand]" : "")
                << ((flags & 0x10u) ? " [underflow]" : "") << "\n";
    }
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(DenormalReport)
