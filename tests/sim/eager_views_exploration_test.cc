// Seeded exploration of the eager-in-place protocol (docs/design.md section 9, "eager in place";
// core/signal.h SignalBuffer::input_rows; sim::Launch::publish_views): in a publishing launch block
// b of every rank stores, before its first barrier, where its input lies for each peer (null: it
// staged) into that peer's input_rows[b][rank], and reads its own row once past that barrier.
// Here some ranks publish their input in place (a "user" buffer of their own, a different one per
// launch, their input buffer poisoned) and the others publish null (staged), over consecutive
// launches of one world with different grids and a non-publishing launch in between; every output
// bit is compared with the contract. Broken variants of the protocol (sim::ViewsFault: the
// publish after the first barrier, the row read before it, a rank that skips its publish and
// leaves an older launch's row; and a launch without its end barrier, whose next launch rewrites
// a row a slow peer has not read yet) are caught within the seed bound.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/signal.h"
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

// Broken: no end barrier. A fast rank's next publishing launch rewrites its entry of a peer's row
// before that peer's block, past its first barrier, has read it.
struct NoEndBarrierProtocol {
  static int flag_set(uint32_t value) { return static_cast<int>(value & 1u); }
  static constexpr bool kEndBarrier = false;
};

enum class Kind { kOneShot, kTwoShot, kReduceScatter, kAllGather };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kOneShot: return "one_shot";
    case Kind::kTwoShot: return "two_shot";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kAllGather: return "allgather";
  }
  return "?";
}

// Launches 0, 1, 3 and 4 publish their views; launch 2 does not (every rank staged, input() the
// input buffers) unless the workload says every launch publishes. Odd-numbered launches run on odd_blocks blocks, the
// others on blocks.
constexpr int kLaunches = 5;
constexpr int kPlainLaunch = 2;
// The launch a rank skips its publish in (ViewsFault::kSkipPublish): the first after the plain
// one, so its peers' rows still hold launch 1's entries.
constexpr int kSkipLaunch = 3;

struct Workload {
  Kind kind;
  int ranks;
  size_t count;  // elements per rank (a multiple of ranks: reduce_scatter)
  int blocks;
  int odd_blocks;
  bool in_place = false;      // two_shot: output == input (the user buffer, or the staged one's source)
  bool all_in_place = false;  // every rank publishes its input in place (else a mix)
  bool plain_launch = true;   // launch kPlainLaunch publishes nothing (else every launch publishes)
};

bool publishes(const Workload& w, int k) { return k != kPlainLaunch || !w.plain_launch; }
int grid(const Workload& w, int k) { return k % 2 == 1 ? w.odd_blocks : w.blocks; }

// Which ranks publish their input in place in launch k under `seed` (bit r): random, but always
// some in place and, with 2 ranks or more, some staged (unless all_in_place).
uint32_t in_place_mask(const Workload& w, uint64_t seed, int k) {
  const uint32_t all = (1u << w.ranks) - 1;
  if (!publishes(w, k)) return 0;
  if (w.all_in_place) return all;
  sim::Xoshiro256 g(seed * 131 + static_cast<uint64_t>(k));
  uint32_t mask = static_cast<uint32_t>(g.next()) & all;
  if (mask == 0) mask = 1u << (k % w.ranks);
  if (mask == all && w.ranks > 1) mask &= ~(1u << ((k + 1) % w.ranks));
  return mask;
}

sim::Op op_of(Kind k) {
  return k == Kind::kReduceScatter ? sim::Op::kReduceScatter
         : k == Kind::kAllGather   ? sim::Op::kAllGather
                                   : sim::Op::kAllReduce;
}

// A 16-byte aligned byte buffer (views and outputs are read and written by 16-byte packs).
struct AlignedBytes {
  struct alignas(16) Chunk {
    uint8_t b[16];
  };
  explicit AlignedBytes(size_t bytes) : chunks((bytes + 15) / 16), size(bytes) {}
  uint8_t* data() { return reinterpret_cast<uint8_t*>(chunks.data()); }
  std::vector<uint8_t> bytes() { return std::vector<uint8_t>(data(), data() + size); }
  std::vector<Chunk> chunks;
  size_t size;
};

// "0 2" for mask 0b101 ("none" for 0).
std::string in_place_ranks(uint32_t mask, int n) {
  std::string out;
  for (int r = 0; r < n; ++r) {
    if ((mask >> r & 1u) != 0) out += (out.empty() ? "" : " ") + std::to_string(r);
  }
  return out.empty() ? "none" : out;
}

