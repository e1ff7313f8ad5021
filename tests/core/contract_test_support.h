// Helpers shared by the contract tests: storage traits built on the INDEPENDENT reference
// conversions (tests/core/reference_conversions.h, not core's), a small seeded PRNG and
// random storage values.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/storage.h"
#include "sim/prng.h"
#include "tests/core/reference_conversions.h"

namespace exactcoll::testing {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// An fp32 result that is NaN is written as 0x7FFFFFFF (the GPU's canonical NaN).
inline uint32_t canonical_bits(float f) { return f != f ? 0x7FFFFFFFu : bits_of(f); }

// Reference storage traits: widen/narrow through the reference conversions.
template <class T>
struct RefStorage;

template <>
struct RefStorage<bf16> {
  static constexpr int kPack = 8;  // 16 bytes / 2
  static constexpr const char* kName = "bf16";
  static bf16 narrow(float f) { return bf16{reference_float_to_bf16(bits_of(f))}; }
  static float widen(bf16 x) { return float_of(reference_bf16_to_float_bits(x.bits)); }
  static uint32_t bits(bf16 x) { return x.bits; }
  static bf16 from_bits(uint32_t b) { return bf16{static_cast<uint16_t>(b)}; }
  static constexpr int kMantissaBits = 7;
  static constexpr int kMinNormalExponent = -126;
};

template <>
struct RefStorage<fp16> {
  static constexpr int kPack = 8;
  static constexpr const char* kName = "fp16";
  static fp16 narrow(float f) { return fp16{reference_float_to_fp16(bits_of(f))}; }
  static float widen(fp16 x) { return float_of(reference_fp16_to_float_bits(x.bits)); }
  static uint32_t bits(fp16 x) { return x.bits; }
  static fp16 from_bits(uint32_t b) { return fp16{static_cast<uint16_t>(b)}; }
  static constexpr int kMantissaBits = 10;
  static constexpr int kMinNormalExponent = -14;
};

template <>
struct RefStorage<float> {
  static constexpr int kPack = 4;  // 16 bytes / 4
  static constexpr const char* kName = "fp32";
  static float narrow(float f) { return float_of(canonical_bits(f)); }
  static float widen(float x) { return x; }
  static uint32_t bits(float x) { return bits_of(x); }
  static float from_bits(uint32_t b) { return float_of(b); }
  static constexpr int kMantissaBits = 23;
  static constexpr int kMinNormalExponent = -126;
};

// Returns the spacing of storage type T's values at magnitude |x| (subnormal spacing below the
// normal range).
template <class T>
double storage_ulp(double x) {
  int exponent = x == 0 ? RefStorage<T>::kMinNormalExponent : std::ilogb(x);
  if (exponent < RefStorage<T>::kMinNormalExponent) exponent = RefStorage<T>::kMinNormalExponent;
  return std::ldexp(1.0, exponent - RefStorage<T>::kMantissaBits);
}

// splitmix64 (sim/prng.h): small, fast, and the same sequence on every platform for a given seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return sim::splitmix64(&state_); }
  // Uniform in [0, n).
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((next() >> 32) * n >> 32); }
  // Uniform in [0, 1) with 24 random bits.
  float unit() { return static_cast<float>(next() >> 40) * 0x1p-24f; }

 private:
  uint64_t state_;
};

// Returns a random float +-(1 + f) * 2^e, e uniform in [min_exponent, max_exponent], rounded to T.
template <class T>
T random_storage(Rng& rng, int min_exponent, int max_exponent) {
  const float magnitude =
      std::ldexp(1.0f + rng.unit(), min_exponent + static_cast<int>(rng.below(max_exponent - min_exponent + 1)));
  return RefStorage<T>::narrow(rng.below(2) ? -magnitude : magnitude);
}

}  // namespace exactcoll::testing
