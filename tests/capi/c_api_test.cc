// The C API (include/exactcoll/exactcoll.h) on the CPU: the simulator's results through it against
// the independent references (tests/sim/reference.h, sim/fused/reference.h) bit for bit, and every
// error path: null pointers, bad dtypes, algorithms, shapes and counts, extensible structs of the
// wrong size, handles used after destroy, GPU calls on a machine without a GPU. Every failure must
// return a status and a message, never crash.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/contract.h"
#include "exactcoll/exactcoll.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "tests/capi/expect_status.h"
#include "tests/capi/memory_store.h"
#include "tests/sim/sim_test_util.h"
#include "tests/support/command_runner.h"
#include "tools/launch/launcher.h"

namespace exactcoll {
namespace {

using capitest::callbacks_for;
using capitest::expect_contains;
using capitest::expect_error;
using capitest::last_error;
using capitest::MemoryStore;
using simtest::first_difference;
using test_support::temp_path;

DType dtype_of(int c_dtype) {
  return c_dtype == EXACTCOLL_BF16 ? DType::kBF16 : c_dtype == EXACTCOLL_FP16 ? DType::kFP16 : DType::kFP32;
}

std::vector<uint8_t> flatten(const std::vector<std::vector<uint8_t>>& per_rank) {
  std::vector<uint8_t> all;
  for (const auto& r : per_rank) all.insert(all.end(), r.begin(), r.end());
  return all;
}

std::vector<std::vector<uint8_t>> split(const std::vector<uint8_t>& all, int ranks) {
  const size_t each = all.size() / static_cast<size_t>(ranks);
  std::vector<std::vector<uint8_t>> per_rank;
  for (int r = 0; r < ranks; ++r) per_rank.emplace_back(all.begin() + r * each, all.begin() + (r + 1) * each);
  return per_rank;
}

// ---- version and names -------------------------------------------------------------------------

TEST(CApiVersion, MatchesTheHeader) {
  EXPECT_EQ(exactcoll_version(),
            EXACTCOLL_VERSION_MAJOR * 10000 + EXACTCOLL_VERSION_MINOR * 100 + EXACTCOLL_VERSION_PATCH);
  EXPECT_EQ(exactcoll_abi_version(), EXACTCOLL_ABI_VERSION);
  const std::string text = exactcoll_version_string();
  expect_contains(text, std::to_string(EXACTCOLL_VERSION_MAJOR) + "." + std::to_string(EXACTCOLL_VERSION_MINOR) + ".");
  expect_contains(text, exactcoll_has_cuda() ? "(cuda)" : "(no cuda)");
}

TEST(CApiVersion, StructSizesForBindings) {
  EXPECT_EQ(exactcoll_struct_size("exactcoll_call_info"), sizeof(exactcoll_call_info));
  EXPECT_EQ(exactcoll_struct_size("exactcoll_store_callbacks"), sizeof(exactcoll_store_callbacks));
  EXPECT_EQ(exactcoll_struct_size("exactcoll_comm_options"), sizeof(exactcoll_comm_options));
  EXPECT_EQ(exactcoll_struct_size("exactcoll_comm_properties"), sizeof(exactcoll_comm_properties));
  EXPECT_EQ(exactcoll_struct_size("exactcoll_sim_options"), sizeof(exactcoll_sim_options));
  EXPECT_EQ(exactcoll_struct_size("exactcoll_nothing"), 0u);
  EXPECT_EQ(exactcoll_struct_size(nullptr), 0u);
}

// Ops in either spelling (core/registry.h kOpAliases): the canonical name back from exactcoll_op_name.
TEST(CApiNames, OpsTakeEitherSpelling) {
  const struct {
    const char* name;
    int op;
  } spellings[] = {{"allreduce", EXACTCOLL_OP_ALLREDUCE},
                   {"all_reduce", EXACTCOLL_OP_ALLREDUCE},
                   {"reduce_scatter", EXACTCOLL_OP_REDUCE_SCATTER},
                   {"allgather", EXACTCOLL_OP_ALLGATHER},
                   {"all_gather", EXACTCOLL_OP_ALLGATHER}};
  for (const auto& s : spellings) {
    int op = -1;
    ASSERT_EQ(exactcoll_op_from_name(s.name, &op), EXACTCOLL_OK) << s.name << ": " << last_error();
    EXPECT_EQ(op, s.op) << s.name;
  }
  EXPECT_STREQ(exactcoll_op_name(EXACTCOLL_OP_ALLREDUCE), "allreduce");
  int op = -1;
  expect_error(
      exactcoll_op_from_name("all_sum", &op), EXACTCOLL_ERROR_INVALID_ARGUMENT,
      "unknown name 'all_sum'; expected one of allreduce, reduce_scatter, allgather (or all_reduce, all_gather)");
  expect_error(exactcoll_op_from_name("fused_rms_norm", &op), EXACTCOLL_ERROR_INVALID_ARGUMENT,
               "unknown name 'fused_rms_norm'");  // the fused op has functions of its own, no op value
  expect_error(exactcoll_op_from_name(nullptr, &op), EXACTCOLL_ERROR_INVALID_ARGUMENT, "name is NULL");
  // A known name with no place for the result names the pointer, not the name.
  expect_error(exactcoll_op_from_name("allreduce", nullptr), EXACTCOLL_ERROR_INVALID_ARGUMENT,
               "the result pointer is NULL");
}

TEST(CApiNames, EveryValueRoundTripsAndUnknownNamesAreListed) {
  struct Enum {
    const char* (*name)(int);
    int (*from)(const char*, int*);
    int count;
  };
  for (const Enum& e : {Enum{exactcoll_dtype_name, exactcoll_dtype_from_name, 3},
                        Enum{exactcoll_algo_name, exactcoll_algo_from_name, 10},
                        Enum{exactcoll_fused_algo_name, exactcoll_fused_algo_from_name, 11},
                        Enum{exactcoll_contract_name, exactcoll_contract_from_name, 5}}) {
    for (int v = 0; v < e.count; ++v) {
      ASSERT_NE(e.name(v), nullptr) << v;
      int back = -1;
      ASSERT_EQ(e.from(e.name(v), &back), EXACTCOLL_OK) << last_error();
      EXPECT_EQ(back, v);
    }
    EXPECT_EQ(e.name(e.count), nullptr);
    if (e.name == exactcoll_algo_name) {
      EXPECT_STREQ(e.name(EXACTCOLL_ALGO_LAMPORT_ONE_SHOT), "lamport_one_shot");
      EXPECT_STREQ(e.name(EXACTCOLL_ALGO_LAMPORT_TWO_SHOT), "lamport_two_shot");
    }
    if (e.name == exactcoll_fused_algo_name) {
      EXPECT_STREQ(e.name(EXACTCOLL_FUSED_LAMPORT_ONE_STAGE), "lamport_one_stage");
      EXPECT_STREQ(e.name(EXACTCOLL_FUSED_LAMPORT_TWO_STAGE), "lamport_two_stage");
    }
    EXPECT_EQ(e.name(-1), nullptr);
    int out = 0;
    expect_error(e.from("no_such_name", &out), EXACTCOLL_ERROR_INVALID_ARGUMENT, "unknown name 'no_such_name'");
    expect_contains(last_error(), e.name(0));  // the valid names are listed
    expect_error(e.from(nullptr, &out), EXACTCOLL_ERROR_INVALID_ARGUMENT, "name is NULL");
    expect_error(e.from(e.name(0), nullptr), EXACTCOLL_ERROR_INVALID_ARGUMENT, "is NULL");
  }
  EXPECT_STREQ(exactcoll_op_name(EXACTCOLL_OP_REDUCE_SCATTER), "reduce_scatter");
  EXPECT_STREQ(exactcoll_status_name(EXACTCOLL_ERROR_TIMEOUT), "EXACTCOLL_ERROR_TIMEOUT");
  EXPECT_STREQ(exactcoll_status_name(1000), "unknown status");
}

TEST(CApiErrors, LastErrorIsPerThread) {
  int out = 0;
  ASSERT_NE(exactcoll_dtype_from_name("bf17", &out), EXACTCOLL_OK);
  std::string other = "unset";
  std::thread([&] { other = exactcoll_last_error(); }).join();
  EXPECT_EQ(other, "");
  expect_contains(last_error(), "bf17");
}

// ---- the simulator through the C API -------------------------------------------------------------

TEST(CApiSim, CollectivesMatchTheReferenceBitForBit) {
  const int ops[] = {EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_OP_REDUCE_SCATTER, EXACTCOLL_OP_ALLGATHER};
  uint64_t seed = 11;
  for (const int op : ops) {
    const std::vector<int> algos =
        op == EXACTCOLL_OP_ALLREDUCE
            ? std::vector<int>{EXACTCOLL_ALGO_AUTO, EXACTCOLL_ALGO_ONE_SHOT, EXACTCOLL_ALGO_TWO_SHOT,
                               EXACTCOLL_ALGO_PUSH_ONE_SHOT, EXACTCOLL_ALGO_PUSH_TWO_SHOT}
            : std::vector<int>{EXACTCOLL_ALGO_AUTO, EXACTCOLL_ALGO_DIRECT};
    for (const int dtype : {EXACTCOLL_BF16, EXACTCOLL_FP16, EXACTCOLL_FP32}) {
      for (const int ranks : {1, 2, 3, 5, 8}) {
        for (const int algo : algos) {
          const size_t count = static_cast<size_t>(ranks) * 37;  // not a pack multiple: the tails run too
          sim::CollectiveSpec spec;
          spec.op = static_cast<sim::Op>(op);
          spec.dtype = dtype_of(dtype);
          spec.count = count;
          const auto in = simtest::random_inputs(spec.dtype, ranks, count, ++seed);
          const auto want = simtest::expected_outputs(spec, in);
          const std::vector<uint8_t> inputs = flatten(in);
          std::vector<uint8_t> outputs(want[0].size() * static_cast<size_t>(ranks), 0xAB);
          exactcoll_sim_options options;
          exactcoll_sim_options_init(&options);
          options.blocks = 1 + static_cast<int>(seed % 3);
          exactcoll_call_info info;
          exactcoll_call_info_init(&info);
          ASSERT_EQ(
              exactcoll_sim_collective(op, algo, dtype, ranks, count, inputs.data(), outputs.data(), &options, &info),
              EXACTCOLL_OK)
              << last_error();
          SCOPED_TRACE(std::string(exactcoll_op_name(op)) + " " + exactcoll_algo_name(algo) + " " +
                       exactcoll_dtype_name(dtype) + " ranks " + std::to_string(ranks));
          EXPECT_EQ(first_difference(split(outputs, ranks), want, static_cast<size_t>(dtype_size(spec.dtype))), "");
          EXPECT_EQ(info.exact, 1);
          EXPECT_EQ(info.blocks, options.blocks);
          if (algo != EXACTCOLL_ALGO_AUTO) {
            EXPECT_EQ(info.algo, algo);
          }
          EXPECT_NE(info.algo, EXACTCOLL_ALGO_AUTO) << "info names what ran, never auto";
        }
      }
    }
  }
}

TEST(CApiSim, ComparisonCatchesOneFlippedBit) {
  // The comparison above is element by element on the bit patterns: one flipped bit fails it.
  sim::CollectiveSpec spec;
  spec.dtype = DType::kBF16;
  spec.count = 64;
  const auto in = simtest::random_inputs(spec.dtype, 3, spec.count, 5);
  auto want = simtest::expected_outputs(spec, in);
  std::vector<uint8_t> outputs(want[0].size() * 3);
  ASSERT_EQ(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, 3, spec.count,
                                     flatten(in).data(), outputs.data(), nullptr, nullptr),
            EXACTCOLL_OK)
      << last_error();
  EXPECT_EQ(first_difference(split(outputs, 3), want, 2), "");
  outputs[2 * 64 + 17] ^= 0x01;
  EXPECT_NE(first_difference(split(outputs, 3), want, 2), "");
}

// The tree contract through the C API: every all-reduce algorithm and reduce_scatter give
// contract::tree_fold's bits (computed here element by element, bf16), on world sizes that are and
// are not powers of two; a single flipped bit fails the comparison.
TEST(CApiSim, TreeContractMatchesTreeFold) {
  uint64_t seed = 900;
  for (const int ranks : {1, 2, 3, 4, 6, 8}) {
    for (const int op : {EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_OP_REDUCE_SCATTER}) {
      const std::vector<int> algos =
          op == EXACTCOLL_OP_ALLREDUCE ? std::vector<int>{EXACTCOLL_ALGO_AUTO,          EXACTCOLL_ALGO_ONE_SHOT,
                                                          EXACTCOLL_ALGO_TWO_SHOT,      EXACTCOLL_ALGO_PUSH_ONE_SHOT,
                                                          EXACTCOLL_ALGO_PUSH_TWO_SHOT, EXACTCOLL_ALGO_LAMPORT_ONE_SHOT}
                                       : std::vector<int>{EXACTCOLL_ALGO_DIRECT};
      for (const int algo : algos) {
        const size_t count = static_cast<size_t>(ranks) * 77;  // packs and a scalar tail
        fused::SplitMix64 g(++seed);
        std::vector<bf16> in(count * static_cast<size_t>(ranks));
        for (bf16& v : in) v = round_to<bf16>(g.normal() * 3.0f);
        const size_t out_count = op == EXACTCOLL_OP_ALLREDUCE ? count : count / static_cast<size_t>(ranks);
        std::vector<bf16> out(out_count * static_cast<size_t>(ranks));
        exactcoll_sim_options options;
        exactcoll_sim_options_init(&options);
        options.contract = EXACTCOLL_CONTRACT_TREE;
        options.blocks = 1 + static_cast<int>(seed % 3);
        SCOPED_TRACE(std::string(exactcoll_op_name(op)) + " " + exactcoll_algo_name(algo) + " ranks " +
                     std::to_string(ranks));
        ASSERT_EQ(
            exactcoll_sim_collective(op, algo, EXACTCOLL_BF16, ranks, count, in.data(), out.data(), &options, nullptr),
            EXACTCOLL_OK)
            << last_error();
        size_t differing = 0, canonical_differing = 0;
        for (int r = 0; r < ranks; ++r) {
          const size_t first = op == EXACTCOLL_OP_ALLREDUCE ? 0 : static_cast<size_t>(r) * out_count;
          for (size_t j = 0; j < out_count; ++j) {
            auto x = [&](int p) { return in[static_cast<size_t>(p) * count + first + j]; };
            const bf16 want = contract::tree_fold<bf16>(ranks, x);
            const bf16 got = out[static_cast<size_t>(r) * out_count + j];
            differing += got.bits != want.bits;
            canonical_differing += got.bits != contract::fold<bf16>(ranks, x).bits;
          }
        }
        EXPECT_EQ(differing, 0u);
        // From 3 ranks on, the tree rounds between adds: some of these elements must differ from
        // canonical, or the run did not fold under tree.
        if (ranks >= 3) {
          EXPECT_GT(canonical_differing, 0u);
        }
      }
    }
  }
}

TEST(CApiSim, TreeContractRefusals) {
  std::vector<bf16> in(8), out(8);
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  options.contract = EXACTCOLL_CONTRACT_F32_RESIDUAL;
  expect_error(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, 2, 4, in.data(),
                                        out.data(), &options, nullptr),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "library's contracts");
  options.contract = 99;
  expect_error(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, 2, 4, in.data(),
                                        out.data(), &options, nullptr),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "contract");
  // Under tree a traced element records its tree: one tree_node per internal node on each rank
  // that folds it (one_shot: every rank; 2 ranks: one node each), then its round.
  const uint64_t element = 1;
  const std::string trace = temp_path("capi_tree_trace.jsonl");
  options.contract = EXACTCOLL_CONTRACT_TREE;
  options.trace_elements = &element;
  options.num_trace_elements = 1;
  options.trace_path = trace.c_str();
  ASSERT_EQ(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_ONE_SHOT, EXACTCOLL_BF16, 2, 4, in.data(),
                                     out.data(), &options, nullptr),
            EXACTCOLL_OK)
      << last_error();
  std::ifstream file(trace);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  size_t nodes = 0;
  for (size_t at = text.find("\"event\":\"tree_node\""); at != std::string::npos;
       at = text.find("\"event\":\"tree_node\"", at + 1)) {
    ++nodes;
  }
  EXPECT_EQ(nodes, 2u) << text;
  EXPECT_EQ(text.find("\"event\":\"fold\""), std::string::npos) << "no canonical fold under tree";
  // An older caller's struct (before `contract`) still works: the missing field is canonical.
  exactcoll_sim_options old;
  exactcoll_sim_options_init(&old);
  old.struct_size = offsetof(exactcoll_sim_options, contract);
  old.contract = EXACTCOLL_CONTRACT_F32_RESIDUAL;  // beyond struct_size: never read
  EXPECT_EQ(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, 2, 4, in.data(),
                                     out.data(), &old, nullptr),
            EXACTCOLL_OK)
      << last_error();
}

