// exactcoll_sim_multinode_collective (include/exactcoll/exactcoll.h): the bits of the multi-node
// simulator called directly (sim/multinode/multinode_sim.h) and of the contract's reference
// (core/contract.h), the stats and call info, the trace it writes, its argument errors, and an
// older (shorter) exactcoll_sim_options; and exactcoll_sim_multinode_fused_add_rmsnorm's bits
// against the simulator called directly and the one-node entry point, its trace and its errors.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/contract.h"
#include "core/storage.h"
#include "exactcoll/exactcoll.h"
#include "sim/multinode/multinode_sim.h"
#include "tests/capi/expect_status.h"

namespace exactcoll {
namespace {

using capitest::expect_contains;
using capitest::expect_error;
using capitest::last_error;

constexpr int kInvalid = EXACTCOLL_ERROR_INVALID_ARGUMENT;

// Random bf16 values (a 64-bit LCG's high bits), ranks x count.
std::vector<bf16> random_bf16(size_t n, uint64_t seed) {
  std::vector<bf16> v(n);
  for (bf16& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = round_to<bf16>(static_cast<float>(static_cast<int64_t>(seed >> 40) - (int64_t{1} << 23)) / 1048576.0f);
  }
  return v;
}

// A seeded multi-node call's arguments: 1..3 blocks from the seed, schedule seed 3, chunks of 64
// elements, fresh stats and call info.
struct SeededCall {
  exactcoll_sim_options options;
  exactcoll_sim_multinode_options m;
  exactcoll_sim_multinode_stats stats;
  exactcoll_call_info info;
  explicit SeededCall(uint64_t seed) {
    exactcoll_sim_options_init(&options);
    options.blocks = 1 + static_cast<int>(seed % 3);
    options.seeded_schedule = 1;
    options.schedule_seed = 3;
    exactcoll_sim_multinode_options_init(&m);
    m.chunk_elements = 64;
    exactcoll_sim_multinode_stats_init(&stats);
    exactcoll_call_info_init(&info);
  }
};

size_t out_count_of(int op, size_t count, int ranks) {
  return op == EXACTCOLL_OP_ALLREDUCE        ? count
         : op == EXACTCOLL_OP_REDUCE_SCATTER ? count / static_cast<size_t>(ranks)
                                             : count * static_cast<size_t>(ranks);
}

// The same run through the simulator directly: every rank's output, concatenated.
std::vector<bf16> direct(int op, int nodes, int local, size_t count, const std::vector<bf16>& in, Contract contract,
                         int blocks, size_t chunk, bool seeded, multinode::MultiNodeTrace* trace) {
  const int n = nodes * local;
  multinode::NetworkOptions net;
  net.layout.nodes = nodes;
  net.layout.local_ranks = local;
  net.schedule = seeded ? sim::Schedule::kSeeded : sim::Schedule::kThreads;
  net.seed = 3;
  multinode::MultiNodeSpec spec;
  spec.op = static_cast<Op>(op);
  spec.dtype = DType::kBF16;
  spec.count = count;
  spec.blocks = blocks;
  spec.chunk_elements = chunk;
  spec.contract = contract;
  const size_t oc = out_count_of(op, count, n);
  std::vector<bf16> out(oc * static_cast<size_t>(n));
  std::vector<const void*> ins;
  std::vector<void*> outs;
  for (int r = 0; r < n; ++r) {
    ins.push_back(in.data() + static_cast<size_t>(r) * count);
    outs.push_back(out.data() + static_cast<size_t>(r) * oc);
  }
  multinode::run_multinode(net, spec, ins, outs, trace);
  return out;
}

TEST(CApiSimMultiNode, StructSizesForBindings) {
  EXPECT_EQ(exactcoll_struct_size("exactcoll_sim_multinode_options"), sizeof(exactcoll_sim_multinode_options));
  EXPECT_EQ(exactcoll_struct_size("exactcoll_sim_multinode_stats"), sizeof(exactcoll_sim_multinode_stats));
  exactcoll_sim_multinode_options m;
  exactcoll_sim_multinode_options_init(&m);
  EXPECT_EQ(m.struct_size, sizeof m);
  EXPECT_EQ(m.chunk_elements, multinode::kDefaultChunkElements);
}

// Every op under both contracts on several layouts: the simulator's bits called directly, the
// contract's reference (canonical: the fold in global rank order; tree: tree_fold), and the
// stats equal to the direct run's.
TEST(CApiSimMultiNode, MatchesTheSimulatorAndTheContract) {
  uint64_t seed = 40;
  struct Layout {
    int nodes, local;
  };
  for (const Layout l : {Layout{1, 4}, Layout{2, 2}, Layout{2, 4}, Layout{4, 2}, Layout{3, 2}}) {
    for (const int contract : {EXACTCOLL_CONTRACT_CANONICAL, EXACTCOLL_CONTRACT_TREE}) {
      const bool tree = contract == EXACTCOLL_CONTRACT_TREE;
      if (tree && l.nodes == 3) continue;  // the tree needs powers of two across nodes
      for (const int op : {EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_OP_REDUCE_SCATTER, EXACTCOLL_OP_ALLGATHER}) {
        const int n = l.nodes * l.local;
        const size_t count = static_cast<size_t>(n) * 75;  // chunks of 64 and a tail
        const std::vector<bf16> in = random_bf16(count * static_cast<size_t>(n), ++seed);
        const size_t oc = out_count_of(op, count, n);
        std::vector<bf16> out(oc * static_cast<size_t>(n));
        SeededCall call(seed);
        auto& [options, m, stats, info] = call;
        options.contract = contract;
        SCOPED_TRACE(std::string(exactcoll_op_name(op)) + " " + exactcoll_contract_name(contract) + " " +
                     std::to_string(l.nodes) + " x " + std::to_string(l.local));
        ASSERT_EQ(exactcoll_sim_multinode_collective(op, EXACTCOLL_BF16, l.nodes, l.local, count, in.data(), out.data(),
                                                     &options, &m, &stats, &info),
                  EXACTCOLL_OK)
            << last_error();
        multinode::MultiNodeTrace trace;
        const std::vector<bf16> want =
            direct(op, l.nodes, l.local, count, in, static_cast<Contract>(contract), options.blocks, 64, true, &trace);
        ASSERT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(bf16)), 0);
        EXPECT_EQ(stats.messages, trace.messages);
        EXPECT_EQ(stats.cross_node_bytes, trace.cross_node_bytes);
        EXPECT_EQ(info.algo, -1);
        EXPECT_EQ(info.exact, 1);
        EXPECT_EQ(info.blocks, options.blocks);
        EXPECT_STREQ(info.note, op == EXACTCOLL_OP_ALLGATHER   ? "direct_exchange"
                                : !tree                        ? "carry_chain"
                                : op == EXACTCOLL_OP_ALLREDUCE ? "tree_doubling"
                                                               : "tree_halving");
        // The contract's reference.
        size_t differing = 0;
        for (int r = 0; r < n; ++r) {
          for (size_t j = 0; j < oc; ++j) {
            bf16 expected;
            if (op == EXACTCOLL_OP_ALLGATHER) {
              expected = in[(j / count) * count + j % count];
            } else {
              const size_t first = op == EXACTCOLL_OP_ALLREDUCE ? 0 : static_cast<size_t>(r) * oc;
              auto x = [&](int p) { return in[static_cast<size_t>(p) * count + first + j]; };
              expected = tree ? contract::tree_fold<bf16>(n, x) : contract::fold<bf16>(n, x);
            }
            differing += out[static_cast<size_t>(r) * oc + j].bits != expected.bits;
          }
        }
        EXPECT_EQ(differing, 0u);
      }
    }
  }
}

