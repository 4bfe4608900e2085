// libFuzzer harness: bytes -> a model loaded from memory -> one run when its inputs have
// small shapes. Every failure must be a kiln::Error; anything else (a crash, a sanitizer
// report, another exception, an allocation over the fuzzer's limit) is a finding.
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "kiln/kiln.h"
#include "test/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::SessionOptions options = kiln::fuzz::session_options();
  try {
    kiln::Session session = kiln::Session::from_memory(data, size, options);
    kiln::fuzz::run_with_zeros(session);
  } catch (const kiln::Error&) {
    // A clear error is the expected outcome for most inputs.
  } catch (const std::exception& e) {
    kiln::fuzz::finding(e);
  }
  return 0;
}