// Fault injection and the seeded schedule's step bound (options the CLI's `sim` commands need): a
// dead rank fails the call naming it and still writes the trace, a step past the run is
// INVALID_ARGUMENT, a step bound of 5 is a livelock; an older caller's struct gets none of them.
TEST(CApiSim, FaultInjectionAndStepBound) {
  std::vector<bf16> in(4 * 64), out(4 * 64);
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  EXPECT_EQ(options.fail_rank, -1);
  EXPECT_EQ(options.fail_at_step, 0u);
  EXPECT_EQ(options.max_steps, 100000000u);
  EXPECT_EQ(options.progress, nullptr);
  auto run = [&](int ranks) {
    return exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_ONE_SHOT, EXACTCOLL_BF16, ranks, 64,
                                    in.data(), out.data(), &options, nullptr);
  };
  // A dead rank: its peers deadlock (or, under threads, may time out first); the trace is written.
  const std::string trace = temp_path("capi_fault_trace.jsonl");
  options.fail_rank = 2;
  options.fail_at_step = 3;
  options.timeout_ms = 300;
  options.trace_path = trace.c_str();
  for (const int seeded : {0, 1}) {
    SCOPED_TRACE(seeded);
    options.seeded_schedule = seeded;
    std::filesystem::remove(trace);
    const int status = run(4);
    EXPECT_TRUE(status == EXACTCOLL_ERROR_SIMULATION || (!seeded && status == EXACTCOLL_ERROR_TIMEOUT)) << status;
    expect_contains(last_error(), "rank 2 was stopped by fault injection at its synchronization step 3");
    EXPECT_TRUE(std::filesystem::exists(trace));
  }
  // A step the run never reaches (one_shot on 4 ranks: 16 steps of rank 2).
  options.fail_at_step = 999;
  expect_error(run(4), EXACTCOLL_ERROR_INVALID_ARGUMENT,
               "fail_at_step 999 was never reached: rank 2 took 16 synchronization steps in this run");
  // Bad fault options.
  options.fail_rank = 4;
  expect_error(run(4), EXACTCOLL_ERROR_INVALID_ARGUMENT, "fail_rank must be -1 (none) or a rank, 0..3, got 4");
  options.fail_rank = 0;
  options.fail_at_step = 0;
  expect_error(run(4), EXACTCOLL_ERROR_INVALID_ARGUMENT, "fail_at_step must be >= 1 with fail_rank");
  // The seeded schedule's step bound.
  options.fail_rank = -1;
  options.trace_path = nullptr;
  options.max_steps = 5;
  expect_error(run(3), EXACTCOLL_ERROR_SIMULATION, "no completion within 5 scheduling steps");
  options.max_steps = 0;
  expect_error(run(3), EXACTCOLL_ERROR_INVALID_ARGUMENT, "max_steps must be >= 1");
  // An older caller's struct (before max_steps) gets the defaults: no fault, the default bound.
  options.struct_size = offsetof(exactcoll_sim_options, max_steps);
  options.fail_rank = 1;  // beyond struct_size: never read
  options.fail_at_step = 1;
  EXPECT_EQ(run(3), EXACTCOLL_OK) << last_error();
  // The fused op's alternative contracts are the scalar reference's: no fault to inject there.
  exactcoll_sim_options_init(&options);
  options.fail_rank = 0;
  options.fail_at_step = 1;
  std::vector<bf16> ro(4 * 64);
  expect_error(
      exactcoll_sim_fused_add_rmsnorm(EXACTCOLL_FUSED_AUTO, EXACTCOLL_CONTRACT_F32_RESIDUAL, EXACTCOLL_BF16, 2, 1, 64,
                                      1e-6f, in.data(), in.data(), in.data(), ro.data(), out.data(), &options, nullptr),
      EXACTCOLL_ERROR_INVALID_ARGUMENT, "fault injection apply to the library's contracts");
}

