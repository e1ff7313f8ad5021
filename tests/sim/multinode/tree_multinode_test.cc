// The tree contract across nodes (core/multinode.h's tree_allreduce and tree_reduce_scatter) on
// the simulator (sim/multinode): every element of every rank against contract::tree_fold over all
// n = M x L ranks, bit for bit, for (M, L) in {(2,1), (2,2), (4,2), (2,4), (8,1)}, bf16/fp16/fp32,
// adversarial inputs (NaN with payloads, infinities, signed zeros, subnormals, values near the
// largest finite one), counts that are not a multiple of the pack, chunks of 64 elements (several
// chunks per call) and the default chunk, seeded schedules. Mutations the checks catch: pairing
// the nodes top-down (another tree), and the canonical chain's result.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/contract.h"
#include "core/multinode.h"
#include "sim/collectives.h"
#include "sim/fused/reference.h"
#include "sim/multinode/multinode_sim.h"
#include "sim/world.h"
#include "tests/sim/sim_test_util.h"
#include "tests/sim/multinode/tree_trace_check.h"
#include "tests/sim/tree_nodes.h"

namespace exactcoll::multinode {
namespace {

constexpr uint64_t kBaseSeed = 20261127;
constexpr DType kTypes[] = {DType::kBF16, DType::kFP16, DType::kFP32};
constexpr NodeLayout kLayouts[] = {{2, 1}, {2, 2}, {4, 2}, {2, 4}, {8, 1}};

using Bytes = std::vector<std::vector<uint8_t>>;

std::string layout_name(const NodeLayout& layout) {
  return std::to_string(layout.nodes) + " nodes x " + std::to_string(layout.local_ranks);
}

// contract::tree_fold over every rank of element i (the scalar definition, core/contract.h).
uint32_t tree_at(DType dtype, const Bytes& in, size_t i) {
  const int n = static_cast<int>(in.size());
  uint32_t bits = 0;
  with_storage_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T out = contract::tree_fold<T>(n, [&](int r) {
      T x;
      std::memcpy(static_cast<void*>(&x), in[static_cast<size_t>(r)].data() + i * sizeof(T), sizeof(T));
      return x;
    });
    bits = Storage<T>::bits(out);
  });
  return bits;
}

// Every rank's expected output under the tree contract: the tree of each element (all-reduce), of
// rank r's piece (reduce-scatter), or the inputs themselves (all-gather).
Bytes tree_expected(Op op, DType dtype, size_t count, const Bytes& in) {
  const int n = static_cast<int>(in.size());
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  const size_t out_count = output_count(op, count, n);
  Bytes out(static_cast<size_t>(n), std::vector<uint8_t>(out_count * esize));
  for (int r = 0; r < n; ++r) {
    for (size_t j = 0; j < out_count; ++j) {
      uint32_t v = 0;
      if (op == Op::kAllReduce) v = tree_at(dtype, in, j);
      if (op == Op::kReduceScatter) v = tree_at(dtype, in, static_cast<size_t>(r) * out_count + j);
      if (op == Op::kAllGather) v = simtest::element(in[j / count], j % count, esize);
      std::memcpy(out[static_cast<size_t>(r)].data() + j * esize, &v, esize);
    }
  }
  return out;
}

Bytes run(const NetworkOptions& net, const MultiNodeSpec& spec, const Bytes& in, MultiNodeTrace* trace = nullptr,
          const std::vector<uint64_t>& trace_elements = {}) {
  const int n = net.layout.world_size();
  const size_t esize = static_cast<size_t>(dtype_size(spec.dtype));
  Bytes out(static_cast<size_t>(n), std::vector<uint8_t>(output_count(spec.op, spec.count, n) * esize, 0xAB));
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (int r = 0; r < n; ++r) {
    inputs.push_back(in[static_cast<size_t>(r)].data());
    outputs.push_back(out[static_cast<size_t>(r)].data());
  }
  run_multinode(net, spec, inputs, outputs, trace, trace_elements);
  return out;
}

