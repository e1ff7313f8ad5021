// Deterministic pseudo-random numbers for fused-op inputs (tests, `exactcoll layers`): SplitMix64
// and a few value shapes on top of it. Own generator, not <random>'s distributions, so that a seed
// gives the same numbers with every standard library.
#pragma once

#include <cstdint>

#include "sim/prng.h"

namespace exactcoll::fused {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  // Returns the next 64 random bits.
  uint64_t next() { return sim::splitmix64(&state_); }

  // Returns a float uniform in [-1, 1) on a grid of 2^-23.
  float uniform_pm1() { return static_cast<float>(static_cast<int64_t>(next() >> 40) - (1 << 23)) * 0x1p-23f; }

  // Returns an approximately normal value (mean 0, standard deviation 1): the sum of four uniforms
  // scaled by sqrt(3/4) (Irwin-Hall), enough for test data and no libm dependence.
  float normal() {
    const float s = uniform_pm1() + uniform_pm1() + uniform_pm1() + uniform_pm1();
    return s * 0.8660254f;
  }

 private:
  uint64_t state_;
};

}  // namespace exactcoll::fused