// The progress callback: called while a run lasts (about every 100 ms; the count doubles until a
// run takes that long past its setup), with total 0 while the run is set up and then done <= total, and never
// after the call returns.
TEST(CApiSim, ProgressIsReportedWhileARunLasts) {
  struct Seen {
    std::atomic<int> calls{0}, running{0}, wrong{0};  // running: calls with total > 0
  } seen;
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  options.progress = [](void* user_data, uint64_t done, uint64_t total) {
    auto* s = static_cast<Seen*>(user_data);
    ++s->calls;
    if (total > 0) ++s->running;
    if (done > total) ++s->wrong;
  };
  options.progress_user_data = &seen;
  // Seeded, 128 blocks: about a second of fiber switches here, most of it past the setup.
  options.seeded_schedule = 1;
  options.blocks = 128;
  constexpr int kRanks = 16;
  for (size_t count = size_t{1} << 17; seen.running.load() == 0 && count <= (size_t{1} << 19); count *= 2) {
    std::vector<bf16> in(kRanks * count), out(kRanks * count);
    ASSERT_EQ(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_TWO_SHOT, EXACTCOLL_BF16, kRanks, count,
                                       in.data(), out.data(), &options, nullptr),
              EXACTCOLL_OK)
        << last_error();
  }
  ASSERT_GE(seen.running.load(), 1) << "no run lasted 100 ms past its setup";
  EXPECT_EQ(seen.wrong.load(), 0) << "done > total";
  const int calls = seen.calls.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(seen.calls.load(), calls) << "no call after the function returned";
}

