// `exactcoll sim <op> --nodes M`: the same sha256 (and output file) as the one-node command for the
// same inputs, for every op, several layouts and both schedules; the trace names the boundaries;
// bad layouts exit 2 with a clear message and write nothing.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

struct Outcome {
  int code = -1;
  std::string text;  // stdout and stderr
};

// Runs `exactcoll <args>` (the full binary, //tools:exactcoll) and returns its exit code and output.
Outcome exactcoll(const std::string& args) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string binary = std::string(srcdir ? srcdir : ".") + "/exactcoll/tools/exactcoll";
  Outcome o;
  FILE* pipe = popen((binary + " " + args + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return o;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) o.text.append(buffer, n);
  const int status = pclose(pipe);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

// The sha256 words of the summary (the last line): "sha256 <hex>" once or twice.
std::string hashes(const std::string& text) {
  std::string out;
  for (size_t at = text.find("sha256 "); at != std::string::npos; at = text.find("sha256 ", at + 1)) {
    out += text.substr(at + 7, 64) + " ";
  }
  return out;
}

std::string tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(SimNodesCommand, EveryOpGivesTheOneNodeBits) {
  const std::string cases[] = {
      "allreduce --ranks 8 --dtype bf16 --count 5000",    "allreduce --ranks 6 --dtype fp16 --count 777",
      "allreduce --ranks 12 --dtype fp32 --count 3000",   "reduce_scatter --ranks 8 --dtype bf16 --count 1600",
      "allgather --ranks 6 --dtype fp32 --count 300",     "fused_rmsnorm --ranks 4 --rows 16 --hidden 4096",
      "fused_rmsnorm --ranks 6 --dtype fp32 --rows 5 --hidden 256 --specials"};
  for (const std::string& c : cases) {
    const Outcome one = exactcoll("sim " + c);
    ASSERT_EQ(one.code, 0) << c << "\n" << one.text;
    const std::string want = hashes(one.text);
    ASSERT_FALSE(want.empty()) << one.text;
    for (const std::string layout : {"--nodes 2", "--nodes 3 --schedule seeded --schedule-seed 9", "--nodes 1"}) {
      if (c.find("--ranks 8") != std::string::npos && layout.find("--nodes 3") != std::string::npos) continue;
      if (c.find("--ranks 4") != std::string::npos && layout.find("--nodes 3") != std::string::npos) continue;
      const Outcome multi = exactcoll("sim " + c + " " + layout + " --chunk-elements 256");
      ASSERT_EQ(multi.code, 0) << c << " " << layout << "\n" << multi.text;
      EXPECT_EQ(hashes(multi.text), want) << c << " " << layout << "\n" << multi.text;
    }
  }
}

TEST(SimNodesCommand, OutputFileAndTrace) {
  const std::string one = tmp("one.npy"), multi = tmp("multi.npy"), trace = tmp("trace.jsonl");
  ASSERT_EQ(exactcoll("sim allreduce --ranks 4 --count 300 --output " + one).code, 0);
  const Outcome o = exactcoll("sim allreduce --ranks 4 --nodes 2 --count 300 --chunk-elements 128 --output " + multi +
                              " --trace " + trace + " --trace-elements 7");
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_EQ(slurp(one), slurp(multi));
  const std::string t = slurp(trace);
  EXPECT_NE(t.find("\"boundary\":\"node 0 -> node 1\",\"payload\":\"carry\""), std::string::npos);
  EXPECT_NE(t.find("\"boundary\":\"node 1 -> node 0\",\"payload\":\"result\""), std::string::npos);
  EXPECT_NE(t.find("\"index\":7,\"input_rank\":3"), std::string::npos);
}

TEST(SimNodesCommand, BadLayoutsExit2AndWriteNothing) {
  const std::string out = tmp("never.npy");
  Outcome o = exactcoll("sim allreduce --ranks 6 --nodes 4 --count 10 --output " + out);
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("bad layout: 6 ranks do not split into 4 nodes of equal size"), std::string::npos) << o.text;
  struct stat st;
  EXPECT_NE(stat(out.c_str(), &st), 0);
  o = exactcoll("sim allreduce --ranks 34 --nodes 2 --count 10");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("17 ranks per node; a node has 1..16"), std::string::npos) << o.text;
  o = exactcoll("sim reduce_scatter --ranks 4 --nodes 2 --count 10");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("multiple of the 4 ranks"), std::string::npos) << o.text;
  o = exactcoll("sim allreduce --ranks 4 --nodes 0 --count 10");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("at least 1 node"), std::string::npos) << o.text;
}

}  // namespace