// The same bits as exactcoll_sim_collective on the same ranks (defaults: NULL options).
TEST(CApiSimMultiNode, SameBitsAsOneNode) {
  const int nodes = 2, local = 4, n = 8;
  const size_t count = 1000;
  const std::vector<bf16> in = random_bf16(count * n, 7);
  std::vector<bf16> multi(count * n), one(count * n);
  ASSERT_EQ(exactcoll_sim_multinode_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, nodes, local, count, in.data(),
                                               multi.data(), nullptr, nullptr, nullptr, nullptr),
            EXACTCOLL_OK)
      << last_error();
  ASSERT_EQ(exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, n, count, in.data(),
                                     one.data(), nullptr, nullptr),
            EXACTCOLL_OK)
      << last_error();
  EXPECT_EQ(std::memcmp(multi.data(), one.data(), one.size() * sizeof(bf16)), 0);
}

// An older caller's exactcoll_sim_options (as first published, before `contract`): its missing
// fields keep their defaults (canonical, no step bound change), and the run gives the same bits.
TEST(CApiSimMultiNode, OlderShorterOptionsStruct) {
  const size_t count = 256;
  const std::vector<bf16> in = random_bf16(count * 4, 11);
  exactcoll_sim_options full;
  exactcoll_sim_options_init(&full);
  full.seeded_schedule = 1;
  full.blocks = 2;
  exactcoll_sim_options old = full;
  old.struct_size = offsetof(exactcoll_sim_options, contract);
  old.contract = EXACTCOLL_CONTRACT_TREE;  // past the old struct's end: never read
  old.fail_rank = 1;                       // also past it
  std::vector<bf16> a(count * 4), b(count * 4);
  ASSERT_EQ(exactcoll_sim_multinode_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 2, count, in.data(), a.data(),
                                               &full, nullptr, nullptr, nullptr),
            EXACTCOLL_OK)
      << last_error();
  ASSERT_EQ(exactcoll_sim_multinode_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 2, count, in.data(), b.data(),
                                               &old, nullptr, nullptr, nullptr),
            EXACTCOLL_OK)
      << last_error();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)), 0);
  // Shorter than the first version: refused, naming the struct.
  old.struct_size = 8;
  expect_error(exactcoll_sim_multinode_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 2, count, in.data(),
                                                  b.data(), &old, nullptr, nullptr, nullptr),
               kInvalid, "exactcoll_sim_options.struct_size is 8");
  exactcoll_sim_multinode_options m;
  exactcoll_sim_multinode_options_init(&m);
  m.struct_size = 4;
  expect_error(exactcoll_sim_multinode_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 2, count, in.data(),
                                                  b.data(), nullptr, &m, nullptr, nullptr),
               kInvalid, "exactcoll_sim_multinode_options.struct_size is 4");
  exactcoll_sim_multinode_stats stats;
  exactcoll_sim_multinode_stats_init(&stats);
  stats.struct_size = 0;
  expect_error(exactcoll_sim_multinode_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 2, count, in.data(),
                                                  b.data(), nullptr, nullptr, &stats, nullptr),
               kInvalid, "exactcoll_sim_multinode_stats.struct_size is 0");
}