template <class T>
void expect_fused_matches_reference(int dtype, int ranks, int rows, int hidden, int algo, int contract, uint64_t seed,
                                    const exactcoll_sim_options* options = nullptr) {
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
  fused::SplitMix64 g(seed);
  auto value = [&](float scale) {
    const float f = g.normal() * scale;
    if constexpr (sizeof(T) == 4) {
      return f;
    } else {
      return round_to<T>(f);
    }
  };
  std::vector<T> x(count * static_cast<size_t>(ranks)), residual(count), weight(static_cast<size_t>(hidden));
  for (auto& v : x) v = value(1.0f);
  for (auto& v : residual) v = value(2.0f);
  for (auto& v : weight) v = value(0.5f);
  fused::FusedProblem<T> problem{ranks, rows, hidden, 1e-6f, x.data(), residual.data(), weight.data()};
  std::vector<T> want_ro(count), want_out(count);
  fused::fused_reference<T>(static_cast<fused::Contract>(contract), problem, want_ro.data(), want_out.data());
  std::vector<T> ro(count * static_cast<size_t>(ranks)), out(count * static_cast<size_t>(ranks));
  exactcoll_call_info info;
  exactcoll_call_info_init(&info);
  ASSERT_EQ(exactcoll_sim_fused_add_rmsnorm(algo, contract, dtype, ranks, rows, hidden, 1e-6f, x.data(),
                                            residual.data(), weight.data(), ro.data(), out.data(), options, &info),
            EXACTCOLL_OK)
      << last_error();
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(std::memcmp(ro.data() + r * count, want_ro.data(), count * sizeof(T)), 0);
    EXPECT_EQ(std::memcmp(out.data() + r * count, want_out.data(), count * sizeof(T)), 0);
  }
  EXPECT_EQ(info.algo, algo == EXACTCOLL_FUSED_AUTO ? EXACTCOLL_FUSED_ONE_STAGE : algo);
  EXPECT_EQ(info.allreduce_algo, algo == EXACTCOLL_FUSED_UNFUSED ? EXACTCOLL_ALGO_ONE_SHOT : -1);
}

TEST(CApiSim, FusedMatchesTheScalarReferenceUnderEveryContract) {
  uint64_t seed = 100;
  for (const int algo :
       {EXACTCOLL_FUSED_AUTO, EXACTCOLL_FUSED_ONE_STAGE, EXACTCOLL_FUSED_TWO_STAGE, EXACTCOLL_FUSED_PUSH_ONE_STAGE,
        EXACTCOLL_FUSED_UNFUSED, EXACTCOLL_FUSED_ONE_STAGE_REG, EXACTCOLL_FUSED_GATHER_NORM}) {
    for (const int ranks : {1, 3, 4}) {
      SCOPED_TRACE(std::string(exactcoll_fused_algo_name(algo)) + " ranks " + std::to_string(ranks));
      expect_fused_matches_reference<bf16>(EXACTCOLL_BF16, ranks, 3, 64, algo, EXACTCOLL_CONTRACT_CANONICAL, ++seed);
      expect_fused_matches_reference<fp16>(EXACTCOLL_FP16, ranks, 2, 2880, algo, EXACTCOLL_CONTRACT_CANONICAL, ++seed);
      expect_fused_matches_reference<float>(EXACTCOLL_FP32, ranks, 2, 36, algo, EXACTCOLL_CONTRACT_CANONICAL, ++seed);
    }
  }
  // tree: the algorithms on the simulated ranks under the tree contract, against its reference.
  for (const int algo : {EXACTCOLL_FUSED_AUTO, EXACTCOLL_FUSED_ONE_STAGE, EXACTCOLL_FUSED_TWO_STAGE,
                         EXACTCOLL_FUSED_PUSH_ONE_STAGE, EXACTCOLL_FUSED_UNFUSED, EXACTCOLL_FUSED_ONE_STAGE_REG,
                         EXACTCOLL_FUSED_GATHER_NORM, EXACTCOLL_FUSED_LAMPORT_ONE_STAGE}) {
    for (const int ranks : {1, 3, 4}) {
      SCOPED_TRACE(std::string("tree ") + exactcoll_fused_algo_name(algo) + " ranks " + std::to_string(ranks));
      expect_fused_matches_reference<bf16>(EXACTCOLL_BF16, ranks, 3, 64, algo, EXACTCOLL_CONTRACT_TREE, ++seed);
      expect_fused_matches_reference<float>(EXACTCOLL_FP32, ranks, 2, 36, algo, EXACTCOLL_CONTRACT_TREE, ++seed);
    }
  }
  for (const int contract :
       {EXACTCOLL_CONTRACT_F32_RESIDUAL, EXACTCOLL_CONTRACT_BF16_ACCUMULATE, EXACTCOLL_CONTRACT_ROTATED_TWO_SHOT}) {
    SCOPED_TRACE(exactcoll_contract_name(contract));
    expect_fused_matches_reference<bf16>(EXACTCOLL_BF16, 4, 5, 64, EXACTCOLL_FUSED_AUTO, contract, ++seed);
    expect_fused_matches_reference<float>(EXACTCOLL_FP32, 3, 5, 64, EXACTCOLL_FUSED_AUTO, contract, ++seed);
  }
}