NetworkOptions seeded(const NodeLayout& layout, uint64_t seed) {
  NetworkOptions net;
  net.layout = layout;
  net.schedule = sim::Schedule::kSeeded;
  net.seed = seed;
  return net;
}

MultiNodeSpec tree_spec(Op op, DType dtype, size_t count, size_t chunk) {
  MultiNodeSpec spec;
  spec.op = op;
  spec.dtype = dtype;
  spec.count = count;
  spec.chunk_elements = chunk;
  spec.contract = Contract::kTree;
  return spec;
}

// All-reduce counts: 1 and 13 (shorter than a pack, most local ranks' slices empty), 200 and 4099
// (tails, several chunks of 64), 1024 (whole packs). Reduce-scatter: pieces of 1, 13, 70 and 200
// elements per rank (pieces that begin mid-pack). All-gather: a copy under either contract.
std::vector<size_t> counts_for(Op op, int n) {
  if (op == Op::kReduceScatter) {
    return {static_cast<size_t>(n), 13 * static_cast<size_t>(n), 70 * static_cast<size_t>(n),
            200 * static_cast<size_t>(n)};
  }
  if (op == Op::kAllGather) return {1, 100};
  return {1, 13, 200, 1024, 4099};
}

TEST(TreeMultiNode, EveryOpIsTheTreeOverAllRanks) {
  std::printf("base seed %llu\n", static_cast<unsigned long long>(kBaseSeed));
  uint64_t combination = 0;
  for (const NodeLayout& layout : kLayouts) {
    const int n = layout.world_size();
    for (DType dtype : kTypes) {
      for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
        for (size_t count : counts_for(op, n)) {
          const uint64_t seed = kBaseSeed + combination++;
          const Bytes in = simtest::random_inputs(dtype, n, count, seed);
          const Bytes want = tree_expected(op, dtype, count, in);
          // Chunks of 64 (several per call) on the seeded network, and the default chunk on threads.
          MultiNodeSpec spec = tree_spec(op, dtype, count, 64);
          spec.blocks = 1 + static_cast<int>(combination % 2);
          ASSERT_EQ(simtest::first_difference(run(seeded(layout, seed), spec, in), want,
                                              static_cast<size_t>(dtype_size(dtype))),
                    "")
              << op_name(op) << " " << dtype_name(dtype) << " count " << count << ", " << layout_name(layout)
              << ", seed " << seed;
          spec.chunk_elements = kDefaultChunkElements;
          NetworkOptions threads;
          threads.layout = layout;
          ASSERT_EQ(simtest::first_difference(run(threads, spec, in), want, static_cast<size_t>(dtype_size(dtype))), "")
              << op_name(op) << " " << dtype_name(dtype) << " count " << count << ", " << layout_name(layout)
              << ", threads, default chunk";
        }
      }
    }
  }
}

// The point of the tree contract: the bits do not depend on how the n ranks are split into nodes.
// Every layout of 8 ranks (one node of 8 included, which runs the same code with no exchange) gives
// the one-node simulator's tree all-reduce and reduce-scatter (sim/collectives, one_shot and
// two_shot under Contract::kTree).
TEST(TreeMultiNode, EveryLayoutOfEightRanksGivesTheOneNodeTreesBits) {
  const int n = 8;
  for (DType dtype : kTypes) {
    for (Op op : {Op::kAllReduce, Op::kReduceScatter}) {
      const size_t count = op == Op::kAllReduce ? 1000 : 8 * 125;
      const Bytes in = simtest::random_inputs(dtype, n, count, kBaseSeed + 7);
      sim::CollectiveSpec one;
      one.op = op == Op::kAllReduce ? sim::Op::kAllReduce : sim::Op::kReduceScatter;
      one.dtype = dtype;
      one.count = count;
      one.contract = Contract::kTree;
      one.algorithm = op == Op::kAllReduce ? sim::Algorithm::kTwoShot : sim::Algorithm::kAuto;
      sim::WorldOptions options;
      options.ranks = n;
      sim::World world(options);
      const Bytes want = simtest::run_collective(world, one, in);
      ASSERT_EQ(
          simtest::first_difference(want, tree_expected(op, dtype, count, in), static_cast<size_t>(dtype_size(dtype))),
          "")
          << "the one-node simulator against tree_fold, " << op_name(op) << " " << dtype_name(dtype);
      for (const NodeLayout layout : {NodeLayout{1, 8}, NodeLayout{2, 4}, NodeLayout{4, 2}, NodeLayout{8, 1}}) {
        const MultiNodeSpec spec = tree_spec(op, dtype, count, 128);
        ASSERT_EQ(simtest::first_difference(run(seeded(layout, kBaseSeed), spec, in), want,
                                            static_cast<size_t>(dtype_size(dtype))),
                  "")
            << op_name(op) << " " << dtype_name(dtype) << ", " << layout_name(layout);
      }
    }
  }
}

