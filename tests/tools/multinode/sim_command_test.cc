// `exactcoll sim <op> --nodes M`: the same sha256 (and output file) as the one-node command for the
// same inputs, for every op, several layouts and both schedules; the trace names the boundaries;
// bad layouts exit 2 with a clear message and write nothing.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/command_runner.h"

namespace {

using exactcoll::test_support::CommandResult;
using exactcoll::test_support::file_exists;
using exactcoll::test_support::read_file;
using exactcoll::test_support::temp_path;

// Runs `exactcoll <args>` (the full binary, //tools:exactcoll; args are words for the shell).
CommandResult exactcoll(const std::string& args) {
  return exactcoll::test_support::run_binary(exactcoll::test_support::runfile("tools/exactcoll"), args);
}

// The sha256 words of the summary (the last line): "sha256 <hex>" once or twice.
std::string hashes(const std::string& text) {
  std::string out;
  for (size_t at = text.find("sha256 "); at != std::string::npos; at = text.find("sha256 ", at + 1)) {
    out += text.substr(at + 7, 64) + " ";
  }
  return out;
}

TEST(SimNodesCommand, EveryOpGivesTheOneNodeBits) {
  const std::string cases[] = {"allreduce --ranks 8 --dtype bf16 --count 5000",
                               "allreduce --ranks 6 --dtype fp16 --count 777",
                               "allreduce --ranks 12 --dtype fp32 --count 3000",
                               "reduce_scatter --ranks 8 --dtype bf16 --count 1600",
                               "allgather --ranks 6 --dtype fp32 --count 300",
                               "fused_rmsnorm --ranks 4 --rows 16 --hidden 4096",
                               "fused_rmsnorm --ranks 6 --dtype fp32 --rows 5 --hidden 256 --specials"};
  for (const std::string& c : cases) {
    const CommandResult one = exactcoll("sim " + c);
    ASSERT_EQ(one.code, 0) << c << "\n" << one.out << one.err;
    const std::string want = hashes(one.out);
    ASSERT_FALSE(want.empty()) << one.out << one.err;
    for (const std::string layout : {"--nodes 2", "--nodes 3 --schedule seeded --schedule-seed 9", "--nodes 1"}) {
      if (c.find("--ranks 8") != std::string::npos && layout.find("--nodes 3") != std::string::npos) continue;
      if (c.find("--ranks 4") != std::string::npos && layout.find("--nodes 3") != std::string::npos) continue;
      const CommandResult multi = exactcoll("sim " + c + " " + layout + " --chunk-elements 256");
      ASSERT_EQ(multi.code, 0) << c << " " << layout << "\n" << multi.out << multi.err;
      EXPECT_EQ(hashes(multi.out), want) << c << " " << layout << "\n" << multi.out << multi.err;
    }
  }
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n') + 1); }

// The input banner (what runs on which inputs) is the one-node command's, from the same function
// (tools/sim/sim_flags.h: input_banner), before the run's summary.
TEST(SimNodesCommand, PrintsTheOneNodeInputBanner) {
  const CommandResult multi = exactcoll("sim allreduce --ranks 4 --nodes 2 --count 300");
  ASSERT_EQ(multi.code, 0) << multi.err;
  EXPECT_EQ(first_line(multi.out),
            "exactcoll sim allreduce: 4 ranks x 300 bf16 elements; inputs: random, --seed 1 (the default)\n")
      << multi.out;
  EXPECT_NE(multi.out.find("(random, --seed 1 (the default)), 2 nodes"), std::string::npos) << multi.out;
  const std::string cases[] = {"allreduce --ranks 4 --dtype fp16 --count 300 --seed 7",
                               "reduce_scatter --ranks 6 --dtype fp32 --count 600",
                               "allgather --ranks 4 --dtype bf16 --count 300 --seed 3"};
  // --chunk-elements 256, as above: with the default chunk, `sim allgather --nodes` writes past its
  // scratch when count < chunk / nodes (core/multinode.h's allgather takes the unclamped chunk as
  // its slot stride; buffer_needs sizes the slots by min(chunk, count)) and crashes.
  for (const std::string& c : cases) {
    const CommandResult one = exactcoll("sim " + c);
    const CommandResult nodes = exactcoll("sim " + c + " --nodes 2 --chunk-elements 256");
    ASSERT_EQ(one.code, 0) << c << "\n" << one.err;
    ASSERT_EQ(nodes.code, 0) << c << "\n" << nodes.err;
    EXPECT_EQ(first_line(nodes.out), first_line(one.out)) << c << "\n" << nodes.out;
    EXPECT_EQ(first_line(nodes.out).rfind("exactcoll sim ", 0), 0u) << nodes.out;
  }
  // The fused op prints no banner on one node either: its summary line says what its inputs were.
  const CommandResult fused = exactcoll("sim fused_rmsnorm --ranks 4 --rows 2 --hidden 64 --specials --nodes 2");
  ASSERT_EQ(fused.code, 0) << fused.err;
  EXPECT_NE(fused.out.find("(random with specials, --seed 1 (the default)), 2 nodes"), std::string::npos) << fused.out;
}

TEST(SimNodesCommand, OutputFileAndTrace) {
  const std::string one = temp_path("one.npy"), multi = temp_path("multi.npy"), trace = temp_path("trace.jsonl");
  ASSERT_EQ(exactcoll("sim allreduce --ranks 4 --count 300 --output " + one).code, 0);
  const CommandResult o = exactcoll("sim allreduce --ranks 4 --nodes 2 --count 300 --chunk-elements 128 --output " +
                                    multi + " --trace " + trace + " --trace-elements 7");
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(read_file(one), read_file(multi));
  const std::string t = read_file(trace);
  EXPECT_NE(t.find("\"boundary\":\"node 0 -> node 1\",\"payload\":\"carry\""), std::string::npos);
  EXPECT_NE(t.find("\"boundary\":\"node 1 -> node 0\",\"payload\":\"result\""), std::string::npos);
  EXPECT_NE(t.find("\"index\":7,\"input_rank\":3"), std::string::npos);
}

TEST(SimNodesCommand, BadLayoutsExit2AndWriteNothing) {
  const std::string out = temp_path("never.npy");
  CommandResult o = exactcoll("sim allreduce --ranks 6 --nodes 4 --count 10 --output " + out);
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("bad layout: 6 ranks do not split into 4 nodes of equal size"), std::string::npos) << o.err;
  EXPECT_FALSE(file_exists(out));
  o = exactcoll("sim allreduce --ranks 34 --nodes 2 --count 10");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("17 ranks per node; a node has 1..16"), std::string::npos) << o.err;
  o = exactcoll("sim reduce_scatter --ranks 4 --nodes 2 --count 10");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("multiple of the 4 ranks"), std::string::npos) << o.err;
  o = exactcoll("sim allreduce --ranks 4 --nodes 0 --count 10");
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("at least 1 node"), std::string::npos) << o.err;
}

// An output that cannot be written is found before the run (exit 2, nothing run, no file left);
// outputs and trace are written together.
TEST(SimNodesCommand, UnwritableOutputsExit2BeforeTheRun) {
  const std::string trace = temp_path("kept_out.jsonl");
  const std::string missing_dir = temp_path("no_such_dir") + "/out.npy";
  CommandResult o =
      exactcoll("sim allreduce --ranks 4 --nodes 2 --count 10 --trace " + trace + " --output " + missing_dir);
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("nothing was run"), std::string::npos) << o.err;
  EXPECT_EQ(o.out.find("sha256"), std::string::npos) << o.out;
  EXPECT_FALSE(file_exists(trace));
  const std::string out = temp_path("fused_out.npy");
  o = exactcoll("sim fused_rmsnorm --ranks 4 --nodes 2 --rows 2 --hidden 64 --output " + out + " --residual-output " +
                missing_dir);
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("nothing was run"), std::string::npos) << o.err;
  EXPECT_FALSE(file_exists(out));
}

}  // namespace
