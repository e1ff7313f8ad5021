// cuda_backend/fused/fused_table.h: parsing (every malformed field named), lookup (nearest measured
// row size and row count, the fastest algorithm there), the heuristic without rows, the default
// grids, and round trips through the file format.
#include "cuda_backend/fused/fused_table.h"

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "core/contract.h"
#include "core/fused_rmsnorm_kernels.h"
#include "core/signal.h"
#include "core/storage.h"
#include "cuda_backend/fused/fused_kernel_args.h"

namespace exactcoll::cuda::fused {
namespace {

const char* kTable =
    "# comment\n"
    "sm90\t4\t16384\t1\tone_stage\t1\t1024\t7.5\n"
    "sm90\t4\t16384\t1\tgather_norm\t1\t1024\t9.0\n"
    "sm90\t4\t16384\t256\tone_stage\t64\t1024\t40\n"
    "sm90\t4\t16384\t256\tgather_norm\t64\t1024\t25\n"
    "sm90\t4\t16384\t256\tunfused\t256\t1024\t30\n"
    "sm90\t4\t8192\t1\tone_stage\t1\t512\t6.0\n"
    "sm90\t4\t8192\t1024\ttwo_stage\t64\t512\t50\n";

TEST(FusedTable, ParsesAndPicksTheFastestAtTheNearestMeasuredPoint) {
  const FusedTable t = FusedTable::parse(kTable, "t");
  ASSERT_EQ(t.rows().size(), 7u);
  // Exactly measured: its grid too.
  FusedChoice c = t.choose("sm90", 4, 256, 8192, DType::kBF16, FusedAlgorithm::kAuto);
  EXPECT_EQ(c.algo, FusedAlgorithm::kGatherNorm);
  EXPECT_TRUE(c.from_table);
  EXPECT_EQ(c.grid.blocks, 64);
  // Between measured row counts: the next larger (256) decides; the grid is the default for 100 rows.
  c = t.choose("sm90", 4, 100, 8192, DType::kBF16, FusedAlgorithm::kAuto);
  EXPECT_EQ(c.algo, FusedAlgorithm::kGatherNorm);
  EXPECT_EQ(c.grid.blocks, 25);
  EXPECT_EQ(c.grid.threads, 1024);
  // Beyond every measured row count: the largest.
  EXPECT_EQ(t.choose("sm90", 4, 5000, 8192, DType::kBF16, FusedAlgorithm::kAuto).algo, FusedAlgorithm::kGatherNorm);
  // fp32 H = 4096 is 16384 bytes a row, like bf16 H = 8192.
  EXPECT_EQ(t.choose("sm90", 4, 1, 4096, DType::kFP32, FusedAlgorithm::kAuto).algo, FusedAlgorithm::kOneStage);
  // A smaller row size uses the 8192-byte rows.
  EXPECT_EQ(t.choose("sm90", 4, 600, 2880, DType::kBF16, FusedAlgorithm::kAuto).algo, FusedAlgorithm::kTwoStage);
  // A larger row size than any measured: the largest (16384).
  EXPECT_EQ(t.choose("sm90", 4, 200, 16384, DType::kBF16, FusedAlgorithm::kAuto).algo, FusedAlgorithm::kGatherNorm);
  // Another world size: the heuristic.
  c = t.choose("sm90", 2, 1, 8192, DType::kBF16, FusedAlgorithm::kAuto);
  EXPECT_FALSE(c.from_table);
  EXPECT_EQ(c.algo, FusedAlgorithm::kPushOneStage);
  // A named algorithm: itself, with its default grid.
  c = t.choose("sm90", 4, 256, 8192, DType::kBF16, FusedAlgorithm::kTwoStage);
  EXPECT_EQ(c.algo, FusedAlgorithm::kTwoStage);
  EXPECT_EQ(c.grid.blocks, 64);
  // An algorithm `allowed` refuses is passed over: the next fastest at that point (unfused, 30),
  // with its measured grid; where every measured one is refused, the heuristic.
  c = t.choose("sm90", 4, 256, 8192, DType::kBF16, FusedAlgorithm::kAuto,
               [](FusedAlgorithm a) { return a != FusedAlgorithm::kGatherNorm; });
  EXPECT_EQ(c.algo, FusedAlgorithm::kUnfused);
  EXPECT_TRUE(c.from_table);
  c = t.choose("sm90", 4, 1, 4096, DType::kBF16, FusedAlgorithm::kAuto, [](FusedAlgorithm) { return false; });
  EXPECT_FALSE(c.from_table);
  EXPECT_EQ(c.algo, FusedAlgorithm::kPushOneStage);
}

TEST(FusedTable, HeuristicAndDefaultGrids) {
  EXPECT_EQ(FusedTable::default_choice(4, 16, 8192, DType::kBF16, FusedAlgorithm::kAuto).algo,
            FusedAlgorithm::kPushOneStage);
  EXPECT_EQ(FusedTable::default_choice(3, 1, 16384, DType::kFP32, FusedAlgorithm::kAuto).algo,
            FusedAlgorithm::kPushOneStage);
  EXPECT_EQ(FusedTable::default_choice(4, 17, 8192, DType::kBF16, FusedAlgorithm::kAuto).algo,
            FusedAlgorithm::kGatherNorm);
  EXPECT_EQ(FusedTable::default_choice(4, 100, 512, DType::kBF16, FusedAlgorithm::kAuto).algo,
            FusedAlgorithm::kOneStageReg);
  // Threads: the tree's lanes (H / pack rounded up to warps, capped at 1024), at least 64.
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kOneStage, 3, 2880, DType::kBF16, 4).threads, 384);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kOneStage, 3, 2880, DType::kBF16, 4).blocks, 3);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kOneStage, 3, 16384, DType::kFP32, 4).threads, 1024);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kOneStage, 3, 8, DType::kBF16, 4).threads, 64);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kOneStage, 4096, 8192, DType::kBF16, 4).blocks, kMaxBlocks);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kGatherNorm, 9, 8192, DType::kBF16, 4).blocks, 3);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kTwoStage, 1, 8192, DType::kBF16, 4).blocks, 1);
  // push_one_stage: one block per row of all rows, like one_stage (its blocks push their own rows).
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kPushOneStage, 9, 8192, DType::kBF16, 4).blocks, 9);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kPushOneStage, 9, 8192, DType::kBF16, 4).threads, 1024);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kPushOneStage, 4096, 4096, DType::kBF16, 2).blocks, kMaxBlocks);
  // lamport_one_stage: at least one block per kLamportPushBytesPerBlock (2 KiB) of x, since every
  // block pushes a share of the whole message; rows where that is more; at most kMaxBlocks.
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 1, 8192, DType::kBF16, 4).blocks, 8);
  // One row of 1 024 lanes and at most 1 024 packs runs on a cluster of 8 blocks of 128 threads;
  // more rows, and other rows, on one block of their lanes.
  const LaunchConfig one_row = default_fused_grid(FusedAlgorithm::kLamportOneStage, 1, 8192, DType::kBF16, 4);
  EXPECT_EQ(one_row.threads, 128);
  EXPECT_EQ(one_row.cluster, 8);
  EXPECT_EQ(one_row.blocks, 8);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 1, 4096, DType::kFP32, 4).threads, 128);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 1, 8192, DType::kBF16, 2).blocks, 8);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 2, 8192, DType::kBF16, 4).threads, 1024);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 2, 8192, DType::kBF16, 4).cluster, 1);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 1, 4096, DType::kBF16, 4).threads, 512);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 1, 16384, DType::kBF16, 4).threads, 1024);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 1, 4096, DType::kBF16, 2).blocks, 4);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 2, 8192, DType::kBF16, 4).blocks, 16);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 16, 8192, DType::kBF16, 4).blocks, kMaxBlocks);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 3, 64, DType::kBF16, 4).blocks, 3);
  // lamport_two_stage takes the same grid (its push is spread over the grid too, its rows likewise).
  for (int rows : {1, 2, 16, 256}) {
    for (DType dtype : {DType::kBF16, DType::kFP32}) {
      const LaunchConfig one = default_fused_grid(FusedAlgorithm::kLamportOneStage, rows, 8192, dtype, 4);
      const LaunchConfig two = default_fused_grid(FusedAlgorithm::kLamportTwoStage, rows, 8192, dtype, 4);
      EXPECT_EQ(two.blocks, one.blocks) << rows;
      EXPECT_EQ(two.threads, one.threads) << rows;
      EXPECT_EQ(two.cluster, one.cluster) << rows;
    }
  }
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 1, 8, DType::kBF16, 4).blocks, 1);
  EXPECT_EQ(default_fused_grid(FusedAlgorithm::kLamportOneStage, 4096, 8192, DType::kBF16, 4).blocks, kMaxBlocks);
  EXPECT_EQ(residual_rmsnorm_grid(100000, 8192, DType::kBF16).blocks, 8192);
}

