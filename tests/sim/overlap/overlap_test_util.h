// Shared helpers of the overlap tests: random shards and matrices (finite values for products,
// adversarial bit patterns for the gathered data), and per-rank buffers of one call.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/storage.h"
#include "sim/overlap/inputs.h"
#include "sim/overlap/matmul.h"
#include "sim/overlap/overlap_sim.h"
#include "sim/prng.h"

namespace exactcoll::overlap::test {

using Bytes = std::vector<uint8_t>;

// Returns `count` elements whose bit patterns include NaNs with payloads, -0, ±inf and subnormals
// (a bit copy must keep all of them).
inline Bytes adversarial_bits(DType dtype, size_t count, uint64_t seed) {
  sim::Xoshiro256 g(seed);
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  Bytes out(count * esize);
  const bool wide = dtype == DType::kFP32;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits = static_cast<uint32_t>(g.next());
    if (!wide) bits &= 0xFFFFu;
    switch (g.below(6)) {
      case 0:
        bits = wide ? (0x7F800001u | (bits & 0x803FFFFFu))
                    : (dtype == DType::kBF16 ? 0x7F81u : 0x7C01u) | (bits & 0x803Fu);
        break;
      case 1: bits = wide ? 0x80000000u : 0x8000u; break;                                       // -0
      case 2: bits = wide ? 0xFF800000u : (dtype == DType::kBF16 ? 0xFF80u : 0xFC00u); break;   // -inf
      case 3: bits &= wide ? 0x807FFFFFu : (dtype == DType::kBF16 ? 0x807Fu : 0x83FFu); break;  // subnormal
      default: break;                                                                           // anything
    }
    std::memcpy(out.data() + i * esize, &bits, esize);
  }
  return out;
}

// Every host buffer of one call, per rank, and the OverlapIo pointing at them.
struct CallBuffers {
  std::vector<Bytes> shards, lhs, rhs, gathered, products;
  OverlapIo io() {
    OverlapIo out;
    for (size_t r = 0; r < shards.size(); ++r) {
      out.shards.push_back(shards[r].data());
      if (!lhs.empty()) out.lhs.push_back(lhs[r].data());
      out.rhs.push_back(rhs[r].data());
      out.gathered.push_back(gathered[r].data());
      out.products.push_back(products[r].data());
    }
    return out;
  }
};

// Inputs of one call: shards (finite or adversarial), B (or X and W), replicated B identical on
// every rank as tensor parallelism has it; outputs poisoned (0xA5) so unwritten bytes show.
inline CallBuffers make_call(const OverlapShape& shape, int ranks, uint64_t seed, bool adversarial_shards) {
  const size_t esize = static_cast<size_t>(dtype_size(shape.dtype));
  const size_t shard = shape.shard_elements(ranks);
  CallBuffers c;
  const Bytes b = finite_values(shape.dtype, shape.k * shape.n, rhs_seed(seed));
  for (int r = 0; r < ranks; ++r) {
    const uint64_t s = shard_seed(seed, r);
    c.shards.push_back(adversarial_shards ? adversarial_bits(shape.dtype, shard, s)
                                          : finite_values(shape.dtype, shard, s));
    if (shape.pattern == Pattern::kPrefetch)
      c.lhs.push_back(finite_values(shape.dtype, shape.m * shape.k, lhs_seed(seed, r)));
    c.rhs.push_back(b);
    c.gathered.emplace_back(shard * static_cast<size_t>(ranks) * esize, 0xA5);
    c.products.emplace_back(shape.m * shape.n * esize, 0xA5);
  }
  return c;
}

// The concatenation of every rank's shard: what each rank's gathered A must hold, bit for bit.
inline Bytes concatenated(const std::vector<Bytes>& shards) {
  Bytes out;
  for (const Bytes& s : shards) out.insert(out.end(), s.begin(), s.end());
  return out;
}

// Returns "" when product (C = a @ b, rows x n, from storage bits) is within the tolerance of the
// float64 reference at every element: u * |ref| + k * 2^-23 * sum |a_l b_l| (u: the storage
// type's unit roundoff; the second term bounds float accumulation), else the first bad element.
inline std::string product_within_tolerance(DType dtype, const void* a, const void* b, const void* product, size_t rows,
                                            size_t k, size_t n) {
  const double u = dtype == DType::kBF16 ? 0x1p-8 : dtype == DType::kFP16 ? 0x1p-11 : 0x1p-24;
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const double ref = dot_reference(dtype, a, i, k, b, n, j);
      double magnitude = 0;
      for (size_t l = 0; l < k; ++l) {
        magnitude += std::fabs(element_value(dtype, a, i * k + l) * element_value(dtype, b, l * n + j));
      }
      const double got = element_value(dtype, product, i * n + j);
      const double tol = u * std::fabs(ref) + static_cast<double>(k) * 0x1p-23 * magnitude;
      if (!(std::fabs(got - ref) <= tol)) {
        return "C[" + std::to_string(i) + "][" + std::to_string(j) + "] = " + std::to_string(got) + ", reference " +
               std::to_string(ref) + ", tolerance " + std::to_string(tol);
      }
    }
  }
  return "";
}

}  // namespace exactcoll::overlap::test
