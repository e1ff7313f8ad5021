// The seeded scheduler finds protocol bugs: deliberately broken variants of the signal protocol,
// which exist only in this test, are caught (a deadlock report or wrong bits) within a bounded
// number of schedule seeds, while the real protocol (core/signal.h TwoSetProtocol) passes
// thousands of seeds. Each run is several consecutive collectives on one world, so a fast rank's
// next launch (and its input staging) can overtake a slow peer, as on GPUs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/push.h"
#include "core/signal.h"
#include "sim/collectives.h"
#include "sim/world.h"
#include "tests/sim/exploration.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll {
namespace {

using exploration::CountSizedHalves;
using exploration::kSeedBound;
using exploration::name;
using exploration::OneHalf;
using exploration::Outcome;

// Broken: one flag set. Peer p's signal for barrier k+1 can overwrite its signal k in this block's
// slot before this block has read k; this block then waits for k forever.
struct OneSetProtocol {
  static int flag_set(uint32_t) { return 0; }
  static constexpr bool kEndBarrier = true;
};

// Broken: no end barrier. A fast rank finishes the collective, and its next launch stages new
// input over the buffer a slow peer is still folding: wrong bits.
struct NoEndBarrierProtocol {
  static int flag_set(uint32_t value) { return static_cast<int>(value & 1u); }
  static constexpr bool kEndBarrier = false;
};

// Broken push_one_shot receive halves: OneHalf and CountSizedHalves (tests/sim/exploration.h), and
// this one, which keeps the production choice of what it does not break. The block's
// barrier-count parity: equal to the alternating half while every launch has the same grid, but
// after a launch with fewer blocks the blocks' counts differ, and block 0 of call k+1 (covering
// every element) can store into the half that block 1 of call k is still folding.
struct BarrierParityHalf : AlternatingHalves {
  static int half(uint32_t, uint32_t barriers) { return static_cast<int>((barriers + 1) & 1u); }
};

constexpr int kLaunches = 4;

struct Workload {
  int ranks;
  size_t count;
  int blocks;
  bool two_shot;
  bool push = false;      // allreduce_push_one_shot, or with two_shot allreduce_push_two_shot
  int odd_blocks = 0;     // > 0: odd-numbered launches use this grid instead of `blocks`
  size_t odd_count = 0;   // > 0: odd-numbered launches reduce this many elements instead of `count`
  bool in_place = false;  // output == input (each rank's input buffer is overwritten by its result)
};

size_t launch_count(const Workload& w, int k) { return w.odd_count > 0 && k % 2 == 1 ? w.odd_count : w.count; }

const char* algorithm(const Workload& w) {
  return w.push ? (w.two_shot ? "push_two_shot" : "push_one_shot") : w.two_shot ? "two_shot" : "one_shot";
}

// Runs kLaunches all-reduces with Protocol (and, for push_one_shot, Halves) under schedule `seed`
// on one fresh world.
template <class Protocol, class Halves = AlternatingHalves>
Outcome explore(const Workload& w, uint64_t seed, std::string* detail) {
  sim::WorldOptions options;
  options.ranks = w.ranks;
  options.schedule = sim::Schedule::kSeeded;
  options.schedule_seed = seed;
  sim::World world(options);
  sim::CollectiveSpec spec;
  spec.dtype = DType::kBF16;
  spec.algorithm = w.two_shot ? sim::Algorithm::kTwoShot : sim::Algorithm::kOneShot;
  std::vector<std::vector<std::vector<uint8_t>>> ins, outs;
  for (int k = 0; k < kLaunches; ++k) {
    ins.push_back(simtest::random_inputs(spec.dtype, w.ranks, launch_count(w, k), 1000 * seed + k));
    outs.emplace_back(w.ranks, std::vector<uint8_t>(launch_count(w, k) * 2));
  }
  for (int k = 0; k < kLaunches; ++k) {
    const size_t count = launch_count(w, k);
    sim::Launch launch;
    launch.name = std::string("allreduce_") + algorithm(w);
    launch.blocks = w.odd_blocks > 0 && k % 2 == 1 ? w.odd_blocks : w.blocks;
    launch.input_bytes = count * 2;
    launch.scratch_bytes = (w.push ? push_scratch_elements(count, Storage<bf16>::kPack, w.ranks) : count) * 2;
    launch.output_bytes = count * 2;
    launch.output_is_input = w.in_place;
    for (int r = 0; r < w.ranks; ++r) {
      launch.inputs.push_back(ins[k][r].data());
      launch.outputs.push_back(outs[k][r].data());
    }
    if (w.push && w.two_shot) {
      world.enqueue<bf16>(launch,
                          [count](auto& ctx) { allreduce_push_two_shot<bf16, 0, Protocol, Halves>(ctx, count); });
    } else if (w.push) {
      world.enqueue<bf16>(launch,
                          [count](auto& ctx) { allreduce_push_one_shot<bf16, 0, Protocol, Halves>(ctx, count); });
    } else if (w.two_shot) {
      world.enqueue<bf16>(launch, [count](auto& ctx) { allreduce_two_shot<bf16, 0, Protocol>(ctx, count); });
    } else {
      world.enqueue<bf16>(launch, [count](auto& ctx) { allreduce_one_shot<bf16, 0, Protocol>(ctx, count); });
    }
  }
  if (exploration::ran_into_deadlock(world, detail)) return Outcome::kDeadlock;
  for (int k = 0; k < kLaunches; ++k) {
    spec.count = launch_count(w, k);
    const std::string diff = simtest::first_difference(outs[k], simtest::expected_outputs(spec, ins[k]), 2);
    if (!diff.empty()) {
      *detail = "collective " + std::to_string(k) + ": " + diff;
      return Outcome::kWrongBits;
    }
  }
  return Outcome::kCorrect;
}

// Returns the first seed in 1..kSeedBound at which Protocol (with Halves) fails on w, or 0;
// *caught counts the failing seeds among all kSeedBound (exploration::first_failing_seed).
template <class Protocol, class Halves = AlternatingHalves>
uint64_t first_failing_seed(const Workload& w, Outcome* outcome, std::string* detail, int* caught) {
  return exploration::first_failing_seed(
      [&](uint64_t seed, std::string* d) { return explore<Protocol, Halves>(w, seed, d); }, outcome, detail, caught);
}

TEST(ProtocolExploration, OneFlagSetIsCaughtWithinTheSeedBound) {
  for (const Workload w : {Workload{2, 16, 1, false}, Workload{3, 40, 2, false}, Workload{4, 40, 1, true}}) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = first_failing_seed<OneSetProtocol>(w, &outcome, &detail, &caught);
    EXPECT_NE(seed, 0u) << "one flag set survived " << kSeedBound << " seeds on " << w.ranks << " ranks";
    std::printf("one flag set, %d ranks, %s: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n", w.ranks,
                algorithm(w), caught, static_cast<unsigned long long>(kSeedBound),
                static_cast<unsigned long long>(seed), name(outcome), detail.c_str());
  }
}