// What an explore run breaks: a views fault done by every rank in every publishing launch, or by
// one rank in one launch (kSkipPublish: the lowest in-place rank of kSkipLaunch).
struct Mutation {
  sim::ViewsFault fault = sim::ViewsFault::kNone;
};

// Runs kLaunches collectives of w (bf16) under schedule `seed` on one fresh world, with Protocol
// and the views fault m; compares every output bit with the contract.
template <class Protocol = TwoSetProtocol>
Outcome explore(const Workload& w, uint64_t seed, std::string* detail, Mutation m = {},
                sim::Schedule schedule = sim::Schedule::kSeeded) {
  const int n = w.ranks;
  const size_t count = w.count;
  const size_t in_bytes = count * 2;
  sim::WorldOptions options;
  options.ranks = n;
  options.schedule = schedule;
  options.schedule_seed = seed;
  sim::World world(options);
  sim::CollectiveSpec spec;
  spec.op = op_of(w.kind);
  spec.dtype = DType::kBF16;
  spec.count = count;
  const size_t out_bytes = sim::output_count(spec.op, count, n) * 2;
  const bool in_place_output = w.kind == Kind::kTwoShot && w.in_place;

  std::vector<std::vector<std::vector<uint8_t>>> ins;  // [launch][rank]: the inputs
  std::vector<std::vector<AlignedBytes>> user, outs;   // [launch][rank]: user buffers, outputs
  std::vector<uint32_t> masks;                         // [launch]: in-place ranks
  for (int k = 0; k < kLaunches; ++k) {
    ins.push_back(simtest::random_inputs(spec.dtype, n, count, 1000 * seed + static_cast<uint64_t>(k)));
    masks.push_back(in_place_mask(w, seed, k));
    user.emplace_back();
    outs.emplace_back();
    for (int r = 0; r < n; ++r) {
      user[k].emplace_back(in_bytes);
      std::memcpy(user[k][r].data(), ins[k][r].data(), in_bytes);
      outs[k].emplace_back(out_bytes);
    }
  }
  for (int k = 0; k < kLaunches; ++k) {
    sim::Launch launch;
    launch.name = std::string(kind_name(w.kind)) + (publishes(w, k) ? " (publishing)" : "");
    launch.blocks = grid(w, k);
    launch.input_bytes = in_bytes;
    launch.scratch_bytes = w.kind == Kind::kTwoShot ? in_bytes : 0;
    launch.output_bytes = out_bytes;
    launch.publish_views = publishes(w, k);
    const uint32_t mask = masks[k];
    for (int r = 0; r < n; ++r) {
      const bool own = (mask >> r & 1u) != 0;
      // In place: nothing staged, peers read the user buffer; staged: copied into the input buffer.
      launch.inputs.push_back(own ? nullptr : user[k][r].data());
      launch.outputs.push_back(in_place_output ? user[k][r].data() : outs[k][r].data());
      if (publishes(w, k)) {
        std::array<const void*, kMaxRanks> views{};
        if (own) views.fill(user[k][r].data());
        launch.input_views.push_back(views);
      }
    }
    // An in-place rank's input buffer holds garbage: a peer that reads it instead of the view
    // folds the wrong bits. (Written in stream order, as staging is: no peer reads it any more.)
    launch.before = [&world, mask, in_bytes](int r) {
      if ((mask >> r & 1u) != 0) std::memset(world.local_input(r), 0x5A, in_bytes);
    };
    if (publishes(w, k) && m.fault != sim::ViewsFault::kNone) {
      if (m.fault == sim::ViewsFault::kSkipPublish) {
        if (k == kSkipLaunch) {
          launch.views_fault = m.fault;
          launch.views_fault_rank = __builtin_ctz(mask);
        }
      } else {
        launch.views_fault = m.fault;
      }
    }
    switch (w.kind) {
      case Kind::kOneShot:
        world.enqueue<bf16>(launch, [count](auto& ctx) { allreduce_one_shot<bf16, 0, Protocol>(ctx, count); });
        break;
      case Kind::kTwoShot:
        world.enqueue<bf16>(launch, [count](auto& ctx) { allreduce_two_shot<bf16, 0, Protocol>(ctx, count); });
        break;
      case Kind::kReduceScatter:
        world.enqueue<bf16>(launch, [count](auto& ctx) { reduce_scatter<bf16, 0, Protocol>(ctx, count); });
        break;
      case Kind::kAllGather:
        world.enqueue<bf16>(launch, [count](auto& ctx) { allgather<bf16, 0, Protocol>(ctx, count); });
        break;
    }
  }
  if (exploration::ran_into_deadlock(world, detail)) return Outcome::kDeadlock;
  for (int k = 0; k < kLaunches; ++k) {
    std::vector<std::vector<uint8_t>> got;
    for (int r = 0; r < n; ++r) got.push_back(in_place_output ? user[k][r].bytes() : outs[k][r].bytes());
    const std::string diff = simtest::first_difference(got, simtest::expected_outputs(spec, ins[k]), 2);
    if (!diff.empty()) {
      *detail = "launch " + std::to_string(k) + " (ranks in place: " + in_place_ranks(masks[k], n) + "): " + diff;
      return Outcome::kWrongBits;
    }
  }
  return Outcome::kCorrect;
}