// The RMSNorm tree of a bf16 row of H elements.
contract::RmsNormTree bf16_tree(int hidden) {
  contract::RmsNormTree tree;
  EXPECT_TRUE(contract::make_rmsnorm_tree<bf16>(hidden, &tree)) << hidden;
  return tree;
}

// The blocks that hold a lamport_one_stage row (core's lamport_register_blocks, at most a cluster of
// kMaxClusterBlocks): one where threads == lanes, a cluster of lanes / threads blocks (2 to 8) where
// threads divides the lanes and is a multiple of the warp, none (core's path) otherwise or where the
// row has more packs than lanes.
TEST(FusedTable, LamportRegisterBlocks) {
  auto blocks = [](int threads, int hidden) {
    return lamport_register_blocks(threads, bf16_tree(hidden), kMaxClusterBlocks);
  };
  EXPECT_EQ(blocks(1024, 8192), 1);  // 1 024 packs, 1 024 lanes
  EXPECT_EQ(blocks(512, 8192), 2);
  EXPECT_EQ(blocks(256, 8000), 4);  // 1 000 packs, 1 024 lanes
  EXPECT_EQ(blocks(128, 8192), 8);
  EXPECT_EQ(blocks(64, 8192), 0);   // 16 blocks: above the portable cluster
  EXPECT_EQ(blocks(192, 2880), 2);  // 360 packs, 384 lanes
  EXPECT_EQ(blocks(96, 2880), 4);
  EXPECT_EQ(blocks(384, 8192), 0);    // does not divide the lanes
  EXPECT_EQ(blocks(48, 768), 0);      // 96 lanes: 48 threads divide them, but not a multiple of the warp
  EXPECT_EQ(blocks(2048, 8192), 0);   // more threads than lanes
  EXPECT_EQ(blocks(512, 12000), 0);   // 1 500 packs, more than the 1 024 lanes
  EXPECT_EQ(blocks(1024, 16384), 0);  // 2 048 packs
  EXPECT_EQ(blocks(0, 8192), 0);
  // The launch: the cluster, and the blocks rounded up to whole clusters (at most kMaxBlocks).
  const LaunchConfig two = lamport_launch_grid(LaunchConfig{7, 512}, 8192, DType::kBF16);
  EXPECT_EQ(two.cluster, 2);
  EXPECT_EQ(two.blocks, 8);
  EXPECT_EQ(two.threads, 512);
  const LaunchConfig eight = lamport_launch_grid(LaunchConfig{kMaxBlocks - 1, 128}, 8192, DType::kBF16);
  EXPECT_EQ(eight.cluster, 8);
  EXPECT_EQ(eight.blocks, kMaxBlocks);
  const LaunchConfig fp32 = lamport_launch_grid(LaunchConfig{3, 256}, 4096, DType::kFP32);  // 1 024 lanes
  EXPECT_EQ(fp32.cluster, 4);
  EXPECT_EQ(fp32.blocks, 4);
  const LaunchConfig one = lamport_launch_grid(LaunchConfig{3, 384}, 2880, DType::kBF16);
  EXPECT_EQ(one.cluster, 1);
  EXPECT_EQ(one.blocks, 3);
  const LaunchConfig core = lamport_launch_grid(LaunchConfig{3, 64}, 8192, DType::kBF16);
  EXPECT_EQ(core.cluster, 1);
  EXPECT_EQ(core.blocks, 3);
  const LaunchConfig wide = lamport_launch_grid(LaunchConfig{5, 512}, 16384, DType::kBF16);  // 2 048 packs
  EXPECT_EQ(wide.cluster, 1);
  EXPECT_EQ(wide.blocks, 5);
  // Smaller rows: 128 packs on 64 threads (a cluster of 2); 40 packs, 64 lanes on 64 threads (one block).
  EXPECT_EQ(lamport_launch_grid(LaunchConfig{3, 64}, 128 * 8, DType::kBF16).cluster, 2);
  EXPECT_EQ(lamport_launch_grid(LaunchConfig{3, 64}, 40 * 8, DType::kBF16).cluster, 1);
  // Clusters that do not divide kMaxBlocks keep whole clusters: 5 blocks of 128 threads (H 5120 bf16,
  // 640 lanes) on a grid of 128 take 125 blocks; 7 (H 7168) 126; 6 (H 6144) 126; 3 (H 3072) 126.
  EXPECT_EQ(lamport_launch_grid(LaunchConfig{128, 128}, 5120, DType::kBF16).blocks, 125);
  EXPECT_EQ(lamport_launch_grid(LaunchConfig{127, 128}, 7168, DType::kBF16).blocks, 126);
  EXPECT_EQ(lamport_launch_grid(LaunchConfig{128, 128}, 6144, DType::kBF16).blocks, 126);
  EXPECT_EQ(lamport_launch_grid(LaunchConfig{128, 128}, 3072, DType::kBF16).blocks, 126);
  // A cluster in the grid given is not kept where the threads make none.
  LaunchConfig stale{8, 384};
  stale.cluster = 8;
  EXPECT_EQ(lamport_launch_grid(stale, 2880, DType::kBF16).cluster, 1);
}