// The library writes the trace (also after a failed run), with the traced elements' events.
TEST(CApiSimMultiNode, TraceIsWrittenAlsoAfterAFailedRun) {
  const std::string path = (std::filesystem::temp_directory_path() / "multinode_capi_trace.jsonl").string();
  const size_t count = 512;
  const std::vector<bf16> in = random_bf16(count * 4, 13);
  std::vector<bf16> out(count * 4);
  const uint64_t elements[] = {5};
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  options.seeded_schedule = 1;
  options.trace_path = path.c_str();
  options.trace_elements = elements;
  options.num_trace_elements = 1;
  std::filesystem::remove(path);
  ASSERT_EQ(exactcoll_sim_multinode_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 2, count, in.data(),
                                               out.data(), &options, nullptr, nullptr, nullptr),
            EXACTCOLL_OK)
      << last_error();
  multinode::NetworkOptions net;
  net.layout = {2, 2};
  net.schedule = sim::Schedule::kSeeded;
  net.trace = true;
  multinode::MultiNodeSpec spec;
  spec.count = count;
  std::vector<bf16> want(count * 4);
  std::vector<const void*> ins;
  std::vector<void*> outs;
  for (int r = 0; r < 4; ++r) {
    ins.push_back(in.data() + r * count);
    outs.push_back(want.data() + r * count);
  }
  multinode::MultiNodeTrace trace;
  multinode::run_multinode(net, spec, ins, outs, &trace, {5});
  std::ifstream file(path);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, trace.json_lines);
  expect_contains(text, "\"fold\"");

  // A livelock bound that the run cannot meet: SIMULATION, and the trace of how far it got.
  std::filesystem::remove(path);
  options.max_steps = 20;
  exactcoll_sim_multinode_stats stats;
  exactcoll_sim_multinode_stats_init(&stats);
  expect_error(exactcoll_sim_multinode_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 2, count, in.data(),
                                                  out.data(), &options, nullptr, &stats, nullptr),
               EXACTCOLL_ERROR_SIMULATION, "exactcoll_sim_multinode_collective: no completion within 20");
  EXPECT_TRUE(std::filesystem::exists(path));
  std::filesystem::remove(path);
}

