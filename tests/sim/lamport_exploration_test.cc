// Seeded exploration of the Lamport all-reduces (core/lamport.h: lamport_one_shot, lamport_two_shot,
// and sequences that alternate the two). Every Lamport store, peek and poll is a scheduling point
// of the seeded scheduler, and a poll that finds the sentinel blocks until the word changes, so a
// seed decides how pushes, clears and polls of all ranks interleave. Each run is kCalls
// consecutive calls on one world (every buffer of the rotation is used twice, and cleared), with
// counts, grids and algorithms that change between calls in some workloads. Broken variants, which
// exist only here (LamportProtocol's knobs), are caught within exploration::kSeedBound seeds on
// every workload: two buffers instead of three, no clear, and a push that does not canonicalize
// NaNs (so an input equal to the sentinel is never seen as arrived). The production protocol
// passes thousands of seeds on the same workloads.
#include <gtest/gtest.h>

#include <algorithm>
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

constexpr Algorithm L1 = Algorithm::kLamportOneShot;
constexpr Algorithm L2 = Algorithm::kLamportTwoShot;

struct Workload {
  int ranks;
  size_t count;
  int blocks;
  int odd_blocks = 0;    // > 0: odd-numbered calls use this grid
  size_t odd_count = 0;  // > 0: odd-numbered calls reduce this many elements
  Algorithm algorithm = L1;
  Algorithm odd_algorithm = L1;  // odd-numbered calls' algorithm
};

size_t call_count(const Workload& w, int k) { return w.odd_count > 0 && k % 2 == 1 ? w.odd_count : w.count; }
int call_blocks(const Workload& w, int k) { return w.odd_blocks > 0 && k % 2 == 1 ? w.odd_blocks : w.blocks; }
Algorithm call_algorithm(const Workload& w, int k) { return k % 2 == 1 ? w.odd_algorithm : w.algorithm; }

// lamport_one_shot's workloads; lamport_two_shot's; and the two alternating (each order). Every
// two_shot workload alternates a count of fewer packs than ranks (every slice but the last empty)
// with a longer one, in grids of 2 or 3 blocks. Why: with two buffers, rank r's clear in call k
// races with a peer's call k+1 piece of slice r only where the peer finished call k without waiting
// for a push that r's clearing block makes after its clear, i.e. where r's slice was empty in call
// k (or that block's share of it) but is not in call k+1. With one count, whatever the grids, the
// block that clears where a piece will go has a share of r's slice and pushes its folded share
// after its clear, which the peer waits for: two buffers are safe there, and the seeds never caught
// them (0 of 200 on 2 ranks x 16 elements, and on 3 ranks x 40 in 2 blocks).
const Workload kWorkloads[] = {
    Workload{2, 16, 1},
    Workload{3, 40, 2},
    Workload{4, 24, 1},
    Workload{2, 64, 1, 2, 16},
    Workload{3, 24, 2, 1, 72},
    Workload{2, 8, 2, 1, 64, L2, L2},
    Workload{3, 16, 2, 2, 72, L2, L2},
    Workload{3, 16, 3, 1, 96, L2, L2},
    Workload{4, 24, 2, 2, 128, L2, L2},
    Workload{4, 24, 3, 1, 128, L2, L2},
    Workload{2, 8, 2, 1, 64, L2, L1},
    Workload{3, 72, 1, 2, 16, L1, L2},
    Workload{3, 16, 2, 1, 96, L2, L1},
    Workload{4, 24, 2, 1, 128, L2, L1},
};