// The fused op across nodes under tree: the tree all-reduce, then the canonical residual add and
// RMSNorm, as sim/fused/reference.h computes the tree contract.
template <class T>
void check_fused(const NodeLayout& layout, int rows, int hidden, uint64_t seed) {
  const int n = layout.world_size();
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
  const DType dtype = sizeof(T) == 4 ? DType::kFP32 : std::is_same_v<T, bf16> ? DType::kBF16 : DType::kFP16;
  const Bytes x = simtest::random_inputs(dtype, n, count, seed);
  const Bytes residual = simtest::random_inputs(dtype, 1, count, seed + 1);
  const Bytes weight = simtest::random_inputs(dtype, 1, static_cast<size_t>(hidden), seed + 2);
  std::vector<T> all_x(count * static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    std::memcpy(all_x.data() + count * static_cast<size_t>(r), x[static_cast<size_t>(r)].data(), count * sizeof(T));
  fused::FusedProblem<T> problem;
  problem.ranks = n, problem.rows = rows, problem.hidden = hidden, problem.eps = 1e-6f;
  problem.x = all_x.data();
  problem.residual = reinterpret_cast<const T*>(residual[0].data());
  problem.weight = reinterpret_cast<const T*>(weight[0].data());
  std::vector<T> want_ro(count), want_out(count);
  fused::fused_reference<T>(fused::Contract::kTree, problem, want_ro.data(), want_out.data());

  MultiNodeFusedSpec spec;
  spec.dtype = dtype;
  spec.rows = rows;
  spec.hidden = hidden;
  spec.chunk_elements = 64;
  spec.contract = Contract::kTree;
  std::vector<std::vector<T>> ro(static_cast<size_t>(n), std::vector<T>(count)), out = ro;
  MultiNodeFusedIo io;
  for (int r = 0; r < n; ++r) {
    io.x.push_back(x[static_cast<size_t>(r)].data());
    io.residual.push_back(residual[0].data());
    io.weight.push_back(weight[0].data());
    io.residual_out.push_back(ro[static_cast<size_t>(r)].data());
    io.out.push_back(out[static_cast<size_t>(r)].data());
  }
  run_multinode_fused(seeded(layout, seed), spec, io);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(std::memcmp(ro[static_cast<size_t>(r)].data(), want_ro.data(), count * sizeof(T)), 0)
        << "residual_out of rank " << r << ", " << layout_name(layout) << ", seed " << seed;
    ASSERT_EQ(std::memcmp(out[static_cast<size_t>(r)].data(), want_out.data(), count * sizeof(T)), 0)
        << "out of rank " << r << ", " << layout_name(layout) << ", seed " << seed;
  }
}

TEST(TreeMultiNode, FusedIsTheTreeThenTheCanonicalNorm) {
  uint64_t seed = kBaseSeed;
  for (const NodeLayout& layout : kLayouts) {
    check_fused<bf16>(layout, 3, 64, seed++);
    check_fused<fp16>(layout, 3, 64, seed++);
    check_fused<float>(layout, 3, 32, seed++);
  }
}