TEST(CApiSimMultiNode, BadArgumentsAreErrorsNotCrashes) {
  std::vector<bf16> in(64 * 8), out(64 * 8 * 8);
  auto call = [&](int op, int dtype, int nodes, int local, size_t count, const exactcoll_sim_options* o,
                  const exactcoll_sim_multinode_options* m, const void* i, void* out_ptr) {
    return exactcoll_sim_multinode_collective(op, dtype, nodes, local, count, i, out_ptr, o, m, nullptr, nullptr);
  };
  const int ar = EXACTCOLL_OP_ALLREDUCE;
  expect_error(call(99, EXACTCOLL_BF16, 2, 2, 64, nullptr, nullptr, in.data(), out.data()), kInvalid, "op");
  expect_error(call(ar, 99, 2, 2, 64, nullptr, nullptr, in.data(), out.data()), kInvalid, "dtype");
  expect_error(call(ar, EXACTCOLL_BF16, 0, 2, 64, nullptr, nullptr, in.data(), out.data()), kInvalid,
               "nodes must be 1..1024, got 0");
  expect_error(call(ar, EXACTCOLL_BF16, 2, 17, 64, nullptr, nullptr, in.data(), out.data()), kInvalid,
               "ranks_per_node must be 1..16, got 17");
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 64, nullptr, nullptr, nullptr, out.data()), kInvalid, "inputs is NULL");
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 64, nullptr, nullptr, in.data(), nullptr), kInvalid, "outputs is NULL");
  expect_error(call(EXACTCOLL_OP_REDUCE_SCATTER, EXACTCOLL_BF16, 2, 2, 10, nullptr, nullptr, in.data(), out.data()),
               kInvalid, "multiple of the 4 ranks");
  exactcoll_sim_multinode_options m;
  exactcoll_sim_multinode_options_init(&m);
  m.chunk_elements = 100;
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 64, nullptr, &m, in.data(), out.data()), kInvalid,
               "multiple of 64 elements, not 100");
  exactcoll_sim_options o;
  exactcoll_sim_options_init(&o);
  o.contract = EXACTCOLL_CONTRACT_TREE;
  expect_error(call(ar, EXACTCOLL_BF16, 3, 2, 64, &o, nullptr, in.data(), out.data()), kInvalid, "power-of-two");
  exactcoll_sim_options_init(&o);
  o.fail_rank = 1;
  o.fail_at_step = 1;
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 64, &o, nullptr, in.data(), out.data()), kInvalid, "kills no rank");
  exactcoll_sim_options_init(&o);
  o.chrome_trace_path = "x.json";
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 64, &o, nullptr, in.data(), out.data()), kInvalid,
               "chrome_trace_path must be NULL");
  exactcoll_sim_options_init(&o);
  o.threads = 32;
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 64, &o, nullptr, in.data(), out.data()), kInvalid, "threads");
  exactcoll_sim_options_init(&o);
  o.blocks = 0;
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 64, &o, nullptr, in.data(), out.data()), kInvalid, "blocks");
  exactcoll_sim_options_init(&o);
  const uint64_t past[] = {64};
  o.trace_elements = past;
  o.num_trace_elements = 1;
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 64, &o, nullptr, in.data(), out.data()), kInvalid,
               "trace element 64 is past");
  // Count 0: nothing runs, nothing is read (NULL buffers allowed), but the rest is still checked.
  EXPECT_EQ(call(ar, EXACTCOLL_BF16, 2, 2, 0, nullptr, nullptr, nullptr, nullptr), EXACTCOLL_OK) << last_error();
  expect_error(call(ar, EXACTCOLL_BF16, 2, 2, 0, nullptr, &m, nullptr, nullptr), kInvalid, "not 100");
}

