// The dispatch table: parsing (every malformed line named), lookup rules, writing, the embedded
// table, and the built-in heuristic. CPU only.
#include "cuda_backend/dispatch_table.h"

#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/lamport.h"
#include "cuda_backend/communicator_options.h"

namespace exactcoll::cuda {
namespace {

// A default communicator's Lamport region on 2 and 4 ranks (lamport_message_bytes 1 MiB: one slot
// of 1 MiB per rank and buffer).
const uint64_t kLamport2 = exactcoll::lamport_region_bytes(size_t{1} << 20, 1, 2);
const uint64_t kLamport4 = exactcoll::lamport_region_bytes(size_t{1} << 20, 1, 4);

const char* kTable =
    "# a comment\n"
    "sm90\t2\tallreduce\t1024\tone_shot\t2\t512\t5.00\n"
    "sm90\t2\tallreduce\t1024\ttwo_shot\t4\t256\t6.00\n"
    "sm90\t2\tallreduce\t1048576\tone_shot\t64\t512\t20.00\n"
    "sm90\t2\tallreduce\t1048576\ttwo_shot\t32\t1024\t12.50\n"
    "sm90\t4\treduce_scatter\t4096\tdirect\t8\t512\t7.00\n"
    "sm90\t4\tallgather\t4096\tdirect\t8\t512\t9.00\n"
    "sm90\t4\tallgather\t4096\tcopy_engine\t1\t64\t8.00\n";

TEST(DispatchTable, ParsesAndChoosesFastestForAuto) {
  const DispatchTable t = DispatchTable::parse(kTable, "t.tsv");
  ASSERT_EQ(t.rows().size(), 7u);
  // Small message: the 1024-byte rows; auto takes one_shot (5.00 < 6.00).
  Choice c = t.choose("sm90", 2, Op::kAllReduce, 512, Algorithm::kAuto);
  EXPECT_TRUE(c.from_table);
  EXPECT_EQ(c.algo, Algorithm::kOneShot);
  EXPECT_EQ(c.grid.blocks, 2);
  EXPECT_EQ(c.grid.threads, 512);
  // Exactly at a measured size.
  c = t.choose("sm90", 2, Op::kAllReduce, 1024, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kOneShot);
  // Between sizes: the next larger measured size (1 MiB), where two_shot is faster.
  c = t.choose("sm90", 2, Op::kAllReduce, 1025, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kTwoShot);
  EXPECT_EQ(c.grid.blocks, 32);
  EXPECT_EQ(c.grid.threads, 1024);
  // Beyond every row: the largest.
  c = t.choose("sm90", 2, Op::kAllReduce, uint64_t{1} << 30, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kTwoShot);
  // A named algorithm gets its own grid at that size.
  c = t.choose("sm90", 2, Op::kAllReduce, 1 << 20, Algorithm::kOneShot);
  EXPECT_EQ(c.algo, Algorithm::kOneShot);
  EXPECT_EQ(c.grid.blocks, 64);
  // All-gather: copy_engine is faster here.
  c = t.choose("sm90", 4, Op::kAllGather, 100, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kCopyEngine);
  c = t.choose("sm90", 4, Op::kReduceScatter, 100, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kDirect);
  EXPECT_EQ(c.grid.blocks, 8);
}

TEST(DispatchTable, FallsBackToTheHeuristicWithoutRows) {
  const DispatchTable t = DispatchTable::parse(kTable, "t.tsv");
  // No rows for 3 ranks, nor for sm80.
  for (const Choice& c : {t.choose("sm90", 3, Op::kAllReduce, 1024, Algorithm::kAuto),
                          t.choose("sm80", 2, Op::kAllReduce, 1024, Algorithm::kAuto)}) {
    EXPECT_FALSE(c.from_table);
    EXPECT_EQ(c.algo, Algorithm::kOneShot);
  }
  // The heuristic: two_shot for large messages on 4 ranks, one block per 512 packs, capped.
  Choice c = DispatchTable::default_choice(4, Op::kAllReduce, uint64_t{16} << 20, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kTwoShot);
  EXPECT_EQ(c.grid.blocks, kMaxBlocks);
  EXPECT_EQ(c.grid.threads, 512);
  c = DispatchTable::default_choice(4, Op::kAllReduce, 16, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kOneShot);
  EXPECT_EQ(c.grid.blocks, 1);
  c = DispatchTable::default_choice(2, Op::kAllGather, 4096, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kDirect);
}

TEST(DispatchTable, RoundTripsThroughText) {
  const DispatchTable t = DispatchTable::parse(kTable, "t.tsv");
  const std::string text = t.to_text({"header line"});
  EXPECT_EQ(text.rfind("# header line\n", 0), 0u);
  const DispatchTable again = DispatchTable::parse(text, "again");
  ASSERT_EQ(again.rows().size(), t.rows().size());
  for (size_t i = 0; i < t.rows().size(); ++i) {
    EXPECT_EQ(again.rows()[i].bytes, t.rows()[i].bytes);
    EXPECT_EQ(again.rows()[i].measured_on, "");
    EXPECT_EQ(again.rows()[i].algo, t.rows()[i].algo);
    EXPECT_EQ(again.rows()[i].grid.blocks, t.rows()[i].grid.blocks);
    EXPECT_DOUBLE_EQ(again.rows()[i].time_us, t.rows()[i].time_us);
  }
}

// measured_on, the optional 9th column: rows of 8 fields (older tables, users' files) have none;
// to_text writes it back, and the column's name in the header line.
TEST(DispatchTable, MeasuredOnIsAnOptionalNinthColumn) {
  const DispatchTable t = DispatchTable::parse(
      "sm90\t2\tallreduce\t1024\tone_shot\t2\t512\t5.00\n"
      "sm90\t2\tallreduce\t1024\ttwo_shot\t4\t256\t6.00\tnvidia-h100-x4 2026-11-27\n"
      "sm90\t2\tallreduce\t1024\tpush_one_shot\t1\t256\t4.00\tnvidia-h200-x4 2026-11-21\n",
      "m.tsv");
  ASSERT_EQ(t.rows().size(), 3u);
  EXPECT_EQ(t.rows()[0].measured_on, "");
  EXPECT_EQ(t.rows()[1].measured_on, "nvidia-h100-x4 2026-11-27");
  EXPECT_EQ(t.rows()[2].measured_on, "nvidia-h200-x4 2026-11-21");
  // measured_on says where a row came from; auto still takes the fastest row.
  EXPECT_EQ(t.choose("sm90", 2, Op::kAllReduce, 1024, Algorithm::kAuto).algo, Algorithm::kPushOneShot);
  const std::string text = t.to_text({"header line"});
  EXPECT_NE(text.find("# arch\tworld_size\top\tbytes\talgo\tblocks\tthreads\ttime_us\tmeasured_on\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sm90\t2\tallreduce\t1024\tone_shot\t2\t512\t5.00\n"), std::string::npos) << text;
  EXPECT_NE(text.find("sm90\t2\tallreduce\t1024\ttwo_shot\t4\t256\t6.00\tnvidia-h100-x4 2026-11-27\n"),
            std::string::npos)
      << text;
  const DispatchTable again = DispatchTable::parse(text, "again");
  ASSERT_EQ(again.rows().size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again.rows()[i].measured_on, t.rows()[i].measured_on);
  // to_text refuses what would not read back as one field.
  std::vector<TableRow> rows = t.rows();
  rows[0].measured_on = "nvidia-h100-x4\t2026-11-27";
  EXPECT_THROW(DispatchTable(rows).to_text({}), std::invalid_argument);
}

TEST(DispatchTable, NamesTheLineAndProblemOfMalformedInput) {
  struct Case {
    const char* line;
    const char* message;
  };
  const Case cases[] = {
      {"sm90\t2\tallreduce\t1024\tone_shot\t2\t512\n", "expected 8 or 9 tab-separated fields, got 7"},
      {"sm90\t2\tallreduce\t1024\tone_shot\t2\t512\t1\tnvidia-h100-x4 2026-11-27\textra\n",
       "expected 8 or 9 tab-separated fields, got 10"},
      // A tab inside measured_on splits it: one field too many.
      {"sm90\t2\tallreduce\t1024\tone_shot\t2\t512\t1\tnvidia-h100-x4\t2026-11-27\n",
       "expected 8 or 9 tab-separated fields, got 10"},
      {"sm90\t0\tallreduce\t1024\tone_shot\t2\t512\t1\n", "world_size must be 1..16"},
      {"sm90\t2\tbroadcast\t1024\tone_shot\t2\t512\t1\n", "unknown op 'broadcast'"},
      {"sm90\t2\tallreduce\t0\tone_shot\t2\t512\t1\n", "bytes must be a positive whole number"},
      {"sm90\t2\tallreduce\t-5\tone_shot\t2\t512\t1\n", "bytes must be a positive whole number"},
      {"sm90\t2\tallreduce\t1024\tdirect\t2\t512\t1\n", "not an IPC algorithm of allreduce"},
      {"sm90\t2\tallgather\t1024\tnccl\t2\t512\t1\n", "not an IPC algorithm of allgather"},
      {"sm90\t2\tallreduce\t1024\tone_shot\t129\t512\t1\n", "blocks must be 1..128"},
      {"sm90\t2\tallreduce\t1024\tone_shot\t2\t500\t1\n", "threads must be a multiple of 32"},
      {"sm90\t2\tallreduce\t1024\tone_shot\t2\t512\t-3\n", "time_us must be a positive number"},
  };
  for (const Case& c : cases) {
    const std::string text = std::string("# ok\n") + c.line;
    try {
      DispatchTable::parse(text, "bad.tsv");
      ADD_FAILURE() << "accepted: " << c.line;
    } catch (const TableError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("bad.tsv:2:"), std::string::npos) << what;
      EXPECT_NE(what.find(c.message), std::string::npos) << what;
    }
  }
}

// push_one_shot is an IPC algorithm of allreduce only; auto takes it where its row is fastest.
TEST(DispatchTable, PushOneShotRowsParseAndAutoPicksThemWhereFastest) {
  const DispatchTable t = DispatchTable::parse(
      "sm90\t4\tallreduce\t16384\tone_shot\t2\t512\t5.70\n"
      "sm90\t4\tallreduce\t16384\tpush_one_shot\t4\t256\t4.90\n"
      "sm90\t4\tallreduce\t4194304\tone_shot\t64\t512\t45.0\n"
      "sm90\t4\tallreduce\t4194304\ttwo_shot\t64\t512\t28.4\n"
      "sm90\t4\tallreduce\t4194304\tpush_one_shot\t64\t512\t40.0\n",
      "push.tsv");
  Choice c = t.choose("sm90", 4, Op::kAllReduce, 16384, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kPushOneShot);
  EXPECT_EQ(c.grid.blocks, 4);
  EXPECT_EQ(c.grid.threads, 256);
  c = t.choose("sm90", 4, Op::kAllReduce, 4194304, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kTwoShot);
  c = t.choose("sm90", 4, Op::kAllReduce, 4194304, Algorithm::kPushOneShot);
  EXPECT_EQ(c.algo, Algorithm::kPushOneShot);
  EXPECT_EQ(c.grid.blocks, 64);
  try {
    DispatchTable::parse("sm90\t4\treduce_scatter\t1024\tpush_one_shot\t2\t512\t1\n", "rs.tsv");
    ADD_FAILURE() << "push_one_shot accepted for reduce_scatter";
  } catch (const TableError& e) {
    EXPECT_NE(std::string(e.what()).find("not an IPC algorithm of reduce_scatter"), std::string::npos) << e.what();
  }
}

// push_two_shot is an IPC algorithm of allreduce only; auto takes it where its row is fastest.
TEST(DispatchTable, PushTwoShotRowsParseAndAutoPicksThemWhereFastest) {
  const DispatchTable t = DispatchTable::parse(
      "sm90\t4\tallreduce\t524288\tone_shot\t16\t512\t12.0\n"
      "sm90\t4\tallreduce\t524288\tpush_one_shot\t16\t512\t9.06\n"
      "sm90\t4\tallreduce\t524288\tpush_two_shot\t8\t1024\t6.90\n"
      "sm90\t4\tallreduce\t1048576\tpush_one_shot\t32\t512\t14.0\n"
      "sm90\t4\tallreduce\t1048576\tpush_two_shot\t32\t512\t15.0\n",
      "push2.tsv");
  Choice c = t.choose("sm90", 4, Op::kAllReduce, 524288, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kPushTwoShot);
  EXPECT_EQ(c.grid.blocks, 8);
  EXPECT_EQ(c.grid.threads, 1024);
  c = t.choose("sm90", 4, Op::kAllReduce, 1048576, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kPushOneShot);
  c = t.choose("sm90", 4, Op::kAllReduce, 1048576, Algorithm::kPushTwoShot);
  EXPECT_EQ(c.algo, Algorithm::kPushTwoShot);
  EXPECT_EQ(c.grid.blocks, 32);
  try {
    DispatchTable::parse("sm90\t4\tallgather\t1024\tpush_two_shot\t2\t512\t1\n", "ag.tsv");
    ADD_FAILURE() << "push_two_shot accepted for allgather";
  } catch (const TableError& e) {
    EXPECT_NE(std::string(e.what()).find("not an IPC algorithm of allgather"), std::string::npos) << e.what();
  }
}

// lamport_one_shot and lamport_two_shot are IPC algorithms of allreduce only: a table can name
// them, and auto takes them where their row is fastest.
TEST(DispatchTable, LamportRowsParseAndAutoPicksThemWhereFastest) {
  const DispatchTable t = DispatchTable::parse(
      "sm90\t2\tallreduce\t16384\tone_shot\t2\t256\t5.0\n"
      "sm90\t2\tallreduce\t16384\tlamport_one_shot\t4\t512\t2.9\n"
      "sm90\t2\tallreduce\t16384\tlamport_two_shot\t2\t256\t3.1\n"
      "sm90\t2\tallreduce\t65536\tlamport_one_shot\t8\t512\t4.0\n"
      "sm90\t2\tallreduce\t65536\tlamport_two_shot\t4\t1024\t3.5\n"
      "sm90\t2\tallreduce\t524288\tone_shot\t16\t512\t8.0\n"
      "sm90\t2\tallreduce\t524288\tlamport_one_shot\t32\t512\t9.0\n"
      "sm90\t2\tallreduce\t524288\tlamport_two_shot\t16\t256\t8.5\n",
      "lamport.tsv");
  ASSERT_EQ(t.rows().size(), 8u);
  Choice c = t.choose("sm90", 2, Op::kAllReduce, 16384, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kLamportOneShot);
  EXPECT_EQ(c.grid.blocks, 4);
  c = t.choose("sm90", 2, Op::kAllReduce, 65536, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kLamportTwoShot);
  EXPECT_EQ(c.grid.blocks, 4);
  EXPECT_EQ(c.grid.threads, 1024);
  EXPECT_TRUE(c.from_table);
  c = t.choose_allreduce_auto("sm90", 2, 65536 / 2, 2, 128 << 20, kLamport2);  // fits: as measured
  EXPECT_EQ(c.algo, Algorithm::kLamportTwoShot);
  EXPECT_EQ(c.grid.blocks, 4);
  c = t.choose("sm90", 2, Op::kAllReduce, 524288, Algorithm::kAuto);
  EXPECT_EQ(c.algo, Algorithm::kOneShot);
  c = t.choose("sm90", 2, Op::kAllReduce, 524288, Algorithm::kLamportOneShot);
  EXPECT_EQ(c.algo, Algorithm::kLamportOneShot);
  EXPECT_EQ(c.grid.blocks, 32);
  c = t.choose("sm90", 2, Op::kAllReduce, 524288, Algorithm::kLamportTwoShot);
  EXPECT_EQ(c.algo, Algorithm::kLamportTwoShot);
  EXPECT_EQ(c.grid.blocks, 16);
  EXPECT_EQ(c.grid.threads, 256);
  EXPECT_STREQ(algorithm_name(Algorithm::kLamportOneShot), "lamport_one_shot");
  EXPECT_STREQ(algorithm_name(Algorithm::kLamportTwoShot), "lamport_two_shot");
  const DispatchTable back = DispatchTable::parse(t.to_text({}), "back.tsv");
  ASSERT_EQ(back.rows().size(), t.rows().size());
  EXPECT_EQ(back.choose("sm90", 2, Op::kAllReduce, 65536, Algorithm::kAuto).algo, Algorithm::kLamportTwoShot);
  for (const char* name : {"lamport_one_shot", "lamport_two_shot"}) {
    for (const char* op : {"allgather", "reduce_scatter"}) {
      try {
        DispatchTable::parse(std::string("sm90\t4\t") + op + "\t1024\t" + name + "\t2\t512\t1\n", "ag.tsv");
        ADD_FAILURE() << name << " accepted for " << op;
      } catch (const TableError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string("not an IPC algorithm of ") + op), std::string::npos)
            << e.what();
      }
    }
  }
}

