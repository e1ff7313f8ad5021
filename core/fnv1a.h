// FNV-1a, 64 bits: the digests ranks compare to check that they hold the same sequence (the
// handle exchange's buffer lists, the calls a communicator captured in place). Not a hash table's
// hash and not cryptographic: equal inputs give equal digests on every rank of one build.
#pragma once

#include <cstddef>
#include <cstdint>

namespace exactcoll {

inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;

// Returns h folded with each byte of data[0, bytes).
// Example: fnv1a_bytes(kFnv1aOffset, "a", 1) == 0xaf63dc4c8601ec8cull.
inline uint64_t fnv1a_bytes(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// Returns h folded with the 8 bytes of v, least significant first (the same on any host).
inline uint64_t fnv1a_u64(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    const unsigned char byte = static_cast<unsigned char>(v >> (8 * i));
    h = fnv1a_bytes(h, &byte, 1);
  }
  return h;
}

}  // namespace exactcoll
