// `exactcoll sim fused_rmsnorm` driven through its registered function on temp files: every
// algorithm gives byte-identical files equal to the reference, alternative contracts differ,
// traces are written, and bad input exits 2 without writing anything.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/registry.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "tests/sim/tree_nodes.h"
#include "tests/support/command_runner.h"
#include "tools/diff/diff_command.h"
#include "tools/fused/fused_rmsnorm_command.h"
#include "tools/sim/sim_subcommands.h"
#include "npy/npy.h"

namespace exactcoll::fused {
namespace {

using test_support::CommandResult;
using test_support::file_exists;
using test_support::read_file;
using test_support::run_in_process;
using test_support::temp_path;

// Through the sim-subcommand registry, as tools/sim dispatches.
CommandResult run_fused(const std::vector<std::string>& args) {
  const cli::SimSubcommand* sub = cli::find_sim_subcommand("fused_rmsnorm");
  if (sub == nullptr) {
    ADD_FAILURE() << "fused_rmsnorm is not registered as a sim subcommand";
    return {-1, "", ""};
  }
  return run_in_process(sub->run, "fused_rmsnorm", args);
}

// Writes x [N, rows, H], r [rows, H], w [H] in bf16 bits; returns the reference outputs.
struct Files {
  std::string x, r, w;
  std::vector<bf16> ref_out, ref_ro, f32_ro;
  std::vector<bf16> tree_out, tree_ro;  // fused_reference(Contract::kTree, ...)
};

Files make_files(const std::string& tag, int ranks, int rows, int hidden, uint64_t seed) {
  SplitMix64 rng(seed);
  const size_t count = static_cast<size_t>(rows) * hidden;
  std::vector<bf16> x(count * ranks), r(count), w(hidden);
  for (auto& v : x) v = round_to<bf16>(rng.normal());
  for (auto& v : r) v = round_to<bf16>(rng.normal());
  for (auto& v : w) v = round_to<bf16>(1.0f + 0.1f * rng.normal());
  Files f{temp_path(tag + "_x.npy"), temp_path(tag + "_r.npy"), temp_path(tag + "_w.npy"), {}, {}, {}, {}, {}};
  npy::write_npy(f.x, npy::kU16, {ranks, rows, hidden}, x.data(), x.size() * 2);
  npy::write_npy(f.r, npy::kU16, {rows, hidden}, r.data(), r.size() * 2);
  npy::write_npy(f.w, npy::kU16, {hidden}, w.data(), w.size() * 2);
  FusedProblem<bf16> p;
  p.ranks = ranks, p.rows = rows, p.hidden = hidden, p.eps = 1e-6f;
  p.x = x.data(), p.residual = r.data(), p.weight = w.data();
  if (hidden % Storage<bf16>::kPack != 0) return f;  // an input for the bad-input cases: no reference
  f.ref_out.resize(count), f.ref_ro.resize(count), f.f32_ro.resize(count);
  f.tree_out.resize(count), f.tree_ro.resize(count);
  std::vector<bf16> scratch(count);
  fused_reference<bf16>(Contract::kCanonical, p, f.ref_ro.data(), f.ref_out.data());
  fused_reference<bf16>(Contract::kF32Residual, p, f.f32_ro.data(), scratch.data());
  fused_reference<bf16>(Contract::kTree, p, f.tree_ro.data(), f.tree_out.data());
  return f;
}

TEST(SimFusedCommand, AlgorithmsWriteIdenticalFilesEqualToTheReference) {
  const int ranks = 4, rows = 3, H = 4096;
  const Files f = make_files("alg", ranks, rows, H, 11);
  std::string first_summary_hashes;
  for (const char* algo :
       {"one_stage", "two_stage", "push_one_stage", "unfused", "one_stage_reg", "gather_norm", "push_one_stage_reg"}) {
    const std::string out = temp_path(std::string(algo) + "_out.npy"), ro = temp_path(std::string(algo) + "_ro.npy");
    const CommandResult r = run_fused({"--ranks", "4", "--dtype", "bf16", "--input", f.x, "--residual", f.r, "--weight",
                                       f.w, "--output", out, "--residual-output", ro, "--algo", algo, "--blocks", "3"});
    ASSERT_EQ(r.code, 0) << algo << ": " << r.err;
    // The GPU's register kernels run on blocks of the tree's lanes (512 for H 4096 bf16).
    const bool reg = std::string(algo).find("_reg") != std::string::npos || std::string(algo) == "gather_norm";
    EXPECT_NE(r.out.find(std::string("sim fused_rmsnorm bf16: 4 ranks x [3, 4096] (") + f.x +
                         " (4, 3, 4096)), contract canonical, " + algo +
                         (reg ? ", 3 blocks x 512 threads (register path)" : ", 3 blocks") +
                         ", threads schedule; out sha256 "),
              std::string::npos)
        << r.out;
    const std::string hashes = r.out.substr(r.out.find("out sha256"));
    if (first_summary_hashes.empty()) first_summary_hashes = hashes;
    EXPECT_EQ(hashes, first_summary_hashes) << algo;
    const npy::NpyArray o = npy::read_npy(out), q = npy::read_npy(ro);
    ASSERT_EQ(o.shape, (std::vector<int64_t>{ranks, rows, H}));
    ASSERT_EQ(q.shape, (std::vector<int64_t>{ranks, rows, H}));
    for (int k = 0; k < ranks; ++k) {
      EXPECT_EQ(std::memcmp(o.data.data() + k * rows * H * 2, f.ref_out.data(), rows * H * 2), 0)
          << algo << " rank " << k;
      EXPECT_EQ(std::memcmp(q.data.data() + k * rows * H * 2, f.ref_ro.data(), rows * H * 2), 0)
          << algo << " rank " << k;
    }
  }
  // `exactcoll diff` agrees: identical files exit 0.
  const CommandResult d = run_in_process(
      diff::diff_main, "diff", {temp_path("one_stage_ro.npy"), temp_path("two_stage_ro.npy"), "--dtype", "bf16"});
  EXPECT_EQ(d.code, 0) << d.out;
}

// --contract tree runs the simulated algorithms (not the reference's emulation): every simulator
// algorithm, on 4 ranks and on 3 (not a power of two), with blocks, threads and a seeded schedule,
// writes on every rank the bits of fused_reference(Contract::kTree) computed here; they are not
// canonical's; the summary names the contract and the algorithm.
TEST(SimFusedCommand, TreeContractRunsEveryAlgorithmWithTheTreeReferencesBits) {
  std::vector<std::string> algos = fused_algorithm_name_list(kOnSimulator);
  ASSERT_GE(algos.size(), 8u);
  for (const int ranks : {4, 3}) {
    const int rows = 5, H = 256;
    const Files f = make_files("tree" + std::to_string(ranks), ranks, rows, H, 31);
    const size_t count = static_cast<size_t>(rows) * H;
    const bool same_as_canonical = std::memcmp(f.tree_out.data(), f.ref_out.data(), count * 2) == 0 &&
                                   std::memcmp(f.tree_ro.data(), f.ref_ro.data(), count * 2) == 0;
    ASSERT_FALSE(same_as_canonical) << "these inputs must tell tree from canonical";
    for (const std::string& algo : algos) {
      for (const std::vector<std::string>& variant :
           std::vector<std::vector<std::string>>{{"--blocks", "2"}, {"--schedule", "seeded", "--schedule-seed", "7"}}) {
        std::string label = std::to_string(ranks) + " ranks " + algo;
        for (const auto& a : variant) label += " " + a;
        SCOPED_TRACE(label);
        const std::string out = temp_path("tree_out.npy"), ro = temp_path("tree_ro.npy");
        std::remove(out.c_str());
        std::remove(ro.c_str());
        std::vector<std::string> args = {"--ranks",
                                         std::to_string(ranks),
                                         "--input",
                                         f.x,
                                         "--residual",
                                         f.r,
                                         "--weight",
                                         f.w,
                                         "--algo",
                                         algo,
                                         "--output",
                                         out,
                                         "--residual-output",
                                         ro,
                                         "--contract",
                                         "tree"};
        args.insert(args.end(), variant.begin(), variant.end());
        const CommandResult r = run_fused(args);
        ASSERT_EQ(r.code, 0) << r.err;
        const std::string ran = algo == "auto" ? "one_stage" : algo;
        EXPECT_NE(r.out.find("), contract tree, " + ran + ", "), std::string::npos) << r.out;
        const npy::NpyArray o = npy::read_npy(out), q = npy::read_npy(ro);
        ASSERT_EQ(o.data.size(), count * 2 * ranks);
        ASSERT_EQ(q.data.size(), count * 2 * ranks);
        for (int k = 0; k < ranks; ++k) {
          EXPECT_EQ(std::memcmp(o.data.data() + k * count * 2, f.tree_out.data(), count * 2), 0) << "out, rank " << k;
          EXPECT_EQ(std::memcmp(q.data.data() + k * count * 2, f.tree_ro.data(), count * 2), 0)
              << "residual_out, rank " << k;
        }
      }
    }
  }
}

TEST(SimFusedCommand, AlternativeContractDiffersAndTakesNoAlgo) {
  const Files f = make_files("alt", 4, 2, 4096, 12);
  const std::string ro = temp_path("alt_ro.npy"), canon = temp_path("alt_canon_ro.npy");
  const std::vector<std::string> in = {"--ranks", "4",          "--dtype", "bf16",     "--input",
                                       f.x,       "--residual", f.r,       "--weight", f.w};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = in;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ASSERT_EQ(run_fused(with({"--contract", "f32_residual", "--residual-output", ro})).code, 0);
  ASSERT_EQ(run_fused(with({"--residual-output", canon})).code, 0);
  const npy::NpyArray a = npy::read_npy(ro);
  EXPECT_EQ(std::memcmp(a.data.data(), f.f32_ro.data(), f.f32_ro.size() * 2), 0);
  const CommandResult d = run_in_process(diff::diff_main, "diff", {ro, canon, "--dtype", "bf16"});
  EXPECT_EQ(d.code, 1) << d.out;
  const CommandResult bad = run_fused(with({"--contract", "f32_residual", "--algo", "two_stage"}));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--algo applies only to --contract canonical or tree"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("--blocks"), std::string::npos) << "only the flags given are named: " << bad.err;
  EXPECT_EQ(bad.err.find("--trace"), std::string::npos) << "only the flags given are named: " << bad.err;
  const CommandResult threads = run_fused(with({"--contract", "f32_residual", "--threads", "64"}));
  EXPECT_EQ(threads.code, 2);
  EXPECT_NE(threads.err.find("--threads applies only to --contract canonical"), std::string::npos) << threads.err;
}

TEST(SimFusedCommand, SeededScheduleAndTraces) {
  const Files f = make_files("tr", 3, 2, 64, 13);
  const std::string trace = temp_path("tr.jsonl"), chrome = temp_path("tr.json"), out = temp_path("tr_out.npy");
  const CommandResult r =
      run_fused({"--ranks",        "3",         "--input",          f.x,      "--residual",      f.r, "--weight", f.w,
                 "--algo",         "two_stage", "--schedule",       "seeded", "--schedule-seed", "5", "--trace",  trace,
                 "--chrome-trace", chrome,      "--trace-elements", "0,70",   "--output",        out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("seeded schedule (--schedule-seed 5)"), std::string::npos) << r.out;
  const std::string t = read_file(trace);
  EXPECT_NE(t.find("fused_slice"), std::string::npos);
  EXPECT_NE(t.find("gather_rows"), std::string::npos);
  EXPECT_FALSE(read_file(chrome).empty());
  const npy::NpyArray o = npy::read_npy(out);
  EXPECT_EQ(std::memcmp(o.data.data(), f.ref_out.data(), f.ref_out.size() * 2), 0);
}

// push_one_stage's trace (core's kernel, and the GPU's register kernel push_one_stage_reg): the push
// into the peers' scratch, then the rows read from this rank's own input and scratch only.
TEST(SimFusedCommand, PushOneStageTraceShowsPushThenLocalReads) {
  for (const char* algo : {"push_one_stage", "push_one_stage_reg"}) {
    SCOPED_TRACE(algo);
    const Files f = make_files("push", 3, 2, 64, 16);
    const std::string trace = temp_path("push.jsonl"), out = temp_path("push_out.npy");
    const CommandResult r =
        run_fused({"--ranks", "3",   "--input",          f.x,    "--residual", f.r,      "--weight",        f.w,
                   "--algo",  algo,  "--blocks",         "2",    "--schedule", "seeded", "--schedule-seed", "3",
                   "--trace", trace, "--trace-elements", "0,70", "--output",   out});
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string t = read_file(trace);
    EXPECT_NE(t.find("\"step\":\"push_rows\""), std::string::npos);
    EXPECT_NE(t.find("\"step\":\"fused_rows\""), std::string::npos);
    // Rank 0 block 0 writes into rank 1's and rank 2's scratch; its rows read nobody else's buffers.
    std::istringstream lines(t);
    int pushes_to_peers = 0, rows_steps = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.find("\"rank\":0,\"block\":0,\"step\":\"push_rows\"") != std::string::npos) {
        pushes_to_peers += line.find("\"access\":\"write\",\"peer\":1,\"buffer\":\"scratch\"") != std::string::npos;
        pushes_to_peers += line.find("\"access\":\"write\",\"peer\":2,\"buffer\":\"scratch\"") != std::string::npos;
      }
      if (line.find("\"step\":\"fused_rows\"") != std::string::npos) {
        ++rows_steps;
        const size_t at = line.find("\"rank\":");
        ASSERT_NE(at, std::string::npos);
        const std::string me = line.substr(at + 7, 1);
        for (const char* peer : {"0", "1", "2"}) {
          if (me != peer) {
            EXPECT_EQ(line.find(std::string("\"peer\":") + peer), std::string::npos) << line;
          }
        }
      }
    }
    EXPECT_EQ(pushes_to_peers, 2);
    EXPECT_EQ(rows_steps, 6);  // 3 ranks x 2 blocks
    EXPECT_NE(t.find("\"event\":\"fold\""), std::string::npos) << "the traced elements' folds";
    const npy::NpyArray o = npy::read_npy(out);
    EXPECT_EQ(std::memcmp(o.data.data(), f.ref_out.data(), f.ref_out.size() * 2), 0);
  }
}

// The GPU's kernels of core/fused_rmsnorm_kernels.h (one_stage_reg, gather_norm,
// push_one_stage_reg) give one_stage's sha256 on random inputs with specials, every dtype, on the
// register path (default threads) and core's (--threads 64: the GPU's default grid for these H;
// --threads 3), under the threads scheduler and a seeded one.
TEST(SimFusedCommand, GpuKernelsGiveOneStagesSha) {
  for (const char* dtype : {"bf16", "fp16", "fp32"}) {
    const std::vector<std::string> problem = {"--ranks",  "3",   "--dtype",    dtype,    "--rows", "5",
                                              "--hidden", "128", "--specials", "--seed", "4"};
    auto sha_of = [&](std::vector<std::string> extra) {
      std::vector<std::string> args = problem;
      args.insert(args.end(), extra.begin(), extra.end());
      const CommandResult r = run_fused(args);
      EXPECT_EQ(r.code, 0) << r.err;
      const size_t at = r.out.find("out sha256");
      return at == std::string::npos ? "no sha: " + r.out : r.out.substr(at);
    };
    const std::string want = sha_of({"--algo", "one_stage"});
    for (const char* algo : {"one_stage_reg", "gather_norm", "push_one_stage_reg"}) {
      for (const std::vector<std::string>& variant :
           std::vector<std::vector<std::string>>{{},
                                                 {"--threads", "64"},
                                                 {"--threads", "3", "--blocks", "2"},
                                                 {"--blocks", "2", "--schedule", "seeded", "--schedule-seed", "11"},
                                                 {"--threads", "5", "--schedule", "seeded", "--schedule-seed", "12"}}) {
        std::vector<std::string> args = {"--algo", algo};
        args.insert(args.end(), variant.begin(), variant.end());
        std::string label = dtype;
        for (const auto& a : args) label += " " + a;
        EXPECT_EQ(sha_of(args), want) << label;
      }
    }
  }
  // The summary says which path ran.
  const CommandResult reg = run_fused({"--ranks", "2", "--rows", "2", "--hidden", "64", "--algo", "gather_norm"});
  EXPECT_NE(reg.out.find("gather_norm, 1 block x 32 threads (register path), threads schedule"), std::string::npos)
      << reg.out;
  const CommandResult core = run_fused(
      {"--ranks", "2", "--rows", "2", "--hidden", "64", "--algo", "one_stage_reg", "--threads", "64", "--blocks", "2"});
  EXPECT_NE(core.out.find("one_stage_reg, 2 blocks x 64 threads (core's path), threads schedule"), std::string::npos)
      << core.out;
}

// gather_norm's trace: the input staged in the kernel, this rank's slice folded into its scratch and
// outputs, then every peer's slice read from the peer's scratch; the Chrome trace is written.
TEST(SimFusedCommand, GatherNormTraceShowsSliceThenGather) {
  const Files f = make_files("gn", 3, 4, 64, 17);
  const std::string trace = temp_path("gn.jsonl"), chrome = temp_path("gn.json"), out = temp_path("gn_out.npy");
  const CommandResult r = run_fused({"--ranks",        "3",      "--input",          f.x,           "--residual", f.r,
                                     "--weight",       f.w,      "--algo",           "gather_norm", "--blocks",   "2",
                                     "--schedule",     "seeded", "--schedule-seed",  "5",           "--trace",    trace,
                                     "--chrome-trace", chrome,   "--trace-elements", "0,70",        "--output",   out});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string t = read_file(trace);
  for (const char* step : {"stage_input", "fused_slice", "gather_norm_rows"}) {
    EXPECT_NE(t.find(std::string("\"step\":\"") + step + "\""), std::string::npos) << step;
  }
  // Rank 0 block 0 gathers row 1 (rank 1's slice) from rank 1's scratch and row 2 from rank 2's.
  EXPECT_NE(t.find("\"rank\":0,\"block\":0,\"step\":\"gather_norm_rows\",\"accesses\":[{\"access\":\"read\",\"peer\":1,"
                   "\"buffer\":\"scratch\",\"begin\":64,\"end\":128}"),
            std::string::npos);
  const std::string c = read_file(chrome);
  EXPECT_NE(c.find("\"name\":\"gather_norm_rows\""), std::string::npos);
  EXPECT_NE(c.find("\"traceEvents\""), std::string::npos);
  const npy::NpyArray o = npy::read_npy(out);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(std::memcmp(o.data.data() + k * f.ref_out.size() * 2, f.ref_out.data(), f.ref_out.size() * 2), 0) << k;
  }
}

