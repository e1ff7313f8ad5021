// `exactcoll sim <op> --nodes M`: the same sha256 (and output file) as the one-node command for the
// same inputs, for every op, several layouts and both schedules; the trace names the boundaries and,
// under tree, records every node of a traced element's tree; bad layouts exit 2 with a clear
// message and write nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/multinode_layout.h"
#include "core/op.h"
#include "core/storage.h"
#include "npy/npy.h"
#include "tests/sim/multinode/tree_trace_check.h"
#include "tests/support/command_runner.h"

namespace {

using exactcoll::test_support::CommandResult;
using exactcoll::test_support::file_exists;
using exactcoll::test_support::read_file;
using exactcoll::test_support::temp_path;
namespace npy = exactcoll::npy;
namespace simtest = exactcoll::simtest;

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
  // --chunk-elements 256, as above: several chunks per message (the default chunk is tested in
  // AllGatherSlotsOfAnOddCountStayAligned).
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

// `multinode verify` faulted on GPUs at all-gather count 4099 (cudaErrorMisalignedAddress): node
// 1's slot began 4099 elements into the scratch, mid-pack. The simulator now refuses a misaligned
// 16-byte access as the GPU does, and the slots are whole packs (core/multinode.h slot_elements).
TEST(SimNodesCommand, AllGatherSlotsOfAnOddCountStayAligned) {
  for (const std::string c :
       {"allgather --ranks 4 --dtype bf16 --count 4099", "allgather --ranks 4 --dtype fp16 --count 1001",
        "allgather --ranks 6 --dtype fp32 --count 4099"}) {
    const CommandResult one = exactcoll("sim " + c);
    ASSERT_EQ(one.code, 0) << c << "\n" << one.err;
    for (const std::string layout : {"--nodes 2", "--nodes 2 --blocks 3 --schedule seeded --schedule-seed 5"}) {
      const CommandResult multi = exactcoll("sim " + c + " " + layout);
      ASSERT_EQ(multi.code, 0) << c << " " << layout << "\n" << multi.out << multi.err;
      EXPECT_EQ(hashes(multi.out), hashes(one.out)) << c << " " << layout;
    }
  }
}

// Writes n ranks x count bf16 bit patterns (rank r's element i = a value of r and i) as [n, count].
std::string write_rank_inputs(const std::string& name, int n, int64_t count) {
  std::vector<uint16_t> bits(static_cast<size_t>(n * count));
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(0x3c00 + (i * 2654435761u >> 20) % 0x0800);
  const std::string path = temp_path(name);
  exactcoll::npy::write_npy(path, exactcoll::npy::kU16, {n, count}, bits.data(), bits.size() * 2);
  return path;
}

// --input works with --nodes as on one node: the same file gives the same sha256 and output file.
TEST(SimNodesCommand, InputFilesGiveTheOneNodeBits) {
  const std::string x = write_rank_inputs("x.npy", 4, 1000);
  for (const std::string op : {"allreduce", "reduce_scatter", "allgather"}) {
    const std::string one_out = temp_path(op + "_one.npy"), multi_out = temp_path(op + "_multi.npy");
    const CommandResult one = exactcoll("sim " + op + " --ranks 4 --input " + x + " --output " + one_out);
    ASSERT_EQ(one.code, 0) << op << "\n" << one.err;
    const CommandResult multi =
        exactcoll("sim " + op + " --ranks 4 --nodes 2 --chunk-elements 128 --input " + x + " --output " + multi_out);
    ASSERT_EQ(multi.code, 0) << op << "\n" << multi.err;
    EXPECT_EQ(hashes(multi.out), hashes(one.out)) << op << "\n" << multi.out;
    EXPECT_EQ(read_file(multi_out), read_file(one_out)) << op;
    EXPECT_EQ(first_line(multi.out), first_line(one.out)) << op;  // the banner names the file
    EXPECT_NE(multi.out.find(x + " (4, 1000)"), std::string::npos) << multi.out;
  }
  // The fused op's three files.
  const std::string r = temp_path("r.npy"), w = temp_path("w.npy"), fx = temp_path("fx.npy");
  {
    std::vector<uint16_t> xb(4 * 3 * 64), rb(3 * 64), wb(64);
    for (size_t i = 0; i < xb.size(); ++i) xb[i] = static_cast<uint16_t>(0x3c00 + (i * 40503u >> 4) % 0x0900);
    for (size_t i = 0; i < rb.size(); ++i) rb[i] = static_cast<uint16_t>(0xbc00 + (i * 7919u) % 0x0700);
    for (size_t i = 0; i < wb.size(); ++i) wb[i] = static_cast<uint16_t>(0x3f00 + i);
    exactcoll::npy::write_npy(fx, exactcoll::npy::kU16, {4, 3, 64}, xb.data(), xb.size() * 2);
    exactcoll::npy::write_npy(r, exactcoll::npy::kU16, {3, 64}, rb.data(), rb.size() * 2);
    exactcoll::npy::write_npy(w, exactcoll::npy::kU16, {64}, wb.data(), wb.size() * 2);
  }
  const std::string files = " --input " + fx + " --residual " + r + " --weight " + w;
  const CommandResult one = exactcoll("sim fused_rmsnorm --ranks 4" + files);
  ASSERT_EQ(one.code, 0) << one.err;
  const CommandResult multi = exactcoll("sim fused_rmsnorm --ranks 4 --nodes 2" + files);
  ASSERT_EQ(multi.code, 0) << multi.err;
  EXPECT_EQ(hashes(multi.out), hashes(one.out)) << multi.out;
  EXPECT_NE(multi.out.find(fx + " (4, 3, 64)"), std::string::npos) << multi.out;
  // Bad files and mixed flags: exit 2 naming what is wrong, as on one node.
  const struct {
    std::string args, message;
  } bad[] = {
      {"allreduce --ranks 2 --nodes 2 --input " + x, "has 4 rows in its first dimension"},
      {"allreduce --ranks 4 --nodes 2 --dtype fp32 --input " + x, "holds '<u2' but --dtype fp32 needs '<f4'"},
      {"allreduce --ranks 4 --nodes 2 --count 8 --input " + x, "give --input FILE or --count C"},
      {"allreduce --ranks 4 --nodes 2 --seed 3 --input " + x, "--seed applies to random inputs"},
      {"allreduce --ranks 4 --nodes 2 --input " + temp_path("missing.npy"), "missing.npy"},
      {"fused_rmsnorm --ranks 4 --nodes 2 --input " + fx, "give all three of --input, --residual and --weight"},
      {"fused_rmsnorm --ranks 4 --nodes 2 --rows 3" + files, "shape random inputs, not --input files"},
      {"fused_rmsnorm --ranks 2 --nodes 2" + files, "4 ranks in its first dimension, --ranks is 2"},
      {"allreduce --ranks 4 --nodes 2 --input " + x + " --trace " + temp_path("t.jsonl") + " --trace-elements " +
           [] {
             std::string list = "0";
             for (int i = 1; i < 4097; ++i) {
               list.push_back(',');
               list.append(std::to_string(i % 1000));
             }
             return list;
           }(),
       "--trace-elements names 4097 elements; at most 4096"},
  };
  for (const auto& b : bad) {
    const CommandResult o = exactcoll("sim " + b.args);
    EXPECT_EQ(o.code, 2) << b.args << "\n" << o.out << o.err;
    EXPECT_NE(o.err.find(b.message), std::string::npos) << b.args << "\n" << o.err;
    EXPECT_EQ(o.out.find("sha256"), std::string::npos) << b.args << "\n" << o.out;
  }
}

// Fault injection is refused with --nodes (exit 2, naming the flag), never accepted and ignored,
// and --help offers it only where it works.
TEST(SimNodesCommand, FaultFlagsAreRefusedNotIgnored) {
  for (const std::string flags : {"--fail-rank 1 --fail-at-step 1", "--fail-rank=99", "--fail-at-step -5"}) {
    const CommandResult o = exactcoll("sim allreduce --nodes 2 --ranks 4 --count 1000 " + flags);
    EXPECT_EQ(o.code, 2) << flags << "\n" << o.out << o.err;
    EXPECT_NE(o.err.find("is not available with --nodes"), std::string::npos) << flags << "\n" << o.err;
    EXPECT_EQ(o.out.find("sha256"), std::string::npos) << o.out;
  }
  const CommandResult help = exactcoll("sim allreduce --nodes 2 --help");
  EXPECT_EQ(help.code, 0) << help.err;
  EXPECT_EQ(help.out.find("\n  --fail-rank"), std::string::npos) << help.out;  // not among the flags
  EXPECT_NE(help.out.find("--input"), std::string::npos) << help.out;
}

// The tree contract runs on one node only for now (its cross-node exchange is not built): with
// --nodes it is refused before anything is written (exit 2, naming the reason), never run as
// canonical; --contract canonical still runs, with the one-node command's bits.
TEST(SimNodesCommand, ContractFlagAcrossNodes) {
  const CommandResult emulation = exactcoll(
      "sim fused_rmsnorm --nodes 2 --ranks 4 --rows 2 --hidden 64 --contract "
      "f32_residual");
  EXPECT_EQ(emulation.code, 2) << emulation.err;
  EXPECT_NE(emulation.err.find("--contract must be one of canonical|tree"), std::string::npos) << emulation.err;
  const CommandResult one = exactcoll("sim allreduce --ranks 4 --count 300");
  const CommandResult canonical = exactcoll("sim allreduce --nodes 2 --ranks 4 --count 300 --contract canonical");
  ASSERT_EQ(canonical.code, 0) << canonical.err;
  EXPECT_EQ(hashes(canonical.out), hashes(one.out));
  const CommandResult help = exactcoll("sim allreduce --nodes 2 --help");
  EXPECT_NE(help.out.find("--contract canonical|tree"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("across nodes: canonical, tree only"), std::string::npos) << help.out;
}

// Every op's one-node --help names --nodes (the multi-node form was listed only by `sim --help`).
TEST(SimNodesCommand, EveryOpsHelpNamesNodes) {
  for (const std::string op : {"allreduce", "reduce_scatter", "allgather", "fused_rmsnorm"}) {
    const CommandResult help = exactcoll("sim " + op + " --help");
    EXPECT_EQ(help.code, 0) << op << "\n" << help.err;
    EXPECT_NE(help.out.find("--nodes M"), std::string::npos) << op << "\n" << help.out;
  }
}

// --contract tree: every split of 8 ranks into nodes (one node of 8 included) gives the same bits,
// which are not the chain's; the summary names the exchange; layouts the tree does not run on are
// refused (exit 2, nothing written); the trace shows the exchange's partials.
TEST(SimNodesCommand, TreeContractGivesTheSameBitsOnEveryLayout) {
  const std::string cases[] = {
      "allreduce --ranks 8 --dtype bf16 --count 5000", "allreduce --ranks 8 --dtype fp32 --count 777",
      "reduce_scatter --ranks 8 --dtype fp16 --count 1600", "fused_rmsnorm --ranks 8 --rows 3 --hidden 256 --specials"};
  for (const std::string& c : cases) {
    const CommandResult chain = exactcoll("sim " + c + " --nodes 2");
    ASSERT_EQ(chain.code, 0) << c << "\n" << chain.err;
    std::string want;
    for (const std::string layout :
         {"--nodes 1", "--nodes 2", "--nodes 4 --schedule seeded --schedule-seed 3", "--nodes 8"}) {
      const CommandResult tree = exactcoll("sim " + c + " " + layout + " --contract tree --chunk-elements 256");
      ASSERT_EQ(tree.code, 0) << c << " " << layout << "\n" << tree.out << tree.err;
      if (want.empty()) want = hashes(tree.out);
      EXPECT_EQ(hashes(tree.out), want) << c << " " << layout << "\n" << tree.out;
      if (c.rfind("allreduce", 0) == 0 || c.rfind("fused", 0) == 0) {
        EXPECT_NE(tree.out.find("tree contract, recursive doubling"), std::string::npos) << tree.out;
      } else {
        EXPECT_NE(tree.out.find("tree contract, recursive halving"), std::string::npos) << tree.out;
      }
    }
    EXPECT_NE(hashes(chain.out), want) << c << ": the tree's bits equal the chain's";
  }
  struct Bad {
    std::string args, message;
  };
  const Bad bad[] = {
      {"--nodes 3 --ranks 6 --count 100 --contract tree", "needs a power-of-two number of nodes"},
      {"--nodes 2 --ranks 6 --count 100 --contract tree", "this job has 2 nodes of 3 ranks"},
      {"--nodes 2 --ranks 4 --count 100 --contract f32_residual", "f32_residual"},
  };
  for (const Bad& b : bad) {
    std::string args = b.args;
    const std::string trace = temp_path("refused.jsonl");
    if (const size_t at = args.find(" T "); at != std::string::npos) args.replace(at, 3, " " + trace + " ");
    const CommandResult o = exactcoll("sim allreduce " + args);
    EXPECT_EQ(o.code, 2) << args << "\n" << o.out << o.err;
    EXPECT_NE(o.err.find(b.message), std::string::npos) << args << "\n" << o.err;
    EXPECT_FALSE(file_exists(trace)) << args;
  }
  const std::string trace = temp_path("tree.jsonl");
  const CommandResult o =
      exactcoll("sim allreduce --ranks 4 --nodes 2 --count 300 --contract tree --chunk-elements 128 --trace " + trace);
  ASSERT_EQ(o.code, 0) << o.err;
  const std::string t = read_file(trace);
  EXPECT_NE(t.find("\"boundary\":\"node 0 -> node 1\",\"payload\":\"partial\""), std::string::npos);
  EXPECT_NE(t.find("\"boundary\":\"node 1 -> node 0\",\"payload\":\"partial\""), std::string::npos);
  EXPECT_EQ(t.find("\"payload\":\"carry\""), std::string::npos);
  const CommandResult help = exactcoll("sim allreduce --nodes 2 --help");
  EXPECT_NE(help.out.find("--contract canonical|tree"), std::string::npos) << help.out;
}

// --trace-elements under --contract tree: every traced element's tree_node events are its tree
// (recomputed here from the input file: tests/sim/multinode/tree_trace_check.h): each rank its
// node's subtree, then the exchange steps it combines, the round on every rank that computes the
// root with the output file's bits; the sha256 is the untraced run's. The fused op across nodes
// takes no element (exit 2, nothing written).
TEST(SimNodesCommand, TreeContractTracesEveryNodeOfAnElementsTree) {
  const int n = 8;
  const size_t count = 300;
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(count * 2));
  std::vector<uint8_t> flat;
  uint64_t state = 20261128;
  for (auto& rank : in) {
    for (size_t e = 0; e < count; ++e) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const uint16_t bits = static_cast<uint16_t>(0x3c00 + ((state >> 33) % 0x0800)) | ((state >> 20) & 1 ? 0x8000 : 0);
      std::memcpy(rank.data() + e * 2, &bits, 2);  // bf16 of magnitudes 2^-7 .. 2^8, either sign
    }
    flat.insert(flat.end(), rank.begin(), rank.end());
  }
  const std::string input = temp_path("tree_trace_in.npy"), output = temp_path("tree_trace_out.npy");
  npy::write_npy(input, npy::kU16, {n, static_cast<int64_t>(count)}, flat.data(), flat.size());
  for (const int nodes : {2, 4}) {
    SCOPED_TRACE(std::to_string(nodes) + " nodes");
    const std::string trace = temp_path("tree_trace.jsonl");
    const std::string args = "sim allreduce --ranks 8 --dtype bf16 --input " + input + " --nodes " +
                             std::to_string(nodes) + " --contract tree --chunk-elements 64";
    const CommandResult plain = exactcoll(args);
    const CommandResult traced =
        exactcoll(args + " --output " + output + " --trace " + trace + " --trace-elements 5,299");
    ASSERT_EQ(plain.code, 0) << plain.err;
    ASSERT_EQ(traced.code, 0) << traced.err;
    EXPECT_EQ(hashes(traced.out), hashes(plain.out)) << "tracing changes no bit";
    const npy::NpyArray out = npy::read_npy(output);
    const std::string t = read_file(trace);
    for (const size_t i : {size_t{5}, size_t{299}}) {
      uint16_t want;
      std::memcpy(&want, out.data.data() + i * 2, 2);
      EXPECT_EQ(simtest::check_tree_events(t, exactcoll::Op::kAllReduce, {nodes, n / nodes}, i,
                                           simtest::element_tree(exactcoll::DType::kBF16, in, i), want, count),
                "")
          << "element " << i;
    }
  }
  const std::string trace = temp_path("fused_refused.jsonl");
  const CommandResult fused = exactcoll(
      "sim fused_rmsnorm --nodes 2 --ranks 4 --rows 1 --hidden 64 --contract tree "
      "--trace " +
      trace + " --trace-elements 3");
  EXPECT_EQ(fused.code, 2) << fused.out << fused.err;
  EXPECT_NE(fused.err.find("--trace-elements is not available for fused_rmsnorm with --nodes"), std::string::npos)
      << fused.err;
  EXPECT_FALSE(file_exists(trace));
  // An unusable eps: the one-node command's message, before anything is written (it once ran, and
  // the C API refuses it).
  for (const char* eps : {"-1", "nan"}) {
    const CommandResult bad = exactcoll(
        std::string("sim fused_rmsnorm --nodes 2 --ranks 4 --rows 1 --hidden 64 --eps ") + eps + " --trace " + trace);
    EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
    EXPECT_NE(bad.err.find("--eps must be a finite number >= 0"), std::string::npos) << bad.err;
    EXPECT_FALSE(file_exists(trace));
  }
  const CommandResult help = exactcoll("sim allreduce --nodes 2 --help");
  EXPECT_NE(help.out.find("under tree a tree_node event per node of"), std::string::npos) << help.out;
}