// ---- exactcoll_sim_multinode_fused_add_rmsnorm ----------------------------------------------------

// The fused op through the simulator directly: residual_out and out of every rank, concatenated.
struct FusedOut {
  std::vector<bf16> ro, out;
};
FusedOut direct_fused(int nodes, int local, int rows, int hidden, float eps, const std::vector<bf16>& x,
                      const std::vector<bf16>& residual, const std::vector<bf16>& weight, Contract contract, int blocks,
                      size_t chunk, bool seeded, multinode::MultiNodeTrace* trace) {
  const int n = nodes * local;
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
  multinode::NetworkOptions net;
  net.layout.nodes = nodes;
  net.layout.local_ranks = local;
  net.schedule = seeded ? sim::Schedule::kSeeded : sim::Schedule::kThreads;
  net.seed = 3;
  net.trace = trace != nullptr;
  multinode::MultiNodeFusedSpec spec;
  spec.dtype = DType::kBF16;
  spec.rows = rows;
  spec.hidden = hidden;
  spec.eps = eps;
  spec.blocks = blocks;
  spec.chunk_elements = chunk;
  spec.contract = contract;
  FusedOut o{std::vector<bf16>(count * static_cast<size_t>(n)), std::vector<bf16>(count * static_cast<size_t>(n))};
  multinode::MultiNodeFusedIo io;
  for (int r = 0; r < n; ++r) {
    io.x.push_back(x.data() + static_cast<size_t>(r) * count);
    io.residual.push_back(residual.data());
    io.weight.push_back(weight.data());
    io.residual_out.push_back(o.ro.data() + static_cast<size_t>(r) * count);
    io.out.push_back(o.out.data() + static_cast<size_t>(r) * count);
  }
  multinode::MultiNodeTrace unused;
  multinode::run_multinode_fused(net, spec, io, trace != nullptr ? trace : &unused);
  return o;
}

