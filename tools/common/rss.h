// Resident memory of this process, for the benchmark tools.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace kiln::tooling {

// The peak RSS of this process image: VmHWM. getrusage's ru_maxrss keeps the high-water mark
// of the image replaced by exec (Linux carries it over), so a child started by a large parent
// (a Python script) would report the parent's size. ru_maxrss is the fallback where /proc is
// missing.
inline uint64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// The current RSS (/proc/self/statm).
inline uint64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace kiln::tooling