std::string describe(const Workload& w) {
  return std::string(kind_name(w.kind)) + (w.in_place ? " in place" : "") + ", " + std::to_string(w.ranks) +
         " ranks, " + std::to_string(w.count) + " elements, grids " + std::to_string(w.blocks) + "/" +
         std::to_string(w.odd_blocks);
}

// Runs `seeds` seeds of each workload with the production protocol: all must be correct.
int run_correct(std::initializer_list<Workload> workloads, uint64_t seeds) {
  int runs = 0;
  for (const Workload& w : workloads) {
    for (uint64_t seed = 1; seed <= seeds; ++seed) {
      std::string detail;
      const Outcome o = explore(w, seed, &detail);
      EXPECT_EQ(o, Outcome::kCorrect) << name(o) << ", " << describe(w) << ", seed " << seed << ": " << detail;
      if (o != Outcome::kCorrect) return runs;
      ++runs;
    }
  }
  return runs;
}

// ---- the production protocol: thousands of seeds, every bit right --------------------------------

TEST(EagerViewsExploration, OneShotMixedInPlaceAndStagedPassesThousandsOfSeeds) {
  EXPECT_EQ(run_correct({Workload{Kind::kOneShot, 2, 32, 1, 2}, Workload{Kind::kOneShot, 3, 48, 2, 1},
                         Workload{Kind::kOneShot, 4, 64, 3, 2}},
                        700),
            2100);
}

TEST(EagerViewsExploration, TwoShotMixedInPlaceAndStagedPassesThousandsOfSeeds) {
  EXPECT_EQ(run_correct({Workload{Kind::kTwoShot, 2, 32, 1, 2}, Workload{Kind::kTwoShot, 3, 48, 2, 1},
                         Workload{Kind::kTwoShot, 4, 64, 1, 3}},
                        700),
            2100);
}

// Output == input: an in-place rank's result lands in the user buffer its peers read through its
// view, a staged rank's in the buffer it staged from.
TEST(EagerViewsExploration, TwoShotInPlaceMixedPassesThousandsOfSeeds) {
  EXPECT_EQ(run_correct({Workload{Kind::kTwoShot, 2, 32, 2, 1, true}, Workload{Kind::kTwoShot, 3, 48, 1, 2, true},
                         Workload{Kind::kTwoShot, 4, 64, 2, 3, true}},
                        700),
            2100);
}

TEST(EagerViewsExploration, ReduceScatterMixedInPlaceAndStagedPassesThousandsOfSeeds) {
  EXPECT_EQ(run_correct({Workload{Kind::kReduceScatter, 2, 32, 1, 2}, Workload{Kind::kReduceScatter, 3, 48, 2, 1},
                         Workload{Kind::kReduceScatter, 4, 64, 2, 3}},
                        700),
            2100);
}

TEST(EagerViewsExploration, AllGatherMixedInPlaceAndStagedPassesThousandsOfSeeds) {
  EXPECT_EQ(run_correct({Workload{Kind::kAllGather, 2, 32, 1, 2}, Workload{Kind::kAllGather, 3, 48, 2, 1},
                         Workload{Kind::kAllGather, 4, 64, 3, 1}},
                        700),
            2100);
}

