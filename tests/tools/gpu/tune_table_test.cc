// tools/gpu/tune_table.h: what `exactcoll tune` writes over an existing table: rows outside the
// run's (arch, world size, ops, size range) kept with their measured_on, the run's rows added, the
// run's header lines first and the file's other comment lines kept in order.
#include "tools/gpu/tune_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_backend/tsv.h"

namespace exactcoll::gpu {
namespace {

using cuda::Algorithm;
using cuda::Op;
using cuda::TableRow;

const char* kExisting =
    "# exactcoll dispatch table (cuda_backend/dispatch_table.h): written by `exactcoll tune`.\n"
    "# last tuned 2026-11-21 (4 x NVIDIA H200, nvidia-h200-x4); world sizes in this file: 2, 4.\n"
    "# time_us = max over ranks of the median per-op time, CUDA graph of 10 ops, bf16, registered inputs.\n"
    "# world size 2: rows re-tuned 2026-11-21 on nvidia-h200-x4\n"
    "#   (a note of two lines)\n"
    "# arch\tworld_size\top\tbytes\talgo\tblocks\tthreads\ttime_us\n"
    "sm90\t2\tallreduce\t1024\tone_shot\t1\t256\t5.28\n"
    "sm90\t2\tallreduce\t1024\tpush_one_shot\t1\t256\t3.86\tnvidia-h200-x4 2026-11-21\n"
    "sm90\t2\tallreduce\t2097152\ttwo_shot\t64\t1024\t14.40\tnvidia-h200-x4 2026-11-21\n"
    "sm90\t2\treduce_scatter\t1024\tdirect\t1\t256\t4.00\n"
    "sm90\t4\tallreduce\t1024\tone_shot\t1\t256\t5.53\tnvidia-h200-x4 2026-11-21\n";

TuneRun two_gpus_up_to_1_mib() {
  TuneRun run;
  run.arch = "sm90";
  run.world_size = 2;
  run.ops = {Op::kAllReduce};
  run.min_bytes = 1024;
  run.max_bytes = 1 << 20;
  run.measured_on = "nvidia-h100-x4 2026-11-27";
  run.device_name = "NVIDIA H100 80GB HBM3";
  return run;
}

std::vector<TableRow> new_rows(const TuneRun& run) {
  TableRow r;
  r.arch = "sm90";
  r.world_size = 2;
  r.op = Op::kAllReduce;
  r.bytes = 1024;
  r.algo = Algorithm::kLamportOneShot;
  r.grid = {1, 256};
  r.time_us = 3.06;
  r.measured_on = run.measured_on;
  return {r};
}

TEST(TuneTable, ReplacesOnlyTheRunsRowsAndKeepsTheRest) {
  const TuneRun run = two_gpus_up_to_1_mib();
  const TunedTable t = tuned_table(kExisting, "old.tsv", run, new_rows(run));
  const cuda::DispatchTable table = cuda::DispatchTable::parse(t.text, "new.tsv");
  ASSERT_EQ(t.rows, 4u);
  ASSERT_EQ(table.rows().size(), 4u);
  // Sorted by (arch, world size, op, bytes): the new 1 KiB row, the kept 2 MiB row, reduce_scatter
  // (another op), 4 GPUs (another world size), each with its own measured_on.
  EXPECT_EQ(table.rows()[0].algo, Algorithm::kLamportOneShot);
  EXPECT_EQ(table.rows()[0].measured_on, "nvidia-h100-x4 2026-11-27");
  EXPECT_EQ(table.rows()[1].bytes, 2097152u);
  EXPECT_EQ(table.rows()[1].measured_on, "nvidia-h200-x4 2026-11-21");
  EXPECT_EQ(table.rows()[2].op, Op::kReduceScatter);
  EXPECT_EQ(table.rows()[2].measured_on, "");
  EXPECT_EQ(table.rows()[3].world_size, 4);
  EXPECT_EQ(table.rows()[3].measured_on, "nvidia-h200-x4 2026-11-21");
  // The run's header lines, then the file's own notes in order; the old 'last tuned', 'time_us'
  // and column lines are not repeated.
  EXPECT_EQ(cuda::tsv_comments(t.text),
            (std::vector<std::string>{
                "exactcoll dispatch table (cuda_backend/dispatch_table.h): written by `exactcoll tune`.",
                "last tuned on nvidia-h100-x4 2026-11-27 (2 x NVIDIA H100 80GB HBM3): allreduce 1024 .. 1048576 "
                "bytes; world sizes in this file: 2, 4.",
                "time_us = max over ranks of the median per-op time, CUDA graph of 10 ops, bf16, registered inputs.",
                "world size 2: rows re-tuned 2026-11-21 on nvidia-h200-x4",
                "  (a note of two lines)",
                "arch\tworld_size\top\tbytes\talgo\tblocks\tthreads\ttime_us\tmeasured_on",
            }));
  // Tuning again over the result keeps the notes once.
  EXPECT_EQ(tuned_table(t.text, "new.tsv", run, new_rows(run)).text, t.text);
}

TEST(TuneTable, WithoutAFileOnlyTheRunsRows) {
  const TuneRun run = two_gpus_up_to_1_mib();
  const TunedTable t = tuned_table("", "none.tsv", run, new_rows(run));
  EXPECT_EQ(t.rows, 1u);
  EXPECT_EQ(cuda::tsv_comments(t.text).size(), 4u);  // the run's 3 lines and the column line
}

TEST(TuneTable, AFileThatDoesNotParseIsAnError) {
  const TuneRun run = two_gpus_up_to_1_mib();
  try {
    tuned_table("# x\nsm90\t2\tallreduce\n", "bad.tsv", run, new_rows(run));
    ADD_FAILURE() << "accepted";
  } catch (const cuda::TableError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tsv:2:"), std::string::npos) << e.what();
  }
}

TEST(TuneTable, OwnCommentLines) {
  EXPECT_TRUE(is_tune_own_comment("last tuned 2026-11-21 (4 x NVIDIA H200, nvidia-h200-x4)"));
  EXPECT_TRUE(is_tune_own_comment("time_us = max over ranks"));
  EXPECT_TRUE(is_tune_own_comment("arch\tworld_size"));
  EXPECT_FALSE(is_tune_own_comment("world size 2: allreduce rows re-tuned"));
  EXPECT_FALSE(is_tune_own_comment("lamport_one_shot (core/lamport.h): rows since 2026-11-27"));
}

}  // namespace
}  // namespace exactcoll::gpu
