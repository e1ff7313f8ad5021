// Seeded random operands for the overlap schedules: finite values uniform in [-2, 2), rounded to
// the storage type. The same generator serves the simulator command, the tests and the GPU
// benchmark's checks, so a GPU run and a simulator run with the same seed start from the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/storage.h"
#include "sim/prng.h"

namespace exactcoll::overlap {

// Returns the storage bits of one value uniform in [-2, 2) (53 random bits, then rounded).
inline uint32_t random_finite_bits(DType dtype, sim::Xoshiro256& g) {
  const float v = static_cast<float>(static_cast<double>(g.next() >> 11) * 0x1p-53 * 4.0 - 2.0);
  return with_storage_type(dtype, [&](auto tag) { return Storage<decltype(tag)>::bits(round_to<decltype(tag)>(v)); });
}

// Fills `count` elements of dtype at `out` from seed (little-endian storage bits).
inline void fill_finite(DType dtype, void* out, size_t count, uint64_t seed) {
  sim::Xoshiro256 g(seed);
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  auto* dst = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t bits = random_finite_bits(dtype, g);
    std::memcpy(dst + i * esize, &bits, esize);
  }
}

inline std::vector<uint8_t> finite_values(DType dtype, size_t count, uint64_t seed) {
  std::vector<uint8_t> out(count * static_cast<size_t>(dtype_size(dtype)));
  fill_finite(dtype, out.data(), count, seed);
  return out;
}

// Seeds of one call's operands, so that every backend derives the same inputs: rank r's shard,
// rank r's X (prefetch), and B (or W), identical on every rank.
inline uint64_t shard_seed(uint64_t seed, int rank) { return seed * 1000 + static_cast<uint64_t>(rank); }
inline uint64_t lhs_seed(uint64_t seed, int rank) { return seed * 1000 + 500 + static_cast<uint64_t>(rank); }
inline uint64_t rhs_seed(uint64_t seed) { return seed * 7919 + 1; }

}  // namespace exactcoll::overlap
