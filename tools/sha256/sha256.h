// SHA-256 (FIPS 180-4), small and dependency-free: the `exactcoll sim` summary line ends with the
// sha256 of the output bytes, so two runs (or a simulator and a GPU run) compare by one string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace exactcoll::tools {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  // Returns the 64-character lower-case hex digest. The object is spent afterwards.
  std::string hex_digest();

 private:
  void compress(const uint8_t block[64]);
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// Returns the hex sha256 of bytes.
std::string sha256_hex(const void* data, size_t bytes);

}  // namespace exactcoll::tools
