// The schedulers and traces: deterministic traces per schedule seed, trace contents, deadlock,
// livelock, timeout and kernel-error reports, stream order per rank, and extra symmetric buffers.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "sim/collectives.h"
#include "sim/world.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll {
namespace {

using namespace std::chrono_literals;
using sim::Schedule;
using sim::SimError;
using sim::SimFailure;

struct Traced {
  std::string json, chrome;
  std::vector<std::vector<uint8_t>> out;
  uint64_t steps;
};

// Two consecutive collectives (one_shot, then two_shot) traced, under a seeded schedule.
Traced traced_run(uint64_t schedule_seed, std::vector<uint64_t> elements = {3, 17}) {
  sim::WorldOptions options;
  options.ranks = 3;
  options.schedule = Schedule::kSeeded;
  options.schedule_seed = schedule_seed;
  options.trace = true;
  options.trace_elements = std::move(elements);
  sim::World world(options);
  sim::CollectiveSpec spec;
  spec.dtype = DType::kBF16;
  spec.count = 21;
  spec.blocks = 2;
  const auto in = simtest::random_inputs(spec.dtype, 3, spec.count, 5);
  Traced t;
  spec.algorithm = sim::Algorithm::kOneShot;
  t.out = simtest::run_collective(world, spec, in);
  spec.algorithm = sim::Algorithm::kTwoShot;
  simtest::run_collective(world, spec, in);
  t.json = world.tracer()->json_lines();
  t.chrome = world.tracer()->chrome_trace(true);
  t.steps = world.last_steps();
  return t;
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(SimTrace, SameScheduleSeedGivesTheSameTraceBytes) {
  const Traced a = traced_run(42), b = traced_run(42), c = traced_run(43);
  EXPECT_EQ(a.json, b.json);
  EXPECT_EQ(a.chrome, b.chrome);
  EXPECT_NE(a.json, c.json) << "two seeds gave the same interleaving; the seed has no effect";
  EXPECT_EQ(a.out, c.out);  // the bits never depend on the schedule
}

TEST(SimTrace, EventsNameStepsAccessesFlagsAndElements) {
  const Traced t = traced_run(7);
  // One line per event, each a JSON object.
  size_t lines = 0;
  for (size_t at = 0; at < t.json.size();) {
    const size_t end = t.json.find('\n', at);
    ASSERT_NE(end, std::string::npos);
    EXPECT_EQ(t.json[at], '{');
    EXPECT_EQ(t.json[end - 1], '}');
    at = end + 1;
    ++lines;
  }
  // 3 ranks x 2 blocks; one_shot: 2 barriers, two_shot: 3; each barrier = 3 signals + 3 waits.
  EXPECT_EQ(count_of(t.json, "\"event\":\"signal\""), 3u * 2 * (2 + 3) * 3);
  EXPECT_EQ(count_of(t.json, "\"event\":\"wait\""), 3u * 2 * (2 + 3) * 3);
  EXPECT_EQ(count_of(t.json, "\"event\":\"launch\""), 3u * 2);
  EXPECT_EQ(count_of(t.json, "\"step\":\"fold\""), 3u * 2);
  EXPECT_EQ(count_of(t.json, "\"step\":\"reduce_slice\""), 3u * 2);
  EXPECT_EQ(count_of(t.json, "\"step\":\"gather_slice\""), 3u * 2 * 2);
  // Epochs: one_shot uses barriers 1, 2 (sets 1, 0); two_shot continues with 3, 4, 5.
  EXPECT_NE(t.json.find("\"set\":1,\"epoch\":1"), std::string::npos);
  EXPECT_NE(t.json.find("\"set\":1,\"epoch\":5"), std::string::npos);
  EXPECT_EQ(t.json.find("\"epoch\":6"), std::string::npos);
  // Rank 0 block 0's one_shot fold reads the first pack [0, 8) of every rank's input (block 1 takes
  // [8, 16) and the tail [16, 21)).
  EXPECT_NE(t.json.find("\"rank\":0,\"block\":0,\"step\":\"fold\",\"accesses\":[{\"access\":\"read\",\"peer\":0,"
                        "\"buffer\":\"input\",\"begin\":0,\"end\":8}"),
            std::string::npos)
      << t.json.substr(0, 2000);
  // Traced elements 3 and 17: one_shot folds them on every rank (3 folds + 1 round each), two_shot
  // only on the owning rank.
  EXPECT_EQ(count_of(t.json, "\"event\":\"fold\""), 2u * (3 * 3 + 3));
  EXPECT_EQ(count_of(t.json, "\"event\":\"round\""), 2u * (3 + 1));
  EXPECT_NE(t.json.find("\"index\":17,\"input_rank\":2,\"acc_before\":\"0x"), std::string::npos);
  // Chrome trace: a process per rank, balanced braces (access ranges like [0,8) are in strings).
  EXPECT_NE(t.chrome.find("\"args\":{\"name\":\"rank 2\"}"), std::string::npos);
  EXPECT_EQ(count_of(t.chrome, "{"), count_of(t.chrome, "}"));
  EXPECT_EQ(count_of(t.chrome, "\"ph\":\"X\""), 3u * 2 * (1 + 1 + 2) + 90u) << "one slice per step and wait";
  // The traced elements' folds and roundings are instants too, with their values.
  EXPECT_EQ(count_of(t.chrome, "\"name\":\"fold element "), 2u * (3 * 3 + 3));
  EXPECT_EQ(count_of(t.chrome, "\"name\":\"round element "), 2u * (3 + 1));
  EXPECT_NE(t.chrome.find("\"name\":\"fold element 17 + rank 2\""), std::string::npos);
  EXPECT_NE(t.chrome.find("\"acc_after\":\"0x"), std::string::npos);
}

// The element trace follows the contract: the stored bits are the reference's.
TEST(SimTrace, ElementTraceShowsTheReferenceRounding) {
  sim::WorldOptions options;
  options.ranks = 2;
  options.trace = true;
  options.trace_elements = {0};
  sim::World world(options);
  sim::CollectiveSpec spec;
  spec.dtype = DType::kBF16;
  spec.count = 1;
  spec.algorithm = sim::Algorithm::kOneShot;
  // 1 + 2^-8: a tie in bf16, to even (1.0).
  std::vector<std::vector<uint8_t>> in = {{0x80, 0x3F}, {0x80, 0x3B}};
  simtest::run_collective(world, spec, in);
  const std::string json = world.tracer()->json_lines();
  EXPECT_NE(json.find("\"event\":\"round\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"acc\":\"0x3f808000\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"stored\":\"0x3f80\",\"stored_value\":\"1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"input_rank\":1,\"acc_before\":\"0x3f800000\",\"acc_before_value\":\"1\",\"x\":\"0x3b800000\""),
            std::string::npos)
      << json;
}

// A kernel that waits for a flag nobody sets.
void enqueue_stuck(sim::World& world) {
  sim::Launch launch;
  launch.name = "stuck";
  launch.blocks = 2;
  world.enqueue<bf16>(launch, [](auto& ctx) {
    if (ctx.rank() == 1 && ctx.block() == 1) {
      ctx.wait(&ctx.signals(1)->flags[1][1][0], 9, 0, 1);
    }
  });
}

TEST(SimScheduler, DeadlockIsReportedWithFlagEpochAndSeed) {
  sim::WorldOptions options;
  options.ranks = 2;
  options.schedule = Schedule::kSeeded;
  options.schedule_seed = 1234;
  sim::World world(options);
  enqueue_stuck(world);
  try {
    world.run();
    FAIL() << "no deadlock reported";
  } catch (const SimError& e) {
    EXPECT_EQ(e.kind(), SimFailure::kDeadlock);
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 block 1 (launch 0 'stuck') waits for flag set 1, block 1, from peer 0 to hold epoch 9 "
                     "(it holds 0)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("reproduce with --schedule-seed 1234"), std::string::npos) << m;
  }
  // The world's flags are in an unknown state now: it refuses further runs.
  enqueue_stuck(world);
  EXPECT_THROW(world.run(), std::logic_error);
}

TEST(SimScheduler, ThreadsWaitTimesOutNamingRankBlockPeerAndEpoch) {
  sim::WorldOptions options;
  options.ranks = 2;
  options.wait_timeout = 100ms;
  sim::World world(options);
  enqueue_stuck(world);
  const auto start = std::chrono::steady_clock::now();
  try {
    world.run();
    FAIL() << "no timeout";
  } catch (const SimError& e) {
    EXPECT_EQ(e.kind(), SimFailure::kTimeout);
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 block 1"), std::string::npos) << m;
    EXPECT_NE(m.find("flag set 1 from peer 0 to hold epoch 9"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(SimScheduler, LivelockIsStoppedByTheStepBound) {
  sim::WorldOptions options;
  options.ranks = 2;
  options.schedule = Schedule::kSeeded;
  options.schedule_seed = 5;
  options.max_steps = 1000;
  sim::World world(options);
  sim::Launch launch;
  launch.name = "spin";
  world.enqueue<float>(launch, [](auto& ctx) {
    for (uint32_t v = 1;; ++v) ctx.signal(&ctx.signals(ctx.rank())->flags[0][0][ctx.rank()], v, ctx.rank(), 0);
  });
  try {
    world.run();
    FAIL() << "no livelock report";
  } catch (const SimError& e) {
    EXPECT_EQ(e.kind(), SimFailure::kLivelock);
    EXPECT_NE(std::string(e.what()).find("reproduce with --schedule-seed 5"), std::string::npos) << e.what();
  }
}

TEST(SimScheduler, KernelExceptionIsReportedUnderBothSchedulers) {
  for (const Schedule s : {Schedule::kThreads, Schedule::kSeeded}) {
    sim::WorldOptions options;
    options.ranks = 3;
    options.schedule = s;
    options.wait_timeout = 2000ms;
    sim::World world(options);
    sim::Launch launch;
    launch.name = "throws";
    world.enqueue<float>(launch, [](auto& ctx) {
      if (ctx.rank() == 2) throw std::runtime_error("kernel says no");
    });
    try {
      world.run();
      FAIL() << "no error";
    } catch (const SimError& e) {
      EXPECT_EQ(e.kind(), SimFailure::kError);
      EXPECT_NE(std::string(e.what()).find("kernel says no"), std::string::npos) << e.what();
    }
  }
}

// Fault injection (issue 15, item 5): a rank stopped at step K under both schedulers; its peers'
// report names it, the note says it was injected, and the world refuses further runs.
TEST(SimFault, ADeadRankIsNamedUnderBothSchedulers) {
  for (const Schedule s : {Schedule::kThreads, Schedule::kSeeded}) {
    for (const uint64_t step : {1u, 2u, 5u}) {
      sim::WorldOptions options;
      options.ranks = 4;
      options.schedule = s;
      options.wait_timeout = 200ms;
      options.fail_rank = 3;
      options.fail_at_step = step;
      sim::World world(options);
      sim::CollectiveSpec spec;
      spec.dtype = DType::kFP32;
      spec.count = 64;
      spec.blocks = 2;
      spec.algorithm = sim::Algorithm::kTwoShot;
      const auto in = simtest::random_inputs(spec.dtype, 4, spec.count, 3);
      const auto start = std::chrono::steady_clock::now();
      try {
        simtest::run_collective(world, spec, in);
        FAIL() << "a dead rank went unnoticed";
      } catch (const SimError& e) {
        const std::string m = e.what();
        // Threads: the stall is seen within a 20 ms slice, but on a loaded machine the 200 ms
        // timeout may still come first (DeadRankEndsTheRunWithoutItsTimeout pins the stall).
        EXPECT_TRUE(e.kind() == SimFailure::kDeadlock || e.kind() == SimFailure::kRankDied ||
                    (s == Schedule::kThreads && e.kind() == SimFailure::kTimeout))
            << m;
        EXPECT_NE(m.find("rank 3 was stopped by fault injection at its synchronization step " + std::to_string(step)),
                  std::string::npos)
            << m;
        if (e.kind() != SimFailure::kRankDied) {
          EXPECT_NE(m.find("peer 3"), std::string::npos) << m;
        }
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
      EXPECT_TRUE(world.rank_dead(3));
      EXPECT_EQ(world.fault_steps(), step);
      enqueue_stuck(world);
      EXPECT_THROW(world.run(), std::logic_error);
    }
  }
}

// Threads, with a timeout of an hour: once the dead rank's peers all wait, none can move again,
// and the run ends at once as a deadlock naming it (the CLI fuzzer once hung here on
// --timeout-ms 2147483647 --fail-rank 1). Every op and algorithm family: flag waits and Lamport
// polls.
TEST(SimFault, DeadRankEndsTheRunWithoutItsTimeout) {
  struct Case {
    sim::Op op;
    sim::Algorithm algorithm;
  };
  for (const Case c :
       {Case{sim::Op::kAllReduce, sim::Algorithm::kOneShot}, Case{sim::Op::kAllReduce, sim::Algorithm::kTwoShot},
        Case{sim::Op::kAllReduce, sim::Algorithm::kLamportOneShot},
        Case{sim::Op::kReduceScatter, sim::Algorithm::kAuto}, Case{sim::Op::kAllGather, sim::Algorithm::kAuto}}) {
    for (const uint64_t step : {1u, 3u, 7u}) {
      sim::WorldOptions options;
      options.ranks = 4;
      options.wait_timeout = std::chrono::hours(1);
      options.fail_rank = 1;
      options.fail_at_step = step;
      sim::World world(options);
      sim::CollectiveSpec spec;
      spec.op = c.op;
      spec.dtype = DType::kBF16;
      spec.count = 16;
      spec.algorithm = c.algorithm;
      const auto in = simtest::random_inputs(spec.dtype, 4, spec.count, 5);
      const auto start = std::chrono::steady_clock::now();
      const std::string what = sim::op_name(c.op) + std::string(" step ") + std::to_string(step);
      try {
        simtest::run_collective(world, spec, in);
        FAIL() << what << ": a dead rank went unnoticed (it took " << world.fault_steps() << " steps)";
      } catch (const SimError& e) {
        const std::string m = e.what();
        EXPECT_TRUE(e.kind() == SimFailure::kDeadlock || e.kind() == SimFailure::kRankDied) << what << ": " << m;
        if (e.kind() == SimFailure::kDeadlock) {
          EXPECT_NE(m.find("every other live rank waits too"), std::string::npos) << what << ": " << m;
          EXPECT_NE(m.find("peer 1"), std::string::npos) << what << ": " << m;
        }
        EXPECT_NE(m.find("rank 1 was stopped by fault injection"), std::string::npos) << what << ": " << m;
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << what;
    }
  }
}

// A timeout of "forever" is the clock's last instant, not an overflow (UBSan caught now + 2^63 - 1
// ms); an ordinary one is now + timeout.
TEST(SimDeadline, SaturatesAtTheClocksEnd) {
  using Clock = std::chrono::steady_clock;
  EXPECT_EQ(sim::deadline_after(std::chrono::milliseconds::max()), Clock::time_point::max());
  EXPECT_EQ(sim::deadline_after(std::chrono::hours::max()), Clock::time_point::max());
  EXPECT_EQ(sim::deadline_after(Clock::duration::max()), Clock::time_point::max());
  const auto before = Clock::now();
  const auto deadline = sim::deadline_after(std::chrono::milliseconds(1500));
  EXPECT_GE(deadline - before, 1500ms);
  EXPECT_LT(deadline - before, 1500ms + 5s);
}

TEST(SimFault, ARankThatNeverJoinsIsNamedByTheHandleExchange) {
  // Step 0: rank 1 never joins the world's first handle exchange. Before issue 15 such a store
  // timeout escaped the world as a StoreError (an abort in the CLI); it is a SimError naming the
  // rank now.
  sim::WorldOptions options;
  options.ranks = 3;
  options.store_timeout = 100ms;
  options.fail_rank = 1;
  options.fail_at_step = 0;
  try {
    sim::World world(options);
    FAIL() << "the world formed without rank 1";
  } catch (const SimError& e) {
    EXPECT_EQ(e.kind(), SimFailure::kTimeout);
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 never published its miss bit"), std::string::npos) << m;
    EXPECT_NE(m.find("before it joined the world"), std::string::npos) << m;
  }
}

// Stream order: rank r's launch k+1 starts only after all its blocks finished launch k. A kernel
// records (launch, block) order per rank under the seeded scheduler.
TEST(SimScheduler, LaunchesRunInStreamOrderPerRank) {
  sim::WorldOptions options;
  options.ranks = 4;
  options.schedule = Schedule::kSeeded;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    options.schedule_seed = seed;
    sim::World world(options);
    std::vector<std::vector<int>> order(4);
    for (int k = 0; k < 3; ++k) {
      sim::Launch launch;
      launch.name = "record";
      launch.blocks = 3;
      world.enqueue<float>(launch, [&order, k](auto& ctx) {
        uint32_t count = load_barrier_count(ctx);
        block_barrier<TwoSetProtocol>(ctx, &count);  // scheduling points inside the launch
        order[ctx.rank()].push_back(k);
        store_barrier_count(ctx, count);
      });
    }
    world.run();
    for (int r = 0; r < 4; ++r) {
      ASSERT_EQ(order[r].size(), 9u);
      for (size_t i = 1; i < order[r].size(); ++i) ASSERT_LE(order[r][i - 1], order[r][i]) << "seed " << seed;
    }
  }
}

// Extra symmetric buffers (what fused kernels use): rank r writes its buffer, a barrier, then
// reads every peer's.
TEST(SimWorld, ExtraBuffersAreSymmetricAndOpenedThroughTheExchange) {
  for (const Schedule s : {Schedule::kThreads, Schedule::kSeeded}) {
    sim::WorldOptions options;
    options.ranks = 5;
    options.schedule = s;
    sim::World world(options);
    const int id = world.add_buffer("partials", 16 * sizeof(int));
    std::vector<int> sums(5, 0);
    sim::Launch launch;
    launch.name = "exchange_partials";
    launch.before = [&world, id](int rank) { static_cast<int*>(world.local_buffer(id, rank))[0] = 10 * (rank + 1); };
    world.enqueue<float>(launch, [&sums, id](auto& ctx) {
      uint32_t count = load_barrier_count(ctx);
      block_barrier<TwoSetProtocol>(ctx, &count);
      int sum = 0;
      for (int p = 0; p < ctx.world_size(); ++p) sum += static_cast<const int*>(ctx.buffer(id, p))[0];
      sums[ctx.rank()] = sum;
      block_barrier<TwoSetProtocol>(ctx, &count);
      store_barrier_count(ctx, count);
    });
    world.run();
    for (int r = 0; r < 5; ++r) EXPECT_EQ(sums[r], 150) << sim::schedule_name(s) << " rank " << r;
  }
}

TEST(SimWorld, RanksOutsideOneToSixteenAreRefused) {
  sim::WorldOptions options;
  options.ranks = 0;
  EXPECT_THROW(sim::World{options}, std::invalid_argument);
  options.ranks = 17;
  EXPECT_THROW(sim::World{options}, std::invalid_argument);
}

}  // namespace
}  // namespace exactcoll
