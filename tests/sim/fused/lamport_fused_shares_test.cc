// lamport_one_stage's split of the work over the grid (core/fused_rmsnorm.h): every block pushes its
// block_share of the whole message, and block b folds the rows that end in its share
// (lamport_block_rows). A wrong split shows as a row folded by no block (its outputs keep the
// unwritten pattern), a pack nobody pushes (its poll never ends: a deadlock), or a block that polls
// a later block's push (a deadlock under the threads scheduler, which runs a rank's blocks in
// order, as the barrier algorithms require). The calls run back to back on one world, with row
// counts 1, 2, 3 and 7, grids from fewer blocks than rows to more blocks than packs, H a multiple
// of no block count, so that the three buffers rotate and every clear erases an extent of another
// size and grid; every output of every call is compared bit for bit with the contract's reference.
// lamport_two_stage shares the split (its push share goes to each row's owner, its rows are the
// same blocks'), so it runs these workloads too, alone and in turn with lamport_one_stage.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/contract.h"
#include "tests/sim/fused/exploration_calls.h"
#include "core/fused_rmsnorm.h"
#include "core/fused_rmsnorm_kernels.h"
#include "core/lamport.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tests/core/thread_world.h"

namespace exactcoll {
namespace {

using testing_world::AlignedBuffer;

constexpr float kEps = 1e-6f;
constexpr uint16_t kUnwritten = 0x7FC1;  // a NaN no algorithm writes (NaN results are 0x7FFF)

// ---- The split itself ----------------------------------------------------------------------------------

// For every rows, H (in packs) and grid: the rows of lamport_block_rows partition [0, rows) in
// block order; every element of block b's rows lies before the end of block b's push share (so only
// blocks 0..b push what b polls); the pushes cover [0, rows * H) exactly once; with one block per
// row the rows are fused_block_rows'.
TEST(LamportFusedShares, RowsPartitionAndFollowThePush) {
  constexpr int P = Storage<bf16>::kPack;
  for (int rows = 0; rows <= 9; ++rows) {
    for (int packs_per_row = 1; packs_per_row <= 6; ++packs_per_row) {
      const size_t H = static_cast<size_t>(packs_per_row) * P;
      const size_t count = static_cast<size_t>(rows) * H;
      for (int blocks = 1; blocks <= 20; ++blocks) {
        const std::string what =
            "rows " + std::to_string(rows) + " H " + std::to_string(H) + " blocks " + std::to_string(blocks);
        int next_row = 0;
        size_t next_element = 0;
        for (int b = 0; b < blocks; ++b) {
          const BlockShare push = block_share(0, count, P, b, blocks);
          ASSERT_EQ(push.pack_begin, next_element) << what << " block " << b;
          ASSERT_GE(push.pack_end, push.pack_begin) << what;
          next_element = push.pack_end;
          const RowRange mine = lamport_block_rows(push, H);
          ASSERT_EQ(mine.begin, next_row) << what << " block " << b;
          ASSERT_GE(mine.end, mine.begin) << what << " block " << b;
          if (mine.end > mine.begin) {
            EXPECT_LE(static_cast<size_t>(mine.end) * H, push.pack_end) << what << " block " << b;
          }
          if (blocks == rows) {
            const RowRange chunk = fused_block_rows(RowRange{0, rows}, b, blocks);
            EXPECT_EQ(mine.begin, chunk.begin) << what << " block " << b;
            EXPECT_EQ(mine.end, chunk.end) << what << " block " << b;
          }
          next_row = mine.end;
        }
        EXPECT_EQ(next_row, rows) << what;
        EXPECT_EQ(next_element, count) << what;
      }
    }
  }
}

// ---- Back-to-back calls on the simulator ------------------------------------------------------------------

struct Call {
  int rows;
  int blocks;
};

struct Workload {
  int ranks;
  int hidden;  // bf16 elements a row (a multiple of the pack, 8)
  std::vector<Call> calls;
};

// Seven calls each (every buffer of the rotation used at least twice, every clear after a call of
// another size and grid). H 40 is 5 packs, H 56 is 7: no grid below divides a row evenly, the
// shares cut rows in the middle, and the grids of 8 and 16 blocks at 1 row have blocks with no pack.
const Workload kWorkloads[] = {
    {2, 40, {{1, 3}, {7, 4}, {2, 5}, {3, 2}, {1, 8}, {7, 3}, {2, 16}}},
    {2, 56, {{3, 4}, {1, 16}, {7, 6}, {2, 3}, {1, 1}, {3, 9}, {7, 7}}},
    {4, 40, {{1, 4}, {2, 3}, {7, 5}, {3, 8}, {1, 16}, {2, 2}, {7, 3}}},
    {4, 56, {{7, 4}, {3, 6}, {1, 3}, {2, 9}, {7, 16}, {1, 7}, {3, 5}}},
};

std::string describe(const Workload& w) {
  std::string s = std::to_string(w.ranks) + " ranks, H " + std::to_string(w.hidden) + ":";
  for (const Call& c : w.calls) s += " (" + std::to_string(c.rows) + " rows, " + std::to_string(c.blocks) + " blocks)";
  return s;
}

// One call's buffers on every rank and the contract's outputs.
struct CallData {
  std::vector<bf16> x;  // [ranks, rows * H]
  std::vector<AlignedBuffer<bf16>> own_x, residual, weight, residual_out, out;
  AlignedBuffer<bf16> unreadable;  // what a peer's x reads as: the unwritten pattern
  std::vector<bf16> want_ro, want_out;
  std::vector<FusedRmsNormArgs<bf16>> args;
};

// Random x with the sentinel's pattern (0xFFFF, a NaN the push must canonicalize) in one element of
// one rank and -0.0 in another; outputs filled with the unwritten pattern.
void make_call(const Call& c, int ranks, int hidden, uint64_t seed, CallData* out) {
  CallData& d = *out;
  fused::SplitMix64 rng(seed);
  const size_t count = static_cast<size_t>(c.rows) * hidden;
  d.x.resize(count * ranks);
  for (auto& v : d.x) v = round_to<bf16>(rng.normal() * 2.0f);
  d.x[(rng.next() % ranks) * count + rng.next() % count] = bf16{0xFFFF};
  d.x[(rng.next() % ranks) * count + rng.next() % count] = bf16{0x8000};
  std::vector<bf16> residual(count), weight(hidden);
  for (auto& v : residual) v = round_to<bf16>(rng.normal());
  for (auto& v : weight) v = round_to<bf16>(1.0f + 0.1f * rng.normal());
  d.unreadable.resize(count);
  std::fill(d.unreadable.data(), d.unreadable.data() + count, bf16{kUnwritten});
  for (int r = 0; r < ranks; ++r) {
    d.own_x.emplace_back(count);
    d.residual.emplace_back(count);
    d.weight.emplace_back(hidden);
    d.residual_out.emplace_back(count);
    d.out.emplace_back(count);
    std::memcpy(d.own_x[r].data(), d.x.data() + r * count, count * sizeof(bf16));
    std::memcpy(d.residual[r].data(), residual.data(), count * sizeof(bf16));
    std::memcpy(d.weight[r].data(), weight.data(), hidden * sizeof(bf16));
    std::fill(d.residual_out[r].data(), d.residual_out[r].data() + count, bf16{kUnwritten});
    std::fill(d.out[r].data(), d.out[r].data() + count, bf16{kUnwritten});
  }
  for (int r = 0; r < ranks; ++r) {
    FusedRmsNormArgs<bf16> a;
    a.residual = d.residual[r].data();
    a.weight = d.weight[r].data();
    a.residual_out = d.residual_out[r].data();
    a.out = d.out[r].data();
    a.rows = c.rows;
    a.hidden = hidden;
    a.eps = kEps;
    d.args.push_back(a);
  }
  fused::FusedProblem<bf16> p;
  p.ranks = ranks, p.rows = c.rows, p.hidden = hidden, p.eps = kEps;
  p.x = d.x.data(), p.residual = residual.data(), p.weight = weight.data();
  d.want_ro.resize(count);
  d.want_out.resize(count);
  fused::fused_reference<bf16>(fused::Contract::kCanonical, p, d.want_ro.data(), d.want_out.data());
}

// Runs the workload's calls back to back on one world; returns "" or the first failure. Each
// rank reads its own x in place (the GPU kernel's base.inputs[rank]); a peer's x reads as the
// unwritten pattern, so a fold that read a peer's x instead of its Lamport slot shows.
// threads_of(k): call k's threads a block; 0 runs core's fused_rmsnorm_lamport with one thread (the
// default), else the GPU's fused_rmsnorm_lamport_reg with that many (its register path where they
// are the tree's lanes, core's path otherwise). kind_of(k): call k's protocol (default
// lamport_one_stage).
std::string run_workload(const Workload& w, sim::Schedule schedule, uint64_t seed, int (*threads_of)(size_t) = nullptr,
                         LamportFused (*kind_of)(size_t) = nullptr) {
  sim::WorldOptions options;
  options.ranks = w.ranks;
  options.schedule = schedule;
  options.schedule_seed = seed;
  options.wait_timeout = std::chrono::milliseconds(5000);  // threads: a poll that can never end fails in 5 s
  sim::World world(options);
  std::vector<CallData> data(w.calls.size());
  size_t region = 0;
  for (size_t k = 0; k < w.calls.size(); ++k) {
    make_call(w.calls[k], w.ranks, w.hidden, 7919 * seed + 31 * k + w.ranks, &data[k]);
    region =
        std::max({region, lamport_region_bytes(static_cast<size_t>(w.calls[k].rows) * w.hidden, sizeof(bf16), w.ranks),
                  lamport_two_stage_region_bytes(w.calls[k].rows, w.hidden, sizeof(bf16), w.ranks)});
  }
  for (size_t k = 0; k < w.calls.size(); ++k) {
    CallData& d = data[k];
    sim::Launch launch;
    const LamportFused kind = kind_of != nullptr ? kind_of(k) : LamportFused::kOneStage;
    launch.name =
        kind == LamportFused::kTwoStage ? "fused_rmsnorm_lamport_two_stage" : "fused_rmsnorm_lamport_one_stage";
    launch.blocks = w.calls[k].blocks;
    launch.lamport_bytes = region;  // one layout for the whole run
    const std::vector<FusedRmsNormArgs<bf16>> args = d.args;
    std::vector<const bf16*> own;
    for (int r = 0; r < w.ranks; ++r) own.push_back(d.own_x[r].data());
    const bf16* unreadable = d.unreadable.data();
    const int threads = threads_of != nullptr ? threads_of(k) : 0;
    const std::optional<uint64_t> order =
        schedule == sim::Schedule::kSeeded ? std::optional<uint64_t>(seed) : std::nullopt;
    world.enqueue<bf16>(launch, [args, own, unreadable, threads, order, kind](auto& ctx) {
      fused::FusedBlockOptions block;
      block.own_x = own[ctx.rank()];
      block.unreadable_x = unreadable;
      auto run = [&](auto& fctx) {
        const FusedRmsNormArgs<bf16>& a = args[fctx.rank()];
        if (threads == 0 && kind == LamportFused::kTwoStage) {
          fused_rmsnorm_lamport<bf16, 0, LamportProtocol, LamportFused::kTwoStage>(fctx, a);
        } else if (threads == 0) {
          fused_rmsnorm_lamport<bf16>(fctx, a);
        } else if (kind == LamportFused::kTwoStage) {
          fused_rmsnorm_lamport_reg<bf16, 0, LamportProtocol, LamportFused::kTwoStage>(fctx, a);
        } else {
          fused_rmsnorm_lamport_reg<bf16>(fctx, a);
        }
      };
      if (threads != 0) {
        block.threads = threads;
        block.thread_order_seed = order;
      }
      fused::with_fused_ctx(ctx, block, run);
    });
  }
  try {
    world.run();
  } catch (const sim::SimError& e) {
    return std::string("the run failed: ") + e.what();
  }
  for (size_t k = 0; k < w.calls.size(); ++k) {
    const CallData& d = data[k];
    for (int r = 0; r < w.ranks; ++r) {
      std::string diff = fused_exploration::first_difference(d.residual_out[r].data(), d.want_ro, w.hidden, kUnwritten);
      if (!diff.empty()) diff = "residual_out " + diff;
      if (diff.empty()) {
        diff = fused_exploration::first_difference(d.out[r].data(), d.want_out, w.hidden, kUnwritten);
        if (!diff.empty()) diff = "out " + diff;
      }
      if (!diff.empty()) return "call " + std::to_string(k) + ", rank " + std::to_string(r) + ": " + diff;
    }
  }
  return "";
}

// The threads scheduler runs each rank's blocks one after the other: a block that polled what a
// later block of a peer pushes would wait for ever (reported after the world's timeout).
TEST(LamportFusedShares, BackToBackCallsUnderTheThreadsScheduler) {
  for (const Workload& w : kWorkloads) {
    EXPECT_EQ(run_workload(w, sim::Schedule::kThreads, 1), "") << describe(w);
  }
}

TEST(LamportFusedShares, BackToBackCallsUnderSeededSchedules) {
  for (const Workload& w : kWorkloads) {
    for (uint64_t seed = 1; seed <= 250; ++seed) {
      const std::string problem = run_workload(w, sim::Schedule::kSeeded, seed);
      ASSERT_EQ(problem, "") << describe(w) << ", seed " << seed;
    }
  }
}

// The GPU's kernels back to back with core's, sharing the buffers, the counter and the extents:
// H 320 (40 packs, 64 lanes), calls on one lane a thread (64 threads), core's path on 32 threads
// (half the lanes) and on 3, and core's one-thread kernel, in turn.
int threads_in_turn(size_t k) {
  constexpr int kThreads[] = {64, 32, 0, 3};
  return kThreads[k % 4];
}

const Workload kRegisterWorkloads[] = {
    {2, 320, {{1, 3}, {7, 4}, {2, 5}, {3, 2}, {1, 8}, {7, 3}, {2, 16}}},
    {3, 320, {{3, 4}, {1, 16}, {7, 6}, {2, 3}, {1, 1}, {3, 9}, {7, 7}}},
    {4, 320, {{1, 4}, {2, 3}, {7, 5}, {3, 8}, {1, 16}, {2, 2}, {7, 3}}},
};

TEST(LamportFusedShares, RegisterPathsBackToBackWithCoresPath) {
  for (const Workload& w : kRegisterWorkloads) {
    EXPECT_EQ(run_workload(w, sim::Schedule::kThreads, 1, threads_in_turn), "") << describe(w);
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      const std::string problem = run_workload(w, sim::Schedule::kSeeded, seed, threads_in_turn);
      ASSERT_EQ(problem, "") << describe(w) << ", seed " << seed;
    }
  }
}

// lamport_two_stage on the same workloads: alone (every call two-stage, core's one-thread path),
// and in turn with lamport_one_stage on the register path and core's (kinds alternate every call,
// threads every call: both kinds meet every thread count), all sharing the buffers, the counter and
// the extents.
LamportFused every_call_two_stage(size_t) { return LamportFused::kTwoStage; }
LamportFused kinds_in_turn(size_t k) { return k % 2 == 0 ? LamportFused::kTwoStage : LamportFused::kOneStage; }

TEST(LamportFusedShares, TwoStageBackToBackAloneAndInTurnWithOneStage) {
  for (const Workload& w : kWorkloads) {
    EXPECT_EQ(run_workload(w, sim::Schedule::kThreads, 1, nullptr, every_call_two_stage), "") << describe(w);
    for (uint64_t seed = 1; seed <= 60; ++seed) {
      const std::string problem = run_workload(w, sim::Schedule::kSeeded, seed, nullptr, every_call_two_stage);
      ASSERT_EQ(problem, "") << describe(w) << ", seed " << seed;
    }
  }
  for (const Workload& w : kRegisterWorkloads) {
    EXPECT_EQ(run_workload(w, sim::Schedule::kThreads, 1, threads_in_turn, kinds_in_turn), "") << describe(w);
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      const std::string problem = run_workload(w, sim::Schedule::kSeeded, seed, threads_in_turn, kinds_in_turn);
      ASSERT_EQ(problem, "") << describe(w) << ", seed " << seed;
    }
  }
}

}  // namespace
}  // namespace exactcoll
