// libFuzzer harness for the tensor readers: the first byte picks the .npy reader or the ONNX
// test-data (.pb) reader, the rest is the file. Every failure must be a kiln::Error.
#include <cstdint>
#include <string>

#include "proto/loader.h"
#include "test/fuzz/fuzz_common.h"
#include "tools/common/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string path = kiln::fuzz::scratch_file("tensor", data + 1, size - 1);
  try {
    if (data[0] & 1) {
      kiln::tooling::read_npy(path);
    } else {
      std::string name;
      kiln::proto::read_value_file(path, kiln::ir::TypeInfo{}, &name);
    }
  } catch (const kiln::Error&) {
  } catch (const std::exception& e) {
    kiln::fuzz::finding(e);
  }
  return 0;
}
