// `exactcoll sim overlap`: a passing run with its summary, the plan printout, trace files, and bad
// input (a clear message, exit 2, no trace file written).
#include "tools/overlap/sim_overlap_command.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace exactcoll::tools {
namespace {

struct Result {
  int code;
  std::string out, err;
};

Result run(std::vector<std::string> args) {
  args.insert(args.begin(), "overlap");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = sim_overlap_main(static_cast<int>(argv.size()), argv.data());
  Result r{code, testing::internal::GetCapturedStdout(), testing::internal::GetCapturedStderr()};
  return r;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name + "." + std::to_string(getpid());
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(SimOverlapCommand, AgMatmulPassesItsChecksAndPrintsDigests) {
  const Result r = run({"--ranks", "4", "--m", "32", "--k", "24", "--n", "16", "--calls", "2"});
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
    const Result r = run({"--ranks", "4", "--m", "32", "--k", "24", "--n", "16", "--products", products, "--plan",
                          "--schedule", "seeded", "--schedule-seed", "3"});
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(std::string("m=32 k=24 n=16, products ") + products), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("C identical to the unpipelined schedule (bitwise)"), std::string::npos) << r.out;
    // Rank 3: every peer shard in one product (merged), or the first two pulls' shards (pairs).
    EXPECT_NE(r.out.find(std::string("rank 3:\n")), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(products == std::string("merged") ? "matmul(0..2)" : "matmul(0..1) wait_arrival(2,s3) matmul(2,s3)"),
              std::string::npos)
        << r.out;
  }
  const Result bad = run({"--ranks", "2", "--products", "both"});
  EXPECT_EQ(bad.code, 2);
}

TEST(SimOverlapCommand, SameSeedSameDigestsAcrossSchedulers) {
  const Result a = run({"--ranks", "3", "--pattern", "prefetch", "--dtype", "fp16", "--m", "9", "--k", "8", "--n", "5",
                        "--gather-count", "77"});
  const Result b = run({"--ranks", "3", "--pattern", "prefetch", "--dtype", "fp16", "--m", "9", "--k", "8", "--n", "5",
                        "--gather-count", "77", "--schedule", "seeded", "--schedule-seed", "9"});
  ASSERT_EQ(a.code, 0) << a.out << a.err;
  ASSERT_EQ(b.code, 0) << b.out << b.err;
  const auto digests = [](const std::string& out) { return out.substr(out.find("last call:")); };
  EXPECT_EQ(digests(a.out), digests(b.out));
}

TEST(SimOverlapCommand, PrintsThePlanAndWritesTraces) {
  const std::string trace = temp_path("overlap_trace.jsonl"), chrome = temp_path("overlap_chrome.json");
  const Result r = run({"--ranks", "2", "--m", "4", "--k", "4", "--n", "4", "--plan", "--schedule", "seeded",
                        "--trace", trace, "--chrome-trace", chrome});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 1:\ncomm0: signal_ready(0) wait_ready(0,s1) pull_shard(0,s1)"), std::string::npos) << r.out;
  const std::string json = read(trace);
  EXPECT_NE(json.find("\"step\":\"pull_shard\""), std::string::npos);
  EXPECT_NE(read(chrome).find("\"traceEvents\""), std::string::npos);
  std::remove(trace.c_str());
  std::remove(chrome.c_str());
}

TEST(SimOverlapCommand, BadInputFailsClearlyWithoutWritingTheTrace) {
  const std::string trace = temp_path("overlap_bad.jsonl");
  const Result r = run({"--ranks", "3", "--m", "10", "--trace", trace});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("m must be a multiple of the ranks"), std::string::npos) << r.err;
  EXPECT_FALSE(exists(trace));
  EXPECT_EQ(run({"--m", "8"}).code, 2);                               // no --ranks
  EXPECT_EQ(run({"--ranks", "2", "--pattern", "fsdp"}).code, 2);       // unknown pattern
  // It folds nothing, so --trace-elements is no flag of it: refused as unknown, absent from --help.
  const Result traced = run({"--ranks", "2", "--trace-elements", "3"});
  EXPECT_EQ(traced.code, 2);
  EXPECT_NE(traced.err.find("--trace-elements"), std::string::npos) << traced.err;
  const Result help = run({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_EQ(help.out.find("trace-elements"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace exactcoll::tools
