// A read-only memory map of a whole file. Weights are views into it, so it lives as long
// as any tensor that views it (Storage holds it through a shared_ptr).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace kiln::proto {

class MappedFile {
 public:
  // Throws kiln::Error (Io) naming the path when the file cannot be opened or mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace kiln::proto