// Both contracts on several layouts: the bits of the simulator called directly and of the one-node
// entry point on the same ranks; the stats and the call info.
TEST(CApiSimMultiNodeFused, MatchesTheSimulatorAndOneNode) {
  uint64_t seed = 90;
  struct Layout {
    int nodes, local;
  };
  const int rows = 3, hidden = 200;  // chunks of 64 and a tail
  const float eps = 1e-5f;
  for (const Layout l : {Layout{1, 4}, Layout{2, 2}, Layout{2, 4}, Layout{4, 2}, Layout{3, 2}}) {
    for (const int contract : {EXACTCOLL_CONTRACT_CANONICAL, EXACTCOLL_CONTRACT_TREE}) {
      const bool tree = contract == EXACTCOLL_CONTRACT_TREE;
      if (tree && l.nodes == 3) continue;  // the tree needs powers of two across nodes
      const int n = l.nodes * l.local;
      const size_t count = static_cast<size_t>(rows) * hidden;
      const std::vector<bf16> x = random_bf16(count * static_cast<size_t>(n), ++seed);
      const std::vector<bf16> residual = random_bf16(count, ++seed);
      const std::vector<bf16> weight = random_bf16(hidden, ++seed);
      std::vector<bf16> ro(count * static_cast<size_t>(n)), out(ro.size());
      SeededCall call(seed);
      auto& [options, m, stats, info] = call;
      SCOPED_TRACE(std::string(exactcoll_contract_name(contract)) + " " + std::to_string(l.nodes) + " x " +
                   std::to_string(l.local));
      ASSERT_EQ(exactcoll_sim_multinode_fused_add_rmsnorm(contract, EXACTCOLL_BF16, l.nodes, l.local, rows, hidden, eps,
                                                          x.data(), residual.data(), weight.data(), ro.data(),
                                                          out.data(), &options, &m, &stats, &info),
                EXACTCOLL_OK)
          << last_error();
      multinode::MultiNodeTrace trace;
      const FusedOut want = direct_fused(l.nodes, l.local, rows, hidden, eps, x, residual, weight,
                                         static_cast<Contract>(contract), options.blocks, 64, true, &trace);
      EXPECT_EQ(std::memcmp(ro.data(), want.ro.data(), ro.size() * sizeof(bf16)), 0);
      EXPECT_EQ(std::memcmp(out.data(), want.out.data(), out.size() * sizeof(bf16)), 0);
      EXPECT_EQ(stats.messages, trace.messages);
      EXPECT_EQ(stats.cross_node_bytes, trace.cross_node_bytes);
      EXPECT_EQ(info.algo, -1);
      EXPECT_EQ(info.allreduce_algo, -1);
      EXPECT_EQ(info.exact, 1);
      EXPECT_EQ(info.blocks, options.blocks);
      EXPECT_STREQ(info.note, tree ? "tree_doubling" : "carry_chain");
      // The one-node entry point on the same ranks, under the same contract (defaults otherwise).
      std::vector<bf16> ro1(ro.size()), out1(out.size());
      ASSERT_EQ(exactcoll_sim_fused_add_rmsnorm(EXACTCOLL_FUSED_AUTO, contract, EXACTCOLL_BF16, n, rows, hidden, eps,
                                                x.data(), residual.data(), weight.data(), ro1.data(), out1.data(),
                                                nullptr, nullptr),
                EXACTCOLL_OK)
          << last_error();
      EXPECT_EQ(std::memcmp(ro.data(), ro1.data(), ro.size() * sizeof(bf16)), 0);
      EXPECT_EQ(std::memcmp(out.data(), out1.data(), out.size() * sizeof(bf16)), 0);
    }
  }
}

