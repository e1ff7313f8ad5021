// tools/gpu/tally.h: the verify commands' per-rank counts survive the text round trip, sum key by
// key over ranks, and print as the fixed-width table the commands have always printed.
#include "tools/gpu/tally.h"

#include <gtest/gtest.h>

namespace exactcoll::gpu {
namespace {

TEST(Tally, SumsEveryRanksTextKeyByKey) {
  Tallies rank0, rank1;
  rank0["allreduce bf16 one_shot staged"] = {2, 100, 0, 1};
  rank0["allgather fp32 auto graph"] = {1, 7, 3, 0};
  rank1["allreduce bf16 one_shot staged"] = {2, 100, 5, 0};
  const Tallies total = sum_tallies({serialize_tallies(rank0), serialize_tallies(rank1), ""});
  ASSERT_EQ(total.size(), 2u);
  const Tally& a = total.at("allreduce bf16 one_shot staged");
  EXPECT_EQ(a.runs, 4u);
  EXPECT_EQ(a.compared, 200u);
  EXPECT_EQ(a.sim_mismatches, 5u);
  EXPECT_EQ(a.reference_mismatches, 1u);
  const Tally& g = total.at("allgather fp32 auto graph");
  EXPECT_EQ(g.runs, 1u);
  EXPECT_EQ(g.compared, 7u);
  EXPECT_EQ(g.sim_mismatches, 3u);
  EXPECT_EQ(g.reference_mismatches, 0u);
}

TEST(Tally, CleanOnlyWhenSomethingWasComparedAndNothingDiffers) {
  EXPECT_FALSE(Tally{}.clean());
  EXPECT_TRUE((Tally{1, 10, 0, 0}.clean()));
  EXPECT_FALSE((Tally{1, 10, 1, 0}.clean()));
  EXPECT_FALSE((Tally{1, 10, 0, 1}.clean()));
}

TEST(Tally, TableHasTheHeaderAndOneRowPerKeyAndAddsIntoTheGrandTotal) {
  Tallies total;
  total["fused_rmsnorm bf16 two_stage registered"] = {3, 4096, 0, 2};
  total["fused_rmsnorm bf16 auto staged"] = {1, 16, 1, 0};
  Tally grand{1, 1, 1, 1};
  const std::string table = format_tally_table(total, "diff_vs_ref", &grand);
  EXPECT_EQ(table,
            "op              dtype algorithm    variant          runs       elements  diff_vs_sim  diff_vs_ref\n"
            "fused_rmsnorm   bf16  auto         staged              1             16            1            0\n"
            "fused_rmsnorm   bf16  two_stage    registered          3           4096            0            2\n");
  EXPECT_EQ(grand.runs, 5u);
  EXPECT_EQ(grand.compared, 4113u);
  EXPECT_EQ(grand.sim_mismatches, 2u);
  EXPECT_EQ(grand.reference_mismatches, 3u);
}

// A name longer than its column's default width (lamport_one_stage, 17 characters) widens the
// column for every row, so the numbers stay in line with the header.
TEST(Tally, LongNamesWidenTheirColumn) {
  Tallies total;
  total["fused_rmsnorm bf16 lamport_one_stage grid64x1024"] = Tally{1, 16, 0, 0};
  total["allreduce fp32 auto staged"] = Tally{2, 8, 0, 0};
  Tally grand;
  const std::string table = format_tally_table(total, "diff_vs_ref", &grand);
  EXPECT_EQ(table,
            "op              dtype algorithm         variant          runs       elements  diff_vs_sim  diff_vs_ref\n"
            "allreduce       fp32  auto              staged              2              8            0            0\n"
            "fused_rmsnorm   bf16  lamport_one_stage grid64x1024         1             16            0            0\n");
}

// The summary line verify prints last (device scripts grep it).
TEST(Tally, VerifySummaryLineNamesEveryCount) {
  Tally grand;
  grand.runs = 3;
  grand.compared = 1116315288;
  grand.sim_mismatches = 0;
  grand.reference_mismatches = 2;
  EXPECT_EQ(verify_summary_line("verify 2 ranks", grand, "all ranks", "contract", 3.25),
            "verify 2 ranks: 3 runs, 1116315288 elements compared (all ranks), 0 differ from the simulator, 2 from the "
            "contract (3.2 s)\n");
}

}  // namespace
}  // namespace exactcoll::gpu