// What the checks above catch. (1) Pairing the nodes at distance M/2 first (k = log2(M)-1 .. 0)
// builds another tree, ((x0 + x2) + (x1 + x3)) over the node subtrees: some element differs on 4
// and 8 nodes. (2) The canonical chain (one rounding, rank order) differs from the tree wherever a
// node holds more than one rank or there are more than 2 ranks. (3) Swapping left and right in
// tree_node changes nothing: round(a + b) == round(b + a) (fp32 addition commutes), which is why
// both partners of an exchange hold the same bits whichever side calls itself left; order matters
// only as grouping, which (1) checks.
TEST(TreeMultiNode, AnotherTreeOrTheChainIsCaught) {
  for (const NodeLayout layout : {NodeLayout{4, 2}, NodeLayout{8, 1}, NodeLayout{4, 1}}) {
    const int n = layout.world_size();
    for (DType dtype : kTypes) {
      const size_t count = 1000;
      const Bytes in = simtest::random_inputs(dtype, n, count, kBaseSeed + 11);
      const Bytes want = tree_expected(Op::kAllReduce, dtype, count, in);
      MultiNodeSpec spec = tree_spec(Op::kAllReduce, dtype, count, 256);
      spec.tree_steps_top_down = true;
      const std::string diff =
          simtest::first_difference(run(seeded(layout, 3), spec, in), want, static_cast<size_t>(dtype_size(dtype)));
      EXPECT_NE(diff, "") << "top-down pairing went unnoticed: " << layout_name(layout) << " " << dtype_name(dtype);
      std::printf("top-down pairing, %s %s: %s\n", layout_name(layout).c_str(), dtype_name(dtype), diff.c_str());
    }
  }
  for (const NodeLayout& layout : kLayouts) {
    if (layout.world_size() <= 2) continue;  // two ranks: the chain's one rounding is the tree's one node
    for (DType dtype : kTypes) {
      const int n = layout.world_size();
      const size_t count = 1000;
      const Bytes in = simtest::random_inputs(dtype, n, count, kBaseSeed + 13);
      MultiNodeSpec spec = tree_spec(Op::kAllReduce, dtype, count, 256);
      spec.contract = Contract::kCanonical;
      EXPECT_NE(
          simtest::first_difference(run(seeded(layout, 5), spec, in), tree_expected(Op::kAllReduce, dtype, count, in),
                                    static_cast<size_t>(dtype_size(dtype))),
          "")
          << "the chain's bits passed as the tree's: " << layout_name(layout) << " " << dtype_name(dtype);
    }
  }
  sim::Xoshiro256 g(kBaseSeed);
  for (int i = 0; i < 100000; ++i) {
    const bf16 a{static_cast<uint16_t>(simtest::random_bits(DType::kBF16, g))};
    const bf16 b{static_cast<uint16_t>(simtest::random_bits(DType::kBF16, g))};
    ASSERT_EQ(contract::tree_node(a, b).bits, contract::tree_node(b, a).bits) << a.bits << " " << b.bits;
  }
}