// The trace the library writes: the direct run's (seeded schedule), and also after a failed run.
TEST(CApiSimMultiNodeFused, TraceIsWrittenAlsoAfterAFailedRun) {
  const std::string path = (std::filesystem::temp_directory_path() / "multinode_capi_fused_trace.jsonl").string();
  const int rows = 2, hidden = 64;
  const size_t count = rows * hidden;
  const std::vector<bf16> x = random_bf16(count * 4, 21), residual = random_bf16(count, 22),
                          weight = random_bf16(hidden, 23);
  std::vector<bf16> ro(count * 4), out(count * 4);
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  options.seeded_schedule = 1;
  options.schedule_seed = 3;
  options.trace_path = path.c_str();
  std::filesystem::remove(path);
  ASSERT_EQ(exactcoll_sim_multinode_fused_add_rmsnorm(EXACTCOLL_CONTRACT_CANONICAL, EXACTCOLL_BF16, 2, 2, rows, hidden,
                                                      1e-6f, x.data(), residual.data(), weight.data(), ro.data(),
                                                      out.data(), &options, nullptr, nullptr, nullptr),
            EXACTCOLL_OK)
      << last_error();
  multinode::MultiNodeTrace trace;
  direct_fused(2, 2, rows, hidden, 1e-6f, x, residual, weight, Contract::kCanonical, 1,
               multinode::kDefaultChunkElements, true, &trace);
  std::ifstream file(path);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, trace.json_lines);
  EXPECT_FALSE(text.empty());
  // options->contract is not this call's (the argument is): an emulation there changes nothing.
  std::vector<bf16> ro2(count * 4), out2(count * 4);
  options.trace_path = nullptr;
  options.contract = EXACTCOLL_CONTRACT_F32_RESIDUAL;
  ASSERT_EQ(exactcoll_sim_multinode_fused_add_rmsnorm(EXACTCOLL_CONTRACT_CANONICAL, EXACTCOLL_BF16, 2, 2, rows, hidden,
                                                      1e-6f, x.data(), residual.data(), weight.data(), ro2.data(),
                                                      out2.data(), &options, nullptr, nullptr, nullptr),
            EXACTCOLL_OK)
      << last_error();
  EXPECT_EQ(std::memcmp(out2.data(), out.data(), out.size() * sizeof(bf16)), 0);
  EXPECT_EQ(std::memcmp(ro2.data(), ro.data(), ro.size() * sizeof(bf16)), 0);
  options.contract = EXACTCOLL_CONTRACT_CANONICAL;
  options.trace_path = path.c_str();

  // A livelock bound that the run cannot meet: SIMULATION, the stats and the trace of how far it got.
  std::filesystem::remove(path);
  options.max_steps = 5;
  exactcoll_sim_multinode_stats stats;
  exactcoll_sim_multinode_stats_init(&stats);
  expect_error(exactcoll_sim_multinode_fused_add_rmsnorm(EXACTCOLL_CONTRACT_CANONICAL, EXACTCOLL_BF16, 2, 2, rows,
                                                         hidden, 1e-6f, x.data(), residual.data(), weight.data(),
                                                         ro.data(), out.data(), &options, nullptr, &stats, nullptr),
               EXACTCOLL_ERROR_SIMULATION, "exactcoll_sim_multinode_fused_add_rmsnorm: no completion within 5");
  EXPECT_TRUE(std::filesystem::exists(path));
  std::filesystem::remove(path);
}

