// lamport_one_stage and lamport_two_stage (the fused all-reduce + residual + RMSNorm over the
// Lamport protocol, core/fused_rmsnorm.h) under the seeded scheduler, mixed with the Lamport
// all-reduces (lamport_one_shot, and lamport_two_shot in the later workloads) on ONE world: all share the
// call counter, the three buffers, the extents and the sentinel (core/lamport.h), and none has a
// barrier, so a fast rank's next Lamport call (fused or not, another size,
// another grid) may store into a slow peer's region while that peer still polls. Every output of
// every call is compared with the contract (sim/fused/reference.h, contract::fold). The production
// protocol passes thousands of seeds; the broken variants of tests/sim/exploration.h (two
// buffers, no clear, no canonicalization) are caught within 200 seeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "core/lamport.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tests/sim/fused/exploration_calls.h"
#include "tests/core/thread_world.h"
#include "tests/sim/exploration.h"

namespace exactcoll {
namespace {

using exploration::kSeedBound;
using exploration::name;
using exploration::Outcome;
using fused_exploration::CallData;
using fused_exploration::complete_call;
using fused_exploration::first_difference;
using fused_exploration::kEps;
using fused_exploration::kHidden;
using testing_world::AlignedBuffer;

enum class Kind { kFused, kFusedTwoStage, kAllReduce, kAllReduceTwoShot };

// One call: lamport_one_stage (kFused) or lamport_two_stage over `size` rows of kHidden, or
// lamport_one_shot (kAllReduce) or lamport_two_shot of `size` elements.
struct Call {
  Kind kind;
  int size;
  int blocks;
};

struct Workload {
  int ranks;
  std::vector<Call> calls;
};

bool is_fused(const Call& c) { return c.kind == Kind::kFused || c.kind == Kind::kFusedTwoStage; }
size_t elements(const Call& c) { return is_fused(c) ? static_cast<size_t>(c.size) * kHidden : c.size; }

// At least seven calls each, so every buffer of the rotation is used at least twice (and cleared
// by calls of other kinds, sizes and grids).
const Workload kWorkloads[] = {
    {2,
     {{Kind::kFused, 3, 1},
      {Kind::kAllReduce, 24, 2},
      {Kind::kFused, 5, 3},
      {Kind::kAllReduce, 16, 1},
      {Kind::kFused, 1, 2},
      {Kind::kFused, 4, 1},
      {Kind::kAllReduce, 37, 2}}},
    {3,
     {{Kind::kAllReduce, 64, 2},
      {Kind::kFused, 1, 1},
      {Kind::kFused, 4, 2},
      {Kind::kAllReduce, 9, 1},
      {Kind::kFused, 5, 3},
      {Kind::kAllReduce, 40, 1},
      {Kind::kFused, 2, 2}}},
    {4,
     {{Kind::kFused, 4, 2},
      {Kind::kAllReduce, 16, 1},
      {Kind::kFused, 3, 3},
      {Kind::kFused, 1, 1},
      {Kind::kAllReduce, 48, 2},
      {Kind::kFused, 2, 1},
      {Kind::kAllReduce, 8, 1}}},
    // lamport_two_shot writes two strides per slot (for 3 packs on 4 ranks: 6 packs, past its
    // message), the fused call and lamport_one_shot their messages: each clears the others' extents.
    {3,
     {{Kind::kAllReduceTwoShot, 16, 2},
      {Kind::kFused, 2, 1},
      {Kind::kAllReduceTwoShot, 96, 1},
      {Kind::kAllReduce, 24, 2},
      {Kind::kFused, 1, 2},
      {Kind::kAllReduceTwoShot, 8, 1},
      {Kind::kFused, 4, 3},
      {Kind::kAllReduceTwoShot, 40, 2}}},
    {4,
     {{Kind::kFused, 1, 1},
      {Kind::kAllReduceTwoShot, 128, 3},
      {Kind::kFused, 4, 2},
      {Kind::kAllReduceTwoShot, 24, 2},
      {Kind::kAllReduceTwoShot, 128, 2},
      {Kind::kAllReduce, 40, 1},
      {Kind::kAllReduceTwoShot, 24, 3},
      {Kind::kFused, 2, 1}}},
    // lamport_two_stage: fewer rows than ranks (some ranks own none), as many, more; blocks whose
    // rows have several owners and rows spread over several blocks; two strides of a rank's rows a
    // slot, cleared by and clearing the other kinds' extents.
    {4,
     {{Kind::kFusedTwoStage, 5, 2},
      {Kind::kAllReduce, 16, 1},
      {Kind::kFusedTwoStage, 1, 1},
      {Kind::kFused, 3, 2},
      {Kind::kFusedTwoStage, 8, 3},
      {Kind::kAllReduceTwoShot, 24, 2},
      {Kind::kFusedTwoStage, 2, 4},
      {Kind::kAllReduce, 8, 1}}},
    {3,
     {{Kind::kFusedTwoStage, 1, 2},
      {Kind::kFusedTwoStage, 4, 2},
      {Kind::kFused, 2, 1},
      {Kind::kFusedTwoStage, 2, 1},
      {Kind::kAllReduce, 24, 2},
      {Kind::kFusedTwoStage, 1, 1},
      {Kind::kAllReduceTwoShot, 40, 1},
      {Kind::kFusedTwoStage, 7, 3}}},
    // lamport_two_stage alone, so that a broken variant is caught by its own calls.
    {3,
     {{Kind::kFusedTwoStage, 4, 2},
      {Kind::kFusedTwoStage, 1, 1},
      {Kind::kFusedTwoStage, 7, 3},
      {Kind::kFusedTwoStage, 2, 2},
      {Kind::kFusedTwoStage, 5, 1},
      {Kind::kFusedTwoStage, 3, 2},
      {Kind::kFusedTwoStage, 6, 3}}},
    {2,
     {{Kind::kFusedTwoStage, 3, 1},
      {Kind::kFusedTwoStage, 2, 2},
      {Kind::kAllReduce, 16, 1},
      {Kind::kFusedTwoStage, 5, 3},
      {Kind::kFused, 1, 1},
      {Kind::kFusedTwoStage, 4, 2},
      {Kind::kAllReduceTwoShot, 16, 2}}},
};

Algorithm algorithm_of(const Call& c) {
  return c.kind == Kind::kAllReduceTwoShot ? Algorithm::kLamportTwoShot : Algorithm::kLamportOneShot;
}

std::string describe(const Workload& w) {
  std::string s = std::to_string(w.ranks) + " ranks:";
  for (const Call& c : w.calls) {
    s += c.kind == Kind::kFused ? " lamport_one_stage(" + std::to_string(c.size) + " rows"
         : c.kind == Kind::kFusedTwoStage
             ? " lamport_two_stage(" + std::to_string(c.size) + " rows"
             : std::string(" ") + algorithm_name(algorithm_of(c)) + "(" + std::to_string(c.size);
    s += ", " + std::to_string(c.blocks) + (c.blocks == 1 ? " block)" : " blocks)");
  }
  return s;
}

// Random x, with the sentinel's pattern (0xFFFF, a NaN) in one element of one rank and -0.0 in
// another: the push must canonicalize the first and keep the second.
CallData make_data(const Call& c, int ranks, uint64_t seed) {
  fused::SplitMix64 rng(seed);
  const size_t count = elements(c);
  CallData d;
  d.x.resize(count * ranks);
  for (auto& v : d.x) v = round_to<bf16>(rng.normal() * 2.0f);
  d.x[(rng.next() % ranks) * count + rng.next() % count] = bf16{0xFFFF};
  d.x[(rng.next() % ranks) * count + rng.next() % count] = bf16{0x8000};
  complete_call(is_fused(c), ranks, count, rng, &d);
  return d;
}

// Runs the workload's calls back to back on one world under the seeded schedule `seed`.
template <class Protocol>
Outcome explore(const Workload& w, uint64_t seed, std::string* detail) {
  sim::WorldOptions options;
  options.ranks = w.ranks;
  options.schedule = sim::Schedule::kSeeded;
  options.schedule_seed = seed;
  sim::World world(options);
  std::vector<CallData> data;
  size_t region = 0;
  for (size_t k = 0; k < w.calls.size(); ++k) {
    data.push_back(make_data(w.calls[k], w.ranks, 1000 * seed + k));
    region = std::max(
        region, w.calls[k].kind == Kind::kFusedTwoStage
                    ? lamport_two_stage_region_bytes(w.calls[k].size, kHidden, sizeof(bf16), w.ranks)
                    : lamport_region_bytes(algorithm_of(w.calls[k]), elements(w.calls[k]), sizeof(bf16), w.ranks));
  }
  for (size_t k = 0; k < w.calls.size(); ++k) {
    const Call& c = w.calls[k];
    CallData& d = data[k];
    const size_t count = elements(c);
    sim::Launch launch;
    launch.blocks = c.blocks;
    launch.input_bytes = count * sizeof(bf16);
    launch.lamport_bytes = region;  // one layout for the whole run
    for (int r = 0; r < w.ranks; ++r) launch.inputs.push_back(d.x.data() + r * count);
    if (c.kind == Kind::kFused) {
      launch.name = "fused_rmsnorm_lamport_one_stage";
      const std::vector<FusedRmsNormArgs<bf16>> args = d.args;
      world.enqueue<bf16>(launch, [args](auto& ctx) {
        fused::with_fused_ctx(ctx, [&](auto& fctx) {
          dispatch_fused_world_size(
              fctx.world_size(), [&](auto ranks) {  // the GPU's compile-time ranks (peeks up to 4)
                fused_rmsnorm_lamport<bf16, decltype(ranks)::value, Protocol>(fctx, args[fctx.rank()]);
              });
        });
      });
    } else if (c.kind == Kind::kFusedTwoStage) {
      launch.name = "fused_rmsnorm_lamport_two_stage";
      const std::vector<FusedRmsNormArgs<bf16>> args = d.args;
      world.enqueue<bf16>(launch, [args](auto& ctx) {
        fused::with_fused_ctx(ctx, [&](auto& fctx) {
          dispatch_fused_world_size(fctx.world_size(), [&](auto ranks) {
            fused_rmsnorm_lamport<bf16, decltype(ranks)::value, Protocol, LamportFused::kTwoStage>(fctx,
                                                                                                   args[fctx.rank()]);
          });
        });
      });
    } else {
      launch.name = std::string("allreduce_") + algorithm_name(algorithm_of(c));
      launch.output_bytes = count * sizeof(bf16);
      for (int r = 0; r < w.ranks; ++r) launch.outputs.push_back(d.ar_out[r].data());
      exploration::enqueue_lamport_allreduce<Protocol>(world, launch, algorithm_of(c), count);
    }
  }
  if (exploration::ran_into_deadlock(world, detail)) return Outcome::kDeadlock;
  for (size_t k = 0; k < w.calls.size(); ++k) {
    const CallData& d = data[k];
    for (int r = 0; r < w.ranks; ++r) {
      std::string diff;
      if (is_fused(w.calls[k])) {
        diff = first_difference(d.residual_out[r].data(), d.want_ro);
        if (diff.empty()) diff = first_difference(d.out[r].data(), d.want_out);
      } else {
        diff = first_difference(d.ar_out[r].data(), d.want_out);
      }
      if (!diff.empty()) {
        *detail = "call " + std::to_string(k) + ", rank " + std::to_string(r) + ": " + diff;
        return Outcome::kWrongBits;
      }
    }
  }
  return Outcome::kCorrect;
}

template <class Protocol>
void expect_caught(const char* variant) {
  for (const Workload& w : kWorkloads) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = exploration::first_failing_seed(
        [&](uint64_t s, std::string* d) { return explore<Protocol>(w, s, d); }, &outcome, &detail, &caught);
    EXPECT_NE(seed, 0u) << variant << " survived " << kSeedBound << " seeds on " << describe(w);
    std::printf("%s, %s: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n", variant, describe(w).c_str(),
                caught, static_cast<unsigned long long>(kSeedBound), static_cast<unsigned long long>(seed),
                name(outcome), detail.substr(0, 400).c_str());
  }
}

TEST(FusedLamportExploration, TwoBuffersAreCaughtWithinTheSeedBound) {
  expect_caught<exploration::LamportTwoBuffers>("two buffers");
}

TEST(FusedLamportExploration, AMissingClearIsCaughtWithinTheSeedBound) {
  expect_caught<exploration::LamportNoClear>("no clear");
}

TEST(FusedLamportExploration, ASentinelThatCanCollideIsCaughtWithinTheSeedBound) {
  expect_caught<exploration::LamportNoCanonicalization>("no canonicalization");
}

// The production protocol on the same workloads: thousands of seeds, every output of every call
// equal to the contract.
TEST(FusedLamportExploration, TheRealProtocolPassesThousandsOfSeeds) {
  int runs = 0;
  for (const Workload& w : kWorkloads) {
    for (uint64_t seed = 1; seed <= 1000; ++seed) {
      std::string detail;
      const Outcome o = explore<LamportProtocol>(w, seed, &detail);
      ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " on " << describe(w) << ", seed " << seed << ": " << detail;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 1000 * static_cast<int>(std::size(kWorkloads)));
}

}  // namespace
}  // namespace exactcoll