// Every grid a caller may give (1..kMaxBlocks blocks, a multiple of 32 threads in 64..1024) on every
// row of bf16 and fp32 up to H 16384: the launch holds whole clusters within kMaxBlocks, its cluster
// is lamport_register_blocks of the contract's tree (the kernel's own test), and it never drops
// blocks below the grid's unless kMaxBlocks forces it.
TEST(FusedTable, LamportLaunchGridHoldsWholeClustersForEveryGrid) {
  int clustered = 0;
  for (DType dtype : {DType::kBF16, DType::kFP32}) {
    const int pack = dtype == DType::kBF16 ? 8 : 4;
    for (int hidden = pack; hidden <= 16384; hidden += pack) {
      contract::RmsNormTree tree;
      if (dtype == DType::kBF16) {
        contract::make_rmsnorm_tree<bf16>(hidden, &tree);
      } else {
        contract::make_rmsnorm_tree<float>(hidden, &tree);
      }
      for (int threads = 64; threads <= 1024; threads += 32) {
        const int want = std::max(1, lamport_register_blocks(threads, tree, kMaxClusterBlocks));
        for (int blocks : {1, 2, 3, 5, 7, 63, 100, 121, 125, 126, 127, kMaxBlocks}) {
          const LaunchConfig g = lamport_launch_grid(LaunchConfig{blocks, threads}, hidden, dtype);
          ASSERT_EQ(g.cluster, want) << hidden << " " << threads << " " << blocks;
          ASSERT_EQ(g.blocks % g.cluster, 0) << hidden << " " << threads << " " << blocks;
          ASSERT_LE(g.blocks, kMaxBlocks);
          ASSERT_GE(g.blocks, std::min(blocks, kMaxBlocks / g.cluster * g.cluster));
          ASSERT_EQ(g.threads, threads);
          if (g.cluster > 1) ++clustered;
        }
      }
    }
  }
  EXPECT_GT(clustered, 0);
}