// Every rank in place: the rows alone say where every input is.
TEST(EagerViewsExploration, EveryRankInPlacePassesThousandsOfSeeds) {
  Workload one{Kind::kOneShot, 3, 48, 2, 1};
  Workload two{Kind::kTwoShot, 4, 64, 1, 2, true};
  one.all_in_place = two.all_in_place = true;
  EXPECT_EQ(run_correct({one, two}, 500), 1000);
}

// The threads scheduler runs the same rows (relaxed atomics ordered by the flags' release and
// acquire): a few runs of every op, all correct.
TEST(EagerViewsExploration, ThreadsSchedulerGivesTheContractsBits) {
  for (const Workload& w : {Workload{Kind::kOneShot, 4, 64, 2, 3}, Workload{Kind::kTwoShot, 3, 48, 2, 1, true},
                            Workload{Kind::kReduceScatter, 4, 64, 3, 1}, Workload{Kind::kAllGather, 3, 48, 1, 2}}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      std::string detail;
      const Outcome o = explore(w, seed, &detail, {}, sim::Schedule::kThreads);
      EXPECT_EQ(o, Outcome::kCorrect) << name(o) << ", " << describe(w) << ", seed " << seed << ": " << detail;
    }
  }
}

// What a publishing launch leaves in the signal buffers: peer p's input_rows[b][r] is rank r's view
// for p (null when r staged) for every block b of the launch; a non-publishing launch leaves the
// rows as they are.
TEST(EagerViewsExploration, RowsHoldThePublishedViews) {
  const int n = 3;
  const size_t count = 48;
  sim::WorldOptions options;
  options.ranks = n;
  options.schedule = sim::Schedule::kSeeded;
  options.schedule_seed = 3;
  sim::World world(options);
  std::vector<std::vector<uint8_t>> ins = simtest::random_inputs(DType::kBF16, n, count, 5);
  std::vector<AlignedBytes> user, out;
  for (int r = 0; r < n; ++r) {
    user.emplace_back(count * 2);
    std::memcpy(user[r].data(), ins[r].data(), count * 2);
    out.emplace_back(count * 2);
  }
  auto launch_of = [&](bool publish) {
    sim::Launch l;
    l.name = "one_shot";
    l.blocks = 2;
    l.input_bytes = count * 2;
    l.output_bytes = count * 2;
    l.publish_views = publish;
    for (int r = 0; r < n; ++r) {
      const bool own = publish && r != 1;  // rank 1 stages
      l.inputs.push_back(own ? nullptr : user[r].data());
      l.outputs.push_back(out[r].data());
      if (publish) {
        std::array<const void*, kMaxRanks> views{};
        if (own) views.fill(user[r].data());
        l.input_views.push_back(views);
      }
    }
    return l;
  };
  world.enqueue<bf16>(launch_of(true), [count](auto& ctx) { allreduce_one_shot<bf16>(ctx, count); });
  world.enqueue<bf16>(launch_of(false), [count](auto& ctx) { allreduce_one_shot<bf16>(ctx, count); });
  world.run();
  for (int p = 0; p < n; ++p) {
    for (int b = 0; b < 2; ++b) {
      for (int r = 0; r < n; ++r) {
        const void* want = r == p || r == 1 ? nullptr : user[r].data();
        EXPECT_EQ(world.local_signals(p)->input_rows[b][r], want) << "rank " << p << " block " << b << " entry " << r;
      }
    }
    EXPECT_EQ(world.local_signals(p)->input_rows[2][0], nullptr);
  }
  sim::CollectiveSpec spec;
  spec.count = count;
  std::vector<std::vector<uint8_t>> got;
  for (int r = 0; r < n; ++r) got.push_back(out[r].bytes());
  EXPECT_EQ(simtest::first_difference(got, simtest::expected_outputs(spec, ins), 2), "");
}

// A launch description the protocol cannot run is refused before anything runs.
TEST(EagerViewsExploration, MalformedViewsAreRefused) {
  sim::WorldOptions options;
  options.ranks = 2;
  sim::World world(options);
  sim::Launch l;
  l.name = "one_shot";
  l.publish_views = true;  // but no views
  world.enqueue<bf16>(l, [](auto& ctx) { allreduce_one_shot<bf16>(ctx, 0); });
  EXPECT_THROW(world.run(), std::invalid_argument);
  sim::Launch m;
  m.name = "one_shot";
  m.views_fault = sim::ViewsFault::kSkipPublish;  // not a publishing launch
  world.enqueue<bf16>(m, [](auto& ctx) { allreduce_one_shot<bf16>(ctx, 0); });
  EXPECT_THROW(world.run(), std::invalid_argument);
}

