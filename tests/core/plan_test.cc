// The overlap plan (core/overlap_plan.h): pull order rank+1, rank+2, ..., alternating comm streams,
// every pull guarded by the get protocol, the compute stream's products in step order (per_shard)
// or over contiguous row blocks (merged, pairs), and the checker catching plans that break the
// protocol or the products' coverage of C.
#include "core/overlap_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace exactcoll::overlap {
namespace {

constexpr ProductGrouping kGroupings[] = {ProductGrouping::kPerShard, ProductGrouping::kMerged,
                                          ProductGrouping::kPairs};

std::vector<RankPlan> plans_for(Pattern pattern, int n, int comm_streams = 2,
                                ProductGrouping grouping = ProductGrouping::kPerShard) {
  std::vector<RankPlan> plans;
  for (int r = 0; r < n; ++r) plans.push_back(make_plan(pattern, r, n, comm_streams, grouping));
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

TEST(OverlapPlan, DefaultPlansAreValidForEveryWorldSizeStreamCountAndGrouping) {
  for (Pattern pattern : {Pattern::kAgMatmul, Pattern::kPrefetch}) {
    for (ProductGrouping grouping : kGroupings) {
      for (int n = 1; n <= kMaxOverlapRanks; ++n) {
        for (int comm = 1; comm <= 3; ++comm) {
          EXPECT_EQ(check_plans(plans_for(pattern, n, comm, grouping)), "")
              << pattern_name(pattern) << ", " << grouping_name(grouping) << ", " << n << " ranks, " << comm
              << " comm streams";
        }
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

// The products of a plan with, for each, the steps whose arrival it waits for since the previous product.
struct Product {
  ShardRange range;
  int step;
  std::vector<int> awaited_steps;
};
std::vector<Product> products_of(const RankPlan& plan) {
  std::vector<Product> out;
  std::vector<int> awaited;
  for (const PlanOp& op : plan.compute().ops) {
    if (op.kind == OpKind::kWaitArrival) awaited.push_back(op.step);
    if (op.kind == OpKind::kMatmul) {
      out.push_back({{op.peer, op.shards}, op.step, awaited});
      awaited.clear();
    }
  }
  return out;
}

// Returns the products `grouping` must give rank r of n: the own shard, then the after block
// [r+1, n) and the before block [0, r), each cut into pieces of at most `most` shards in order.
std::vector<ShardRange> expected_ranges(int r, int n, int most) {
  std::vector<ShardRange> out = {{r, 1}};
  for (const ShardRange block : {ShardRange{r + 1, n - r - 1}, ShardRange{0, r}}) {
    for (int first = block.first; first < block.first + block.count; first += most) {
      out.push_back({first, std::min(most, block.first + block.count - first)});
    }
  }
  return out;
}

TEST(OverlapPlan, GroupedPlansCoverEveryRowOnceAfterTheirShardsArriveAndKeepThePulls) {
  for (ProductGrouping grouping : kGroupings) {
    for (int n = 1; n <= 8; ++n) {
      for (int r = 0; r < n; ++r) {
        SCOPED_TRACE(std::string(grouping_name(grouping)) + ", rank " + std::to_string(r) + " of " + std::to_string(n));
        const RankPlan plan = make_plan(Pattern::kAgMatmul, r, n, 2, grouping);
        const RankPlan per_shard = make_plan(Pattern::kAgMatmul, r, n, 2, ProductGrouping::kPerShard);
        EXPECT_EQ(plan.grouping, grouping);
        // The comm streams (pulls, flags, arrivals) do not depend on the grouping.
        for (int s = 0; s < plan.comm_streams(); ++s) {
          const auto& a = plan.streams[static_cast<size_t>(s)].ops;
          const auto& b = per_shard.streams[static_cast<size_t>(s)].ops;
          ASSERT_EQ(a.size(), b.size());
          for (size_t i = 0; i < a.size(); ++i) {
            EXPECT_TRUE(a[i].kind == b[i].kind && a[i].step == b[i].step && a[i].peer == b[i].peer)
                << "comm" << s << " op " << i;
          }
        }
        // The products: the own shard first, then the blocks, each waiting for exactly its shards' steps.
        const std::vector<ShardRange> expected = expected_ranges(r, n, max_shards_per_product(grouping, n));
        const std::vector<Product> products = products_of(plan);
        ASSERT_EQ(products.size(), expected.size());
        const std::vector<ShardRange> ranges = product_ranges(plan);
        ASSERT_EQ(ranges.size(), expected.size());
        std::vector<int> rows_covered(static_cast<size_t>(n), 0);
        for (size_t i = 0; i < products.size(); ++i) {
          const Product& p = products[i];
          EXPECT_EQ(p.range.first, expected[i].first) << "product " << i;
          EXPECT_EQ(p.range.count, expected[i].count) << "product " << i;
          EXPECT_EQ(ranges[i].first, p.range.first);
          EXPECT_EQ(ranges[i].count, p.range.count);
          std::vector<int> steps;
          for (int shard = p.range.first; shard < p.range.first + p.range.count; ++shard) {
            ++rows_covered[static_cast<size_t>(shard)];
            if (shard != r) steps.push_back(step_of_shard(r, shard, n));
          }
          EXPECT_EQ(p.awaited_steps, steps) << "product " << i;
          EXPECT_EQ(p.step, i == 0               ? 0
                            : p.range.count == 1 ? step_of_shard(r, p.range.first, n)
                                                 : -1)
              << "product " << i;
        }
        for (int shard = 0; shard < n; ++shard)
          EXPECT_EQ(rows_covered[static_cast<size_t>(shard)], 1) << "shard " << shard;
        // merged: two peer products at most, one on the first and the last rank; per_shard: one per shard.
        const size_t peer_products = products.size() - 1;
        if (grouping == ProductGrouping::kMerged) {
          EXPECT_EQ(peer_products, static_cast<size_t>(n == 1 ? 0 : r == 0 || r == n - 1 ? 1 : 2));
        } else if (grouping == ProductGrouping::kPerShard) {
          EXPECT_EQ(peer_products, static_cast<size_t>(n - 1));
        }
      }
    }
  }
}

TEST(OverlapPlan, MergedPlanTextMatchesTheHeaderExample) {
  const std::string text = plan_text(make_plan(Pattern::kAgMatmul, 1, 4, 2, ProductGrouping::kMerged));
  EXPECT_NE(text.find("compute: matmul(1,s0) wait_arrival(2,s1) wait_arrival(3,s2) matmul(2..3) wait_arrival(0,s3) "
                      "matmul(0,s3) wait_consumed(2) wait_consumed(3) wait_consumed(0)\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.substr(0, text.find("compute:")),
            plan_text(make_plan(Pattern::kAgMatmul, 1, 4, 2)).substr(0, text.find("compute:")));
  // Rank 0 of 4: every peer shard in one product; pairs splits it after the first two pulls.
  EXPECT_NE(plan_text(make_plan(Pattern::kAgMatmul, 0, 4, 2, ProductGrouping::kMerged))
                .find("compute: matmul(0,s0) wait_arrival(1,s1) wait_arrival(2,s2) wait_arrival(3,s3) matmul(1..3) "),
            std::string::npos);
  EXPECT_NE(plan_text(make_plan(Pattern::kAgMatmul, 0, 4, 2, ProductGrouping::kPairs))
                .find("compute: matmul(0,s0) wait_arrival(1,s1) wait_arrival(2,s2) matmul(1..2) wait_arrival(3,s3) "
                      "matmul(3,s3) "),
            std::string::npos);
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
  for (ProductGrouping g : kGroupings) {
    ProductGrouping parsed = ProductGrouping::kPerShard;
    EXPECT_TRUE(parse_grouping(grouping_name(g), &parsed));
    EXPECT_EQ(parsed, g);
  }
  ProductGrouping g;
  EXPECT_FALSE(parse_grouping("both", &g));
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

// Returns rank's compute-stream product covering `first` (the test fails when there is none).
PlanOp& product_at(std::vector<RankPlan>& plans, int rank, int first) {
  for (PlanOp& op : plans[static_cast<size_t>(rank)].streams.back().ops) {
    if (op.kind == OpKind::kMatmul && op.peer == first) return op;
  }
  ADD_FAILURE() << "no product of shard " << first << " on rank " << rank;
  return plans[static_cast<size_t>(rank)].streams.back().ops.front();
}

TEST(OverlapPlan, CheckerCatchesGroupedProductsThatMissRowsOrArrivals) {
  {
    // Rank 1 of 4 (merged: matmul(2..3) after steps 1 and 2): the wait for step 2 dropped.
    auto plans = plans_for(Pattern::kAgMatmul, 4, 2, ProductGrouping::kMerged);
    remove_op(plans, 1, OpKind::kWaitArrival, 2);
    EXPECT_NE(check_plans(plans).find("product of shard 3 (step 2) before its shard arrived"), std::string::npos)
        << check_plans(plans);
  }
  {
    // Rank 0 of 4: the merged product covers shards 1..2 only, so shard 3's rows are never produced.
    auto plans = plans_for(Pattern::kAgMatmul, 4, 2, ProductGrouping::kMerged);
    product_at(plans, 0, 1).shards = 2;
    EXPECT_NE(check_plans(plans).find("rows of C of shard 3 0 times"), std::string::npos) << check_plans(plans);
  }
  {
    // Rank 2 of 4: pairs' product of shards 0..1 also covers shard 2 (its own, already multiplied).
    auto plans = plans_for(Pattern::kAgMatmul, 4, 2, ProductGrouping::kPairs);
    product_at(plans, 2, 0).shards = 3;
    EXPECT_NE(check_plans(plans).find("own shard must be multiplied alone"), std::string::npos) << check_plans(plans);
  }
  {
    // Rank 3 of 4: a product past the last row of C.
    auto plans = plans_for(Pattern::kAgMatmul, 4, 2, ProductGrouping::kMerged);
    product_at(plans, 3, 0).peer = 2;
    EXPECT_NE(check_plans(plans).find("outside 0..4"), std::string::npos) << check_plans(plans);
  }
  {
    // Rank 0 of 3, per_shard: the last product computes shard 1's rows again instead of shard 2's.
    auto plans = plans_for(Pattern::kAgMatmul, 3, 2, ProductGrouping::kPerShard);
    PlanOp& op = product_at(plans, 0, 2);
    op.peer = 1;
    op.step = 1;
    EXPECT_NE(check_plans(plans).find("rows of C of shard 1 2 times"), std::string::npos) << check_plans(plans);
  }
  {
    // A one-shard product labelled with another shard's step.
    auto plans = plans_for(Pattern::kAgMatmul, 3, 2, ProductGrouping::kPerShard);
    product_at(plans, 0, 2).step = 1;
    EXPECT_NE(check_plans(plans).find("step 1, not 2"), std::string::npos) << check_plans(plans);
  }
}

}  // namespace
}  // namespace exactcoll::overlap
