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

// Returns condition ? a : b as a bit select, not a branch: host loops over packs then vectorize
// (g++ does not if-convert a branch around a floating-point operation that may trap).
EXC_HD EXC_INLINE uint32_t select_bits(bool condition, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (a & mask) | (b & ~mask);
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
// Host form without branches, so that loops of it vectorize: every case is computed and the
// right one selected.
EXC_HD EXC_INLINE uint16_t float_to_fp16_bits(float f) {
#if EXC_DEVICE_PASS
  return __half_as_ushort(__float2half_rn(f));
#else
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // Normal half (a >= 2^-14): rebias the exponent (127 -> 15) and round the mantissa to 10 bits.
  const uint32_t rebiased = a - 0x38000000u;
  const uint32_t normal = (rebiased + 0xFFFu + ((rebiased >> 13) & 1u)) >> 13;
  // Subnormal half (a < 2^-14): in |f| + 0.5 the unit in the last place is 2^-24, the half
  // subnormal unit, so the IEEE addition (round to nearest even) rounds |f| to whole units and
  // the sum's low bits count them (1024 units = 0x400, the smallest normal half, when it rounds up).
  // This needs the default rounding mode (nearest even), which nothing in exactcoll changes; it
  // holds with flush-to-zero too (no operand or result here is a subnormal float).
  // (Inputs below 2^-25 round to zero; they enter the addition as 0, so that no subnormal float
  // operand slows the vector unit down.)
  const float small = bits_to_float(select_bits(a < 0x33000000u, 0u, a));
  const uint32_t subnormal = float_to_bits(small + 0.5f) - 0x3F000000u;
  uint32_t r = select_bits(a >= 0x38800000u, normal, subnormal);
  r = select_bits(a >= 0x477FF000u, 0x7C00u, r);  // >= 65520 rounds to inf
  return static_cast<uint16_t>(select_bits(a > 0x7F800000u, kStorageNaN16, sign | r));
#endif
}

// Exact: bf16 is the top half of a float.
EXC_HD EXC_INLINE float bf16_bits_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// Exact for every non-NaN; NaN becomes 0x7FFFFFFF. Host form without branches (vectorizes).
EXC_HD EXC_INLINE float fp16_bits_to_float(uint16_t h) {
#if EXC_DEVICE_PASS
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  const uint32_t normal = sign | ((e + 112u) << 23) | (m << 13);
  // Subnormal (and zero): m * 2^-24, exact (m < 2^10 converts exactly; the scaling is a power of 2).
  const uint32_t subnormal = sign | float_to_bits(static_cast<float>(static_cast<int32_t>(m)) * 0x1p-24f);
  const uint32_t special = select_bits(m != 0, kCanonicalNaN32, sign | 0x7F800000u);
  return bits_to_float(select_bits(e == 0, subnormal, select_bits(e == 0x1Fu, special, normal)));
#endif
}

// Returns f, or the canonical NaN 0x7FFFFFFF when f is NaN (what the GPU produces).
// Explicit on both sides: a NaN input that no operation touched (an fp32 all-reduce of one rank)
// still carries its payload, on the GPU too.
EXC_HD EXC_INLINE float canonicalize_nan(float f) {
#if EXC_DEVICE_PASS
  return f != f ? bits_to_float(kCanonicalNaN32) : f;
#else
  // A bit select rather than a branch, so that folds over packs vectorize on the host.
  const uint32_t u = float_to_bits(f);
  return bits_to_float(select_bits((u & 0x7FFFFFFFu) > 0x7F800000u, kCanonicalNaN32, u));
#endif
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

// Returns the elements of one 16-byte pack of d: 8 for bf16 and fp16, 4 for fp32 (the runtime
// Storage<T>::kPack). Example: a fused op's H must be a multiple of pack_elements(dtype).
inline constexpr int pack_elements(DType d) { return 16 / dtype_size(d); }

// The one runtime-to-template dispatch: calls f with a value of the storage type d names (bf16{},
// fp16{} or 0.0f) and returns what it returns. Preconditions: f returns the same type for all
// three. Example:
//   return with_storage_type(dtype, [&](auto tag) { return reference_typed<decltype(tag)>(in, eps); });
template <class F>
decltype(auto) with_storage_type(DType d, F&& f) {
  switch (d) {
    case DType::kBF16: return f(bf16{});
    case DType::kFP16: return f(fp16{});
    case DType::kFP32: break;
  }
  return f(0.0f);
}

}  // namespace exactcoll
