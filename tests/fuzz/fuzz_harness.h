// Seeded, bounded runs of many random inputs — the fuzzers (tests/fuzz) and the soak test
// (tests/soak) — in the style of the simulator's seeded explorations (and of TigerBeetle's and
// FoundationDB's simulators): one run has one printed seed; input i of the run is generated from
// its own seed, derived from (run seed, i), so one failing input reproduces on its own, without
// replaying the ones before it.
//
// Environment (all optional; PREFIX is EXACTCOLL_FUZZ for the fuzzers, EXACTCOLL_SOAK for the soak):
//   PREFIX_SEED=S      the run's seed (default: fresh from /dev/urandom, printed)
//   PREFIX_SECONDS=T   stop after T seconds (default: the target's, about 30 s for a fuzzer in CI)
//   PREFIX_INPUTS=N    stop after N inputs (default: the target's; else the time bounds the run)
//   PREFIX_INPUT=I     run only input I of seed S (reproduces a failure the run printed)
// Under bazel: bazel test //tests/fuzz:npy_fuzz_test --test_env=EXACTCOLL_FUZZ_SEED=S ...
//
// Example:
//   SeededRun run("fuzz npy", "EXACTCOLL_FUZZ", 30.0);
//   run.each([](sim::Xoshiro256& rng, uint64_t input) { ... ADD_FAILURE() << ... ; });
//   // prints "fuzz npy: seed 123 ...: 41234 inputs in 30.0 s" and, for the first failing input,
//   // "reproduce with EXACTCOLL_FUZZ_SEED=123 EXACTCOLL_FUZZ_INPUT=77"
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "sim/prng.h"

namespace exactcoll::fuzz {

// Whether this process's RSS measures the code under test. Under AddressSanitizer it does not:
// freed memory waits in ASan's quarantine (up to 256 MiB) and shadow memory comes on top, so RSS
// bounds are checked in the plain build and skipped in --config=asan.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kRssIsMeaningful = false;
#else
inline constexpr bool kRssIsMeaningful = true;
#endif

class SeededRun {
 public:
  // `target` names the run in its messages and `env_prefix` its environment variables;
  // `default_seconds` and `default_inputs` bound it unless the environment says otherwise.
  SeededRun(std::string target, std::string env_prefix, double default_seconds, uint64_t default_inputs = UINT64_MAX)
      : target_(std::move(target)), prefix_(std::move(env_prefix)) {
    seed_ = env_u64("_SEED").value_or(fresh_seed());
    seconds_ = env_double("_SECONDS").value_or(default_seconds);
    max_inputs_ = env_u64("_INPUTS").value_or(default_inputs);
    only_input_ = env_u64("_INPUT");
    std::printf("%s: seed %llu (%s_SEED=%llu reproduces the run), at most %.1f s%s\n", target_.c_str(),
                static_cast<unsigned long long>(seed_), prefix_.c_str(), static_cast<unsigned long long>(seed_),
                seconds_, only_input_ ? ", one input" : "");
    std::fflush(stdout);
  }

  uint64_t seed() const { return seed_; }
  uint64_t inputs() const { return inputs_; }
  // Called from inside each()'s callback: the current input is the last one.
  void stop() { stop_ = true; }

  // Calls one(rng, i) for inputs i = 0, 1, ... until the time or the input budget runs out, or an
  // input fails (a gtest failure); rng is seeded from (seed, i). Prints the count and, on failure,
  // the input that reproduces it. Returns the number of inputs run.
  uint64_t each(const std::function<void(sim::Xoshiro256& rng, uint64_t input)>& one) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration<double>(seconds_);
    auto next_report = start + std::chrono::minutes(1);                 // long runs say how far they are
    for (uint64_t i = only_input_.value_or(0); i < max_inputs_; ++i) {  // bounded by inputs, time or failure
      if (!only_input_ && std::chrono::steady_clock::now() >= deadline) break;
      sim::Xoshiro256 rng(input_seed(i));
      one(rng, i);
      ++inputs_;
      if (const auto now = std::chrono::steady_clock::now(); now >= next_report) {
        std::printf("%s: %llu inputs in %.0f s\n", target_.c_str(), static_cast<unsigned long long>(inputs_),
                    std::chrono::duration<double>(now - start).count());
        std::fflush(stdout);
        next_report = now + std::chrono::minutes(1);
      }
      if (::testing::Test::HasFailure()) {
        std::printf("%s: input %llu failed; reproduce with %s_SEED=%llu %s_INPUT=%llu\n", target_.c_str(),
                    static_cast<unsigned long long>(i), prefix_.c_str(), static_cast<unsigned long long>(seed_),
                    prefix_.c_str(), static_cast<unsigned long long>(i));
        break;
      }
      if (only_input_ || stop_) break;
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: seed %llu: %llu inputs in %.1f s\n", target_.c_str(), static_cast<unsigned long long>(seed_),
                static_cast<unsigned long long>(inputs_), elapsed);
    std::fflush(stdout);
    return inputs_;
  }

 private:
  uint64_t input_seed(uint64_t input) const {
    uint64_t state = seed_ ^ (input * 0x9E3779B97F4A7C15ull);
    return sim::splitmix64(&state);
  }
  std::optional<uint64_t> env_u64(const char* suffix) const {
    const char* text = std::getenv((prefix_ + suffix).c_str());
    if (text == nullptr || *text == '\0') return std::nullopt;
    return std::strtoull(text, nullptr, 10);
  }
  std::optional<double> env_double(const char* suffix) const {
    const char* text = std::getenv((prefix_ + suffix).c_str());
    if (text == nullptr || *text == '\0') return std::nullopt;
    return std::strtod(text, nullptr);
  }
  static uint64_t fresh_seed() {
    uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::ifstream urandom("/dev/urandom", std::ios::binary);
    urandom.read(reinterpret_cast<char*>(&seed), sizeof seed);
    return seed % 1'000'000'000'000ull;  // short enough to type
  }

  std::string target_;
  std::string prefix_;
  uint64_t seed_ = 0;
  double seconds_ = 30;
  uint64_t max_inputs_ = UINT64_MAX;
  std::optional<uint64_t> only_input_;
  uint64_t inputs_ = 0;
  bool stop_ = false;
};

// Returns one element of `items`, uniformly.
template <class T, size_t N>
const T& pick(sim::Xoshiro256& rng, const T (&items)[N]) {
  return items[rng.below(N)];
}

}  // namespace exactcoll::fuzz