TEST(FusedTable, RoundTripsThroughText) {
  const FusedTable t = FusedTable::parse(kTable, "t");
  const FusedTable back = FusedTable::parse(t.to_text({"header"}), "back");
  ASSERT_EQ(back.rows().size(), t.rows().size());
  for (size_t i = 0; i < t.rows().size(); ++i) {
    EXPECT_EQ(back.rows()[i].algo, t.rows()[i].algo);
    EXPECT_EQ(back.rows()[i].rows, t.rows()[i].rows);
    EXPECT_EQ(back.rows()[i].row_bytes, t.rows()[i].row_bytes);
    EXPECT_EQ(back.rows()[i].grid.blocks, t.rows()[i].grid.blocks);
    EXPECT_DOUBLE_EQ(back.rows()[i].time_us, t.rows()[i].time_us);
  }
}

// measured_on, the optional 9th column (cuda_backend/tsv.h, as in the all-reduce table).
TEST(FusedTable, MeasuredOnIsAnOptionalNinthColumn) {
  const FusedTable t = FusedTable::parse(
      "sm90\t4\t16384\t1\tone_stage\t1\t1024\t7.5\n"
      "sm90\t4\t16384\t1\tgather_norm\t1\t1024\t9.0\tnvidia-h200-x4 2026-11-21\n",
      "m");
  ASSERT_EQ(t.rows().size(), 2u);
  EXPECT_EQ(t.rows()[0].measured_on, "");
  EXPECT_EQ(t.rows()[1].measured_on, "nvidia-h200-x4 2026-11-21");
  const std::string text = t.to_text({"header"});
  EXPECT_NE(text.find("# arch\tworld_size\trow_bytes\trows\talgo\tblocks\tthreads\ttime_us\tmeasured_on\n"),
            std::string::npos)
      << text;
  const FusedTable back = FusedTable::parse(text, "back");
  ASSERT_EQ(back.rows().size(), 2u);
  EXPECT_EQ(back.rows()[0].measured_on, "");
  EXPECT_EQ(back.rows()[1].measured_on, "nvidia-h200-x4 2026-11-21");
  try {
    FusedTable::parse("# ok\nsm90\t4\t16384\t1\tone_stage\t1\t1024\t7.5\tnvidia-h200-x4 2026-11-21\tx\n", "f.tsv");
    ADD_FAILURE() << "10 fields accepted";
  } catch (const FusedTableError& e) {
    EXPECT_NE(std::string(e.what()).find("f.tsv:2: expected 8 or 9 tab-separated fields, got 10"), std::string::npos)
        << e.what();
  }
}

