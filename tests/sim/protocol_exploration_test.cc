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
#include "core/signal.h"
#include "sim/collectives.h"
#include "sim/world.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll {
namespace {

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

enum class Outcome { kCorrect, kDeadlock, kWrongBits };

constexpr int kLaunches = 4;

struct Workload {
  int ranks;
  size_t count;
  int blocks;
  bool two_shot;
};

// Runs kLaunches all-reduces with Protocol under schedule `seed` on one fresh world.
template <class Protocol>
Outcome explore(const Workload& w, uint64_t seed, std::string* detail) {
  sim::WorldOptions options;
  options.ranks = w.ranks;
  options.schedule = sim::Schedule::kSeeded;
  options.schedule_seed = seed;
  sim::World world(options);
  sim::CollectiveSpec spec;
  spec.dtype = DType::kBF16;
  spec.count = w.count;
  spec.algorithm = w.two_shot ? sim::Algorithm::kTwoShot : sim::Algorithm::kOneShot;
  std::vector<std::vector<std::vector<uint8_t>>> ins, outs;
  for (int k = 0; k < kLaunches; ++k) {
    ins.push_back(simtest::random_inputs(spec.dtype, w.ranks, w.count, 1000 * seed + k));
    outs.emplace_back(w.ranks, std::vector<uint8_t>(w.count * 2));
  }
  for (int k = 0; k < kLaunches; ++k) {
    sim::Launch launch;
    launch.name = w.two_shot ? "allreduce_two_shot" : "allreduce_one_shot";
    launch.blocks = w.blocks;
    launch.input_bytes = w.count * 2;
    launch.scratch_bytes = w.count * 2;
    launch.output_bytes = w.count * 2;
    for (int r = 0; r < w.ranks; ++r) {
      launch.inputs.push_back(ins[k][r].data());
      launch.outputs.push_back(outs[k][r].data());
    }
    const size_t count = w.count;
    if (w.two_shot) {
      world.enqueue<bf16>(launch, [count](auto& ctx) { allreduce_two_shot<bf16, 0, Protocol>(ctx, count); });
    } else {
      world.enqueue<bf16>(launch, [count](auto& ctx) { allreduce_one_shot<bf16, 0, Protocol>(ctx, count); });
    }
  }
  try {
    world.run();
  } catch (const sim::SimError& e) {
    if (e.kind() != sim::SimFailure::kDeadlock) throw;
    *detail = e.what();
    return Outcome::kDeadlock;
  }
  for (int k = 0; k < kLaunches; ++k) {
    const std::string diff = simtest::first_difference(outs[k], simtest::expected_outputs(spec, ins[k]), 2);
    if (!diff.empty()) {
      *detail = "collective " + std::to_string(k) + ": " + diff;
      return Outcome::kWrongBits;
    }
  }
  return Outcome::kCorrect;
}

constexpr uint64_t kSeedBound = 200;

// Returns the first seed in 1..kSeedBound at which Protocol fails, or 0; *caught counts the
// failing seeds among all kSeedBound (how often a random schedule exposes the bug).
template <class Protocol>
uint64_t first_failing_seed(const Workload& w, Outcome* outcome, std::string* detail, int* caught) {
  uint64_t first = 0;
  *caught = 0;
  for (uint64_t seed = 1; seed <= kSeedBound; ++seed) {
    std::string d;
    const Outcome o = explore<Protocol>(w, seed, &d);
    if (o == Outcome::kCorrect) continue;
    ++*caught;
    if (first == 0) {
      first = seed;
      *outcome = o;
      *detail = d;
    }
  }
  return first;
}

const char* name(Outcome o) {
  return o == Outcome::kDeadlock ? "deadlock" : o == Outcome::kWrongBits ? "wrong bits" : "correct";
}

TEST(ProtocolExploration, OneFlagSetIsCaughtWithinTheSeedBound) {
  for (const Workload w : {Workload{2, 16, 1, false}, Workload{3, 40, 2, false}, Workload{4, 40, 1, true}}) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = first_failing_seed<OneSetProtocol>(w, &outcome, &detail, &caught);
    EXPECT_NE(seed, 0u) << "one flag set survived " << kSeedBound << " seeds on " << w.ranks << " ranks";
    std::printf("one flag set, %d ranks, %s: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n", w.ranks,
                w.two_shot ? "two_shot" : "one_shot", caught, static_cast<unsigned long long>(kSeedBound),
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
                w.two_shot ? "two_shot" : "one_shot", caught, static_cast<unsigned long long>(kSeedBound),
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

}  // namespace
}  // namespace exactcoll