// Only one_shot workloads: two_shot without its end barrier is safe when consecutive launches use
// the same grid (the next launch's first barrier already waits for every peer's gather from this
// rank's scratch, and inputs are last read before the middle barrier), and this scheduler finds
// nothing there — the end barrier protects launches with a different block split.
TEST(ProtocolExploration, MissingEndBarrierIsCaughtWithinTheSeedBound) {
  for (const Workload w : {Workload{2, 16, 1, false}, Workload{3, 40, 2, false}, Workload{4, 40, 3, false}}) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = first_failing_seed<NoEndBarrierProtocol>(w, &outcome, &detail, &caught);
    EXPECT_NE(seed, 0u) << "no end barrier survived " << kSeedBound << " seeds on " << w.ranks << " ranks";
    std::printf("no end barrier, %d ranks, %s: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n", w.ranks,
                algorithm(w), caught, static_cast<unsigned long long>(kSeedBound),
                static_cast<unsigned long long>(seed), name(outcome), detail.c_str());
  }
}

// The production protocol on the same workloads: thousands of seeds, all correct.
TEST(ProtocolExploration, TwoSetProtocolPassesThousandsOfSeeds) {
  int runs = 0;
  for (const Workload w : {Workload{2, 16, 1, false}, Workload{3, 40, 2, false}, Workload{4, 40, 1, true}}) {
    for (uint64_t seed = 1; seed <= 1000; ++seed) {
      std::string detail;
      const Outcome o = explore<TwoSetProtocol>(w, seed, &detail);
      ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " with the real protocol, " << w.ranks << " ranks, seed " << seed
                                      << ": " << detail;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 3000);
}

// push_one_shot workloads: consecutive calls on one grid, and calls whose grid alternates.
const Workload kPushWorkloads[] = {Workload{2, 16, 1, false, true}, Workload{3, 40, 2, false, true},
                                   Workload{4, 40, 1, false, true}, Workload{2, 24, 1, false, true, 2},
                                   Workload{3, 40, 2, false, true, 1}};

// push_two_shot workloads, likewise.
const Workload kPushTwoShotWorkloads[] = {Workload{2, 16, 1, true, true}, Workload{3, 40, 2, true, true},
                                          Workload{4, 40, 1, true, true}, Workload{3, 40, 2, true, true, 1}};

// Push workloads whose count changes between calls: the odd-numbered calls (receive half 1) are
// smaller than the even ones, so with CountSizedHalves an even call's half 0 covers the previous
// call's half 1. One of them also changes the grid.
const Workload kPushMixedCountWorkloads[] = {
    Workload{2, 64, 1, false, true, 0, 16}, Workload{3, 64, 2, false, true, 0, 24},
    Workload{4, 40, 1, false, true, 2, 8},  Workload{2, 64, 1, true, true, 0, 16},
    Workload{3, 64, 2, true, true, 0, 24},  Workload{4, 80, 1, true, true, 2, 16}};

// One receive half instead of two: a peer's next call overwrites what this rank still folds.
TEST(ProtocolExploration, PushOneShotWithOneReceiveHalfIsCaughtWithinTheSeedBound) {
  for (const Workload& w : {kPushWorkloads[0], kPushWorkloads[1], kPushWorkloads[2]}) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = first_failing_seed<TwoSetProtocol, OneHalf>(w, &outcome, &detail, &caught);
    EXPECT_NE(seed, 0u) << "one receive half survived " << kSeedBound << " seeds on " << w.ranks << " ranks";
    std::printf("%s, one receive half, %d ranks: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n",
                algorithm(w), w.ranks, caught, static_cast<unsigned long long>(kSeedBound),
                static_cast<unsigned long long>(seed), name(outcome), detail.c_str());
  }
}