TEST(FusedTable, RejectsMalformedLinesNamingThem) {
  const std::string bad[] = {
      "sm90\t4\t16384\t1\tone_stage\t1\t1024\n",        // 7 fields
      "sm90\t0\t16384\t1\tone_stage\t1\t1024\t1\n",     // world size
      "sm90\t4\t100\t1\tone_stage\t1\t1024\t1\n",       // row bytes not a multiple of 16
      "sm90\t4\t16384\t0\tone_stage\t1\t1024\t1\n",     // rows
      "sm90\t4\t16384\t1\tnccl_split\t1\t1024\t1\n",    // not an IPC algorithm
      "sm90\t4\t16384\t1\tauto\t1\t1024\t1\n",          // auto is not a measurement
      "sm90\t4\t16384\t1\tone_stage\t129\t1024\t1\n",   // too many blocks for a barrier kernel (kMaxBlocks 128)
      "sm90\t4\t16384\t1\tone_stage\t1\t1000\t1\n",     // threads not a multiple of 32
      "sm90\t4\t16384\t1\tone_stage\t1\t1024\t-3\n",    // time
      "sm90\t4\t16384\t1\tone_stage\t1\t1024\tfast\n",  // time
      "sm90\t4\t16384\t1\tone_stage\t1\t1024\t1\tnvidia-h200-x4\t2026-11-21\n",  // a tab in measured_on
  };
  for (const std::string& line : bad) {
    try {
      FusedTable::parse("# ok\n" + line, "file.tsv");
      ADD_FAILURE() << "accepted: " << line;
    } catch (const FusedTableError& e) {
      EXPECT_NE(std::string(e.what()).find("file.tsv:2:"), std::string::npos) << e.what();
    }
  }
}