// A push algorithm whose 2 x n slots do not fit the scratch runs in chunks; auto prices it as those
// chunks (measured time at the chunk's size x chunks) against the other algorithms' whole-message
// time, and uses the grid measured at the chunk's size. Numbers from the 4-GPU run of 2026-11-21.
TEST(DispatchTable, AutoPricesAPushAlgorithmThatDoesNotFitAsItsChunks) {
  const DispatchTable t = DispatchTable::parse(
      "sm90\t4\tallreduce\t16777216\ttwo_shot\t128\t256\t88.0\n"
      "sm90\t4\tallreduce\t16777216\tpush_two_shot\t128\t256\t80.5\n"
      "sm90\t4\tallreduce\t33554432\ttwo_shot\t64\t512\t166.0\n"
      "sm90\t4\tallreduce\t33554432\tpush_two_shot\t128\t512\t153.9\n"
      "sm90\t4\tallreduce\t67108864\ttwo_shot\t128\t256\t318.0\n"
      "sm90\t4\tallreduce\t67108864\tpush_two_shot\t128\t512\t303.3\n",
      "chunks.tsv");
  const uint64_t mib = 1 << 20;
  // bf16 on 4 ranks: a push call of c elements needs 2 x 4 x c x 2 bytes, so 128 MiB holds
  // 16 MiB messages whole and runs 32 MiB as 2 chunks of 16 MiB, 64 MiB as 4.
  EXPECT_TRUE(push_fits(8 * mib, 2, 4, 128 * mib));
  EXPECT_FALSE(push_fits(8 * mib + 64, 2, 4, 128 * mib));
  EXPECT_EQ(push_chunk_elements(2, 4, 128 * mib), 8 * mib);
  EXPECT_EQ(push_chunk_elements(2, 4, 1000), 64u);  // never below 64 elements
  EXPECT_EQ(push_chunk_elements(2, 3, 100000), 100000u / 2 / 6 / 64 * 64);
  // Fits: the table's choice as measured.
  Choice c = t.choose_allreduce_auto("sm90", 4, 16 * mib, 2, 512 * mib, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kPushTwoShot);
  EXPECT_EQ(c.grid.threads, 512);
  // 32 MiB on 128 MiB: 2 x 80.5 = 161 us beats two_shot's 166; the 16 MiB row's grid.
  c = t.choose_allreduce_auto("sm90", 4, 16 * mib, 2, 128 * mib, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kPushTwoShot);
  EXPECT_EQ(c.grid.blocks, 128);
  EXPECT_EQ(c.grid.threads, 256);
  // 64 MiB on 128 MiB: 4 x 80.5 = 322 us loses to two_shot's 318.
  c = t.choose_allreduce_auto("sm90", 4, 32 * mib, 2, 128 * mib, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kTwoShot);
  EXPECT_EQ(c.grid.blocks, 128);
  EXPECT_EQ(c.grid.threads, 256);
  // A table with gaps: at 64 MiB only push_two_shot has a row, and at 16 MiB (the chunk on 128 MiB)
  // no push algorithm has one, so nothing can be priced: two_shot (the push algorithm's sibling)
  // runs instead, never a push algorithm that does not fit.
  const DispatchTable gaps = DispatchTable::parse(
      "sm90\t4\tallreduce\t16777216\tone_shot\t64\t512\t160.0\n"
      "sm90\t4\tallreduce\t67108864\tpush_two_shot\t128\t512\t303.3\n",
      "gaps.tsv");
  c = gaps.choose_allreduce_auto("sm90", 4, 32 * mib, 2, 512 * mib, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kPushTwoShot);  // fits 512 MiB: as measured
  c = gaps.choose_allreduce_auto("sm90", 4, 32 * mib, 2, 128 * mib, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kTwoShot);
  EXPECT_FALSE(c.from_table);  // no two_shot row either: the heuristic's grid
  // Without rows for the world size: the heuristic, never a push algorithm.
  c = t.choose_allreduce_auto("sm90", 2, 32 * mib, 2, 128 * mib, kLamport2);
  EXPECT_FALSE(c.from_table);
  EXPECT_NE(c.algo, Algorithm::kPushOneShot);
  EXPECT_NE(c.algo, Algorithm::kPushTwoShot);
}

