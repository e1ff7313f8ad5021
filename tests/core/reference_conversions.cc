#include "tests/core/reference_conversions.h"

#include <cmath>
#include <cstring>

namespace exactcoll::testing {
namespace {

float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint32_t bits_from_float(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// Returns 2^k as a float. Preconditions: -126 <= k <= 127.
inline float power_of_two(int32_t k) { return float_from_bits(static_cast<uint32_t>(k + 127) << 23); }

// Returns y rounded to the nearest integer, ties to even, by the FPU: y + 2^23 lies in
// [2^23, 2^24) where the float spacing is exactly 1, so the addition itself rounds y to an integer
// (round-to-nearest-even, the default mode) and the mantissa field holds that integer.
// Preconditions: 0 <= y < 2^23 - 1.
inline uint32_t round_half_even_to_integer(float y) { return bits_from_float(y + 0x1p23f) & 0x7FFFFFu; }

// bf16: 8 significant bits (7 stored), exponent bias 127, same exponent range as float.
inline uint16_t bf16_from_float_by_value(uint32_t input) {
  const float x = float_from_bits(input);
  const uint32_t sign = (input >> 16) & 0x8000u;
  // Binade exponent of |x|; float subnormals share the quantum of the lowest normal binade.
  int32_t exponent = static_cast<int32_t>((input >> 23) & 0xFFu) - 127;
  exponent = exponent < -126 ? -126 : exponent;
  exponent = exponent > 127 ? 127 : exponent;  // inf/NaN: value replaced below
  // One bf16 unit in this binade is 2^(exponent - 7); scale |x| so that unit is 1. The scale
  // factor 2^(7 - exponent) reaches 2^133, beyond a float, so it is applied in two exact halves.
  const int32_t scale_log2 = 7 - exponent;
  const float scaled = std::fabs(x) * power_of_two(scale_log2 / 2) * power_of_two(scale_log2 - scale_log2 / 2);
  const uint32_t units = round_half_even_to_integer(scaled);  // 128..256 (0..128 below 2^-126)
  uint32_t bits = (static_cast<uint32_t>(exponent + 127) << 7) + units - 128u;
  bits = std::isinf(x) ? 0x7F80u : bits;
  bits |= sign;
  bits = x != x ? 0x7FFFu : bits;
  return static_cast<uint16_t>(bits);
}

// binary16: 11 significant bits (10 stored), bias 15, normal range 2^-14 .. 65504, subnormal unit
// 2^-24.
inline uint16_t fp16_from_float_by_value(uint32_t input) {
  const float x = float_from_bits(input);
  const uint32_t sign = (input >> 16) & 0x8000u;
  const int32_t exponent = static_cast<int32_t>((input >> 23) & 0xFFu) - 127;
  // Below 2^-14 the unit stays 2^-24 (subnormals); at 2^16 and above every value overflows.
  const int32_t clamped = exponent < -14 ? -14 : (exponent > 15 ? 15 : exponent);
  const float scaled = std::fabs(x) * power_of_two(10 - clamped);
  const uint32_t units = round_half_even_to_integer(scaled);  // 1024..2048 (0..1024 if clamped)
  uint32_t bits = (static_cast<uint32_t>(clamped + 15) << 10) + units - 1024u;
  bits = exponent > 15 ? 0x7C00u : bits;  // |x| >= 65536 (and inf); 65520..65535 carry to 0x7C00
  bits |= sign;
  bits = x != x ? 0x7FFFu : bits;
  return static_cast<uint16_t>(bits);
}

}  // namespace

uint16_t reference_float_to_bf16(uint32_t input) { return bf16_from_float_by_value(input); }

uint16_t reference_float_to_fp16(uint32_t input) { return fp16_from_float_by_value(input); }

// Cloned for AVX2 where the CPU has it (twice the lanes); the default clone runs everywhere.
__attribute__((target_clones("avx2", "default"))) void reference_float_to_bf16_batch(uint32_t first, uint32_t count,
                                                                                     uint16_t* out) {
  for (uint32_t i = 0; i < count; ++i) out[i] = bf16_from_float_by_value(first + i);
}

__attribute__((target_clones("avx2", "default"))) void reference_float_to_fp16_batch(uint32_t first, uint32_t count,
                                                                                     uint16_t* out) {
  for (uint32_t i = 0; i < count; ++i) out[i] = fp16_from_float_by_value(first + i);
}

uint32_t reference_bf16_to_float_bits(uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const int field = (h >> 7) & 0xFF;
  const int mantissa = h & 0x7F;
  if (field == 0xFF && mantissa != 0) return static_cast<uint32_t>(h) << 16;  // NaN: payload kept
  double magnitude;
  if (field == 0xFF) {
    magnitude = INFINITY;
  } else if (field == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -133);  // subnormal: mantissa * 2^-133
  } else {
    magnitude = std::ldexp(static_cast<double>(128 + mantissa), field - 127 - 7);
  }
  return bits_from_float(static_cast<float>(negative ? -magnitude : magnitude));
}

uint32_t reference_fp16_to_float_bits(uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const int field = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  if (field == 0x1F && mantissa != 0) return 0x7FFFFFFFu;  // every NaN, as __half2float gives
  double magnitude;
  if (field == 0x1F) {
    magnitude = INFINITY;
  } else if (field == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);  // subnormal: mantissa * 2^-24
  } else {
    magnitude = std::ldexp(static_cast<double>(1024 + mantissa), field - 15 - 10);
  }
  return bits_from_float(static_cast<float>(negative ? -magnitude : magnitude));
}

}  // namespace exactcoll::testing
