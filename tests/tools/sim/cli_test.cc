// `exactcoll sim`: outputs against the reference, the summary's sha256, traces, and every bad
// input case (clear message, exit 2, no output file). Runs the simulator-only binary
// //tools/sim:exactcoll_sim (same command library as //tools:exactcoll).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/contract.h"
#include "core/registry.h"
#include "core/storage.h"
#include "exactcoll/exactcoll.h"
#include "sim/collectives.h"
#include "tests/sim/sim_test_util.h"
#include "tests/support/command_runner.h"
#include "npy/npy.h"
#include "tools/sha256/sha256.h"

namespace exactcoll {
namespace {

using test_support::CommandResult;
using test_support::file_exists;
using test_support::read_file;

using test_support::temp_path;

// Runs the simulator-only binary with `args` (words for the shell) after `shell_prefix`.
CommandResult run(const std::string& args, const std::string& shell_prefix = "") {
  return test_support::run_binary(test_support::runfile("tools/sim/exactcoll_sim"), args, shell_prefix);
}

std::string last_line(const std::string& text) {
  const size_t end = text.find_last_not_of('\n');
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

// Writes rank-first inputs [n, count] of dtype from the test generator.
std::vector<std::vector<uint8_t>> write_input(const std::string& path, DType d, int n, size_t count, uint64_t seed) {
  const auto in = simtest::random_inputs(d, n, count, seed);
  std::vector<uint8_t> flat;
  for (const auto& r : in) flat.insert(flat.end(), r.begin(), r.end());
  npy::write_npy(path, d == DType::kFP32 ? npy::kF32 : npy::kU16, {n, static_cast<int64_t>(count)}, flat.data(),
                 flat.size());
  return in;
}

// "0,1,...,n-1": n element indices for --trace-elements.
std::string index_list(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) {
    if (i > 0) text.push_back(',');
    text.append(std::to_string(i));
  }
  return text;
}

TEST(SimCli, OutputsMatchTheReferenceAndTheSummaryEndsWithTheirSha256) {
  struct Case {
    const char* op;
    sim::Op collective;
    DType dtype;
    const char* dtype_name;
    int ranks;
    size_t count;
    const char* extra;
  };
  const Case cases[] = {
      {"allreduce", sim::Op::kAllReduce, DType::kBF16, "bf16", 4, 37, "--algo two_shot --blocks 3"},
      {"allreduce", sim::Op::kAllReduce, DType::kFP16, "fp16", 3, 100, "--schedule seeded --schedule-seed 9"},
      {"reduce_scatter", sim::Op::kReduceScatter, DType::kFP32, "fp32", 5, 45, ""},
      {"allgather", sim::Op::kAllGather, DType::kBF16, "bf16", 2, 9, "--blocks 2"},
      {"allreduce", sim::Op::kAllReduce, DType::kFP32, "fp32", 6, 101,
       "--algo lamport_one_shot --blocks 2 --schedule seeded --schedule-seed 4"},
  };
  for (const Case& c : cases) {
    const std::string in_path = temp_path(std::string("in_") + c.op + ".npy");
    const std::string out_path = temp_path(std::string("out_") + c.op + ".npy");
    const auto in = write_input(in_path, c.dtype, c.ranks, c.count, 3);
    const CommandResult r = run(std::string("sim ") + c.op + " --ranks " + std::to_string(c.ranks) + " --dtype " +
                                c.dtype_name + " --input " + in_path + " --output " + out_path + " " + c.extra);
    ASSERT_EQ(r.code, 0) << r.err;
    const npy::NpyArray out = npy::read_npy(out_path);
    sim::CollectiveSpec spec;
    spec.op = c.collective;
    spec.dtype = c.dtype;
    spec.count = c.count;
    const auto want = simtest::expected_outputs(spec, in);
    std::vector<uint8_t> flat;
    for (const auto& w : want) flat.insert(flat.end(), w.begin(), w.end());
    EXPECT_EQ(out.data, flat) << c.op;
    const std::vector<int64_t> shape = {c.ranks,
                                        static_cast<int64_t>(sim::output_count(c.collective, c.count, c.ranks))};
    EXPECT_EQ(out.shape, shape) << c.op;
    const std::string summary = last_line(r.out);
    const std::string sha = tools::sha256_hex(out.data.data(), out.data.size());
    ASSERT_GE(summary.size(), 64u);
    EXPECT_EQ(summary.substr(summary.size() - 64), sha) << summary;
  }
}

// Element i of rank r in rank-first input bytes, as T.
template <class T>
T input_element(const std::vector<std::vector<uint8_t>>& in, int r, size_t i) {
  T v;
  std::memcpy(&v, in[static_cast<size_t>(r)].data() + i * sizeof(T), sizeof(T));
  return v;
}

// What `--contract tree` must give, computed here element by element: contract::tree_fold over the
// ranks of element i (all-reduce: every element; reduce_scatter: rank r's slice), every rank's row
// [n, out_count] flattened. Also checks tree_fold itself against the written-out trees of 3 and 4
// ranks (the largest power of two below n on the left), so that the test holds the definition.
template <class T>
std::vector<uint8_t> tree_outputs(sim::Op op, const std::vector<std::vector<uint8_t>>& in, size_t count) {
  const int n = static_cast<int>(in.size());
  const auto fold = [&](size_t i) {
    const T got = contract::tree_fold<T>(n, [&](int r) { return input_element<T>(in, r, i); });
    const auto x = [&](int r) { return input_element<T>(in, r, i); };
    if (n == 4) {
      const T want = contract::tree_node(contract::tree_node(x(0), x(1)), contract::tree_node(x(2), x(3)));
      EXPECT_EQ(std::memcmp(&got, &want, sizeof(T)), 0) << "tree_fold of 4 ranks, element " << i;
    }
    if (n == 3) {
      const T want = contract::tree_node(contract::tree_node(x(0), x(1)), contract::tree_leaf(x(2)));
      EXPECT_EQ(std::memcmp(&got, &want, sizeof(T)), 0) << "tree_fold of 3 ranks, element " << i;
    }
    return got;
  };
  const size_t out_count = sim::output_count(op, count, n);
  std::vector<uint8_t> out(static_cast<size_t>(n) * out_count * sizeof(T));
  for (int r = 0; r < n; ++r) {
    for (size_t j = 0; j < out_count; ++j) {
      const size_t i = op == sim::Op::kReduceScatter ? static_cast<size_t>(r) * out_count + j : j;
      const T v = fold(i);
      std::memcpy(out.data() + (static_cast<size_t>(r) * out_count + j) * sizeof(T), &v, sizeof(T));
    }
  }
  return out;
}

// `--contract tree`: every all-reduce algorithm (and reduce_scatter) writes the tree contract's bits,
// compared bit for bit with contract::tree_fold computed here, for world sizes that are and are not
// powers of two, every dtype, several block counts and a seeded schedule; the summary names the
// contract; the same inputs under canonical give other bits (so a --contract that was ignored fails).
TEST(SimCli, TreeContractGivesTheTreeFoldsBitsForEveryAlgorithm) {
  struct Case {
    DType dtype;
    const char* dtype_name;
    int ranks;
    size_t count;
    const char* extra;
  };
  const Case cases[] = {
      {DType::kBF16, "bf16", 4, 301, "--blocks 3"},
      {DType::kFP16, "fp16", 3, 77, "--schedule seeded --schedule-seed 5"},
      {DType::kFP32, "fp32", 5, 129, "--blocks 2"},
      {DType::kBF16, "bf16", 8, 64, ""},
      {DType::kBF16, "bf16", 1, 9, ""},
  };
  std::vector<std::string> algos = algorithm_name_list(kOnSimulator, Op::kAllReduce);
  ASSERT_FALSE(algos.empty());
  EXPECT_EQ(algos.front(), "auto");
  bool differs_from_canonical = false;
  for (const Case& c : cases) {
    const std::string tag = std::string(c.dtype_name) + "_" + std::to_string(c.ranks);
    const std::string in_path = temp_path("tree_in_" + tag + ".npy");
    const auto in = write_input(in_path, c.dtype, c.ranks, c.count, 17);
    const std::vector<uint8_t> want =
        with_storage_type(c.dtype, [&](auto t) { return tree_outputs<decltype(t)>(sim::Op::kAllReduce, in, c.count); });
    for (const std::string& algo : algos) {
      SCOPED_TRACE(tag + " " + algo);
      const std::string out_path = temp_path("tree_out_" + tag + "_" + algo + ".npy");
      const CommandResult r =
          run("sim allreduce --ranks " + std::to_string(c.ranks) + " --dtype " + c.dtype_name + " --input " + in_path +
              " --output " + out_path + " --algo " + algo + " --contract tree " + c.extra);
      ASSERT_EQ(r.code, 0) << r.err;
      const npy::NpyArray out = npy::read_npy(out_path);
      EXPECT_EQ(out.shape, (std::vector<int64_t>{c.ranks, static_cast<int64_t>(c.count)}));
      EXPECT_TRUE(out.data == want) << "the output differs from contract::tree_fold's bits";
      EXPECT_NE(last_line(r.out).find(", contract tree, "), std::string::npos) << r.out;
      EXPECT_EQ(last_line(r.out).substr(last_line(r.out).size() - 64),
                tools::sha256_hex(out.data.data(), out.data.size()));
    }
    const std::string canonical_path = temp_path("tree_canonical_" + tag + ".npy");
    const CommandResult canonical = run("sim allreduce --ranks " + std::to_string(c.ranks) + " --dtype " +
                                        c.dtype_name + " --input " + in_path + " --output " + canonical_path);
    ASSERT_EQ(canonical.code, 0) << canonical.err;
    EXPECT_NE(last_line(canonical.out).find(", contract canonical, "), std::string::npos) << canonical.out;
    differs_from_canonical = differs_from_canonical || npy::read_npy(canonical_path).data != want;
  }
  EXPECT_TRUE(differs_from_canonical) << "no case tells tree from canonical: the test would pass if tree were ignored";
  // reduce_scatter folds each slice under tree too; allgather copies bits under either.
  const std::string rs_in = temp_path("tree_rs_in.npy"), rs_out = temp_path("tree_rs_out.npy");
  const auto in = write_input(rs_in, DType::kBF16, 4, 400, 23);
  const CommandResult rs = run("sim reduce_scatter --ranks 4 --dtype bf16 --blocks 2 --contract tree --input " + rs_in +
                               " --output " + rs_out);
  ASSERT_EQ(rs.code, 0) << rs.err;
  EXPECT_TRUE(npy::read_npy(rs_out).data == tree_outputs<bf16>(sim::Op::kReduceScatter, in, 400));
  const CommandResult ag_tree = run("sim allgather --ranks 4 --dtype bf16 --contract tree --input " + rs_in);
  const CommandResult ag = run("sim allgather --ranks 4 --dtype bf16 --input " + rs_in);
  ASSERT_EQ(ag_tree.code, 0) << ag_tree.err;
  EXPECT_EQ(last_line(ag_tree.out).substr(last_line(ag_tree.out).size() - 64),
            last_line(ag.out).substr(last_line(ag.out).size() - 64));
}

// Under tree a run traces its steps (--trace, --chrome-trace) and its traced elements: a tree_node
// event per internal node (n - 1 of them for each rank that folds the element) and the round;
// --help says what tree is.
TEST(SimCli, TreeContractTracesStepsAndElements) {
  const std::string trace = temp_path("tree_steps.jsonl"), chrome = temp_path("tree_steps.json");
  const CommandResult r = run("sim allreduce --ranks 4 --count 64 --algo two_shot --contract tree --trace " + trace +
                              " --chrome-trace " + chrome);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(read_file(trace).find("\"step\""), std::string::npos);
  EXPECT_EQ(read_file(trace).find("\"event\":\"tree_node\""), std::string::npos) << "no element asked for";
  EXPECT_FALSE(read_file(chrome).empty());
  const std::string trace2 = temp_path("tree_elements.jsonl");
  const CommandResult traced = run("sim allreduce --ranks 4 --count 64 --algo one_shot --contract tree --trace " +
                                   trace2 + " --trace-elements 3");
  ASSERT_EQ(traced.code, 0) << traced.err;
  // one_shot: every rank folds every element: 4 ranks x 3 nodes, 4 rounds, no canonical fold event.
  const std::string text = read_file(trace2);
  size_t nodes = 0, rounds = 0;
  for (size_t at = text.find("\"event\":\"tree_node\""); at != std::string::npos;
       at = text.find("\"event\":\"tree_node\"", at + 1)) {
    ++nodes;
  }
  for (size_t at = text.find("\"event\":\"round\""); at != std::string::npos;
       at = text.find("\"event\":\"round\"", at + 1)) {
    ++rounds;
  }
  EXPECT_EQ(nodes, 12u) << text.substr(0, 2000);
  EXPECT_EQ(rounds, 4u);
  EXPECT_EQ(text.find("\"event\":\"fold\""), std::string::npos);
  EXPECT_NE(text.find("\"left_rank\":2,\"right_rank\":3"), std::string::npos) << "the level-1 node of ranks 2 and 3";
  EXPECT_NE(text.find("\"left_rank\":0,\"right_rank\":2"), std::string::npos) << "the root";
  const CommandResult help = run("sim allreduce --help");
  EXPECT_NE(help.out.find("--contract canonical|tree"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("tree: a balanced binary tree over the ranks"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("every node rounded to storage"), std::string::npos) << help.out;
}

TEST(SimCli, RandomInputsPrintFloatsAndTheDefaultSeed) {
  const CommandResult r = run("sim allreduce --ranks 4 --dtype bf16 --count 16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("--seed 1 (the default)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 3:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("identical bits on all 4 ranks"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");  // no progress bar when stderr is not a terminal
  // Same seed, same bits; another seed, other bits.
  const std::string sha1 = last_line(r.out).substr(last_line(r.out).size() - 64);
  const CommandResult again =
      run("sim allreduce --ranks 4 --dtype bf16 --count 16 --seed 1 --algo two_shot --blocks 2");
  EXPECT_EQ(last_line(again.out).substr(last_line(again.out).size() - 64), sha1);
  const CommandResult other = run("sim allreduce --ranks 4 --dtype bf16 --count 16 --seed 2");
  EXPECT_NE(last_line(other.out).substr(last_line(other.out).size() - 64), sha1);
}

TEST(SimCli, SeededTracesAreByteIdenticalPerScheduleSeed) {
  std::string traces[3], chromes[3];
  const int seeds[3] = {5, 5, 6};
  for (int i = 0; i < 3; ++i) {
    const std::string t = temp_path("trace" + std::to_string(i) + ".jsonl"),
                      c = temp_path("chrome" + std::to_string(i) + ".json");
    const CommandResult r =
        run("sim allreduce --ranks 3 --dtype fp16 --count 40 --blocks 2 --algo two_shot --schedule seeded "
            "--schedule-seed " +
            std::to_string(seeds[i]) + " --trace " + t + " --trace-elements 0,39 --chrome-trace " + c);
    ASSERT_EQ(r.code, 0) << r.err;
    traces[i] = read_file(t);
    chromes[i] = read_file(c);
  }
  EXPECT_FALSE(traces[0].empty());
  EXPECT_EQ(traces[0], traces[1]);
  EXPECT_EQ(chromes[0], chromes[1]);
  EXPECT_NE(traces[0], traces[2]);
  EXPECT_NE(traces[0].find("\"event\":\"round\""), std::string::npos);
  EXPECT_NE(traces[0].find("\"index\":39"), std::string::npos);
}

// Each bad input: exit 2, a message naming the problem, and no output file.
TEST(SimCli, BadInputsExitTwoWithAMessageAndNoOutput) {
  const std::string out = temp_path("bad_out.npy");
  const std::string good = temp_path("good.npy"), f32 = temp_path("f32.npy"), malformed = temp_path("malformed.npy");
  write_input(good, DType::kBF16, 4, 10, 1);
  write_input(f32, DType::kFP32, 4, 10, 1);
  {
    std::ofstream m(malformed, std::ios::binary);
    m << "\x93NUMPY\x01\x00garbage";
  }
  struct Case {
    std::string args;
    std::string message;
  };
  const Case cases[] = {
      {"sim allreduce --ranks 4 --dtype bf16 --input " + f32, "holds '<f4' but --dtype bf16 needs '<u2'"},
      {"sim allreduce --ranks 4 --dtype fp32 --input " + good, "holds '<u2' but --dtype fp32 needs '<f4'"},
      {"sim allreduce --ranks 3 --dtype bf16 --input " + good, "has 4 rows in its first dimension"},
      {"sim allreduce --ranks 4 --dtype bf16 --input " + malformed, malformed},
      {"sim allreduce --ranks 4 --dtype bf16 --input " + temp_path("missing.npy"), "missing.npy"},
      {"sim reduce_scatter --ranks 4 --dtype bf16 --input " + good, "divisible by the ranks: 10 elements over 4 ranks"},
      {"sim reduce_scatter --ranks 3 --dtype bf16 --count 7", "divisible by the ranks"},
      {"sim allreduce --ranks 0 --dtype bf16 --count 8", "--ranks must be 1..16, got 0"},
      {"sim allreduce --ranks -2 --dtype bf16 --count 8", "--ranks must be 1..16, got -2"},
      {"sim allreduce --ranks 17 --dtype bf16 --count 8", "--ranks must be 1..16, got 17"},
      {"sim allreduce --dtype bf16 --count 8", "give --ranks"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 0", "--count must be >= 1"},
      // 2^62 x 4 ranks x 4 bytes wrapped to 0 in 64 bits and passed the 16 GiB check.
      {"sim allreduce --ranks 4 --dtype fp32 --count 4611686018427387904", "more than 16 GiB of input"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --fail-rank 1", "--fail-rank and --fail-at-step go together"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --fail-rank 2 --fail-at-step 1",
       "--fail-rank must be a rank, 0..1"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --fail-rank 0 --fail-at-step 0", "--fail-at-step must be >= 1"},
      // The CLI fuzzer's find: now + 2^63 - 1 ms overflowed the clock (UBSan).
      {"sim allreduce --ranks 4 --count 16 --timeout-ms 9223372036854775807",
       "--timeout-ms must be 1..2147483647 (about 24.8 days), got 9223372036854775807"},
      {"sim allreduce --ranks 4 --count 16 --timeout-ms 0", "--timeout-ms must be 1..2147483647"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --fail-rank 0 --fail-at-step 999",
       "fail_at_step 999 was never reached: rank 0 took"},
      {"sim allreduce --ranks 2 --dtype bf16", "give --input FILE or --count C"},
      {"sim allreduce --ranks 4 --dtype bf16 --count 8 --input " + good, "not both"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --blocks 129", "--blocks must be 1..128"},
      {"sim allreduce --ranks 2 --dtype bf17 --count 8", "--dtype must be one of"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --algo three_shot", "--algo must be one of"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --trace-elements 1,x --trace " + temp_path("t.jsonl"),
       "--trace-elements wants element indices"},
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --trace-elements 8 --trace " + temp_path("t.jsonl"),
       "index 8 is past the 8 elements"},
      // The C API's bound (EXACTCOLL_MAX_TRACE_ELEMENTS) for every sim command (--nodes: its own test).
      {"sim allreduce --ranks 2 --dtype bf16 --count 5000 --trace-elements " + index_list(4097) + " --trace " +
           temp_path("t.jsonl"),
       "--trace-elements names 4097 elements; at most 4096"},

      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --schedule-seed 3", "needs --schedule seeded"},
      {"sim allgather --ranks 2 --dtype bf16 --count 8 --bogus 1", "unknown flag --bogus"},
      // --contract: the library's contracts on the simulator; the fused op's emulations are not.
      {"sim allreduce --ranks 2 --dtype bf16 --count 8 --contract sum",
       "--contract must be one of canonical|tree, got 'sum'"},
      {"sim reduce_scatter --ranks 2 --dtype bf16 --count 8 --contract f32_residual",
       "--contract must be one of canonical|tree, got 'f32_residual'"},
      {"sim allsum --ranks 2", "unknown op 'allsum'"},
  };
  for (const Case& c : cases) {
    std::remove(out.c_str());
    const CommandResult r = run(c.args + " --output " + out);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_FALSE(file_exists(out)) << c.args;
  }
}

// A run that fails (here: a step bound of 5 stops the seeded run, reported as a livelock) exits 3
// and writes no output.
TEST(SimCli, FailedRunExitsThreeWithoutOutput) {
  const std::string out = temp_path("fail_out.npy");
  const CommandResult r =
      run("sim allreduce --ranks 3 --dtype bf16 --count 8 --schedule seeded --schedule-seed 4 "
          "--max-steps 5 --output " +
          out);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("reproduce with --schedule-seed 4"), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(out));
}

// Issue 15, item 1: a timeout in the simulator's handle exchange escaped as a StoreError and
// aborted the process (20 of 20 runs of the first command). Every outcome must now be an exit
// code: 0, or 3 with a message (a 1 ms flag wait may legitimately time out).
TEST(SimCli, TinyTimeoutsEndInAnExitCodeNeverASignal) {
  const std::string args[] = {"sim allreduce --ranks 16 --count 16 --timeout-ms 1",
                              "sim allgather --ranks 16 --count 16 --timeout-ms 1",
                              "sim reduce_scatter --ranks 16 --count 16 --timeout-ms 1",
                              "sim allreduce --ranks 4 --count 400000 --timeout-ms 1 --algo two_shot"};
  for (const std::string& a : args) {
    for (int i = 0; i < 5; ++i) {
      const CommandResult r = run(a);
      EXPECT_TRUE(r.code == 0 || r.code == 3) << a << ": exit " << r.code << "\n" << r.err;
      if (r.code == 3) {
        EXPECT_NE(r.err.find("the run failed: "), std::string::npos) << r.err;
      }
    }
  }
}

// Issue 15, item 6: an unwritable output is bad input found before any work; nothing is created.
TEST(SimCli, AnUnwritableOutputIsExitTwoBeforeAnyWork) {
  const std::string trace = temp_path("unwritable_trace.jsonl");
  const CommandResult r = run("sim allreduce --ranks 2 --count 8 --trace " + trace + " --output /nonexistent/o.npy");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/o.npy: cannot create"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(file_exists(trace));
  const CommandResult fifo_out = run("sim allreduce --ranks 2 --count 8 --output /dev/null");
  EXPECT_EQ(fifo_out.code, 2) << "a device is never replaced: " << fifo_out.err;
}

// Issue 15, item 4: `sim allgather` checked only its input against memory; its output is N times
// larger (16 ranks x 16 Mi fp32: 1 GiB in, 16 GiB out) and it died of std::bad_alloc under
// `prlimit --as=4294967296`.
TEST(SimCli, TheOutputCountsAgainstTheMemoryLimit) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves terabytes of address space: an address-space limit breaks it";
#else
  const std::string out = temp_path("big_gather.npy");
  const CommandResult r =
      run("sim allgather --ranks 16 --count 16777216 --dtype fp32 --output " + out, "ulimit -v 4194304; ");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("GiB, more than the 4.0 GiB this process may use"), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(out));
#endif
}

// Fault injection on every collective and both schedulers: the dead rank is named, the run
// exits 3, no output is written, and the trace (what happened) is.
TEST(SimCli, ADeadRankIsAClearErrorAndNoOutput) {
  const std::string out = temp_path("dead_out.npy"), trace = temp_path("dead_trace.jsonl");
  for (const char* op :
       {"allreduce --algo one_shot", "allreduce --algo two_shot", "allreduce --algo push_one_shot",
        "allreduce --algo push_two_shot", "allreduce --algo lamport_one_shot", "reduce_scatter", "allgather"}) {
    for (const char* schedule : {"threads", "seeded"}) {
      std::remove(out.c_str());
      std::remove(trace.c_str());
      const CommandResult r =
          run(std::string("sim ") + op + " --ranks 4 --count 64 --blocks 2 --schedule " + schedule +
              " --timeout-ms 300 --fail-rank 2 --fail-at-step 3 --output " + out + " --trace " + trace);
      EXPECT_EQ(r.code, 3) << op << " " << schedule << "\n" << r.err;
      EXPECT_NE(r.err.find("the run failed: "), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("rank 2 was stopped by fault injection at its synchronization step 3"), std::string::npos)
          << r.err;
      EXPECT_NE(r.err.find("peer 2"), std::string::npos) << "the peers' error names the dead rank: " << r.err;
      EXPECT_FALSE(file_exists(out)) << op << " " << schedule;
      EXPECT_TRUE(file_exists(trace)) << op << " " << schedule;
    }
  }
}

// Ops in either spelling (core/registry.h kOpAliases): `sim all_reduce` is `sim allreduce`, to
// the byte but the time, and prints the canonical name; --help says so.
TEST(SimCli, OpsTakeEitherSpellingAndPrintTheCanonicalOne) {
  auto without_time = [](std::string text) {
    const size_t ms = text.find(" ms;");
    const size_t begin = text.rfind(", ", ms);
    return text.erase(begin, ms - begin);
  };
  for (const auto& [alias, name] : {std::pair{"all_reduce", "allreduce"}, std::pair{"all_gather", "allgather"}}) {
    const std::string args = " --ranks 3 --count 12 --seed 5";
    const CommandResult a = run(std::string("sim ") + alias + args), b = run(std::string("sim ") + name + args);
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    EXPECT_EQ(without_time(a.out), without_time(b.out));
    EXPECT_EQ(a.out.find(alias), std::string::npos) << a.out;
  }
  EXPECT_NE(
      run("sim --help")
          .out.find(
              "(all_reduce, all_gather and fused_rms_norm are accepted for allreduce, allgather and fused_rmsnorm)"),
      std::string::npos);
}

TEST(SimCli, VersionHelpAndHintsNameTheCommandAsTyped) {
  const CommandResult version = run("--version");
  EXPECT_EQ(version.code, 0);
  EXPECT_EQ(version.out, "exactcoll " + std::to_string(EXACTCOLL_VERSION_MAJOR) + "." +
                             std::to_string(EXACTCOLL_VERSION_MINOR) + "." + std::to_string(EXACTCOLL_VERSION_PATCH) +
                             " (C ABI " + std::to_string(EXACTCOLL_ABI_VERSION) + ")\n");
  // A flag error names the command as typed and a help command that exists.
  const CommandResult bad = run("sim allreduce --ranks 2 --bogus 1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err.rfind("exactcoll sim allreduce: ", 0), 0u) << bad.err;
  EXPECT_NE(bad.err.find("(exactcoll sim allreduce --help explains every flag)"), std::string::npos) << bad.err;
  EXPECT_EQ(run("sim allreduce --help").code, 0);
  // A flag without a default says so instead of "(default: 0)".
  const CommandResult help = run("sim allreduce --help");
  EXPECT_NE(help.out.find("simulated ranks, 1..16 (required)"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("(default: 0)"), std::string::npos) << help.out;
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(tools::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(tools::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(tools::sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces (exercises the buffering).
  tools::Sha256 h;
  const std::string piece(997, 'a');
  size_t fed = 0;
  while (fed + piece.size() <= 1000000) {
    h.update(piece.data(), piece.size());
    fed += piece.size();
  }
  h.update(piece.data(), 1000000 - fed);
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace exactcoll