std::string describe(const Workload& w) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s/%s, %d ranks, counts %zu/%zu, grids %d/%d", algorithm_name(w.algorithm),
                algorithm_name(w.odd_algorithm), w.ranks, w.count, w.odd_count > 0 ? w.odd_count : w.count, w.blocks,
                w.odd_blocks > 0 ? w.odd_blocks : w.blocks);
  return buf;
}

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
    region = std::max(region, lamport_region_bytes(call_algorithm(w, k), count, 2, w.ranks));
  }
  for (int k = 0; k < kCalls; ++k) {
    const size_t count = call_count(w, k);
    const Algorithm algorithm = call_algorithm(w, k);
    sim::Launch launch;
    launch.name = std::string("allreduce_") + algorithm_name(algorithm);
    launch.blocks = call_blocks(w, k);
    launch.input_bytes = count * 2;
    launch.lamport_bytes = region;  // one layout for the whole run
    launch.output_bytes = count * 2;
    for (int r = 0; r < w.ranks; ++r) {
      launch.inputs.push_back(ins[k][r].data());
      launch.outputs.push_back(outs[k][r].data());
    }
    exploration::enqueue_lamport_allreduce<Protocol>(world, launch, algorithm, count);
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
    EXPECT_NE(seed, 0u) << what << " survived " << kSeedBound << " seeds on " << describe(w);
    if (seed != 0) {
      EXPECT_EQ(outcome, expected) << detail;
    }
    std::printf("%s, %s: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n", describe(w).c_str(), what, caught,
                static_cast<unsigned long long>(kSeedBound), static_cast<unsigned long long>(seed), name(outcome),
                detail.substr(0, 600).c_str());
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

// Runs Protocol on every workload that `take` accepts, seeds 1..seeds each, and asserts that every
// run is correct (every output the contract's, no deadlock). Returns the number of workloads taken.
template <class Protocol, class Take>
int expect_correct_over_seeds(const char* what, int seeds, Take take) {
  int runs = 0, workloads = 0;
  for (const Workload& w : kWorkloads) {
    if (!take(w)) continue;
    ++workloads;
    for (uint64_t seed = 1; seed <= static_cast<uint64_t>(seeds); ++seed) {
      std::string detail;
      const Outcome o = explore<Protocol>(w, seed, &detail);
      EXPECT_EQ(o, Outcome::kCorrect) << name(o) << " with " << what << ", " << describe(w) << ", seed " << seed << ": "
                                      << detail;
      if (o != Outcome::kCorrect) return workloads;
      ++runs;
    }
  }
  std::printf("%s: %d seeded runs of %d consecutive Lamport calls, all correct\n", what, runs, kCalls);
  return workloads;
}

// The production protocol on the same workloads: thousands of seeds (700 per workload, 9800 in
// all: about 8 s on a 2-core machine), all correct.
constexpr int kProductionSeeds = 700;

TEST(LamportExploration, ThreeBuffersWithClearAndCanonicalizationPassThousandsOfSeeds) {
  const int workloads = expect_correct_over_seeds<LamportProtocol>("the real protocol", kProductionSeeds,
                                                                   [](const Workload&) { return true; });
  EXPECT_EQ(workloads, static_cast<int>(std::size(kWorkloads)));
}

// lamport_two_shot's push and gather with every peer's pack of a thread at once
// (LamportProtocol::kPushPeersAtOnce, kGatherPeersAtOnce; core/lamport.h, for_peer_slices_at_once):
// not the production choice yet (docs/benchmarks.md, "lamport_two_shot step by step"), so these runs
// keep them correct: every workload with a lamport_two_shot call (2, 3 and 4 ranks, the world size
// known at compile time as on the GPU), 200 seeds each, every output the contract's. (The simulator
// runs one thread a block: the thread strides are the GPU's to exercise.)
struct PushAtOnce : LamportProtocol {
  static constexpr bool kPushPeersAtOnce = true;
};
struct GatherAtOnce : LamportProtocol {
  static constexpr bool kGatherPeersAtOnce = true;
};
struct BothAtOnce : LamportProtocol {
  static constexpr bool kPushPeersAtOnce = true;
  static constexpr bool kGatherPeersAtOnce = true;
};
constexpr int kAtOnceSeeds = 200;

template <class Protocol>
void expect_two_shot_correct(const char* what) {
  const int workloads = expect_correct_over_seeds<Protocol>(
      what, kAtOnceSeeds, [](const Workload& w) { return w.algorithm == L2 || w.odd_algorithm == L2; });
  EXPECT_EQ(workloads, 9);
}

TEST(LamportExploration, TwoShotWithEveryPeersPushAtOncePassesTheSeeds) {
  expect_two_shot_correct<PushAtOnce>("push at once");
}

TEST(LamportExploration, TwoShotWithEveryPeersGatherAtOncePassesTheSeeds) {
  expect_two_shot_correct<GatherAtOnce>("gather at once");
}

TEST(LamportExploration, TwoShotWithBothAtOncePassesTheSeeds) { expect_two_shot_correct<BothAtOnce>("both at once"); }

}  // namespace
}  // namespace exactcoll
