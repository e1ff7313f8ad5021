#include "tools/inputs/inputs.h"

#include <cstdlib>
#include <cstring>

#include "sim/prng.h"

namespace exactcoll::gpu {
namespace {

// Field layout of a storage type's bits.
struct Format {
  int bits;      // 16 or 32
  int mantissa;  // 7, 10, 23
  int bias;      // 127, 15, 127
  uint32_t exp_mask() const { return ((1u << (bits - 1 - mantissa)) - 1u) << mantissa; }
  uint32_t sign() const { return 1u << (bits - 1); }
  uint32_t inf() const { return exp_mask(); }
  uint32_t max_finite() const { return exp_mask() - (1u << mantissa) + ((1u << mantissa) - 1u); }
  uint32_t quiet_nan() const { return exp_mask() | (1u << (mantissa - 1)); }
};

Format format_of(DType d) {
  switch (d) {
    case DType::kBF16: return {16, 7, 127};
    case DType::kFP16: return {16, 10, 15};
    case DType::kFP32: return {32, 23, 127};
  }
  return {32, 23, 127};
}

uint32_t random_finite(const Format& f, sim::Xoshiro256& rng, int min_exp, int max_exp) {
  const uint32_t sign = (rng.next() & 1) ? f.sign() : 0u;
  const int e = min_exp + static_cast<int>(rng.below(static_cast<uint64_t>(max_exp - min_exp + 1)));
  const uint32_t mant = static_cast<uint32_t>(rng.next()) & ((1u << f.mantissa) - 1u);
  return sign | (static_cast<uint32_t>(e + f.bias) << f.mantissa) | mant;
}

uint32_t special(const Format& f, sim::Xoshiro256& rng) {
  const uint32_t m = (1u << f.mantissa) - 1u;
  const uint32_t s = f.sign();
  const uint32_t one = static_cast<uint32_t>(f.bias) << f.mantissa;
  const uint32_t table[] = {
      0u,                        // +0
      s,                         // -0
      f.inf(),                   // +inf
      s | f.inf(),               // -inf
      f.quiet_nan(),             // canonical-looking quiet NaN
      s | f.quiet_nan() | 1u,    // negative quiet NaN with a payload
      f.inf() | 1u,              // signalling NaN, smallest payload
      f.inf() | m,               // NaN, all payload bits
      f.quiet_nan() | (m >> 2),  // quiet NaN, mid payload
      1u,                        // smallest subnormal
      s | 1u,                    // its negative
      m,                         // largest subnormal
      f.max_finite(),            // max finite
      s | f.max_finite(),        // -max finite
      one,                       // 1
      s | one,                   // -1
      1u << f.mantissa,          // smallest normal
      s | (1u << f.mantissa),
  };
  constexpr uint64_t kSpecials = sizeof table / sizeof table[0];
  // Mostly specials, some ordinary values in between (NaN and inf must meet finite partners too).
  if (rng.below(4) == 0) return random_finite(f, rng, -4, 4);
  return table[rng.below(kSpecials)];
}

}  // namespace

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::kRandom: return "random";
    case Pattern::kRandomBits: return "random_bits";
    case Pattern::kSpecials: return "specials";
    case Pattern::kOverflow: return "overflow";
    case Pattern::kSubnormal: return "subnormal";
    case Pattern::kCancel: return "cancel";
  }
  return "?";
}

std::optional<Pattern> parse_pattern(const std::string& name) {
  for (Pattern p : all_patterns()) {
    if (name == pattern_name(p)) return p;
  }
  return std::nullopt;
}

const std::vector<Pattern>& all_patterns() {
  static const std::vector<Pattern> patterns = {Pattern::kRandom,   Pattern::kRandomBits, Pattern::kSpecials,
                                                Pattern::kOverflow, Pattern::kSubnormal,  Pattern::kCancel};
  return patterns;
}

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t seed_from_store_token() {
  const char* token = std::getenv("EXACTCOLL_STORE_TOKEN");
  uint64_t h = 1469598103934665603ull;
  for (const char* p = token != nullptr ? token : ""; *p != '\0'; ++p)
    h = (h ^ static_cast<uint8_t>(*p)) * 1099511628211ull;
  return h % 1000000007ull;
}

std::optional<DType> parse_dtype(const std::string& name) {
  for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    if (name == dtype_name(d)) return d;
  }
  return std::nullopt;
}

std::vector<uint8_t> make_input(DType dtype, size_t count, int rank, uint64_t seed, Pattern pattern) {
  const Format f = format_of(dtype);
  // One stream per (seed, rank, pattern, dtype); the cancel pattern shares x between ranks 0 and 1.
  const uint64_t stream =
      seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(pattern) << 40) ^ (static_cast<uint64_t>(dtype) << 48);
  sim::Xoshiro256 rng(stream ^ (static_cast<uint64_t>(rank) + 1) * 0xD1B54A32D192ED03ull);
  sim::Xoshiro256 shared(stream ^ 0x5851F42D4C957F2Dull);
  std::vector<uint8_t> out(count * static_cast<size_t>(f.bits / 8));
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits = 0;
    switch (pattern) {
      case Pattern::kRandom: bits = random_finite(f, rng, -8, 8); break;
      case Pattern::kRandomBits: bits = static_cast<uint32_t>(rng.next()); break;
      case Pattern::kSpecials: bits = special(f, rng); break;
      case Pattern::kOverflow: {
        const uint32_t below = static_cast<uint32_t>(rng.below(4));  // max finite and 3 neighbours
        bits = (f.max_finite() - below) | ((rng.next() & 1) ? f.sign() : 0u);
        break;
      }
      case Pattern::kSubnormal: {
        const uint32_t mant = static_cast<uint32_t>(rng.next()) & ((1u << f.mantissa) - 1u);
        bits = (rng.below(8) == 0 ? 0u : mant) | ((rng.next() & 1) ? f.sign() : 0u);
        break;
      }
      case Pattern::kCancel: {
        const uint32_t x = random_finite(f, shared, -6, 6);
        if (rank == 0) {
          bits = x;
        } else if (rank == 1) {
          bits = x ^ f.sign();
        } else {
          bits = rng.below(3) == 0 ? ((rng.next() & 1) ? f.sign() : 0u) : random_finite(f, rng, -20, -10);
        }
        break;
      }
    }
    if (f.bits == 16) {
      const uint16_t b = static_cast<uint16_t>(bits);
      std::memcpy(&out[i * 2], &b, 2);
    } else {
      std::memcpy(&out[i * 4], &bits, 4);
    }
  }
  return out;
}

std::vector<std::vector<uint8_t>> make_inputs(DType dtype, size_t count, int world_size, uint64_t seed,
                                              Pattern pattern) {
  std::vector<std::vector<uint8_t>> all;
  for (int r = 0; r < world_size; ++r) all.push_back(make_input(dtype, count, r, seed, pattern));
  return all;
}

}  // namespace exactcoll::gpu