// options.threads (the CLI's --threads): the threads per block pick the register path or core's,
// never the bits (lamport_one_stage too, on one lane a thread and core's path); out-of-range
// counts, an alternative contract and a collective with threads are refused; an older caller's struct (before threads)
// is never read past its end.
TEST(CApiSim, FusedThreadsPickThePathNotTheBits) {
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  EXPECT_EQ(options.threads, 0);
  uint64_t seed = 300;
  // H 256 in bf16 is 32 packs: the RMSNorm tree's lanes are 32, the register path's only count.
  for (const int algo : {EXACTCOLL_FUSED_ONE_STAGE_REG, EXACTCOLL_FUSED_GATHER_NORM, EXACTCOLL_FUSED_PUSH_ONE_STAGE_REG,
                         EXACTCOLL_FUSED_ONE_STAGE, EXACTCOLL_FUSED_TWO_STAGE}) {
    for (const int threads : {1, 7, 32, 64}) {
      SCOPED_TRACE(std::string(exactcoll_fused_algo_name(algo)) + " threads " + std::to_string(threads));
      options.threads = threads;
      options.blocks = 2;
      expect_fused_matches_reference<bf16>(EXACTCOLL_BF16, 3, 3, 256, algo, EXACTCOLL_CONTRACT_CANONICAL, ++seed,
                                           &options);
      expect_fused_matches_reference<float>(EXACTCOLL_FP32, 2, 2, 64, algo, EXACTCOLL_CONTRACT_TREE, ++seed, &options);
    }
  }
  std::vector<bf16> x(2 * 64), ro(2 * 64), out(2 * 64);
  auto fused = [&](int algo, int contract) {
    return exactcoll_sim_fused_add_rmsnorm(algo, contract, EXACTCOLL_BF16, 2, 1, 64, 1e-6f, x.data(), x.data(),
                                           x.data(), ro.data(), out.data(), &options, nullptr);
  };
  const int inv = EXACTCOLL_ERROR_INVALID_ARGUMENT;
  exactcoll_sim_options_init(&options);
  options.threads = 1025;
  expect_error(fused(EXACTCOLL_FUSED_ONE_STAGE_REG, EXACTCOLL_CONTRACT_CANONICAL), inv,
               "threads must be 1..1024 (or 0: the algorithm's default), got 1025");
  options.threads = -1;
  expect_error(fused(EXACTCOLL_FUSED_ONE_STAGE_REG, EXACTCOLL_CONTRACT_CANONICAL), inv, "got -1");
  // lamport_one_stage and lamport_two_stage run on blocks of threads too, against the reference: H 512
  // bf16 has 64 lanes, so 64 threads hold one lane each; 32 and 3 take core's path.
  for (int threads : {64, 32, 3}) {
    options.threads = threads;
    for (const int algo : {EXACTCOLL_FUSED_LAMPORT_ONE_STAGE, EXACTCOLL_FUSED_LAMPORT_TWO_STAGE}) {
      expect_fused_matches_reference<bf16>(EXACTCOLL_BF16, 3, 3, 512, algo, EXACTCOLL_CONTRACT_CANONICAL,
                                           900 + static_cast<uint64_t>(threads), &options);
    }
  }
  expect_error(fused(EXACTCOLL_FUSED_AUTO, EXACTCOLL_CONTRACT_F32_RESIDUAL), inv,
               "blocks, threads, seeded schedules, traces and fault injection apply to the library's contracts");
  options.threads = 1;
  EXPECT_EQ(fused(EXACTCOLL_FUSED_LAMPORT_ONE_STAGE, EXACTCOLL_CONTRACT_CANONICAL), EXACTCOLL_OK) << last_error();
  // The collectives run one thread per block.
  std::vector<bf16> in(2 * 8), all(2 * 8);
  auto coll = [&] {
    return exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, 2, 8, in.data(),
                                    all.data(), &options, nullptr);
  };
  EXPECT_EQ(coll(), EXACTCOLL_OK) << last_error();
  options.threads = 4;
  expect_error(coll(), inv,
               "threads is the fused op's; the collectives run one thread per block (threads 0 or 1), got 4");
  // An older caller's struct (before threads) gets the default: the field past its end is never read.
  options.struct_size = offsetof(exactcoll_sim_options, threads);
  options.threads = 5000;
  EXPECT_EQ(coll(), EXACTCOLL_OK) << last_error();
  EXPECT_EQ(fused(EXACTCOLL_FUSED_LAMPORT_ONE_STAGE, EXACTCOLL_CONTRACT_CANONICAL), EXACTCOLL_OK) << last_error();
  EXPECT_EQ(fused(EXACTCOLL_FUSED_AUTO, EXACTCOLL_CONTRACT_F32_RESIDUAL), EXACTCOLL_OK) << last_error();
}

TEST(CApiSim, TracesAreWritten) {
  const std::string trace = temp_path("capi_trace.jsonl"), chrome = temp_path("capi_trace.json");
  std::filesystem::remove(trace);
  std::filesystem::remove(chrome);
  std::vector<uint16_t> in(2 * 9, 0x3F80), out(2 * 9);
  const uint64_t elements[] = {8};
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  options.seeded_schedule = 1;
  options.schedule_seed = 7;
  options.trace_path = trace.c_str();
  options.chrome_trace_path = chrome.c_str();
  options.trace_elements = elements;
  options.num_trace_elements = 1;
  ASSERT_EQ(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_ONE_SHOT, EXACTCOLL_BF16, 2, 9, in.data(),
                                     out.data(), &options, nullptr),
            EXACTCOLL_OK)
      << last_error();
  std::ifstream file(trace);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  expect_contains(text, "\"event\":\"fold\"");
  expect_contains(text, "\"index\":8");
  expect_contains(text, "\"stored\":\"0x4000\"");  // 1 + 1 = 2 is 0x4000 in bf16
  EXPECT_TRUE(std::filesystem::exists(chrome));
  EXPECT_EQ(out[0], 0x4000);
}

