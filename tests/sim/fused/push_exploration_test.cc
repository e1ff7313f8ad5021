// push_one_stage under the seeded scheduler, mixed with the push all-reduces on ONE world: the
// fused call shares their call counter (SignalBuffer::push_calls) and receive halves, and none of
// them has an end barrier, so a fast rank's next push call (fused or not, another size, another
// grid) may store into a slow peer's scratch while that peer still folds. Every run is one world
// running a sequence of such calls back to back; every output of every call is compared with the
// contract. The production halves (AlternatingHalves) pass thousands of seeds; broken halves,
// which exist only in the tests (tests/sim/exploration.h), are caught within 200 seeds — so the
// runs do reach the interleavings that the halves protect against.
// (tests/sim/protocol_exploration_test.cc does the same for the all-reduces alone.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "core/push.h"
#include "core/signal.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tests/sim/fused/exploration_calls.h"
#include "tests/core/thread_world.h"
#include "tests/sim/exploration.h"

namespace exactcoll {
namespace {

using exploration::CountSizedHalves;  // broken halves, caught within kSeedBound seeds
using exploration::kSeedBound;
using exploration::name;
using exploration::OneHalf;
using exploration::Outcome;
using fused_exploration::CallData;
using fused_exploration::complete_call;
using fused_exploration::first_difference;
using fused_exploration::kEps;
using fused_exploration::kHidden;
using testing_world::AlignedBuffer;

enum class Kind { kFusedPush, kPushOneShot, kPushTwoShot };

// One call: push_one_stage over `size` rows of kHidden, or a push all-reduce of `size` elements.
struct Call {
  Kind kind;
  int size;
  int blocks;
};

struct Workload {
  int ranks;
  std::vector<Call> calls;
};

size_t elements(const Call& c) { return c.kind == Kind::kFusedPush ? static_cast<size_t>(c.size) * kHidden : c.size; }

// Sizes and grids change from call to call, so that with CountSizedHalves some call's slots cover
// slots that a slow peer still reads from the previous call (a push_one_stage after a larger
// push_one_shot or push_two_shot, and the other way round), and blocks of one call meet blocks of
// the next with other rows.
const Workload kWorkloads[] = {
    {2,
     {{Kind::kFusedPush, 3, 1},
      {Kind::kPushOneShot, 24, 2},
      {Kind::kFusedPush, 5, 3},
      {Kind::kPushOneShot, 16, 1},
      {Kind::kFusedPush, 1, 2},
      {Kind::kFusedPush, 4, 1}}},
    {3,
     {{Kind::kPushOneShot, 64, 2},
      {Kind::kFusedPush, 1, 1},
      {Kind::kFusedPush, 4, 2},
      {Kind::kPushOneShot, 24, 1},
      {Kind::kFusedPush, 5, 3}}},
    {4,
     {{Kind::kFusedPush, 4, 2},
      {Kind::kPushOneShot, 16, 1},
      {Kind::kFusedPush, 3, 3},
      {Kind::kFusedPush, 1, 1},
      {Kind::kPushOneShot, 48, 2}}},
    {3,
     {{Kind::kFusedPush, 3, 2},
      {Kind::kPushTwoShot, 48, 1},
      {Kind::kPushOneShot, 24, 2},
      {Kind::kFusedPush, 5, 1},
      {Kind::kPushTwoShot, 64, 2},
      {Kind::kFusedPush, 2, 3}}},
};

std::string describe(const Workload& w) {
  std::string s = std::to_string(w.ranks) + " ranks:";
  for (const Call& c : w.calls) {
    s += c.kind == Kind::kFusedPush     ? " push_one_stage(" + std::to_string(c.size) + " rows"
         : c.kind == Kind::kPushOneShot ? " push_one_shot(" + std::to_string(c.size)
                                        : " push_two_shot(" + std::to_string(c.size);
    s += ", " + std::to_string(c.blocks) + (c.blocks == 1 ? " block)" : " blocks)");
  }
  return s;
}

CallData make_data(const Call& c, int ranks, uint64_t seed) {
  fused::SplitMix64 rng(seed);
  const size_t count = elements(c);
  CallData d;
  d.x.resize(count * ranks);
  for (auto& v : d.x) v = round_to<bf16>(rng.normal() * 2.0f);
  complete_call(c.kind == Kind::kFusedPush, ranks, count, rng, &d);
  return d;
}

// Runs the workload's calls back to back on one world under the seeded schedule `seed`.
template <class Halves>
Outcome explore(const Workload& w, uint64_t seed, std::string* detail) {
  sim::WorldOptions options;
  options.ranks = w.ranks;
  options.schedule = sim::Schedule::kSeeded;
  options.schedule_seed = seed;
  sim::World world(options);
  std::vector<CallData> data;
  for (size_t k = 0; k < w.calls.size(); ++k) data.push_back(make_data(w.calls[k], w.ranks, 1000 * seed + k));
  for (size_t k = 0; k < w.calls.size(); ++k) {
    const Call& c = w.calls[k];
    CallData& d = data[k];
    const size_t count = elements(c);
    sim::Launch launch;
    launch.blocks = c.blocks;
    launch.input_bytes = count * sizeof(bf16);
    launch.scratch_bytes = push_scratch_elements(count, Storage<bf16>::kPack, w.ranks) * sizeof(bf16);
    for (int r = 0; r < w.ranks; ++r) launch.inputs.push_back(d.x.data() + r * count);
    if (c.kind == Kind::kFusedPush) {
      launch.name = "fused_rmsnorm_push_one_stage";
      const std::vector<FusedRmsNormArgs<bf16>> args = d.args;
      world.enqueue<bf16>(launch, [args](auto& ctx) {
        fused::with_fused_ctx(ctx, [&](auto& fctx) {
          fused_rmsnorm_push_one_stage<bf16, 0, TwoSetProtocol, Halves>(fctx, args[fctx.rank()]);
        });
      });
    } else {
      launch.output_bytes = count * sizeof(bf16);
      for (int r = 0; r < w.ranks; ++r) launch.outputs.push_back(d.ar_out[r].data());
      if (c.kind == Kind::kPushOneShot) {
        launch.name = "allreduce_push_one_shot";
        world.enqueue<bf16>(
            launch, [count](auto& ctx) { allreduce_push_one_shot<bf16, 0, TwoSetProtocol, Halves>(ctx, count); });
      } else {
        launch.name = "allreduce_push_two_shot";
        world.enqueue<bf16>(
            launch, [count](auto& ctx) { allreduce_push_two_shot<bf16, 0, TwoSetProtocol, Halves>(ctx, count); });
      }
    }
  }
  if (exploration::ran_into_deadlock(world, detail)) return Outcome::kDeadlock;
  for (size_t k = 0; k < w.calls.size(); ++k) {
    const CallData& d = data[k];
    for (int r = 0; r < w.ranks; ++r) {
      std::string diff;
      if (w.calls[k].kind == Kind::kFusedPush) {
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

// Expects the broken Halves to be caught within kSeedBound seeds on every workload, and prints
// how often and where first (exploration::first_failing_seed).
template <class Halves>
void expect_caught(const char* variant) {
  for (const Workload& w : kWorkloads) {
    Outcome outcome = Outcome::kCorrect;
    std::string detail;
    int caught = 0;
    const uint64_t seed = exploration::first_failing_seed(
        [&](uint64_t s, std::string* d) { return explore<Halves>(w, s, d); }, &outcome, &detail, &caught);
    EXPECT_NE(seed, 0u) << variant << " survived " << kSeedBound << " seeds on " << describe(w);
    std::printf("%s, %s: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n", variant, describe(w).c_str(),
                caught, static_cast<unsigned long long>(kSeedBound), static_cast<unsigned long long>(seed),
                name(outcome), detail.c_str());
  }
}

TEST(FusedPushExploration, OneReceiveHalfIsCaughtWithinTheSeedBound) { expect_caught<OneHalf>("one receive half"); }

TEST(FusedPushExploration, HalvesSizedByTheCallAreCaughtWithinTheSeedBound) {
  expect_caught<CountSizedHalves>("count-sized halves");
}

// The production halves on the same workloads: thousands of seeds, every output of every call
// equal to the contract.
TEST(FusedPushExploration, AlternatingHalvesPassThousandsOfSeeds) {
  int runs = 0;
  for (const Workload& w : kWorkloads) {
    for (uint64_t seed = 1; seed <= 1250; ++seed) {
      std::string detail;
      const Outcome o = explore<AlternatingHalves>(w, seed, &detail);
      ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " on " << describe(w) << ", seed " << seed << ": " << detail;
      ++runs;
    }
  }
  EXPECT_EQ(runs, 5000);
}

}  // namespace
}  // namespace exactcoll