// Op names in either spelling (core/registry.h kOpAliases) in the full binary's commands: the
// multi-node and fused sim commands and `model --op`, each printing the canonical name.
TEST(SimNodesCommand, OpsTakeEitherSpelling) {
  const CommandResult nodes = exactcoll("sim all_reduce --nodes 2 --ranks 4 --count 8");
  ASSERT_EQ(nodes.code, 0) << nodes.err;
  EXPECT_EQ(hashes(nodes.out), hashes(exactcoll("sim allreduce --nodes 2 --ranks 4 --count 8").out));
  EXPECT_NE(nodes.out.find("exactcoll sim allreduce"), std::string::npos) << nodes.out;
  const CommandResult fused = exactcoll("sim fused_rms_norm --ranks 2 --rows 1 --hidden 16");
  ASSERT_EQ(fused.code, 0) << fused.err;
  EXPECT_EQ(hashes(fused.out), hashes(exactcoll("sim fused_rmsnorm --ranks 2 --rows 1 --hidden 16").out));
  const CommandResult model = exactcoll("model --op all_gather --nodes 2 --bytes 1048576");
  ASSERT_EQ(model.code, 0) << model.err;
  EXPECT_EQ(model.out, exactcoll("model --op allgather --nodes 2 --bytes 1048576").out);
  EXPECT_NE(exactcoll("model --help").out.find("all_reduce, all_gather and fused_rms_norm are accepted"),
            std::string::npos);
}

}  // namespace