// ---- broken variants: caught within the seed bound ------------------------------------------------

const Workload kMutationWorkloads[] = {
    Workload{Kind::kOneShot, 2, 32, 1, 2},       Workload{Kind::kOneShot, 3, 48, 2, 1},
    Workload{Kind::kTwoShot, 3, 48, 2, 1, true}, Workload{Kind::kReduceScatter, 4, 64, 2, 3},
    Workload{Kind::kAllGather, 3, 48, 1, 2},
};

const char* fault_name(sim::ViewsFault f) {
  switch (f) {
    case sim::ViewsFault::kNone: return "none";
    case sim::ViewsFault::kPublishAfterFirstBarrier: return "publish after the first barrier";
    case sim::ViewsFault::kReadRowsBeforeFirstBarrier: return "rows read before the first barrier";
    case sim::ViewsFault::kSkipPublish: return "one rank skips its publish";
  }
  return "?";
}

// Every workload: the fault is caught (wrong bits or a deadlock) on some seed in 1..kSeedBound.
template <class Protocol = TwoSetProtocol>
void expect_caught(const Workload& w, Mutation m, const char* what) {
  Outcome outcome = Outcome::kCorrect;
  std::string detail;
  int caught = 0;
  const uint64_t seed = exploration::first_failing_seed(
      [&](uint64_t s, std::string* d) { return explore<Protocol>(w, s, d, m); }, &outcome, &detail, &caught);
  EXPECT_NE(seed, 0u) << what << " survived " << kSeedBound << " seeds, " << describe(w);
  std::printf("%s, %s: caught in %d of %llu seeds, first at seed %llu (%s)\n%s\n", what, describe(w).c_str(), caught,
              static_cast<unsigned long long>(kSeedBound), static_cast<unsigned long long>(seed), name(outcome),
              detail.c_str());
}

// (a) The publish moved after the first barrier: a peer past the same barrier may read its row
// before this rank stored it (the previous launch's entry, or null: the poisoned input buffer).
TEST(EagerViewsExploration, PublishAfterTheFirstBarrierIsCaughtWithinTheSeedBound) {
  for (const Workload& w : kMutationWorkloads) {
    expect_caught(w, {sim::ViewsFault::kPublishAfterFirstBarrier},
                  fault_name(sim::ViewsFault::kPublishAfterFirstBarrier));
  }
}

// (b) The row read right after publishing, before the first barrier: peers may not have stored
// their entries yet.
TEST(EagerViewsExploration, RowsReadBeforeTheFirstBarrierAreCaughtWithinTheSeedBound) {
  for (const Workload& w : kMutationWorkloads) {
    expect_caught(w, {sim::ViewsFault::kReadRowsBeforeFirstBarrier},
                  fault_name(sim::ViewsFault::kReadRowsBeforeFirstBarrier));
  }
}

// (c) One rank (in place in launch 3) skips its publish: its peers read the entry launch 1 left
// (launch 2 published nothing), an older user buffer or null (its poisoned input buffer). Caught
// whatever the schedule.
TEST(EagerViewsExploration, AStaleRowFromAnEarlierLaunchIsCaughtWithinTheSeedBound) {
  for (const Workload& w : kMutationWorkloads) {
    expect_caught(w, {sim::ViewsFault::kSkipPublish}, fault_name(sim::ViewsFault::kSkipPublish));
  }
}

// A next launch that rewrites a row a peer still needs: without the end barrier a fast rank's
// next publishing launch stores its new entry before a slow peer, past its first barrier, has read
// the old one. Every rank in place and every launch's inputs in buffers of their own, so nothing
// but the rows is shared between launches: the end barrier is what protects them.
TEST(EagerViewsExploration, ARowRewrittenBeforeItsPeerReadItIsCaughtWithoutTheEndBarrier) {
  Workload w{Kind::kOneShot, 3, 48, 2, 2};
  w.all_in_place = true;
  w.plain_launch = false;
  // The production protocol on the same workload: correct (the check below is not vacuous).
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    std::string detail;
    const Outcome o = explore(w, seed, &detail);
    ASSERT_EQ(o, Outcome::kCorrect) << name(o) << " at seed " << seed << ": " << detail;
  }
  expect_caught<NoEndBarrierProtocol>(w, {}, "no end barrier, every rank in place");
}

}  // namespace
}  // namespace exactcoll
