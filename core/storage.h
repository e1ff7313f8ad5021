// Storage types (bf16, fp16, fp32) and their exact conversions to and from float.
//
// The conversions are part of the rounding contract (docs/numerics.md):
//   - float -> bf16 and float -> fp16 round to nearest, ties to even; every NaN becomes 0x7FFF
//     (sign and payload dropped). That is what __float2bfloat16_rn / __float2half_rn do on H200,
//     checked over all 2^32 inputs (../shared/facts/environment.md).
//   - bf16 -> float is exact (a 16-bit shift; NaN payloads kept, as __bfloat162float does).
//   - fp16 -> float is exact for every non-NaN; every NaN becomes 0x7FFFFFFF, as __half2float does.
//   - An fp32 result that is NaN is stored as 0x7FFFFFFF (every GPU fp32 operation yielding NaN
//     gives that pattern; x86 would keep payloads).
// Device code uses the hardware conversions; host code uses the bit-level ones below; the
// exhaustive tests and `exactcoll verify` hold the two equal.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/platform.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace exactcoll {

// 16-bit storage types: plain bit patterns, so host code needs no CUDA headers.
struct bf16 {
  uint16_t bits;
};
struct fp16 {
  uint16_t bits;
};

inline constexpr uint16_t kStorageNaN16 = 0x7FFF;
inline constexpr uint32_t kCanonicalNaN32 = 0x7FFFFFFF;

EXC_HD EXC_INLINE uint32_t float_to_bits(float f) {
#if EXC_DEVICE_PASS
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

EXC_HD EXC_INLINE float bits_to_float(uint32_t u) {
#if EXC_DEVICE_PASS
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Returns the bf16 nearest to f (ties to even); 0x7FFF for every NaN.
EXC_HD EXC_INLINE uint16_t float_to_bf16_bits(float f) {
#if EXC_DEVICE_PASS
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  uint32_t u = float_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return kStorageNaN16;
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;  // carries into the exponent round up to the next binade or to inf
  return static_cast<uint16_t>(u >> 16);
#endif
}

// Returns the fp16 nearest to f (ties to even, subnormals included); 0x7FFF for every NaN.
EXC_HD EXC_INLINE uint16_t float_to_fp16_bits(float f) {
#if EXC_DEVICE_PASS
  return __half_as_ushort(__float2half_rn(f));
#else
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kStorageNaN16;
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {                                              // normal half (>= 2^-14)
    const uint32_t rebiased = a - 0x38000000u;                         // exponent bias 127 -> 15
    const uint32_t rounded = (rebiased + 0xFFFu + ((rebiased >> 13) & 1u)) >> 13;
    return static_cast<uint16_t>(sign | rounded);
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to zero (tie to even)
  // Subnormal half: the value is m * 2^(e-150); the half unit is 2^-24.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14 (e = 112) .. 24 (e = 102)
  const uint32_t rounded = (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
  return static_cast<uint16_t>(sign | rounded);
#endif
}

// Exact: bf16 is the top half of a float.
EXC_HD EXC_INLINE float bf16_bits_to_float(uint16_t h) {
  return bits_to_float(static_cast<uint32_t>(h) << 16);
}

// Exact for every non-NaN; NaN becomes 0x7FFFFFFF.
EXC_HD EXC_INLINE float fp16_bits_to_float(uint16_t h) {
#if EXC_DEVICE_PASS
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return bits_to_float(m ? kCanonicalNaN32 : (sign | 0x7F800000u));
  if (e != 0) return bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return bits_to_float(sign);
  // Subnormal: m * 2^-24, normalized into a float.
  uint32_t mant = m;
  uint32_t exp = 113;  // float exponent of 2^-14 is 113; shift left until the hidden bit is set
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --exp;
  }
  return bits_to_float(sign | (exp << 23) | ((mant & 0x3FFu) << 13));
#endif
}

// Returns f, or the canonical NaN 0x7FFFFFFF when f is NaN (what the GPU produces).
// Explicit on both sides: a NaN input that no operation touched (an fp32 all-reduce of one rank)
// still carries its payload, on the GPU too.
EXC_HD EXC_INLINE float canonicalize_nan(float f) {
  return f != f ? bits_to_float(kCanonicalNaN32) : f;
}

// Storage traits: the pack (16 bytes of elements), names, and the two conversions.
template <class T>
struct Storage;

template <>
struct Storage<bf16> {
  static constexpr int kPack = 8;
  static constexpr const char* kName = "bf16";
  EXC_HD static EXC_INLINE float widen(bf16 x) { return bf16_bits_to_float(x.bits); }
  EXC_HD static EXC_INLINE bf16 narrow(float f) { return bf16{float_to_bf16_bits(f)}; }
  EXC_HD static EXC_INLINE uint32_t bits(bf16 x) { return x.bits; }
};

template <>
struct Storage<fp16> {
  static constexpr int kPack = 8;
  static constexpr const char* kName = "fp16";
  EXC_HD static EXC_INLINE float widen(fp16 x) { return fp16_bits_to_float(x.bits); }
  EXC_HD static EXC_INLINE fp16 narrow(float f) { return fp16{float_to_fp16_bits(f)}; }
  EXC_HD static EXC_INLINE uint32_t bits(fp16 x) { return x.bits; }
};

template <>
struct Storage<float> {
  static constexpr int kPack = 4;
  static constexpr const char* kName = "fp32";
  EXC_HD static EXC_INLINE float widen(float x) { return x; }
  EXC_HD static EXC_INLINE float narrow(float f) { return canonicalize_nan(f); }
  EXC_HD static EXC_INLINE uint32_t bits(float x) { return float_to_bits(x); }
};

template <class T>
EXC_HD EXC_INLINE float to_float(T x) {
  return Storage<T>::widen(x);
}

template <class T>
EXC_HD EXC_INLINE T round_to(float f) {
  return Storage<T>::narrow(f);
}

// The element types the library serves, for runtime dispatch.
enum class DType { kBF16, kFP16, kFP32 };

inline constexpr int dtype_size(DType d) { return d == DType::kFP32 ? 4 : 2; }
inline constexpr const char* dtype_name(DType d) {
  return d == DType::kBF16 ? "bf16" : d == DType::kFP16 ? "fp16" : "fp32";
}

}  // namespace exactcoll