TEST(CApiSimMultiNodeFused, BadArgumentsAreErrorsNotCrashes) {
  const int rows = 2, hidden = 64;
  std::vector<bf16> x(rows * hidden * 8), residual(rows * hidden), weight(hidden), ro(x.size()), out(x.size());
  const int canonical = EXACTCOLL_CONTRACT_CANONICAL;
  auto call = [&](int contract, int dtype, int nodes, int local, int64_t r, int64_t h, float eps,
                  const exactcoll_sim_options* o, const exactcoll_sim_multinode_options* m, const void* xp,
                  void* outp) {
    return exactcoll_sim_multinode_fused_add_rmsnorm(contract, dtype, nodes, local, r, h, eps, xp, residual.data(),
                                                     weight.data(), ro.data(), outp, o, m, nullptr, nullptr);
  };
  const auto bf = EXACTCOLL_BF16;
  expect_error(call(99, bf, 2, 2, rows, hidden, 1e-6f, nullptr, nullptr, x.data(), out.data()), kInvalid, "contract");
  expect_error(
      call(EXACTCOLL_CONTRACT_F32_RESIDUAL, bf, 2, 2, rows, hidden, 1e-6f, nullptr, nullptr, x.data(), out.data()),
      kInvalid, "contract f32_residual runs on one node only");
  expect_error(call(canonical, 99, 2, 2, rows, hidden, 1e-6f, nullptr, nullptr, x.data(), out.data()), kInvalid,
               "dtype");
  expect_error(call(canonical, bf, 0, 2, rows, hidden, 1e-6f, nullptr, nullptr, x.data(), out.data()), kInvalid,
               "nodes must be 1..1024, got 0");
  expect_error(call(canonical, bf, 2, 17, rows, hidden, 1e-6f, nullptr, nullptr, x.data(), out.data()), kInvalid,
               "ranks_per_node must be 1..16, got 17");
  expect_error(call(canonical, bf, 2, 2, -1, hidden, 1e-6f, nullptr, nullptr, x.data(), out.data()), kInvalid,
               "rows must be 0..16777216, got -1");
  expect_error(call(canonical, bf, 2, 2, rows, 60, 1e-6f, nullptr, nullptr, x.data(), out.data()), kInvalid,
               "hidden size 60 is not a positive multiple of the bf16 pack");
  expect_error(call(canonical, bf, 2, 2, rows, hidden, -1.0f, nullptr, nullptr, x.data(), out.data()), kInvalid,
               "eps must be finite and >= 0");
  expect_error(call(canonical, bf, 2, 2, rows, hidden, 1e-6f, nullptr, nullptr, nullptr, out.data()), kInvalid,
               "x is NULL");
  expect_error(call(canonical, bf, 2, 2, rows, hidden, 1e-6f, nullptr, nullptr, x.data(), nullptr), kInvalid,
               "out is NULL");
  exactcoll_sim_multinode_options m;
  exactcoll_sim_multinode_options_init(&m);
  m.chunk_elements = 100;
  expect_error(call(canonical, bf, 2, 2, rows, hidden, 1e-6f, nullptr, &m, x.data(), out.data()), kInvalid,
               "multiple of 64 elements, not 100");
  expect_error(call(EXACTCOLL_CONTRACT_TREE, bf, 3, 2, rows, hidden, 1e-6f, nullptr, nullptr, x.data(), out.data()),
               kInvalid, "power-of-two");
  exactcoll_sim_options o;
  exactcoll_sim_options_init(&o);
  o.fail_rank = 1;
  o.fail_at_step = 1;
  expect_error(call(canonical, bf, 2, 2, rows, hidden, 1e-6f, &o, nullptr, x.data(), out.data()), kInvalid,
               "kills no rank");
  exactcoll_sim_options_init(&o);
  o.chrome_trace_path = "x.json";
  expect_error(call(canonical, bf, 2, 2, rows, hidden, 1e-6f, &o, nullptr, x.data(), out.data()), kInvalid,
               "chrome_trace_path must be NULL");
  exactcoll_sim_options_init(&o);
  o.threads = 32;
  expect_error(call(canonical, bf, 2, 2, rows, hidden, 1e-6f, &o, nullptr, x.data(), out.data()), kInvalid,
               "threads must be 0 or 1");
  exactcoll_sim_options_init(&o);
  o.blocks = 0;
  expect_error(call(canonical, bf, 2, 2, rows, hidden, 1e-6f, &o, nullptr, x.data(), out.data()), kInvalid, "blocks");
  exactcoll_sim_options_init(&o);
  const uint64_t element[] = {0};
  o.trace_path = "unused.jsonl";
  o.trace_elements = element;
  o.num_trace_elements = 1;
  expect_error(call(canonical, bf, 2, 2, rows, hidden, 1e-6f, &o, nullptr, x.data(), out.data()), kInvalid,
               "trace_elements must be empty");
  // options->contract is not read: the argument is the contract (tree here, on a layout it needs).
  exactcoll_sim_options_init(&o);
  o.contract = EXACTCOLL_CONTRACT_TREE;
  EXPECT_EQ(call(canonical, bf, 3, 2, rows, hidden, 1e-6f, &o, nullptr, x.data(), out.data()), EXACTCOLL_OK)
      << last_error();
  // Rows 0: nothing runs, nothing is read (NULL buffers allowed), but the rest is still checked.
  EXPECT_EQ(call(canonical, bf, 2, 2, 0, hidden, 1e-6f, nullptr, nullptr, nullptr, nullptr), EXACTCOLL_OK)
      << last_error();
  expect_error(call(canonical, bf, 2, 2, 0, hidden, 1e-6f, nullptr, &m, nullptr, nullptr), kInvalid, "not 100");
}

}  // namespace
}  // namespace exactcoll