TEST(CApiSim, BadArgumentsAreErrorsNotCrashes) {
  std::vector<uint16_t> in(64), out(256), ro(256);
  const int ar = EXACTCOLL_OP_ALLREDUCE, rs = EXACTCOLL_OP_REDUCE_SCATTER, ag = EXACTCOLL_OP_ALLGATHER;
  const int inv = EXACTCOLL_ERROR_INVALID_ARGUMENT;
  auto coll = [&](int op, int algo, int dtype, int ranks, size_t count, const void* i, void* o,
                  const exactcoll_sim_options* opt = nullptr) {
    return exactcoll_sim_collective(op, algo, dtype, ranks, count, i, o, opt, nullptr);
  };
  expect_error(coll(ar, 0, EXACTCOLL_BF16, 2, 8, nullptr, out.data()), inv, "inputs is NULL");
  expect_error(coll(ar, 0, EXACTCOLL_BF16, 2, 8, in.data(), nullptr), inv, "outputs is NULL");
  expect_error(coll(ar, 0, 7, 2, 8, in.data(), out.data()), inv, "dtype 7 is none of");
  expect_error(coll(9, 0, EXACTCOLL_BF16, 2, 8, in.data(), out.data()), inv, "op 9 is outside");
  expect_error(coll(ar, 99, EXACTCOLL_BF16, 2, 8, in.data(), out.data()), inv, "algo 99 is outside");
  expect_error(coll(ar, EXACTCOLL_ALGO_DIRECT, EXACTCOLL_BF16, 2, 8, in.data(), out.data()), inv,
               "allreduce has no algorithm direct");
  expect_error(coll(rs, EXACTCOLL_ALGO_ONE_SHOT, EXACTCOLL_BF16, 2, 8, in.data(), out.data()), inv,
               "reduce_scatter has no algorithm one_shot");
  expect_error(coll(ag, EXACTCOLL_ALGO_COPY_ENGINE, EXACTCOLL_BF16, 2, 8, in.data(), out.data()), inv,
               "copy_engine runs on GPUs only");
  expect_error(coll(ar, EXACTCOLL_ALGO_NCCL, EXACTCOLL_BF16, 2, 8, in.data(), out.data()), inv,
               "nccl runs on GPUs only");
  expect_error(coll(rs, 0, EXACTCOLL_BF16, 3, 8, in.data(), out.data()), inv, "divisible by the ranks");
  expect_error(coll(ar, 0, EXACTCOLL_BF16, 0, 8, in.data(), out.data()), inv, "ranks must be 1..16, got 0");
  expect_error(coll(ar, 0, EXACTCOLL_BF16, 17, 8, in.data(), out.data()), inv, "ranks must be 1..16, got 17");
  expect_error(coll(ag, 0, EXACTCOLL_FP32, 16, std::numeric_limits<size_t>::max() / 8, in.data(), out.data()), inv,
               "too large");
  EXPECT_EQ(coll(ar, 0, EXACTCOLL_BF16, 2, 0, nullptr, nullptr), EXACTCOLL_OK) << "count 0 does nothing";

  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  options.blocks = 0;
  expect_error(coll(ar, 0, EXACTCOLL_BF16, 2, 8, in.data(), out.data(), &options), inv, "blocks must be 1..128, got 0");
  exactcoll_sim_options_init(&options);
  options.struct_size = 8;
  expect_error(coll(ar, 0, EXACTCOLL_BF16, 2, 8, in.data(), out.data(), &options), inv,
               "exactcoll_sim_options.struct_size is 8");
  exactcoll_sim_options_init(&options);
  const uint64_t past[] = {8};
  options.trace_elements = past;
  options.num_trace_elements = 1;
  expect_error(coll(ar, 0, EXACTCOLL_BF16, 2, 8, in.data(), out.data(), &options), inv, "trace element 8 is past");
  exactcoll_sim_options_init(&options);
  options.trace_path = "/nonexistent-dir/t.jsonl";
  expect_error(coll(ar, 0, EXACTCOLL_BF16, 2, 8, in.data(), out.data(), &options), inv, "cannot write the trace");
  exactcoll_call_info info;
  exactcoll_call_info_init(&info);
  info.struct_size = 4;
  expect_error(exactcoll_sim_collective(ar, 0, EXACTCOLL_BF16, 2, 8, in.data(), out.data(), nullptr, &info), inv,
               "exactcoll_call_info.struct_size is 4");

  auto fused = [&](int algo, int contract, int dtype, int64_t rows, int64_t hidden, float eps,
                   const exactcoll_sim_options* opt = nullptr) {
    return exactcoll_sim_fused_add_rmsnorm(algo, contract, dtype, 2, rows, hidden, eps, in.data(), in.data(), in.data(),
                                           ro.data(), out.data(), opt, nullptr);
  };
  expect_error(fused(0, 0, EXACTCOLL_BF16, 2, 12, 1e-6f), inv,
               "hidden size 12 is not a positive multiple of the bf16 pack");
  expect_error(fused(0, 0, EXACTCOLL_FP32, 2, 6, 1e-6f), inv, "fp32 pack (4 elements)");
  expect_error(fused(0, 0, EXACTCOLL_BF16, -1, 8, 1e-6f), inv, "rows must be 0..");
  expect_error(fused(0, 0, EXACTCOLL_BF16, 2, 8, NAN), inv, "eps must be finite and >= 0");
  expect_error(fused(0, 0, EXACTCOLL_BF16, 2, 8, -1.0f), inv, "eps must be finite and >= 0");
  expect_error(fused(0, 0, EXACTCOLL_BF16, 2, 8, INFINITY), inv, "eps must be finite and >= 0");
  expect_error(fused(EXACTCOLL_FUSED_NCCL_SPLIT, 0, EXACTCOLL_BF16, 2, 8, 1e-6f), inv, "nccl_split runs on GPUs only");
  expect_error(fused(EXACTCOLL_FUSED_TWO_STAGE, EXACTCOLL_CONTRACT_F32_RESIDUAL, EXACTCOLL_BF16, 2, 8, 1e-6f), inv,
               "algo must be auto");
  expect_error(fused(0, 9, EXACTCOLL_BF16, 2, 8, 1e-6f), inv, "contract 9 is outside");
  expect_error(exactcoll_sim_fused_add_rmsnorm(0, 0, EXACTCOLL_BF16, 2, 2, 8, 1e-6f, in.data(), nullptr, in.data(),
                                               ro.data(), out.data(), nullptr, nullptr),
               inv, "residual is NULL");
}

// ---- stores ----------------------------------------------------------------------------------------

