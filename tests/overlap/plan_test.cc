// The overlap plan (sim/overlap/plan.h): pull order rank+1, rank+2, ..., alternating comm streams,
// every pull guarded by the get protocol, the compute stream's products in step order, and the
// checker catching plans that break the protocol.
#include "sim/overlap/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace exactcoll::overlap {
namespace {

std::vector<RankPlan> plans_for(Pattern pattern, int n, int comm_streams = 2) {
  std::vector<RankPlan> plans;
  for (int r = 0; r < n; ++r) plans.push_back(make_plan(pattern, r, n, comm_streams));
  return plans;
}

// The pulls of one rank as (step, owner, stream index), in step order.
struct Pull {
  int step, owner;
  size_t stream;
};
std::vector<Pull> pulls_of(const RankPlan& plan) {
  std::vector<Pull> out;
  for (size_t s = 0; s < plan.streams.size(); ++s) {
    for (const PlanOp& op : plan.streams[s].ops) {
      if (op.kind == OpKind::kPullShard) out.push_back({op.step, op.peer, s});
    }
  }
  std::sort(out.begin(), out.end(), [](const Pull& a, const Pull& b) { return a.step < b.step; });
  return out;
}

TEST(OverlapPlan, DefaultPlansAreValidForEveryWorldSizeAndStreamCount) {
  for (Pattern pattern : {Pattern::kAgMatmul, Pattern::kPrefetch}) {
    for (int n = 1; n <= kMaxOverlapRanks; ++n) {
      for (int comm = 1; comm <= 3; ++comm) {
        EXPECT_EQ(check_plans(plans_for(pattern, n, comm)), "")
            << pattern_name(pattern) << ", " << n << " ranks, " << comm << " comm streams";
      }
    }
  }
}

TEST(OverlapPlan, PullsPeersInOrderRankPlusOneOnAlternatingStreams) {
  for (int n : {2, 3, 4, 5, 8}) {
    for (int r = 0; r < n; ++r) {
      const RankPlan plan = make_plan(Pattern::kAgMatmul, r, n, 2);
      const std::vector<Pull> pulls = pulls_of(plan);
      ASSERT_EQ(pulls.size(), static_cast<size_t>(n - 1));
      for (int j = 1; j < n; ++j) {
        const Pull& p = pulls[static_cast<size_t>(j - 1)];
        EXPECT_EQ(p.step, j);
        EXPECT_EQ(p.owner, (r + j) % n) << "rank " << r << " step " << j;
        EXPECT_EQ(p.stream, static_cast<size_t>((j - 1) % 2)) << "rank " << r << " step " << j;
      }
    }
  }
}

TEST(OverlapPlan, ComputeStreamMultipliesOwnShardFirstThenEachShardAfterItArrives) {
  const RankPlan plan = make_plan(Pattern::kAgMatmul, 2, 4, 2);
  EXPECT_EQ(plan_text(plan),
            "comm0: signal_ready(3) signal_ready(0) signal_ready(1) wait_ready(3,s1) pull_shard(3,s1) "
            "signal_consumed(3,s1) record_arrival(3,s1) wait_ready(1,s3) pull_shard(1,s3) signal_consumed(1,s3) "
            "record_arrival(1,s3)\n"
            "comm1: copy_own_shard(2,s0) wait_ready(0,s2) pull_shard(0,s2) signal_consumed(0,s2) record_arrival(0,s2)\n"
            "compute: matmul(2,s0) wait_arrival(3,s1) matmul(3,s1) wait_arrival(0,s2) matmul(0,s2) wait_arrival(1,s3) "
            "matmul(1,s3) wait_consumed(3) wait_consumed(0) wait_consumed(1)\n");
}

TEST(OverlapPlan, PrefetchHasOneUnrelatedProductAndNoArrivalWaits) {
  const RankPlan plan = make_plan(Pattern::kPrefetch, 0, 3, 2);
  EXPECT_EQ(plan.compute().ops.size(), 1u + 2u);
  EXPECT_EQ(plan.compute().ops[0].kind, OpKind::kMatmul);
  EXPECT_EQ(plan.compute().ops[0].step, -1);
  for (const PlanOp& op : plan.compute().ops) EXPECT_NE(op.kind, OpKind::kWaitArrival);
}

TEST(OverlapPlan, RejectsBadArguments) {
  EXPECT_THROW(make_plan(Pattern::kAgMatmul, 0, 0), std::invalid_argument);
  EXPECT_THROW(make_plan(Pattern::kAgMatmul, 0, kMaxOverlapRanks + 1), std::invalid_argument);
  EXPECT_THROW(make_plan(Pattern::kAgMatmul, 3, 3), std::invalid_argument);
  EXPECT_THROW(make_plan(Pattern::kAgMatmul, 0, 2, 0), std::invalid_argument);
  Pattern p;
  EXPECT_TRUE(parse_pattern("prefetch", &p));
  EXPECT_EQ(p, Pattern::kPrefetch);
  EXPECT_FALSE(parse_pattern("fsdp", &p));
}

// Removes the first op of `kind` (and step, when step >= -1 is given) from rank's plan.
void remove_op(std::vector<RankPlan>& plans, int rank, OpKind kind, int step = -2) {
  for (StreamPlan& s : plans[static_cast<size_t>(rank)].streams) {
    for (size_t i = 0; i < s.ops.size(); ++i) {
      if (s.ops[i].kind == kind && (step == -2 || s.ops[i].step == step)) {
        s.ops.erase(s.ops.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    }
  }
  FAIL() << "no " << op_name(kind) << " in rank " << rank << "'s plan";
}

TEST(OverlapPlan, CheckerCatchesBrokenProtocols) {
  {
    auto plans = plans_for(Pattern::kAgMatmul, 4);
    remove_op(plans, 1, OpKind::kWaitReady, 2);
    EXPECT_NE(check_plans(plans).find("not guarded by wait_ready"), std::string::npos) << check_plans(plans);
  }
  {
    auto plans = plans_for(Pattern::kAgMatmul, 4);
    remove_op(plans, 0, OpKind::kSignalConsumed, 1);
    EXPECT_NE(check_plans(plans).find("not followed by signal_consumed"), std::string::npos) << check_plans(plans);
  }
  {
    auto plans = plans_for(Pattern::kAgMatmul, 3);
    remove_op(plans, 2, OpKind::kWaitArrival, 1);
    EXPECT_NE(check_plans(plans).find("before its shard arrived"), std::string::npos) << check_plans(plans);
  }
  {
    auto plans = plans_for(Pattern::kAgMatmul, 3);
    remove_op(plans, 2, OpKind::kWaitConsumed);
    EXPECT_NE(check_plans(plans).find("consumed signal 0 times"), std::string::npos) << check_plans(plans);
  }
  {
    // The owner forgets to mark its shard ready for one peer: that peer's pull never starts.
    auto plans = plans_for(Pattern::kAgMatmul, 3);
    remove_op(plans, 0, OpKind::kSignalReady);
    EXPECT_NE(check_plans(plans).find("marks its shard ready"), std::string::npos) << check_plans(plans);
  }
  {
    // Both owners wait for the peer's shard before marking their own ready: each waits for a
    // signal that comes after its own wait, so the abstract run stops.
    auto plans = plans_for(Pattern::kAgMatmul, 2, 1);
    for (RankPlan& plan : plans) {
      auto& comm0 = plan.streams[0].ops;
      ASSERT_EQ(comm0.front().kind, OpKind::kSignalReady);
      std::rotate(comm0.begin(), comm0.begin() + 1, comm0.end());
    }
    EXPECT_NE(check_plans(plans).find("deadlock"), std::string::npos) << check_plans(plans);
  }
}

}  // namespace
}  // namespace exactcoll::overlap
