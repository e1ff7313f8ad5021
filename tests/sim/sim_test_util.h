// Shared helpers of the simulator tests: adversarial random inputs, running one collective on a
// world, and the expected outputs from the independent reference (tests/sim/reference.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/storage.h"
#include "sim/collectives.h"
#include "sim/prng.h"
#include "tests/sim/reference.h"

namespace exactcoll::simtest {

inline reference::Format format_of(DType d) {
  return d == DType::kBF16   ? reference::Format::kBF16
         : d == DType::kFP16 ? reference::Format::kFP16
                             : reference::Format::kFP32;
}

// One element's bit pattern: mostly moderate normal values (so that rounding matters), and a few
// percent each of NaN with random payloads, ±inf, ±0, subnormals and values near the largest
// finite one (whose sums overflow).
inline uint32_t random_bits(DType d, sim::Xoshiro256& g) {
  const uint32_t sign = static_cast<uint32_t>(g.next() & 1);
  const uint64_t k = g.below(100);
  const bool wide = d == DType::kFP32;
  const int mant_bits = d == DType::kBF16 ? 7 : d == DType::kFP16 ? 10 : 23;
  const int exp_bits = d == DType::kFP16 ? 5 : 8;
  const int total = wide ? 32 : 16;
  const uint32_t exp_max = (1u << exp_bits) - 1;
  const uint32_t bias = exp_max / 2;
  const uint32_t mant_mask = (1u << mant_bits) - 1;
  auto make = [&](uint32_t e, uint32_t m) { return (sign << (total - 1)) | (e << mant_bits) | (m & mant_mask); };
  const uint32_t m = static_cast<uint32_t>(g.next());
  if (k < 2) return make(exp_max, (m & mant_mask) | 1);              // NaN, random payload
  if (k < 4) return make(exp_max, 0);                                // ±inf
  if (k < 6) return make(0, 0);                                      // ±0
  if (k < 10) return make(0, m);                                     // subnormal (or 0)
  if (k < 13) return make(exp_max - 1, m);                           // near the largest finite
  const uint32_t e = bias - 6 + static_cast<uint32_t>(g.below(13));  // 2^-6 .. 2^6
  return make(e, m);
}

// Per-rank input bytes for `count` elements of dtype.
inline std::vector<std::vector<uint8_t>> random_inputs(DType d, int ranks, size_t count, uint64_t seed) {
  sim::Xoshiro256 g(seed);
  const size_t esize = static_cast<size_t>(dtype_size(d));
  std::vector<std::vector<uint8_t>> in(ranks, std::vector<uint8_t>(count * esize));
  for (auto& rank : in) {
    for (size_t i = 0; i < count; ++i) {
      const uint32_t b = random_bits(d, g);
      std::memcpy(rank.data() + i * esize, &b, esize);  // little-endian: the low bytes
    }
  }
  return in;
}

inline uint32_t element(const std::vector<uint8_t>& bytes, size_t i, size_t esize) {
  uint32_t b = 0;
  std::memcpy(&b, bytes.data() + i * esize, esize);
  return b;
}

// The contract's outputs per rank, from the reference.
inline std::vector<std::vector<uint8_t>> expected_outputs(const sim::CollectiveSpec& spec,
                                                          const std::vector<std::vector<uint8_t>>& in) {
  const int n = static_cast<int>(in.size());
  const size_t esize = static_cast<size_t>(dtype_size(spec.dtype));
  const size_t out_count = sim::output_count(spec.op, spec.count, n);
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(out_count * esize));
  const reference::Format f = format_of(spec.dtype);
  std::vector<uint32_t> column(n);
  auto fold_at = [&](size_t i) {
    for (int r = 0; r < n; ++r) column[r] = element(in[r], i, esize);
    return reference::fold(f, column);
  };
  for (int r = 0; r < n; ++r) {
    for (size_t j = 0; j < out_count; ++j) {
      uint32_t v = 0;
      switch (spec.op) {
        case sim::Op::kAllReduce: v = fold_at(j); break;
        case sim::Op::kReduceScatter: v = fold_at(static_cast<size_t>(r) * out_count + j); break;
        case sim::Op::kAllGather: v = element(in[j / spec.count], j % spec.count, esize); break;
      }
      std::memcpy(out[r].data() + j * esize, &v, esize);
    }
  }
  return out;
}

// Runs one collective on `world` (fresh output buffers) and returns the outputs per rank.
inline std::vector<std::vector<uint8_t>> run_collective(sim::World& world, const sim::CollectiveSpec& spec,
                                                        const std::vector<std::vector<uint8_t>>& in) {
  const int n = world.ranks();
  const size_t esize = static_cast<size_t>(dtype_size(spec.dtype));
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(sim::output_count(spec.op, spec.count, n) * esize));
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (int r = 0; r < n; ++r) {
    inputs.push_back(in[r].data());
    outputs.push_back(out[r].data());
  }
  sim::enqueue_collective(world, spec, inputs, outputs);
  world.run();
  return out;
}

// "" when equal, else the first differing element of the first differing rank.
inline std::string first_difference(const std::vector<std::vector<uint8_t>>& got,
                                    const std::vector<std::vector<uint8_t>>& want, size_t esize) {
  for (size_t r = 0; r < want.size(); ++r) {
    if (got[r] == want[r]) continue;
    for (size_t i = 0; i * esize < want[r].size(); ++i) {
      const uint32_t g = element(got[r], i, esize), w = element(want[r], i, esize);
      if (g != w) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "rank %zu element %zu: got 0x%0*x, want 0x%0*x", r, i,
                      static_cast<int>(esize * 2), g, static_cast<int>(esize * 2), w);
        return buf;
      }
    }
    return "rank " + std::to_string(r) + ": sizes differ";
  }
  return "";
}

}  // namespace exactcoll::simtest