// The half from the block's barrier count: fine on one grid, caught when the grid changes.
TEST(ProtocolExploration, PushOneShotWithBarrierParityHalvesIsCaughtWhenTheGridChanges) {
  for (const Workload& w : {kPushWorkloads[3], kPushWorkloads[4]}) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = first_failing_seed<TwoSetProtocol, BarrierParityHalf>(w, &outcome, &detail, &caught);
    EXPECT_NE(seed, 0u) << "barrier-parity halves survived " << kSeedBound << " seeds on " << w.ranks << " ranks";
    std::printf(
        "push_one_shot, barrier-parity halves, %d ranks, grids %d/%d: caught in %d of %llu seeds, first at "
        "seed %llu (%s)\n%s\n",
        w.ranks, w.blocks, w.odd_blocks, caught, static_cast<unsigned long long>(kSeedBound),
        static_cast<unsigned long long>(seed), name(outcome), detail.c_str());
  }
}

// The production push_one_shot (alternating halves by call number, one barrier per call):
// thousands of seeds, all correct, on one grid and with grids that change between calls.
TEST(ProtocolExploration, PushOneShotPassesThousandsOfSeeds) {
  int runs = 0;
  for (const Workload& w : kPushWorkloads) {
    for (uint64_t seed = 1; seed <= 1000; ++seed) {
      std::string detail;
      const Outcome o = explore<TwoSetProtocol>(w, seed, &detail);
      ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " with push_one_shot, " << w.ranks << " ranks, seed " << seed
                                      << ": " << detail;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 5000);
}

// A finding, like two_shot's end barrier above: push_two_shot alone would be safe with one receive
// half, even when the grid changes. A peer's next-call stores into slot (h, peer) happen after
// that peer completed this call, i.e. after every block of this rank passed the second barrier,
// which follows the fold that reads those slots; and the result slot (h, rank) is rewritten only
// after the next call's first barrier, which needs this rank's signal from the next call. The two
// halves are there for mixing with push_one_shot (which shares the call counter and the layout).
TEST(ProtocolExploration, PushTwoShotAloneIsSafeWithOneReceiveHalf) {
  for (const Workload& w : kPushTwoShotWorkloads) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = first_failing_seed<TwoSetProtocol, OneHalf>(w, &outcome, &detail, &caught);
    EXPECT_EQ(seed, 0u) << name(outcome) << " at seed " << seed << ": " << detail;
  }
}