// Seeded exploration across node boundaries: many delivery orders, every one the tree's bits; the
// same seed gives the same trace; the trace shows the exchange (log2(M) "partial" messages per rank
// and chunk, each between rail peers q and q xor 2^k).
TEST(TreeMultiNode, ManySeedsAndTheTrace) {
  const NodeLayout layout{4, 2};
  const int n = layout.world_size();
  for (Op op : {Op::kAllReduce, Op::kReduceScatter}) {
    const size_t count = op == Op::kAllReduce ? 300 : 70 * static_cast<size_t>(n);
    const MultiNodeSpec spec = tree_spec(op, DType::kBF16, count, 64);
    const Bytes in = simtest::random_inputs(spec.dtype, n, count, kBaseSeed + 17);
    const Bytes want = tree_expected(op, spec.dtype, count, in);
    for (uint64_t seed = 1; seed <= 60; ++seed) {
      ASSERT_EQ(simtest::first_difference(run(seeded(layout, seed), spec, in), want, 2), "")
          << op_name(op) << " seed " << seed;
    }
  }
  const MultiNodeSpec spec = tree_spec(Op::kAllReduce, DType::kBF16, 256, 64);  // 4 chunks
  const Bytes in = simtest::random_inputs(spec.dtype, n, spec.count, kBaseSeed + 19);
  NetworkOptions net = seeded(layout, 7);
  net.trace = true;
  MultiNodeTrace a, b;
  run(net, spec, in, &a);
  run(net, spec, in, &b);
  EXPECT_EQ(a.json_lines, b.json_lines);
  EXPECT_EQ(a.messages, static_cast<size_t>(n * 2 * 4));  // every rank: log2(4) = 2 steps x 4 chunks
  EXPECT_EQ(a.cross_node_bytes, static_cast<size_t>(4 * 2) * spec.count * 2);  // M log2(M) x the message
  const std::string& t = a.json_lines;
  // Step 0 pairs nodes 0 and 1, step 1 nodes 0 and 2 (rail 1: ranks 1 and 5); never 0 and 3.
  EXPECT_NE(t.find("\"from\":1,\"from_node\":0,\"to\":3,\"to_node\":1,\"boundary\":\"node 0 -> node "
                   "1\",\"payload\":\"partial\""),
            std::string::npos);
  EXPECT_NE(t.find("\"from\":1,\"from_node\":0,\"to\":5,\"to_node\":2,\"boundary\":\"node 0 -> node "
                   "2\",\"payload\":\"partial\""),
            std::string::npos);
  EXPECT_EQ(t.find("\"boundary\":\"node 0 -> node 3\""), std::string::npos);
  EXPECT_EQ(t.find("\"payload\":\"carry\""), std::string::npos);
  EXPECT_NE(t.find("\"op\":\"node_tree_combine\""), std::string::npos);
  EXPECT_NE(t.find("\"step\":\"node_fold_tree\""), std::string::npos);
}

// What the tree across nodes refuses: layouts whose tree is not the tree over node subtrees (or
// needs another exchange), the emulations.
TEST(TreeMultiNode, RefusesWhatItDoesNotRun) {
  MultiNodeSpec spec = tree_spec(Op::kAllReduce, DType::kBF16, 64, 64);
  EXPECT_EQ(check_multinode_spec(spec, NodeLayout{4, 2}), "");
  EXPECT_EQ(check_multinode_spec(spec, NodeLayout{1, 3}), "");  // one node: the node's own tree
  for (const NodeLayout bad : {NodeLayout{3, 2}, NodeLayout{2, 3}, NodeLayout{6, 1}}) {
    const std::string problem = check_multinode_spec(spec, bad);
    EXPECT_NE(problem.find("needs a power-of-two number of nodes and of ranks per node"), std::string::npos) << problem;
    EXPECT_NE(problem.find("this job has " + std::to_string(bad.nodes) + " nodes of " +
                           std::to_string(bad.local_ranks) + " ranks"),
              std::string::npos)
        << problem;
  }
  spec.contract = Contract::kF32Residual;
  EXPECT_NE(check_multinode_spec(spec, NodeLayout{2, 2}).find("fold under canonical, tree, not f32_residual"),
            std::string::npos)
      << check_multinode_spec(spec, NodeLayout{2, 2});
}

// ---- Element traces under tree ------------------------------------------------------------------

using simtest::check_tree_events;
using simtest::DefinitionTree;
using simtest::element_tree;

// Removes the k-th line of text that contains every one of `parts` (k from 0); false when there is none.
bool remove_line(std::string* text, const std::vector<std::string>& parts, int k) {
  for (size_t begin = 0; begin < text->size();) {
    size_t end = text->find('\n', begin);
    if (end == std::string::npos) end = text->size();
    bool all = true;
    for (const std::string& p : parts) all = all && text->substr(begin, end - begin).find(p) != std::string::npos;
    if (all && k-- == 0) {
      text->erase(begin, end + 1 - begin);
      return true;
    }
    begin = end + 1;
  }
  return false;
}

