// This process's resident memory, for the tests that bound it (the store's frame buffers, the
// fuzzers, the soak test).
#pragma once

#include <cstddef>
#include <fstream>
#include <string>

namespace exactcoll::testing_memory {

// Returns VmRSS from /proc/self/status, in bytes (0 when it cannot be read).
inline size_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace exactcoll::testing_memory
