// Seeded exploration of the Lamport one-shot all-reduce (core/lamport.h). Every Lamport store and
// poll is a scheduling point of the seeded scheduler, and a poll that finds the sentinel blocks
// until the word changes, so a seed decides how pushes, clears and polls of all ranks interleave.
// Each run is kCalls consecutive calls on one world (every buffer of the rotation is used twice,
// and cleared), with counts and grids that change between calls in some workloads. Broken
// variants, which exist only here (LamportProtocol's knobs), are caught within
// exploration::kSeedBound seeds: two buffers instead of three, no clear, and a push that does not
// canonicalize NaNs (so an input equal to the sentinel is never seen as arrived). The production
// protocol passes thousands of seeds on the same workloads.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/lamport.h"
#include "sim/collectives.h"
#include "sim/prng.h"
#include "sim/world.h"
#include "tests/sim/exploration.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll {
namespace {

using exploration::kSeedBound;
using exploration::name;
using exploration::Outcome;

// The broken variants (tests/sim/exploration.h).
using TwoBuffers = exploration::LamportTwoBuffers;
using NoClear = exploration::LamportNoClear;
using NoCanonicalization = exploration::LamportNoCanonicalization;

constexpr int kCalls = 7;

struct Workload {
  int ranks;
  size_t count;
  int blocks;
  int odd_blocks = 0;    // > 0: odd-numbered calls use this grid
  size_t odd_count = 0;  // > 0: odd-numbered calls reduce this many elements
};

size_t call_count(const Workload& w, int k) { return w.odd_count > 0 && k % 2 == 1 ? w.odd_count : w.count; }
int call_blocks(const Workload& w, int k) { return w.odd_blocks > 0 && k % 2 == 1 ? w.odd_blocks : w.blocks; }

const Workload kWorkloads[] = {Workload{2, 16, 1}, Workload{3, 40, 2}, Workload{4, 24, 1}, Workload{2, 64, 1, 2, 16},
                               Workload{3, 24, 2, 1, 72}};

// Runs kCalls bf16 Lamport all-reduces with Protocol under schedule `seed` on a fresh world.
// Inputs: simtest's random values (NaNs with random payloads, infinities, signed zeros,
// subnormals), and in every call one rank's element holds the sentinel's bit pattern 0xFFFF.
template <class Protocol>
Outcome explore(const Workload& w, uint64_t seed, std::string* detail) {
  sim::WorldOptions options;
  options.ranks = w.ranks;
  options.schedule = sim::Schedule::kSeeded;
  options.schedule_seed = seed;
  sim::World world(options);
  std::vector<std::vector<std::vector<uint8_t>>> ins, outs;
  size_t region = 0;
  sim::Xoshiro256 g(seed * 31 + 7);
  for (int k = 0; k < kCalls; ++k) {
    const size_t count = call_count(w, k);
    ins.push_back(simtest::random_inputs(DType::kBF16, w.ranks, count, 1000 * seed + k));
    const uint16_t sentinel = 0xFFFF;
    std::memcpy(ins.back()[g.below(w.ranks)].data() + 2 * g.below(count), &sentinel, 2);
    outs.emplace_back(w.ranks, std::vector<uint8_t>(count * 2));
    region = std::max(region, lamport_region_bytes(count, 2, w.ranks));
  }
  for (int k = 0; k < kCalls; ++k) {
    const size_t count = call_count(w, k);
    sim::Launch launch;
    launch.name = "allreduce_lamport_one_shot";
    launch.blocks = call_blocks(w, k);
    launch.input_bytes = count * 2;
    launch.lamport_bytes = region;  // one layout for the whole run
    launch.output_bytes = count * 2;
    for (int r = 0; r < w.ranks; ++r) {
      launch.inputs.push_back(ins[k][r].data());
      launch.outputs.push_back(outs[k][r].data());
    }
    world.enqueue<bf16>(launch, [count](auto& ctx) { allreduce_lamport_one_shot<bf16, 0, Protocol>(ctx, count); });
  }
  if (exploration::ran_into_deadlock(world, detail)) return Outcome::kDeadlock;
  sim::CollectiveSpec spec;
  spec.dtype = DType::kBF16;
  for (int k = 0; k < kCalls; ++k) {
    spec.count = call_count(w, k);
    const std::string diff = simtest::first_difference(outs[k], simtest::expected_outputs(spec, ins[k]), 2);
    if (!diff.empty()) {
      *detail = "call " + std::to_string(k) + ": " + diff;
      return Outcome::kWrongBits;
    }
  }
  return Outcome::kCorrect;
}

template <class Protocol>
void expect_caught(const char* what, Outcome expected) {
  for (const Workload& w : kWorkloads) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = exploration::first_failing_seed(
        [&](uint64_t s, std::string* d) { return explore<Protocol>(w, s, d); }, &outcome, &detail, &caught);
    EXPECT_NE(seed, 0u) << what << " survived " << kSeedBound << " seeds on " << w.ranks << " ranks";
    if (seed != 0) {
      EXPECT_EQ(outcome, expected) << detail;
    }
    std::printf(
        "lamport_one_shot, %s, %d ranks, counts %zu/%zu, grids %d/%d: caught in %d of %llu seeds, first at "
        "seed %llu (%s)\n%s\n",
        what, w.ranks, w.count, w.odd_count > 0 ? w.odd_count : w.count, w.blocks,
        w.odd_blocks > 0 ? w.odd_blocks : w.blocks, caught, static_cast<unsigned long long>(kSeedBound),
        static_cast<unsigned long long>(seed), name(outcome), detail.substr(0, 600).c_str());
  }
}

TEST(LamportExploration, TwoBuffersAreCaughtWithinTheSeedBound) {
  expect_caught<TwoBuffers>("two buffers", Outcome::kDeadlock);
}

TEST(LamportExploration, AMissingClearIsCaughtWithinTheSeedBound) {
  expect_caught<NoClear>("no clear", Outcome::kWrongBits);
}

TEST(LamportExploration, ASentinelThatCanCollideIsCaughtWithinTheSeedBound) {
  expect_caught<NoCanonicalization>("no canonicalization", Outcome::kDeadlock);
}

// The production protocol on the same workloads: thousands of seeds, all correct.
TEST(LamportExploration, ThreeBuffersWithClearAndCanonicalizationPassThousandsOfSeeds) {
  int runs = 0;
  uint64_t steps = 0;
  for (const Workload& w : kWorkloads) {
    for (uint64_t seed = 1; seed <= 1000; ++seed) {
      std::string detail;
      const Outcome o = explore<LamportProtocol>(w, seed, &detail);
      ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " with the real protocol, " << w.ranks << " ranks, seed " << seed
                                      << ": " << detail;
      ++runs;
    }
  }
  (void)steps;
  EXPECT_EQ(runs, 5000);
  std::printf("lamport_one_shot: %d seeded runs of %d consecutive calls, all correct\n", runs, kCalls);
}

}  // namespace
}  // namespace exactcoll