// Under tree a traced element records its whole tree across nodes: every rank that folds it its
// node's subtree (global ranks) then one node per exchange step it combines, and the round where
// the root is computed; every recorded node has the bits of the tree recomputed here from the
// element's inputs, the round the output's, and together they cover the tree. A missing or
// altered node event is caught. Layouts (M, L): (1, 4) (one node: its tree is the whole tree),
// (2, 2), (4, 2), (2, 4), (8, 1); all-reduce and reduce-scatter; bf16, fp16, fp32; several chunks.
TEST(TreeMultiNode, ElementTracesRecordEveryNodeOfTheTree) {
  constexpr NodeLayout kTraced[] = {{1, 4}, {2, 2}, {4, 2}, {2, 4}, {8, 1}};
  for (const NodeLayout& layout : kTraced) {
    const int n = layout.world_size();
    for (Op op : {Op::kAllReduce, Op::kReduceScatter}) {
      for (DType dtype : kTypes) {
        const size_t count = op == Op::kAllReduce ? 300 : 70 * static_cast<size_t>(n);
        const size_t per = count / static_cast<size_t>(n);
        SCOPED_TRACE(layout_name(layout) + ", " + op_name(op) + ", " + dtype_name(dtype));
        const MultiNodeSpec spec = tree_spec(op, dtype, count, 64);
        const Bytes in = simtest::random_inputs(dtype, n, count, kBaseSeed + 23);
        // Element 0, one in a later chunk and the tail (all-reduce); reduce-scatter: pieces of the
        // first and the last rank, mid-piece.
        const std::vector<uint64_t> elements = op == Op::kAllReduce
                                                   ? std::vector<uint64_t>{0, 77, 299}
                                                   : std::vector<uint64_t>{0, per + 13, count - 1, count - per + 3};
        NetworkOptions net = seeded(layout, 5);
        net.trace = true;
        MultiNodeTrace trace;
        const Bytes out = run(net, spec, in, &trace, elements);
        ASSERT_EQ(simtest::first_difference(out, tree_expected(op, dtype, count, in), 2), "");
        const size_t esize = static_cast<size_t>(dtype_size(dtype));
        // Element i's output bits (the owner's, reduce-scatter).
        auto want = [&](uint64_t i) {
          return op == Op::kAllReduce ? simtest::element(out[0], i, esize)
                                      : simtest::element(out[i / per], i % per, esize);
        };
        for (const uint64_t i : elements) {
          SCOPED_TRACE("element " + std::to_string(i));
          const DefinitionTree tree = element_tree(dtype, in, i);
          ASSERT_EQ(tree.nodes.size(), static_cast<size_t>(n - 1));
          EXPECT_EQ(check_tree_events(trace.json_lines, op, layout, i, tree, want(i), per), "");
        }
        // The check catches a missing node event (the first or the third of element 0's, in time
        // order) and an altered one.
        const DefinitionTree tree0 = element_tree(dtype, in, 0);
        const std::string index0 = "\"index\":0,";
        for (int k : {0, 2}) {
          std::string dropped = trace.json_lines;
          ASSERT_TRUE(remove_line(&dropped, {"\"event\":\"tree_node\"", index0}, k));
          EXPECT_NE(check_tree_events(dropped, op, layout, 0, tree0, want(0), per), "") << "event " << k << " dropped";
        }
        std::string altered = trace.json_lines;
        const size_t first = altered.find(index0);  // element 0's first event: a tree_node (n > 1)
        ASSERT_NE(first, std::string::npos);
        const size_t at = altered.find("\"sum\":\"0x", first);
        ASSERT_NE(at, std::string::npos);
        altered[at + 9] = altered[at + 9] == '0' ? '1' : '0';  // the sum's top hex digit
        EXPECT_NE(check_tree_events(altered, op, layout, 0, tree0, want(0), per), "") << "a node's sum altered";
      }
    }
  }
}

}  // namespace
}  // namespace exactcoll::multinode
