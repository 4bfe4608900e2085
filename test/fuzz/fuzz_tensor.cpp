// libFuzzer harness for the tensor readers: the first byte picks the .npy reader or the ONNX
// test-data (.pb) reader, the rest is the file. Every failure must be a kiln::Error.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "proto/loader.h"
#include "test/fuzz/fuzz_common.h"
#include "tools/common/npy.h"

namespace {

const std::string& scratch_path() {
  static const std::string path =
      "/tmp/kiln-fuzz-tensor-" + std::to_string(static_cast<long>(getpid()));
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  {
    std::ofstream out(scratch_path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  try {
    if (data[0] & 1) {
      kiln::tooling::read_npy(scratch_path());
    } else {
      std::string name;
      kiln::proto::read_value_file(scratch_path(), kiln::ir::TypeInfo{}, &name);
    }
  } catch (const kiln::Error&) {
  } catch (const std::exception& e) {
    kiln::fuzz::finding(e);
  }
  return 0;
}
