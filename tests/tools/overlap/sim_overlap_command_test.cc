// `exactcoll sim overlap`: a passing run with its summary, the plan printout, trace files, and bad
// input (a clear message, exit 2, no trace file written).
#include "tools/overlap/sim_overlap_command.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/command_runner.h"

namespace exactcoll::tools {
namespace {

using test_support::CommandResult;
using test_support::file_exists;
using test_support::read_file;
using test_support::temp_path;

CommandResult run(const std::vector<std::string>& args) {
  return test_support::run_in_process(sim_overlap_main, "overlap", args);
}

TEST(SimOverlapCommand, AgMatmulPassesItsChecksAndPrintsDigests) {
  const CommandResult r = run({"--ranks", "4", "--m", "32", "--k", "24", "--n", "16", "--calls", "2"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("sim overlap ag_matmul bf16: 4 ranks, m=32 k=24 n=16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gathered A identical to the shards on every rank and call (bitwise); C identical to the "
                       "unpipelined schedule (bitwise)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(within 0.01)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("C sha256 "), std::string::npos) << r.out;
}

TEST(SimOverlapCommand, MergedAndPairedProductsPassTheirChecksAndPrintTheirPlans) {
  for (const char* products : {"merged", "pairs"}) {
    const CommandResult r = run({"--ranks", "4", "--m", "32", "--k", "24", "--n", "16", "--products", products,
                                 "--plan", "--schedule", "seeded", "--schedule-seed", "3"});
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(std::string("m=32 k=24 n=16, products ") + products), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("C identical to the unpipelined schedule (bitwise)"), std::string::npos) << r.out;
    // Rank 3: every peer shard in one product (merged), or the first two pulls' shards (pairs).
    EXPECT_NE(r.out.find(std::string("rank 3:\n")), std::string::npos) << r.out;
    EXPECT_NE(
        r.out.find(products == std::string("merged") ? "matmul(0..2)" : "matmul(0..1) wait_arrival(2,s3) matmul(2,s3)"),
        std::string::npos)
        << r.out;
  }
  const CommandResult bad = run({"--ranks", "2", "--products", "both"});
  EXPECT_EQ(bad.code, 2);
}

TEST(SimOverlapCommand, SameSeedSameDigestsAcrossSchedulers) {
  const CommandResult a = run({"--ranks", "3", "--pattern", "prefetch", "--dtype", "fp16", "--m", "9", "--k", "8",
                               "--n", "5", "--gather-count", "77"});
  const CommandResult b = run({"--ranks", "3", "--pattern", "prefetch", "--dtype", "fp16", "--m", "9", "--k", "8",
                               "--n", "5", "--gather-count", "77", "--schedule", "seeded", "--schedule-seed", "9"});
  ASSERT_EQ(a.code, 0) << a.out << a.err;
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  const auto digests = [](const std::string& out) { return out.substr(out.find("last call:")); };
  EXPECT_EQ(digests(a.out), digests(b.out));
}

TEST(SimOverlapCommand, PrintsThePlanAndWritesTraces) {
  const std::string trace = temp_path("overlap_trace.jsonl"), chrome = temp_path("overlap_chrome.json");
  const CommandResult r = run({"--ranks", "2", "--m", "4", "--k", "4", "--n", "4", "--plan", "--schedule", "seeded",
                               "--trace", trace, "--chrome-trace", chrome});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 1:\ncomm0: signal_ready(0) wait_ready(0,s1) pull_shard(0,s1)"), std::string::npos)
      << r.out;
  const std::string json = read_file(trace);
  EXPECT_NE(json.find("\"step\":\"pull_shard\""), std::string::npos);
  EXPECT_NE(read_file(chrome).find("\"traceEvents\""), std::string::npos);
  std::remove(trace.c_str());
  std::remove(chrome.c_str());
}

TEST(SimOverlapCommand, BadInputFailsClearlyWithoutWritingTheTrace) {
  const std::string trace = temp_path("overlap_bad.jsonl");
  const CommandResult r = run({"--ranks", "3", "--m", "10", "--trace", trace});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("m must be a multiple of the ranks"), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(trace));
  EXPECT_EQ(run({"--m", "8"}).code, 2);                           // no --ranks
  EXPECT_EQ(run({"--ranks", "2", "--pattern", "fsdp"}).code, 2);  // unknown pattern
  // It folds nothing, so --trace-elements is no flag of it: refused as unknown, absent from --help.
  const CommandResult traced = run({"--ranks", "2", "--trace-elements", "3"});
  EXPECT_EQ(traced.code, 2);
  EXPECT_NE(traced.err.find("--trace-elements"), std::string::npos) << traced.err;
  const CommandResult help = run({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_EQ(help.out.find("trace-elements"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace exactcoll::tools