TEST(CApiStore, HandlesAreCheckedAndNeverReused) {
  MemoryStore memory;
  const exactcoll_store_callbacks cb = callbacks_for(&memory);
  exactcoll_store store{};
  ASSERT_EQ(exactcoll_store_create(&cb, 0, 2, &store), EXACTCOLL_OK) << last_error();
  ASSERT_EQ(exactcoll_store_destroy(store), EXACTCOLL_OK);
  expect_error(exactcoll_store_destroy(store), EXACTCOLL_ERROR_INVALID_ARGUMENT,
               "store handle " + std::to_string(store.id) + " was destroyed");
  exactcoll_store again{};
  ASSERT_EQ(exactcoll_store_create(&cb, 0, 2, &again), EXACTCOLL_OK);
  EXPECT_NE(again.id, store.id) << "ids are never reused";
  EXPECT_EQ(exactcoll_store_destroy(again), EXACTCOLL_OK);
  expect_error(exactcoll_store_destroy(exactcoll_store{0}), EXACTCOLL_ERROR_INVALID_ARGUMENT, "handle is 0");
  expect_error(exactcoll_store_destroy(exactcoll_store{1u << 30}), EXACTCOLL_ERROR_INVALID_ARGUMENT,
               "was never created");

  expect_error(exactcoll_store_create(nullptr, 0, 2, &store), EXACTCOLL_ERROR_INVALID_ARGUMENT, "callbacks is NULL");
  exactcoll_store_callbacks no_get = cb;
  no_get.get = nullptr;
  expect_error(exactcoll_store_create(&no_get, 0, 2, &store), EXACTCOLL_ERROR_INVALID_ARGUMENT,
               "set, get and add callbacks are required");
  expect_error(exactcoll_store_create(&cb, 2, 2, &store), EXACTCOLL_ERROR_INVALID_ARGUMENT, "rank 2 is outside 0..1");
  exactcoll_store_callbacks small = cb;
  small.struct_size = 3;
  expect_error(exactcoll_store_create(&small, 0, 2, &store), EXACTCOLL_ERROR_INVALID_ARGUMENT,
               "exactcoll_store_callbacks.struct_size is 3");
}