// The production push_two_shot: thousands of seeds, all correct, on one grid and alternating grids.
TEST(ProtocolExploration, PushTwoShotPassesThousandsOfSeeds) {
  int runs = 0;
  for (const Workload& w : kPushTwoShotWorkloads) {
    for (uint64_t seed = 1; seed <= 1000; ++seed) {
      std::string detail;
      const Outcome o = explore<TwoSetProtocol>(w, seed, &detail);
      ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " with push_two_shot, " << w.ranks << " ranks, seed " << seed
                                      << ": " << detail;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 4000);
}

// Half 1 sized by the call's own count (the layout before 2026-11-21): caught once consecutive
// calls have different counts (push_one_shot: a peer's larger next call overwrites the slots this
// rank still folds). push_two_shot is printed, not required: its second barrier already orders
// most of what the halves protect.
TEST(ProtocolExploration, PushHalvesSizedByTheCallsCountAreCaughtWhenTheCountChanges) {
  for (const Workload& w : kPushMixedCountWorkloads) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = first_failing_seed<TwoSetProtocol, CountSizedHalves>(w, &outcome, &detail, &caught);
    if (!w.two_shot) {
      EXPECT_NE(seed, 0u) << "count-sized halves survived " << kSeedBound << " seeds on " << w.ranks << " ranks";
    }
    std::printf(
        "%s, count-sized halves, %d ranks, counts %zu/%zu: caught in %d of %llu seeds, first at seed %llu "
        "(%s)\n%s\n",
        algorithm(w), w.ranks, w.count, w.odd_count, caught, static_cast<unsigned long long>(kSeedBound),
        static_cast<unsigned long long>(seed), name(outcome), detail.c_str());
  }
}

// The production halves (half 1 at the middle of the scratch) with counts that change between
// calls: thousands of seeds, all correct, for both push algorithms.
TEST(ProtocolExploration, PushAlgorithmsPassThousandsOfSeedsWhenTheCountChanges) {
  int runs = 0;
  for (const Workload& w : kPushMixedCountWorkloads) {
    for (uint64_t seed = 1; seed <= 500; ++seed) {
      std::string detail;
      const Outcome o = explore<TwoSetProtocol>(w, seed, &detail);
      ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " with " << algorithm(w) << ", " << w.ranks << " ranks, counts "
                                      << w.count << "/" << w.odd_count << ", seed " << seed << ": " << detail;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 3000);
}

}  // namespace
}  // namespace exactcoll

namespace exactcoll {
namespace {

Workload in_place(Workload w) {
  w.in_place = true;
  return w;
}

// In place (output == input), which the GPU runs without staging for the push algorithms (their
// peers never read this rank's input; cuda_backend/communicator.cc step 4b): every block
// overwrites only the elements it has read itself, so thousands of seeds, on one grid and on
// alternating grids, give the contract's bits.
TEST(ProtocolExploration, PushAlgorithmsInPlacePassThousandsOfSeeds) {
  int runs = 0;
  for (const Workload& base : {kPushWorkloads[1], kPushWorkloads[2], kPushWorkloads[4], kPushTwoShotWorkloads[1],
                               kPushTwoShotWorkloads[2], kPushTwoShotWorkloads[3]}) {
    const Workload w = in_place(base);
    for (uint64_t seed = 1; seed <= 500; ++seed) {
      std::string detail;
      const Outcome o = explore<TwoSetProtocol>(w, seed, &detail);
      ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " with " << algorithm(w) << " in place, " << w.ranks
                                      << " ranks, seed " << seed << ": " << detail;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 3000);
}

// The check above can fail: one_shot in place, whose peers read this rank's input while this rank
// writes its result over it, is caught (hence the GPU stages one_shot's in-place calls).
TEST(ProtocolExploration, OneShotInPlaceIsCaughtWithinTheSeedBound) {
  const Workload w = in_place(Workload{3, 40, 2, false});
  Outcome outcome = Outcome::kCorrect;
  std::string detail;
  int caught = 0;
  const uint64_t seed = first_failing_seed<TwoSetProtocol>(w, &outcome, &detail, &caught);
  EXPECT_NE(seed, 0u) << "one_shot in place survived " << kSeedBound << " seeds on " << w.ranks << " ranks";
  std::printf("one_shot in place, %d ranks: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n", w.ranks, caught,
              static_cast<unsigned long long>(kSeedBound), static_cast<unsigned long long>(seed), name(outcome),
              detail.c_str());
}

// A finding: two_shot in place is safe too. Its output is written only in the gather step, after
// the barrier that follows every peer's reads of this rank's input slices (the GPU still stages
// it: its peers read the input, so only a registration or a captured row could spare the copy).
TEST(ProtocolExploration, TwoShotInPlaceIsSafe) {
  for (const Workload& w : {in_place(Workload{4, 40, 1, true}), in_place(Workload{3, 40, 2, true})}) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = first_failing_seed<TwoSetProtocol>(w, &outcome, &detail, &caught);
    EXPECT_EQ(seed, 0u) << name(outcome) << " at seed " << seed << ": " << detail;
  }
}

}  // namespace
}  // namespace exactcoll
