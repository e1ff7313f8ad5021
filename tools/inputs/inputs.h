// Test inputs for verify and bench: deterministic in (seed, rank, pattern, dtype, count), so every
// rank can make every rank's input (for the simulator) without sending any.
//
// Patterns (storage bit patterns, per element):
//   random      finite values of random sign, exponent in [-8, 8] and mantissa
//   random_bits uniformly random bits: NaNs with every payload, infinities, subnormals, huge values
//   specials    drawn from ±0, ±inf, NaNs (quiet, signalling, negative, several payloads), the
//               smallest and largest subnormals, ±max finite, ±1, ±tiny normals
//   overflow    ±(max finite and its neighbours): partial sums overflow (or not) depending on order
//   subnormal   subnormals and zeros of both signs (no flush-to-zero anywhere)
//   cancel      rank 0 holds x, rank 1 holds -x, the rest small values: zeros of either sign and
//               cancellation whose rounding depends on the fold order
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/storage.h"

namespace exactcoll::gpu {

enum class Pattern { kRandom, kRandomBits, kSpecials, kOverflow, kSubnormal, kCancel };

const char* pattern_name(Pattern p);
std::optional<Pattern> parse_pattern(const std::string& name);
const std::vector<Pattern>& all_patterns();

// Returns rank's input: count elements of dtype as little-endian storage bits.
std::vector<uint8_t> make_input(DType dtype, size_t count, int rank, uint64_t seed, Pattern pattern);

// Returns every rank's input (index = rank).
std::vector<std::vector<uint8_t>> make_inputs(DType dtype, size_t count, int world_size, uint64_t seed,
                                              Pattern pattern);

// Returns a well-mixed 64-bit combination of a and b (SplitMix64's finalizer over a * golden + b):
// the verify commands derive each case's seed from (seed, iteration, case) with it.
uint64_t mix_seed(uint64_t a, uint64_t b);

// Returns the default seed of a verify job: an FNV-1a hash of EXACTCOLL_STORE_TOKEN (the same in
// every worker of one job, fresh per job) modulo 1000000007; the hash of "" without a token.
uint64_t seed_from_store_token();

// Parses bf16 | fp16 | fp32.
std::optional<DType> parse_dtype(const std::string& name);

}  // namespace exactcoll::gpu
