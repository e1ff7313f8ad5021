#include "tools/gpu/fused/fused_inputs.h"

#include <cstring>

#include "sim/fused/random.h"

namespace exactcoll::gpu {
namespace {

// Storage bits of a finite value: random sign, a binary exponent in [lo, hi] (unbiased), random
// mantissa. bf16: 8 exponent bits, 7 mantissa; fp16: 5 and 10; fp32: 8 and 23.
uint32_t finite_bits(DType dtype, uint64_t r, int lo, int hi, bool random_sign) {
  const uint32_t sign = random_sign ? static_cast<uint32_t>(r & 1) : 0u;
  const int e = lo + static_cast<int>((r >> 1) % static_cast<uint64_t>(hi - lo + 1));
  const uint64_t m = r >> 8;
  switch (dtype) {
    case DType::kBF16: return (sign << 15) | (static_cast<uint32_t>(e + 127) << 7) | static_cast<uint32_t>(m & 0x7F);
    case DType::kFP16: return (sign << 15) | (static_cast<uint32_t>(e + 15) << 10) | static_cast<uint32_t>(m & 0x3FF);
    case DType::kFP32: return (sign << 31) | (static_cast<uint32_t>(e + 127) << 23) | static_cast<uint32_t>(m & 0x7FFFFF);
  }
  return 0;
}

struct Specials {
  uint32_t nan_payload, pos_inf, neg_inf, largest, neg_zero;
};

Specials specials_of(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return {0xFF81u, 0x7F80u, 0xFF80u, 0x7F7Fu, 0x8000u};
    case DType::kFP16: return {0xFE01u, 0x7C00u, 0xFC00u, 0x7BFFu, 0x8000u};
    case DType::kFP32: return {0xFFC00123u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0x80000000u};
  }
  return {};
}

// -0, +0 or one of the smallest subnormals of either sign.
uint32_t tiny_bits(DType dtype, uint64_t r) {
  const uint32_t sign = static_cast<uint32_t>(r & 1);
  const uint32_t m = static_cast<uint32_t>((r >> 1) % 4);
  return dtype == DType::kFP32 ? (sign << 31) | m : (sign << 15) | m;
}

void put(std::vector<uint8_t>& buffer, DType dtype, size_t i, uint32_t bits) {
  if (dtype == DType::kFP32) {
    std::memcpy(buffer.data() + i * 4, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(buffer.data() + i * 2, &h, 2);
  }
}

}  // namespace

FusedInputs make_fused_inputs(DType dtype, int ranks, int rows, int hidden, uint64_t seed, bool specials) {
  FusedInputs in;
  in.ranks = ranks, in.rows = rows, in.hidden = hidden, in.dtype = dtype;
  const size_t elem = static_cast<size_t>(dtype_size(dtype));
  const size_t count = in.count();
  fused::SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rows) * 131 + static_cast<uint64_t>(hidden));
  // 1. Finite values (x: exponents -6..3; residual: -3..1; weight: near 1).
  in.x.assign(static_cast<size_t>(ranks), std::vector<uint8_t>(count * elem));
  for (auto& x : in.x) {
    for (size_t i = 0; i < count; ++i) put(x, dtype, i, finite_bits(dtype, rng.next(), -6, 3, true));
  }
  in.residual.resize(count * elem);
  for (size_t i = 0; i < count; ++i) put(in.residual, dtype, i, finite_bits(dtype, rng.next(), -3, 1, true));
  in.weight.resize(static_cast<size_t>(hidden) * elem);
  for (int j = 0; j < hidden; ++j) put(in.weight, dtype, static_cast<size_t>(j), finite_bits(dtype, rng.next(), -1, 0, false));
  if (!specials) return in;

  // 2. One kind of adversarial value in about half of the rows.
  const Specials s = specials_of(dtype);
  for (int row = 0; row < rows; ++row) {
    const uint64_t kind = rng.next() % 12;
    const size_t at = static_cast<size_t>(row) * static_cast<size_t>(hidden) + rng.next() % static_cast<uint64_t>(hidden);
    const size_t rank = static_cast<size_t>(rng.next() % static_cast<uint64_t>(ranks));
    switch (kind) {
      case 0: put(in.x[rank], dtype, at, s.nan_payload); break;
      case 1: put(in.residual, dtype, at, s.pos_inf); break;
      case 2: put(in.residual, dtype, at, s.neg_inf); break;
      case 3:  // +inf and -inf at one element: NaN (one rank: just inf)
        put(in.x[0], dtype, at, s.pos_inf);
        put(in.x[static_cast<size_t>(ranks - 1)], dtype, at, s.neg_inf);
        break;
      case 4:
        for (auto& x : in.x) put(x, dtype, at, s.largest);
        break;
      case 5:
        for (int j = 0; j < hidden; ++j) {
          const size_t i = static_cast<size_t>(row) * static_cast<size_t>(hidden) + static_cast<size_t>(j);
          for (auto& x : in.x) put(x, dtype, i, tiny_bits(dtype, rng.next()));
          put(in.residual, dtype, i, tiny_bits(dtype, rng.next()));
        }
        break;
      default: break;  // a plain row
    }
  }
  if (seed % 3 == 0 && hidden >= 3) {
    put(in.weight, dtype, 0, s.nan_payload);
    put(in.weight, dtype, 1, s.pos_inf);
    put(in.weight, dtype, 2, s.neg_zero);
  }
  return in;
}

}  // namespace exactcoll::gpu