// lamport_one_shot runs in one launch only where the message fits one slot of the communicator's
// Lamport region (tune measures it only there); auto takes it only there and prices the other
// algorithms where it does not. Numbers from the 4-GPU run of 2026-11-27.
TEST(DispatchTable, AutoTakesLamportOnlyWhereTheMessageFitsOneLamportSlot) {
  const DispatchTable t = DispatchTable::parse(
      "sm90\t4\tallreduce\t16384\tone_shot\t4\t256\t8.24\n"
      "sm90\t4\tallreduce\t16384\tpush_one_shot\t4\t256\t5.22\n"
      "sm90\t4\tallreduce\t16384\tlamport_one_shot\t4\t256\t4.60\n",
      "lamport_slot.tsv");
  const uint64_t count = 8192;  // 16 KiB of bf16
  // A default communicator (1 MiB slots): as measured.
  Choice c = t.choose_allreduce_auto("sm90", 4, count, 2, 128 << 20, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kLamportOneShot);
  EXPECT_EQ(c.grid.blocks, 4);
  // A slot of exactly 16 KiB still holds it; 16 bytes less does not: push_one_shot, its grid.
  c = t.choose_allreduce_auto("sm90", 4, count, 2, 128 << 20, exactcoll::lamport_region_bytes(16384, 1, 4));
  EXPECT_EQ(c.algo, Algorithm::kLamportOneShot);
  c = t.choose_allreduce_auto("sm90", 4, count, 2, 128 << 20, exactcoll::lamport_region_bytes(16384 - 16, 1, 4));
  EXPECT_EQ(c.algo, Algorithm::kPushOneShot);
  EXPECT_EQ(c.grid.blocks, 4);
  EXPECT_TRUE(c.from_table);
  // No Lamport region and a scratch of 4 KiB (push in 32 chunks of 256 elements, 32 x 5.22 us):
  // one_shot.
  c = t.choose_allreduce_auto("sm90", 4, count, 2, 4096, 0);
  EXPECT_EQ(c.algo, Algorithm::kOneShot);
  // A table with only lamport rows there: one_shot in its place (the heuristic's grid).
  const DispatchTable only =
      DispatchTable::parse("sm90\t4\tallreduce\t16384\tlamport_one_shot\t4\t256\t4.60\n", "l.tsv");
  EXPECT_EQ(only.choose_allreduce_auto("sm90", 4, count, 2, 128 << 20, kLamport4).algo, Algorithm::kLamportOneShot);
  c = only.choose_allreduce_auto("sm90", 4, count, 2, 128 << 20, 0);
  EXPECT_EQ(c.algo, Algorithm::kOneShot);
  EXPECT_FALSE(c.from_table);
  // choose (a named algorithm, or auto with no communicator in view) is not limited.
  EXPECT_EQ(t.choose("sm90", 4, Op::kAllReduce, 16384, Algorithm::kAuto).algo, Algorithm::kLamportOneShot);
}