TEST(FusedTable, NamesRoundTrip) {
  for (FusedAlgorithm a : {FusedAlgorithm::kOneStage, FusedAlgorithm::kOneStageReg, FusedAlgorithm::kPushOneStage,
                           FusedAlgorithm::kTwoStage, FusedAlgorithm::kGatherNorm, FusedAlgorithm::kUnfused,
                           FusedAlgorithm::kAuto, FusedAlgorithm::kNcclSplit}) {
    EXPECT_EQ(parse_fused_algorithm(fused_algorithm_name(a)), a);
  }
  EXPECT_EQ(std::string(fused_algorithm_name(FusedAlgorithm::kPushOneStage)), "push_one_stage");
  EXPECT_TRUE(is_fused_kernel(FusedAlgorithm::kPushOneStage));
  EXPECT_FALSE(parse_fused_algorithm("one_shot").has_value());
}

TEST(FusedTable, TheEmbeddedTableParses) {
  const FusedTable& t = FusedTable::embedded();
  ASSERT_FALSE(t.rows().empty());
  for (const auto& r : t.rows()) {
    EXPECT_EQ(r.arch, "sm90");
    EXPECT_GT(r.time_us, 0);
    // Every row says where and when it was measured: "nvidia-h200-x4 2026-11-21".
    const size_t space = r.measured_on.rfind(' ');
    ASSERT_NE(space, std::string::npos) << "no measured_on: " << r.world_size << " " << r.row_bytes << " " << r.rows;
    EXPECT_GT(space, 0u);
    EXPECT_EQ(r.measured_on.size() - space - 1, 10u) << r.measured_on;  // YYYY-MM-DD
  }
}

// The embedded table (measured, tuning/fused_sm90.tsv): at every measured point of bf16 on 2 and
// 4 GPUs, auto runs an algorithm with the smallest measured time there (one of them where two tie),
// and push_one_stage is among the measured algorithms (so the table was re-tuned with it).
TEST(FusedTable, TheEmbeddedTableRunsTheFastestMeasuredAlgorithm) {
  const FusedTable& t = FusedTable::embedded();
  int points = 0, push_rows = 0;
  for (const auto& r : t.rows()) {
    if (r.algo == FusedAlgorithm::kPushOneStage) ++push_rows;
    if (r.world_size != 2 && r.world_size != 4) continue;
    const int hidden = static_cast<int>(r.row_bytes / 2);  // bf16
    auto at_point = [&](const FusedTableRow& q) {
      return q.arch == r.arch && q.world_size == r.world_size && q.row_bytes == r.row_bytes && q.rows == r.rows;
    };
    double best = r.time_us;
    for (const auto& q : t.rows()) {
      if (at_point(q) && q.time_us < best) best = q.time_us;
    }
    const FusedChoice c = t.choose("sm90", r.world_size, r.rows, hidden, DType::kBF16, FusedAlgorithm::kAuto);
    double chosen_us = -1.0;
    for (const auto& q : t.rows()) {
      if (at_point(q) && q.algo == c.algo) chosen_us = q.time_us;
    }
    EXPECT_EQ(chosen_us, best) << r.world_size << " GPUs, row_bytes " << r.row_bytes << ", rows " << r.rows << ": auto "
                               << fused_algorithm_name(c.algo);
    EXPECT_TRUE(c.from_table);
    ++points;
  }
  EXPECT_GT(points, 0);
  EXPECT_GT(push_rows, 0);
}

}  // namespace
}  // namespace exactcoll::cuda::fused