TEST(CApiStore, BarrierOverCallbacksNamesTheMissingRank) {
  MemoryStore memory;
  const exactcoll_store_callbacks cb = callbacks_for(&memory);
  std::vector<exactcoll_store> stores(3);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(exactcoll_store_create(&cb, r, 3, &stores[r]), EXACTCOLL_OK);
  std::vector<int> status(3, -1);
  std::vector<std::string> message(3);
  std::vector<std::thread> ranks;
  for (int r : {0, 1}) {  // rank 2 never comes
    ranks.emplace_back([&, r] {
      status[r] = exactcoll_store_barrier(stores[r], "gather", 200);
      message[r] = exactcoll_last_error();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r : {0, 1}) {
    EXPECT_EQ(status[r], EXACTCOLL_ERROR_STORE);
    expect_contains(message[r], "barrier 'user/gather': rank 2 never arrived within 200 ms");
  }
  expect_error(exactcoll_store_barrier(stores[0], nullptr, 10), EXACTCOLL_ERROR_INVALID_ARGUMENT, "name is NULL");
  for (auto s : stores) EXPECT_EQ(exactcoll_store_destroy(s), EXACTCOLL_OK);
}

TEST(CApiStore, TcpStoreFormsAndRejectsBadArguments) {
  exactcoll_store store{};
  expect_error(exactcoll_store_create_tcp("127.0.0.1", 0, nullptr, "0123456789abcdef", 0, 1, 1000, &store),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "port must be 1..65535");
  expect_error(exactcoll_store_create_tcp("127.0.0.1", 30000, nullptr, "short", 0, 1, 1000, &store),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "EXACTCOLL_STORE_TOKEN has 5 characters");
  expect_error(exactcoll_store_create_tcp(nullptr, 30000, nullptr, "0123456789abcdef", 0, 1, 1000, &store),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "host is NULL");
  // The client capped a longer connect timeout silently at 2^31 ms; it is the caller's mistake.
  expect_error(
      exactcoll_store_create_tcp("127.0.0.1", 30000, nullptr, "0123456789abcdef", 0, 1, int64_t{1} << 31, &store),
      EXACTCOLL_ERROR_INVALID_ARGUMENT, "connect_timeout_ms must be 1..2147483647 (about 24.8 days), got 2147483648");
  expect_error(exactcoll_store_create_tcp("127.0.0.1", 30000, nullptr, "0123456789abcdef", 0, 1, 0, &store),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "connect_timeout_ms must be 1..");
  const int port = launch::pick_free_port();
  std::vector<exactcoll_store> stores(2);
  std::vector<int> status(2, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      status[r] = exactcoll_store_create_tcp("127.0.0.1", port, nullptr, "0123456789abcdef01", r, 2, 5000, &stores[r]);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_EQ(status[0], EXACTCOLL_OK);
  ASSERT_EQ(status[1], EXACTCOLL_OK);
  ranks.clear();
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] { status[r] = exactcoll_store_barrier(stores[r], "lined-up", 5000); });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(status[0], EXACTCOLL_OK);
  EXPECT_EQ(status[1], EXACTCOLL_OK);
  EXPECT_EQ(exactcoll_store_destroy(stores[1]), EXACTCOLL_OK);
  EXPECT_EQ(exactcoll_store_destroy(stores[0]), EXACTCOLL_OK);
}

// ---- GPU functions on a machine without a GPU, and bad handles ---------------------------------

TEST(CApiGpu, CommunicatorCallsFailCleanlyWithoutAGpu) {
  std::vector<uint16_t> buf(64);
  const exactcoll_comm none{0};
  expect_error(exactcoll_allreduce(none, buf.data(), buf.data(), 8, EXACTCOLL_BF16, 0, nullptr, -1, nullptr),
               exactcoll_has_cuda() ? EXACTCOLL_ERROR_INVALID_ARGUMENT : EXACTCOLL_ERROR_UNAVAILABLE,
               exactcoll_has_cuda() ? "communicator handle is 0" : "built without CUDA");
  expect_error(exactcoll_comm_check(exactcoll_comm{77}, nullptr),
               exactcoll_has_cuda() ? EXACTCOLL_ERROR_INVALID_ARGUMENT : EXACTCOLL_ERROR_UNAVAILABLE,
               exactcoll_has_cuda() ? "was never created" : "built without CUDA");
  int previous = -7;
  expect_error(exactcoll_comm_set_max_blocks(exactcoll_comm{77}, 48, &previous),
               exactcoll_has_cuda() ? EXACTCOLL_ERROR_INVALID_ARGUMENT : EXACTCOLL_ERROR_UNAVAILABLE,
               exactcoll_has_cuda() ? "was never created" : "built without CUDA");
  if (exactcoll_has_cuda()) {
    expect_error(exactcoll_comm_set_max_blocks(exactcoll_comm{77}, -1, &previous), EXACTCOLL_ERROR_INVALID_ARGUMENT,
                 "max_blocks must be >= 0");
  }
  EXPECT_EQ(previous, -7);  // untouched by a failed call
  MemoryStore memory;
  const exactcoll_store_callbacks cb = callbacks_for(&memory);
  exactcoll_store store{};
  ASSERT_EQ(exactcoll_store_create(&cb, 0, 1, &store), EXACTCOLL_OK);
  exactcoll_comm comm{};
  const int status = exactcoll_comm_create(store, 0, 1, nullptr, &comm);
  if (status == EXACTCOLL_OK) {
    GTEST_SKIP() << "this machine has a GPU: the GPU tests (tagged gpu) cover it";
  }
  EXPECT_TRUE(status == EXACTCOLL_ERROR_CUDA || status == EXACTCOLL_ERROR_UNAVAILABLE) << exactcoll_status_name(status);
  EXPECT_FALSE(last_error().empty());
  exactcoll_comm_options options;
  exactcoll_comm_options_init(&options);
  options.buffer_bytes = 16;
  expect_error(exactcoll_comm_create(store, 0, 1, &options, &comm),
               exactcoll_has_cuda() ? EXACTCOLL_ERROR_INVALID_ARGUMENT : EXACTCOLL_ERROR_UNAVAILABLE,
               exactcoll_has_cuda() ? "buffer_bytes must be at least 4096" : "built without CUDA");
  EXPECT_EQ(exactcoll_store_destroy(store), EXACTCOLL_OK);
}

// The multi-node options are checked, and the layout with them, before any GPU is touched; a
// caller compiled against the first exactcoll_comm_options (without node / local_world_size) is
// still served, with their defaults.
TEST(CApiGpu, MultiNodeOptionsAndOlderStructsAreCheckedFirst) {
  if (!exactcoll_has_cuda()) GTEST_SKIP() << "built without CUDA: every GPU call is UNAVAILABLE";
  MemoryStore memory;
  const exactcoll_store_callbacks cb = callbacks_for(&memory);
  exactcoll_store store{};
  ASSERT_EQ(exactcoll_store_create(&cb, 3, 4, &store), EXACTCOLL_OK);
  exactcoll_comm comm{};
  exactcoll_comm_options options;
  exactcoll_comm_options_init(&options);
  EXPECT_EQ(options.node, -1);
  EXPECT_EQ(options.local_world_size, 0);
  const int inv = EXACTCOLL_ERROR_INVALID_ARGUMENT;
  options.node = -2;
  expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "node must be -1 (from the environment)");
  options.node = -1;
  options.local_world_size = -1;
  expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "local_world_size must be 0");
  options.local_world_size = 3;
  expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "world_size 4 is not a multiple of 3");
  options.node = 0;
  options.local_world_size = 2;
  expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "rank 3 is not on node 0 of 2 ranks");
  // The first version of the struct ends before `node`: accepted (buffer_bytes is read and checked).
  exactcoll_comm_options_init(&options);
  options.struct_size = offsetof(exactcoll_comm_options, node);
  options.buffer_bytes = 16;
  expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "buffer_bytes must be at least 4096");
  options.struct_size = offsetof(exactcoll_comm_options, node) - 1;
  expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "exactcoll_comm_options.struct_size is");
  // A field that sits in the tail padding of the struct before it is read only from callers whose
  // struct_size reaches past it: the struct before `contract` (sizeof 64, `contract` at 60) carries
  // padding there, not a contract. The layout error below comes after the contract's check.
  exactcoll_comm_options_init(&options);
  options.contract = 99;
  options.node = 0;
  options.local_world_size = 2;
  options.struct_size = offsetof(exactcoll_comm_options, contract) + sizeof(int);
  expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "rank 3 is not on node 0 of 2 ranks");
  options.struct_size = sizeof options;
  expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "contract");
  // graph_in_place and eager_in_place likewise, each in the tail padding of the struct before it
  // (which ends with `reserved`, `reserved2`): with that struct's size, or its sizeof padded to 8
  // bytes, the bad value is never read (the layout error comes instead); with the full size it is.
  auto padded_switch = [&](int exactcoll_comm_options::*field, size_t previous_end, const std::string& message) {
    exactcoll_comm_options_init(&options);
    EXPECT_EQ(options.*field, 1) << message;
    options.*field = 7;
    options.node = 0;
    options.local_world_size = 2;
    for (const size_t size : {previous_end, (previous_end + 7) / 8 * 8}) {
      options.struct_size = size;
      expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, "rank 3 is not on node 0 of 2 ranks");
    }
    options.struct_size = sizeof options;
    expect_error(exactcoll_comm_create(store, 3, 4, &options, &comm), inv, message);
  };
  padded_switch(&exactcoll_comm_options::graph_in_place, offsetof(exactcoll_comm_options, reserved) + sizeof(int),
                "graph_in_place must be 0 or 1, got 7");
  padded_switch(&exactcoll_comm_options::eager_in_place, offsetof(exactcoll_comm_options, reserved2) + sizeof(int),
                "eager_in_place must be 0 or 1, got 7");
  EXPECT_EQ(exactcoll_store_destroy(store), EXACTCOLL_OK);
}

TEST(CApiGpu, AddRmsNormChecksItsArgumentsFirst) {
  std::vector<uint16_t> buf(64);
  void* p = buf.data();
  const int inv = EXACTCOLL_ERROR_INVALID_ARGUMENT;
  const int unavailable = EXACTCOLL_ERROR_UNAVAILABLE;
  const bool cuda = exactcoll_has_cuda();
  expect_error(exactcoll_add_rmsnorm(p, p, p, p, p, 1, 8, NAN, EXACTCOLL_BF16, -1, nullptr), cuda ? inv : unavailable,
               cuda ? "eps must be finite" : "built without CUDA");
  expect_error(exactcoll_add_rmsnorm(p, nullptr, p, p, p, 1, 8, 1e-6f, EXACTCOLL_BF16, -1, nullptr),
               cuda ? inv : unavailable, cuda ? "residual is NULL" : "built without CUDA");
  expect_error(exactcoll_add_rmsnorm(p, p, p, p, p, 1, 8, 1e-6f, 5, -1, nullptr), cuda ? inv : unavailable,
               cuda ? "dtype 5 is none of" : "built without CUDA");
  expect_error(exactcoll_add_rmsnorm(p, p, p, p, p, -1, 8, 1e-6f, EXACTCOLL_BF16, -1, nullptr),
               cuda ? inv : unavailable, cuda ? "rows must be 0.." : "built without CUDA");
}

}  // namespace
}  // namespace exactcoll