// lamport_two_shot writes two strides (its longest slice, about 1/n of the message) into each
// slot, so it fits messages up to about n/2 slots, where lamport_one_shot fits one: auto takes it
// only where lamport_fits(kLamportTwoShot, ...) holds for the communicator's region, and prices the
// other algorithms where it does not.
TEST(DispatchTable, AutoTakesLamportTwoShotOnlyWhereTheMessageFitsItsSlots) {
  using exactcoll::lamport_fits;
  const uint64_t mib = 1 << 20;
  // A default communicator (1 MiB slots): bf16 messages of n/2 MiB fit two_shot, 16 bytes more do
  // not; one_shot fits 1 MiB whatever n.
  for (const int n : {2, 4, 8}) {
    const uint64_t region = exactcoll::lamport_region_bytes(size_t{1} << 20, 1, n);
    const uint64_t count = static_cast<uint64_t>(n) / 2 * mib / 2;
    EXPECT_TRUE(lamport_fits(Algorithm::kLamportTwoShot, count, 2, n, region)) << n;
    EXPECT_FALSE(lamport_fits(Algorithm::kLamportTwoShot, count + 8, 2, n, region)) << n;
    EXPECT_TRUE(lamport_fits(Algorithm::kLamportOneShot, mib / 2, 2, n, region)) << n;
    EXPECT_FALSE(lamport_fits(Algorithm::kLamportOneShot, mib / 2 + 8, 2, n, region)) << n;
  }
  const DispatchTable t = DispatchTable::parse(
      "sm90\t4\tallreduce\t16384\tone_shot\t4\t256\t8.24\n"
      "sm90\t4\tallreduce\t16384\tlamport_one_shot\t4\t256\t4.60\n"
      "sm90\t4\tallreduce\t16384\tlamport_two_shot\t2\t512\t4.10\n"
      "sm90\t4\tallreduce\t2097152\ttwo_shot\t32\t512\t30.0\n"
      "sm90\t4\tallreduce\t2097152\tpush_two_shot\t32\t512\t20.0\n"
      "sm90\t4\tallreduce\t2097152\tlamport_one_shot\t16\t512\t12.0\n"
      "sm90\t4\tallreduce\t2097152\tlamport_two_shot\t8\t1024\t14.0\n",
      "lamport_two_shot.tsv");
  // 16 KiB of bf16 on a default communicator: both fit, lamport_two_shot is the fastest.
  Choice c = t.choose_allreduce_auto("sm90", 4, 8192, 2, 128 * mib, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kLamportTwoShot);
  EXPECT_EQ(c.grid.blocks, 2);
  EXPECT_EQ(c.grid.threads, 512);
  EXPECT_TRUE(c.from_table);
  // A region whose slots hold exactly two strides of 8192 elements (2 x 2048 x 2 bytes: 8 KiB, half
  // of one_shot's need) still takes lamport_two_shot; 16 bytes less per slot holds neither Lamport
  // algorithm: one_shot, its row.
  const uint64_t exact = exactcoll::lamport_region_bytes(Algorithm::kLamportTwoShot, 8192, 2, 4);
  EXPECT_EQ(exact, 3u * 4u * 8192u);
  c = t.choose_allreduce_auto("sm90", 4, 8192, 2, 128 * mib, exact);
  EXPECT_EQ(c.algo, Algorithm::kLamportTwoShot);
  c = t.choose_allreduce_auto("sm90", 4, 8192, 2, 128 * mib, exact - 3 * 4 * 16);
  EXPECT_EQ(c.algo, Algorithm::kOneShot);
  EXPECT_EQ(c.grid.blocks, 4);
  EXPECT_TRUE(c.from_table);
  // 2 MiB of bf16 on 4 GPUs, 1 MiB slots: lamport_one_shot (the fastest row) does not fit, but
  // lamport_two_shot does (two strides of 262144 elements: exactly 1 MiB), and beats push_two_shot.
  c = t.choose_allreduce_auto("sm90", 4, mib, 2, 128 * mib, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kLamportTwoShot);
  EXPECT_EQ(c.grid.blocks, 8);
  EXPECT_EQ(c.grid.threads, 1024);
  // One pack more (its last slice a pack longer: two strides of 1 MiB + 32 bytes): push_two_shot.
  c = t.choose_allreduce_auto("sm90", 4, mib + 8, 2, 128 * mib, kLamport4);
  EXPECT_EQ(c.algo, Algorithm::kPushTwoShot);
  EXPECT_EQ(c.grid.blocks, 32);
  // No Lamport region: push_two_shot.
  EXPECT_EQ(t.choose_allreduce_auto("sm90", 4, mib, 2, 128 * mib, 0).algo, Algorithm::kPushTwoShot);
  // A table with only lamport_two_shot rows there and no region: two_shot in its place (the
  // heuristic's grid), not one_shot.
  const DispatchTable only =
      DispatchTable::parse("sm90\t4\tallreduce\t16384\tlamport_two_shot\t2\t512\t4.10\n", "l2.tsv");
  EXPECT_EQ(only.choose_allreduce_auto("sm90", 4, 8192, 2, 128 * mib, kLamport4).algo, Algorithm::kLamportTwoShot);
  c = only.choose_allreduce_auto("sm90", 4, 8192, 2, 128 * mib, 0);
  EXPECT_EQ(c.algo, Algorithm::kTwoShot);
  EXPECT_FALSE(c.from_table);
  // choose (a named algorithm, or auto with no communicator in view) is not limited.
  EXPECT_EQ(t.choose("sm90", 4, Op::kAllReduce, 2 * mib, Algorithm::kLamportTwoShot).algo, Algorithm::kLamportTwoShot);
}