// The help names every algorithm and --threads.
TEST(SimFusedCommand, HelpListsEveryAlgorithm) {
  const CommandResult r = run_fused({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* algo : {"one_stage", "one_stage_reg", "two_stage", "gather_norm", "push_one_stage",
                           "push_one_stage_reg", "lamport_one_stage", "lamport_two_stage", "unfused"}) {
    EXPECT_TRUE(r.out.find(std::string(algo) + "|") != std::string::npos ||
                r.out.find(std::string(algo) + "]") != std::string::npos)
        << algo;
  }
  EXPECT_NE(r.out.find("--threads N"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("register path"), std::string::npos) << r.out;
}

// Random inputs: the same as tools/inputs' generator makes (so `exactcoll gpu fused_rmsnorm`
// with the same flags prints comparable sha256s), every algorithm the same bits, specials too.
TEST(SimFusedCommand, RandomInputsAllAlgorithmsSameSha) {
  std::string hashes;
  for (const char* algo : {"one_stage", "two_stage", "push_one_stage", "unfused"}) {
    const CommandResult r = run_fused({"--ranks", "3", "--dtype", "fp16", "--rows", "5", "--hidden", "256",
                                       "--specials", "--algo", algo, "--blocks", "2"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("3 ranks x [5, 256] (random with specials, --seed 1 (the default)), contract canonical"),
              std::string::npos)
        << r.out;
    const std::string h = r.out.substr(r.out.find("out sha256"));
    if (hashes.empty()) hashes = h;
    EXPECT_EQ(h, hashes) << algo;
  }
  const CommandResult other =
      run_fused({"--ranks", "3", "--dtype", "fp16", "--rows", "5", "--hidden", "256", "--seed", "2"});
  ASSERT_EQ(other.code, 0) << other.err;
  EXPECT_EQ(other.out.find(hashes), std::string::npos);
}

TEST(SimFusedCommand, BadInputExitsTwoAndWritesNothing) {
  const Files f = make_files("bad", 2, 2, 64, 14);
  const std::string out = temp_path("bad_out.npy");
  auto expect_bad = [&](std::vector<std::string> args, const std::string& message_part) {
    args.push_back("--output");
    args.push_back(out);
    const CommandResult r = run_fused(args);
    EXPECT_EQ(r.code, 2) << message_part << ": " << r.err;
    EXPECT_NE(r.err.find(message_part), std::string::npos) << r.err;
    EXPECT_FALSE(file_exists(out)) << message_part;
  };
  expect_bad({"--ranks", "3", "--input", f.x, "--residual", f.r, "--weight", f.w},
             "has 2 ranks in its first dimension");
  expect_bad({"--ranks", "2", "--dtype", "fp32", "--input", f.x, "--residual", f.r, "--weight", f.w}, "needs '<f4'");
  expect_bad({"--ranks", "2", "--input", f.x, "--residual", f.x, "--weight", f.w}, "must be [rows, H] = (2, 64)");
  expect_bad({"--ranks", "2", "--input", f.x, "--residual", f.r, "--weight", f.r}, "must be [H] = (64,)");
  expect_bad({"--ranks", "2", "--input", f.x, "--residual", f.r}, "give all of --input, --residual and --weight");
  expect_bad({"--ranks", "2"}, "or --rows and --hidden for random inputs");
  expect_bad({"--ranks", "2", "--rows", "2"}, "or --rows and --hidden for random inputs");
  expect_bad({"--ranks", "2", "--rows", "2", "--hidden", "100"}, "not a positive multiple");
  expect_bad({"--ranks", "2", "--input", f.x, "--residual", f.r, "--weight", f.w, "--seed", "3"}, "not with --input");
  expect_bad({"--input", f.x, "--residual", f.r, "--weight", f.w}, "give --ranks N");
  expect_bad({"--ranks", "2", "--input", f.x, "--residual", f.r, "--weight", f.w, "--blocks", "129"},
             "--blocks must be");
  for (const char* threads : {"0", "-3", "1025"}) {
    expect_bad({"--ranks", "2", "--input", f.x, "--residual", f.r, "--weight", f.w, "--algo", "gather_norm",
                "--threads", threads},
               "--threads must be 1..1024, got " + std::string(threads));
  }
  // Seeded: every thread of every block alive at once is bounded (4 x 5 x 1024 = 20480 > 16384).
  expect_bad({"--ranks", "4", "--rows", "2", "--hidden", "8192", "--algo", "one_stage_reg", "--blocks", "5",
              "--schedule", "seeded"},
             "would hold 20480 simulated threads at once (4 ranks x 5 blocks x 1024 threads), more than 16384");
  for (const char* algo : {"gather_norm", "one_stage_reg", "push_one_stage_reg"}) {
    expect_bad({"--ranks", "2", "--rows", "2", "--hidden", "100", "--algo", algo}, "not a positive multiple");
  }
  // H = 12 is not a multiple of the bf16 pack (8).
  const Files odd = make_files("odd", 2, 1, 12, 15);
  expect_bad({"--ranks", "2", "--input", odd.x, "--residual", odd.r, "--weight", odd.w}, "not a positive multiple");
  // A malformed file.
  const std::string junk = temp_path("junk.npy");
  std::ofstream(junk) << "not numpy";
  expect_bad({"--ranks", "2", "--input", junk, "--residual", f.r, "--weight", f.w}, "bad magic");
}

TEST(SimFusedCommand, AnUnwritableOutputLeavesNoOtherOutputAndRunsNothing) {
  // Issue 15, item 6: --residual-output /nonexistent/o2.npy exited 3 after the whole computation
  // and left --output o1.npy behind.
  const std::string o1 = temp_path("half_o1.npy"), trace = temp_path("half_trace.jsonl");
  std::remove(o1.c_str());
  const CommandResult r = run_fused({"--ranks", "4", "--rows", "2", "--hidden", "8", "--output", o1, "--trace", trace,
                                     "--residual-output", "/nonexistent/o2.npy"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/o2.npy: cannot create"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "nothing may run before every output is known to be writable";
  EXPECT_FALSE(file_exists(o1));
  EXPECT_FALSE(file_exists(trace));
}

TEST(SimFusedCommand, EpsMustBeFiniteAndNonNegative) {
  // Issue 15, item 7: --eps nan made every output NaN and exited 0; -1 and inf were accepted too.
  const std::string out = temp_path("eps_out.npy");
  for (const char* eps : {"nan", "-nan", "-1", "inf", "-inf", "1e300"}) {
    const CommandResult r = run_fused({"--ranks", "2", "--rows", "2", "--hidden", "8", "--eps", eps, "--output", out});
    EXPECT_EQ(r.code, 2) << eps << ": " << r.err;
    EXPECT_NE(r.err.find("--eps must be a finite number >= 0"), std::string::npos) << r.err;
    EXPECT_FALSE(file_exists(out)) << eps;
  }
  EXPECT_EQ(run_fused({"--ranks", "2", "--rows", "2", "--hidden", "8", "--eps", "0"}).code, 0);
  EXPECT_EQ(check_eps(1e-6), "");
}

TEST(SimFusedCommand, ADeadRankIsAClearErrorAndNoOutput) {
  // Fault injection: rank 1 dies at its second flag operation. Its peers time out (threads) or
  // deadlock (seeded), the error names it, and no output is written.
  const std::string out = temp_path("dead_out.npy"), ro = temp_path("dead_ro.npy");
  for (const char* schedule : {"threads", "seeded"}) {
    for (const char* algo : {"one_stage", "two_stage", "push_one_stage", "unfused", "one_stage_reg", "gather_norm",
                             "push_one_stage_reg"}) {
      const CommandResult r = run_fused({"--ranks",
                                         "3",
                                         "--rows",
                                         "4",
                                         "--hidden",
                                         "64",
                                         "--algo",
                                         algo,
                                         "--schedule",
                                         schedule,
                                         "--timeout-ms",
                                         "300",
                                         "--fail-rank",
                                         "1",
                                         "--fail-at-step",
                                         "2",
                                         "--output",
                                         out,
                                         "--residual-output",
                                         ro});
      EXPECT_EQ(r.code, 3) << schedule << " " << algo << ": " << r.err;
      EXPECT_NE(r.err.find("rank 1 was stopped by fault injection at its synchronization step 2"), std::string::npos)
          << r.err;
      EXPECT_NE(r.err.find("peer 1"), std::string::npos) << "the peers' error names the dead rank: " << r.err;
      EXPECT_FALSE(file_exists(out));
      EXPECT_FALSE(file_exists(ro));
    }
  }
}

// The run goes through the C API (exactcoll_sim_fused_add_rmsnorm), whose refusal of a fault never
// reached names its option: the command still names its flag, exits 2, writes the trace (the
// library does) and no output. An alternative contract has no run to stop: the command ignores
// the fault flags there, as it always has (the C API would refuse them).
TEST(SimFusedCommand, AFaultNeverReachedNamesTheFlagAndAnAlternativeIgnoresIt) {
  const std::string out = temp_path("unreached_out.npy"), trace = temp_path("unreached_trace.jsonl");
  std::remove(out.c_str());
  std::remove(trace.c_str());
  CommandResult r = run_fused({"--ranks", "4", "--rows", "3", "--hidden", "64", "--schedule", "seeded", "--fail-rank",
                               "2", "--fail-at-step", "100000", "--trace", trace, "--output", out});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err,
            "exactcoll sim fused_rmsnorm: --fail-at-step 100000 was never reached: rank 2 took 16 synchronization "
            "steps in this run (no output was written)\n");
  EXPECT_TRUE(file_exists(trace));
  EXPECT_FALSE(file_exists(out));
  r = run_fused({"--ranks", "4", "--rows", "3", "--hidden", "64", "--contract", "f32_residual", "--fail-rank", "1",
                 "--fail-at-step", "2", "--output", out});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(file_exists(out));
}

// The last line of a run's stdout (the summary, ending with both sha256s).
std::string last_line(const std::string& out) {
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = out.rfind('\n', end);
  return out.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

// The line of a JSON-lines trace with this element, contract and step (the first one).
std::string element_line(const std::string& trace, uint64_t index, const std::string& step) {
  std::istringstream in(trace);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"event\":\"element\"") != std::string::npos &&
        line.find("\"index\":" + std::to_string(index) + ",") != std::string::npos &&
        line.find("\"step\":\"" + step + "\"") != std::string::npos) {
      return line;
    }
  }
  return "";
}

// The string value of "key":"..." in a JSON line.
std::string field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":\"";
  const size_t at = line.find(k);
  if (at == std::string::npos) return "";
  return line.substr(at + k.size(), line.find('"', at + k.size()) - at - k.size());
}

// --trace-elements traces the whole op under every contract; tracing changes no output bit; the
// canonical trace ends at the output file's bits on every rank; an alternative's marks where it
// departs from canonical.
TEST(SimFusedCommand, ElementTracesEveryContractWithoutChangingTheOutputs) {
  const std::vector<std::string> in = {"--ranks", "2", "--rows", "3", "--hidden", "64", "--seed", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = in;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  for (const char* contract : {"canonical", "f32_residual", "bf16_accumulate", "rotated_two_shot"}) {
    SCOPED_TRACE(contract);
    const std::string trace = temp_path(std::string("el_") + contract + ".jsonl");
    const std::string out = temp_path(std::string("el_") + contract + "_out.npy");
    const std::string ro = temp_path(std::string("el_") + contract + "_ro.npy");
    const CommandResult plain = run_fused(with({"--contract", contract}));
    ASSERT_EQ(plain.code, 0) << plain.err;
    const CommandResult traced = run_fused(with({"--contract", contract, "--trace", trace, "--trace-elements", "3,70",
                                                 "--output", out, "--residual-output", ro}));
    ASSERT_EQ(traced.code, 0) << traced.err;
    EXPECT_EQ(last_line(traced.out), last_line(plain.out)) << "the same sha256 with and without tracing";
    const std::string t = read_file(trace);
    const std::string want_contract = std::string("\"contract\":\"") + contract + "\"";
    for (uint64_t index : {3u, 70u}) {
      SCOPED_TRACE("element " + std::to_string(index));
      const std::string scale = element_line(t, index, "scale"), add = element_line(t, index, "residual_add");
      ASSERT_FALSE(scale.empty()) << t;
      ASSERT_FALSE(add.empty()) << t;
      EXPECT_NE(scale.find(want_contract), std::string::npos) << scale;
      // The trace's last values are the output files' bits, on every rank.
      const npy::NpyArray o = npy::read_npy(out), r = npy::read_npy(ro);
      for (int rank = 0; rank < 2; ++rank) {
        uint16_t out_bits, ro_bits;
        std::memcpy(&out_bits, o.data.data() + (rank * 192 + index) * 2, 2);
        std::memcpy(&ro_bits, r.data.data() + (rank * 192 + index) * 2, 2);
        char want_out[16], want_ro[16];
        std::snprintf(want_out, sizeof want_out, "0x%04x", out_bits);
        std::snprintf(want_ro, sizeof want_ro, "0x%04x", ro_bits);
        EXPECT_EQ(field(scale, "stored"), want_out) << scale;
        EXPECT_EQ(field(add, "stored"), want_ro) << add;
      }
    }
    if (std::string(contract) == "canonical") {
      EXPECT_NE(t.find("\"event\":\"fold\""), std::string::npos) << "the run's own fold events come first";
      EXPECT_NE(traced.out.find("checked against the run bit for bit"), std::string::npos) << traced.out;
      EXPECT_EQ(t.find("vs_canonical"), std::string::npos);
    } else {
      EXPECT_NE(t.find("\"vs_canonical\":\"same\""), std::string::npos) << "every step is compared";
      EXPECT_NE(traced.out.find(std::string(contract) + " "), std::string::npos) << traced.out;
    }
  }
  // f32_residual departs at the all-reduce's rounding (it keeps the fold in fp32) on element 3.
  const std::string f32 = read_file(temp_path("el_f32_residual.jsonl"));
  const std::string round = element_line(f32, 3, "round");
  EXPECT_NE(round.find("\"vs_canonical\":\"departs\""), std::string::npos) << round;
  // No timeline without a schedule; a trace of an alternative needs elements.
  const CommandResult chrome =
      run_fused(with({"--contract", "f32_residual", "--chrome-trace", temp_path("el_chrome.json")}));
  EXPECT_EQ(chrome.code, 2);
  EXPECT_NE(chrome.err.find("--chrome-trace applies only to --contract canonical"), std::string::npos) << chrome.err;
  const CommandResult bare = run_fused(with({"--contract", "f32_residual", "--trace", temp_path("el_bare.jsonl")}));
  EXPECT_EQ(bare.code, 2);
  EXPECT_NE(bare.err.find("needs --trace-elements"), std::string::npos) << bare.err;
  EXPECT_FALSE(file_exists(temp_path("el_bare.jsonl")));
  // A list longer than the bound, and an index past rows * H, are refused before the run.
  std::string many;
  for (int i = 0; i <= 4096; ++i) {
    if (i > 0) many += ',';
    many += std::to_string(i % 192);
  }
  const std::string long_trace = temp_path("el_long.jsonl");
  const CommandResult too_many = run_fused(with({"--trace", long_trace, "--trace-elements", many}));
  EXPECT_EQ(too_many.code, 2);
  EXPECT_NE(too_many.err.find("at most 4096"), std::string::npos) << too_many.err;
  EXPECT_FALSE(file_exists(long_trace));
  const CommandResult past = run_fused(with({"--trace", long_trace, "--trace-elements", "192"}));
  EXPECT_EQ(past.code, 2);
  EXPECT_NE(past.err.find("is past rows * H"), std::string::npos) << past.err;
  EXPECT_FALSE(file_exists(long_trace));
}

// The integer value of "key":N in a JSON line (-1 when absent).
int int_field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t at = line.find(k);
  return at == std::string::npos ? -1 : std::atoi(line.c_str() + at + k.size());
}

uint32_t hex_field(const std::string& line, const std::string& key) {
  return static_cast<uint32_t>(std::strtoul(field(line, key).c_str(), nullptr, 16));
}

// Under tree a run traces its steps (--trace, --chrome-trace, like canonical) and its traced
// elements: the run's own tree_node events (each rank that folds an element records every node of
// its tree, then the round) and the element lines (tree_node steps, then the residual add and the
// norm), checked against the run before they are written. Every node, in the run's events and in
// the element lines, is the node of the element's tree recomputed here from the input file
// (tests/sim/tree_nodes.h); the element lines end at the output files' bits on every rank; tracing
// changes no output bit. The help says what tree is.
TEST(SimFusedCommand, TreeContractTracesStepsAndElements) {
  const std::string trace = temp_path("tree_fused.jsonl"), chrome = temp_path("tree_fused.json");
  const CommandResult steps =
      run_fused({"--ranks", "4", "--rows", "2", "--hidden", "64", "--contract", "tree", "--algo", "two_stage",
                 "--schedule", "seeded", "--trace", trace, "--chrome-trace", chrome});
  ASSERT_EQ(steps.code, 0) << steps.err;
  EXPECT_NE(read_file(trace).find("fused_slice"), std::string::npos);
  EXPECT_EQ(read_file(trace).find("\"event\":\"element\""), std::string::npos) << "no element asked for";
  EXPECT_EQ(read_file(trace).find("\"event\":\"tree_node\""), std::string::npos) << "no element asked for";
  EXPECT_FALSE(read_file(chrome).empty());

  const int ranks = 4, rows = 2, H = 64;
  const Files f = make_files("tree_el", ranks, rows, H, 37);
  const npy::NpyArray x = npy::read_npy(f.x);
  const size_t count = static_cast<size_t>(rows) * H;
  for (const char* algo : {"one_stage", "two_stage", "lamport_one_stage", "lamport_two_stage"}) {
    SCOPED_TRACE(algo);
    const std::string out = temp_path("tree_el_out.npy"), ro = temp_path("tree_el_ro.npy"),
                      el_trace = temp_path("tree_el.jsonl");
    const std::vector<std::string> in = {"--ranks",  "4", "--input",    f.x,    "--residual", f.r,
                                         "--weight", f.w, "--contract", "tree", "--algo",     algo};
    std::vector<std::string> traced_args = in;
    for (const std::string a : {"--trace", el_trace.c_str(), "--trace-elements", "3,70", "--output", out.c_str(),
                                "--residual-output", ro.c_str()}) {
      traced_args.push_back(a);
    }
    const CommandResult plain = run_fused(in), traced = run_fused(traced_args);
    ASSERT_EQ(plain.code, 0) << plain.err;
    ASSERT_EQ(traced.code, 0) << traced.err;
    EXPECT_EQ(last_line(traced.out), last_line(plain.out)) << "the same sha256 with and without tracing";
    EXPECT_NE(traced.out.find("element 3 [row 0, col 3]: 20 steps in " + el_trace +
                              ", tree, checked against the run bit for bit"),
              std::string::npos)
        << traced.out;
    const std::string t = read_file(el_trace);
    EXPECT_EQ(t.find("\"event\":\"fold\""), std::string::npos) << "no canonical fold under tree";
    const npy::NpyArray o = npy::read_npy(out), r = npy::read_npy(ro);
    for (const uint64_t index : {uint64_t{3}, uint64_t{70}}) {
      SCOPED_TRACE("element " + std::to_string(index));
      std::vector<bf16> inputs(ranks);
      for (int k = 0; k < ranks; ++k) std::memcpy(&inputs[k], x.data.data() + (k * count + index) * 2, 2);
      const simtest::DefinitionTree tree = simtest::definition_tree(inputs);
      // A node's bits as tree_nodes.h has them: the run's events show left and right as fp32 bits,
      // the element lines as storage bits (bf16 here), widened.
      auto node_bits = [](const std::string& line, bool storage_children) {
        auto child = [&](const char* key) {
          const uint32_t bits = hex_field(line, key);
          return simtest::canonical_fp32_bits(storage_children ? bits << 16 : bits);
        };
        return simtest::TreeNodeBits{child("left"), child("right"), hex_field(line, "sum"), hex_field(line, "stored")};
      };
      // The run's events: each rank that folded the element, every node then its round.
      std::vector<int> nodes(ranks, 0), rounds(ranks, 0);
      std::vector<std::pair<int, int>> element_nodes;  // the element lines' nodes, in order
      std::istringstream lines(t);
      std::string line;
      while (std::getline(lines, line)) {
        if (line.find("\"index\":" + std::to_string(index) + ",") == std::string::npos) continue;
        const std::string event = field(line, "event");
        const std::pair<int, int> ranks_joined = {int_field(line, "left_rank"), int_field(line, "right_rank")};
        if (event == "tree_node") {
          const int rank = int_field(line, "rank");
          ASSERT_EQ(rounds.at(rank), 0) << "the round comes after every node: " << line;
          ++nodes.at(rank);
          ASSERT_EQ(tree.nodes.count(ranks_joined), 1u) << line;
          EXPECT_EQ(node_bits(line, false), tree.nodes.at(ranks_joined)) << line;
        } else if (event == "round") {
          ++rounds.at(int_field(line, "rank"));
          EXPECT_EQ(hex_field(line, "acc"), tree.root_sum) << line;
          EXPECT_EQ(hex_field(line, "stored"), tree.root) << line;
        } else if (event == "element" && field(line, "step") == "tree_node") {
          element_nodes.push_back(ranks_joined);
          ASSERT_EQ(tree.nodes.count(ranks_joined), 1u) << line;
          EXPECT_EQ(node_bits(line, true), tree.nodes.at(ranks_joined)) << line;
        }
      }
      int folded = 0;
      for (int k = 0; k < ranks; ++k) {
        if (nodes[k] == 0 && rounds[k] == 0) continue;
        ++folded;
        EXPECT_EQ(nodes[k], ranks - 1) << "rank " << k << " recorded every node of the tree";
        EXPECT_EQ(rounds[k], 1) << "rank " << k;
      }
      EXPECT_GT(folded, 0) << "the run recorded the element's tree";
      EXPECT_EQ(element_nodes, (std::vector<std::pair<int, int>>{{0, 1}, {2, 3}, {0, 2}})) << "level by level";
      const std::string round = element_line(t, index, "round"), add = element_line(t, index, "residual_add"),
                        scale = element_line(t, index, "scale");
      EXPECT_EQ(hex_field(round, "stored"), tree.root) << round;
      EXPECT_NE(add.find("\"contract\":\"tree\""), std::string::npos) << add;
      for (int k = 0; k < ranks; ++k) {
        uint16_t out_bits, ro_bits;
        std::memcpy(&out_bits, o.data.data() + (k * count + index) * 2, 2);
        std::memcpy(&ro_bits, r.data.data() + (k * count + index) * 2, 2);
        EXPECT_EQ(hex_field(scale, "stored"), out_bits) << scale;
        EXPECT_EQ(hex_field(add, "stored"), ro_bits) << add;
      }
    }
  }
  const CommandResult help = run_fused({"--help"});
  EXPECT_NE(help.out.find("tree: a balanced binary tree over the ranks"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("under tree, each node of the ranks' tree instead: tree_node"), std::string::npos)
      << help.out;
  EXPECT_NE(help.out.find("Emulations by the scalar reference: f32_residual"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace exactcoll::fused