TEST(DispatchTable, EmbeddedTableParses) {
  // The repo's cuda_backend/tuning/sm90.tsv, compiled in; every row must be usable and say where
  // and when it was measured ("nvidia-h100-x4 2026-11-27": a machine, a space, a UTC date).
  const DispatchTable& t = DispatchTable::embedded();
  ASSERT_FALSE(t.rows().empty());
  for (const TableRow& r : t.rows()) {
    EXPECT_EQ(r.arch, "sm90");
    EXPECT_GE(r.grid.blocks, 1);
    EXPECT_LE(r.grid.blocks, kMaxBlocks);
    const std::string& on = r.measured_on;
    const size_t space = on.rfind(' ');
    ASSERT_NE(space, std::string::npos) << "no measured_on: " << r.world_size << " " << r.bytes;
    EXPECT_GT(space, 0u) << on;
    const std::string date = on.substr(space + 1);
    EXPECT_EQ(date.size(), 10u) << on;
    EXPECT_EQ(date.substr(0, 3), "202") << on;
    EXPECT_EQ(date[4], '-') << on;
    EXPECT_EQ(date[7], '-') << on;
  }
}

// The embedded table's choices for all-reduce on a default communicator (128 MiB buffers, 1 MiB
// Lamport slots; cuda_backend/communicator_options.h). At every measured size of 1 KiB .. 2 MiB
// (the rows measured on nvidia-h100-x4 on 2026-11-27) auto runs the fastest row there (tune
// measured a Lamport algorithm only where it fits one launch, so every fastest row runs as
// measured); and a Lamport algorithm is that row: on 4 GPUs lamport_one_shot up to 512 KiB and
// lamport_two_shot at 1 and 2 MiB (one launch: lamport_launch_elements), on 2 GPUs
// lamport_one_shot up to 1 MiB.
TEST(DispatchTable, EmbeddedTableAutoRunsTheFastestRowAndLamportWhereItWins) {
  const DispatchTable& t = DispatchTable::embedded();
  const CommunicatorOptions defaults;
  const uint64_t kib = 1024, mib = 1 << 20;
  auto lamport_region = [&](int n, size_t message_bytes) {
    return exactcoll::lamport_region_bytes(message_bytes, 1, n);
  };
  auto auto_for = [&](int n, uint64_t bytes, size_t lamport_message_bytes) {
    return t.choose_allreduce_auto("sm90", n, bytes / 2, 2, defaults.buffer_bytes,
                                   lamport_region(n, lamport_message_bytes));
  };
  auto lamport_expected = [&](int n, uint64_t bytes) -> std::optional<Algorithm> {
    if (n == 4 && bytes <= 512 * kib) return Algorithm::kLamportOneShot;
    if (n == 4 && bytes <= 2 * mib) return Algorithm::kLamportTwoShot;
    if (n == 2 && bytes <= mib) return Algorithm::kLamportOneShot;
    return std::nullopt;
  };
  int sizes = 0;
  for (int n : {2, 4}) {
    for (uint64_t bytes = kib; bytes <= 2 * mib; bytes *= 2) {
      const TableRow* fastest = nullptr;
      for (const TableRow& r : t.rows()) {
        if (r.world_size == n && r.op == Op::kAllReduce && r.bytes == bytes &&
            (fastest == nullptr || r.time_us < fastest->time_us)) {
          fastest = &r;
        }
      }
      ASSERT_NE(fastest, nullptr) << n << " GPUs, " << bytes << " bytes";
      EXPECT_EQ(fastest->measured_on, "nvidia-h100-x4 2026-11-27");
      const Choice c = auto_for(n, bytes, defaults.lamport_message_bytes);
      EXPECT_TRUE(c.from_table);
      EXPECT_EQ(c.algo, fastest->algo) << n << " GPUs, " << bytes << " bytes";
      EXPECT_EQ(c.grid.blocks, fastest->grid.blocks);
      EXPECT_EQ(c.grid.threads, fastest->grid.threads);
      const std::optional<Algorithm> lamport = lamport_expected(n, bytes);
      if (lamport) {
        EXPECT_EQ(c.algo, *lamport) << n << " GPUs, " << bytes << " bytes";
      } else {
        EXPECT_FALSE(is_lamport_algorithm(c.algo)) << n << " GPUs, " << bytes << " bytes";
      }
      ++sizes;
    }
  }
  EXPECT_EQ(sizes, 24);
  // Beyond the communicator's Lamport slots auto never takes a Lamport algorithm that does not fit:
  // with 64 KiB slots, 128 KiB on 4 GPUs runs push_one_shot, although lamport_one_shot's row there
  // is faster (it needs a 128 KiB slot; lamport_two_shot, which fits, is slower), and 1 MiB on 2
  // GPUs runs push_one_shot (neither Lamport algorithm fits).
  EXPECT_EQ(auto_for(4, 128 * kib, 64 * kib).algo, Algorithm::kPushOneShot);
  EXPECT_EQ(auto_for(4, 64 * kib, 64 * kib).algo, Algorithm::kLamportOneShot);
  EXPECT_EQ(auto_for(2, mib, 64 * kib).algo, Algorithm::kPushOneShot);
  // Above 2 MiB the rows are H200's, where neither Lamport algorithm has rows (neither fits a
  // default slot there).
  for (int n : {2, 4}) {
    for (uint64_t bytes = 4 * mib; bytes <= 64 * mib; bytes *= 2) {
      EXPECT_FALSE(is_lamport_algorithm(auto_for(n, bytes, defaults.lamport_message_bytes).algo))
          << n << " GPUs, " << bytes << " bytes";
    }
  }
}

TEST(DispatchTable, AlgorithmNamesRoundTrip) {
  for (Algorithm a : {Algorithm::kOneShot, Algorithm::kTwoShot, Algorithm::kPushOneShot, Algorithm::kPushTwoShot,
                      Algorithm::kDirect, Algorithm::kCopyEngine, Algorithm::kAuto, Algorithm::kNccl,
                      Algorithm::kLamportOneShot, Algorithm::kLamportTwoShot}) {
    const auto parsed = parse_algorithm(algorithm_name(a));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, a);
  }
  EXPECT_FALSE(parse_algorithm("ring").has_value());
  EXPECT_FALSE(parse_op("broadcast").has_value());
}

}  // namespace
}  // namespace exactcoll::cuda
