// The multi-node collectives (core/multinode.h) on the simulator (sim/multinode), held against the
// independent references: tests/sim/reference.h for the fold and sim/fused/reference.h for the
// fused op. Every element of every rank is compared bit for bit.
//
// The matrix: nodes 1..4 x local ranks 1..8 x bf16/fp16/fp32, adversarial inputs (NaN with
// payloads, infinities, signed zeros, subnormals, values near the largest finite one), small chunks
// so that every run pipelines several chunks through the chain, under the seeded schedule (each
// combination its own seed, derived from the printed base seed).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/multinode.h"
#include "sim/fused/reference.h"
#include "sim/multinode/multinode_sim.h"
#include "tests/sim/reference.h"
#include "tests/sim/sim_test_util.h"

namespace exactcoll::multinode {
namespace {

constexpr uint64_t kBaseSeed = 20261124;
constexpr DType kTypes[] = {DType::kBF16, DType::kFP16, DType::kFP32};

using Bytes = std::vector<std::vector<uint8_t>>;

template <class T>
constexpr DType dtype_of() {
  return sizeof(T) == 4 ? DType::kFP32 : std::is_same_v<T, bf16> ? DType::kBF16 : DType::kFP16;
}

sim::Op collective_of(Op op) {
  return op == Op::kAllReduce       ? sim::Op::kAllReduce
         : op == Op::kReduceScatter ? sim::Op::kReduceScatter
                                    : sim::Op::kAllGather;
}

// The reference's outputs for every rank (tests/sim/sim_test_util.h: reference::fold per element).
Bytes expected(Op op, DType dtype, size_t count, const Bytes& in) {
  sim::CollectiveSpec spec;
  spec.op = collective_of(op);
  spec.dtype = dtype;
  spec.count = count;
  return simtest::expected_outputs(spec, in);
}

Bytes run(const NetworkOptions& net, const MultiNodeSpec& spec, const Bytes& in, MultiNodeTrace* trace = nullptr,
          const std::vector<uint64_t>& trace_elements = {}) {
  const int n = net.layout.world_size();
  const size_t esize = static_cast<size_t>(dtype_size(spec.dtype));
  Bytes out(n, std::vector<uint8_t>(output_count(spec.op, spec.count, n) * esize, 0xAB));
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (int r = 0; r < n; ++r) {
    inputs.push_back(in[r].data());
    outputs.push_back(out[r].data());
  }
  run_multinode(net, spec, inputs, outputs, trace, trace_elements);
  return out;
}

NetworkOptions seeded(int nodes, int local, uint64_t seed) {
  NetworkOptions net;
  net.layout = {nodes, local};
  net.schedule = sim::Schedule::kSeeded;
  net.seed = seed;
  return net;
}

// Counts per rank for an op: all-reduce and all-gather counts not a multiple of the pack (tails),
// reduce-scatter a per-owner piece of 70 (pieces start mid-pack); chunks of 64 elements, so several
// chunks are in the chain at once.
size_t count_for(Op op, int n) {
  return op == Op::kReduceScatter ? 70 * static_cast<size_t>(n) : op == Op::kAllReduce ? 200 : 100;
}

TEST(MultiNodeMatrix, EveryOpMatchesTheReferenceOnNodes1To4TimesLocalRanks1To8) {
  std::printf("base seed %llu\n", static_cast<unsigned long long>(kBaseSeed));
  uint64_t combination = 0;
  for (int nodes = 1; nodes <= 4; ++nodes) {
    for (int local = 1; local <= 8; ++local) {
      for (DType dtype : kTypes) {
        for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
          const int n = nodes * local;
          const uint64_t seed = kBaseSeed + combination++;
          MultiNodeSpec spec;
          spec.op = op;
          spec.dtype = dtype;
          spec.count = count_for(op, n);
          spec.chunk_elements = 64;
          spec.blocks = 1 + static_cast<int>(combination % 2);
          const Bytes in = simtest::random_inputs(dtype, n, spec.count, seed);
          const Bytes got = run(seeded(nodes, local, seed), spec, in);
          const std::string diff = simtest::first_difference(got, expected(op, dtype, spec.count, in),
                                                             static_cast<size_t>(dtype_size(dtype)));
          ASSERT_EQ(diff, "") << op_name(op) << " " << dtype_name(dtype) << ", " << nodes << " nodes x " << local
                              << " local ranks, seed " << seed;
        }
      }
    }
  }
}

// Adversarial fused inputs: x, residual and weight all drawn from simtest::random_bits (NaN, inf,
// zeros, subnormals, huge values), against sim/fused/reference.h's canonical contract.
template <class T>
void check_fused(int nodes, int local, int rows, int hidden, uint64_t seed) {
  const int n = nodes * local;
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
  const DType dtype = dtype_of<T>();
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
  fused::fused_reference<T>(fused::Contract::kCanonical, problem, want_ro.data(), want_out.data());

  MultiNodeFusedSpec spec;
  spec.dtype = dtype;
  spec.rows = rows;
  spec.hidden = hidden;
  spec.chunk_elements = 64;
  std::vector<std::vector<T>> ro(static_cast<size_t>(n), std::vector<T>(count)), out = ro;
  MultiNodeFusedIo io;
  for (int r = 0; r < n; ++r) {
    io.x.push_back(x[static_cast<size_t>(r)].data());
    io.residual.push_back(residual[0].data());
    io.weight.push_back(weight[0].data());
    io.residual_out.push_back(ro[static_cast<size_t>(r)].data());
    io.out.push_back(out[static_cast<size_t>(r)].data());
  }
  run_multinode_fused(seeded(nodes, local, seed), spec, io);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(std::memcmp(ro[static_cast<size_t>(r)].data(), want_ro.data(), count * sizeof(T)), 0)
        << "residual_out of rank " << r << ", " << nodes << " x " << local << ", seed " << seed;
    ASSERT_EQ(std::memcmp(out[static_cast<size_t>(r)].data(), want_out.data(), count * sizeof(T)), 0)
        << "out of rank " << r << ", " << nodes << " x " << local << ", seed " << seed;
  }
}

TEST(MultiNodeMatrix, FusedMatchesTheReferenceOnNodes1To4TimesLocalRanks1To8) {
  std::printf("base seed %llu\n", static_cast<unsigned long long>(kBaseSeed));
  uint64_t seed = kBaseSeed;
  for (int nodes = 1; nodes <= 4; ++nodes) {
    for (int local = 1; local <= 8; ++local) {
      check_fused<bf16>(nodes, local, 3, 64, seed++);
      check_fused<fp16>(nodes, local, 3, 64, seed++);
      check_fused<float>(nodes, local, 3, 32, seed++);
    }
  }
}

// Both schedules, several block counts and a chunk larger than the message (the default chunk
// too), for every op: the same bits. A message shorter than a chunk has slots as long as the
// message (slot_elements): all-gather once placed them a whole chunk apart, past the end of its
// scratch (a crash of `sim allgather --nodes 2 --count 300`).
TEST(MultiNode, ThreadsScheduleAndGridsGiveTheSameBits) {
  const size_t count = 1200;  // a multiple of the 12 ranks, for reduce-scatter
  const Bytes in = simtest::random_inputs(DType::kBF16, 12, count, kBaseSeed);
  for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
    const Bytes want = expected(op, DType::kBF16, count, in);
    for (size_t chunk : {size_t{64}, size_t{128}, kDefaultChunkElements}) {
      for (int blocks : {1, 3}) {
        NetworkOptions net;
        net.layout = {3, 4};
        MultiNodeSpec spec;
        spec.op = op;
        spec.count = count;
        spec.chunk_elements = chunk;
        spec.blocks = blocks;
        ASSERT_EQ(simtest::first_difference(run(net, spec, in), want, 2), "")
            << op_name(op) << " chunk " << chunk << " blocks " << blocks;
      }
    }
  }
}

// Messages that end in a short chunk, or are shorter than one, on several layouts: every op's
// bits, with buffers sized by buffer_needs. A short last chunk once gave the last local rank a
// longer all-reduce slice than a full chunk does (48 elements over 4 local ranks: 1, 1, 1 and 3
// packs), past the end of the carry buffer; ASan (CI runs this test under it) reports such a
// write even where the heap survives it. Counts of 17 and 100 also give all-gather slots that are
// not a whole number of packs: node 1's slot once began mid-pack, and the GPU faulted
// (cudaErrorMisalignedAddress, `multinode verify` at count 4099); the simulator's context now
// refuses a misaligned 16-byte access as the GPU does, so this test caught it too.
TEST(MultiNode, ShortChunksStayInsideTheirBuffers) {
  for (const NodeLayout layout : {NodeLayout{2, 4}, NodeLayout{3, 4}, NodeLayout{2, 3}, NodeLayout{4, 2}}) {
    const int n = layout.world_size();
    for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
      for (size_t base : {size_t{1}, size_t{17}, size_t{48}, size_t{100}, size_t{1136}}) {
        const size_t count = op == Op::kReduceScatter ? base * static_cast<size_t>(n) : base;
        const Bytes in = simtest::random_inputs(DType::kBF16, n, count, kBaseSeed + base);
        NetworkOptions net;
        net.layout = layout;
        MultiNodeSpec spec;
        spec.op = op;
        spec.count = count;
        spec.chunk_elements = 64;
        ASSERT_EQ(simtest::first_difference(run(net, spec, in), expected(op, DType::kBF16, count, in), 2), "")
            << op_name(op) << " " << layout.nodes << " nodes x " << layout.local_ranks << " count " << count;
      }
    }
  }
}

// What the carry chain saves, and why nothing cheaper is allowed: the reference's fold regrouped
// by node (each node's sum first, then the node sums in order) and a carry rounded to storage
// between nodes both differ from the contract on these inputs, so an algorithm doing either would
// fail the matrix above; the chain is the contract's fold exactly.
TEST(MultiNodeFoldOrder, RegroupingByNodeOrRoundingTheCarryChangesBits) {
  // fp32, 2 nodes x 2 ranks holding 1, 0 | 2^-24, 2^-24: the left fold ties twice to 1.0, while
  // the node sums give 1 + (2^-24 + 2^-24) = 1 + 2^-23.
  const std::vector<uint32_t> x = {reference::to_bits32(1.0f), reference::to_bits32(0.0f),
                                   reference::to_bits32(0x1p-24f), reference::to_bits32(0x1p-24f)};
  EXPECT_EQ(reference::fold(reference::Format::kFP32, x), reference::to_bits32(1.0f));
  const float node0 = 1.0f + 0.0f, node1 = 0x1p-24f + 0x1p-24f;
  EXPECT_EQ(reference::to_bits32(node0 + node1), reference::to_bits32(1.0f + 0x1p-23f));
  // bf16: a carry rounded to bf16 between nodes loses what one rounding keeps (numerics.md's
  // example 1 + 2^-8 + 2^-8 over 2 nodes x ... : node 0 = {1, 2^-8}, node 1 = {2^-8, 0}).
  const std::vector<uint32_t> b = {0x3F80, 0x3B80, 0x3B80, 0x0000};
  EXPECT_EQ(reference::fold(reference::Format::kBF16, b), 0x3F81u);
  const uint16_t rounded_carry = reference::narrow16(reference::Format::kBF16, 1.0f + 0x1p-8f);  // ties to 1.0
  const float continued = reference::widen16(reference::Format::kBF16, rounded_carry) + 0x1p-8f + 0.0f;
  EXPECT_EQ(reference::narrow16(reference::Format::kBF16, continued), 0x3F80u);
  // The simulator's chain on exactly these inputs gives the contract's bits.
  for (DType dtype : {DType::kFP32, DType::kBF16}) {
    const std::vector<uint32_t>& v = dtype == DType::kFP32 ? x : b;
    const size_t esize = static_cast<size_t>(dtype_size(dtype));
    Bytes in(4, std::vector<uint8_t>(esize));
    for (int r = 0; r < 4; ++r) std::memcpy(in[static_cast<size_t>(r)].data(), &v[static_cast<size_t>(r)], esize);
    MultiNodeSpec spec;
    spec.dtype = dtype;
    spec.count = 1;
    const Bytes got = run(seeded(2, 2, kBaseSeed), spec, in);
    EXPECT_EQ(simtest::element(got[3], 0, esize), reference::fold(simtest::format_of(dtype), v)) << dtype_name(dtype);
  }
}

// Seeded exploration across the node boundary: many delivery orders of the same job, every one
// giving the reference's bits; the same seed gives the same trace bytes.
TEST(MultiNodeExploration, ManySeedsAcrossTheBoundary) {
  std::printf("base seed %llu\n", static_cast<unsigned long long>(kBaseSeed));
  for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
    const int nodes = 3, local = 2, n = nodes * local;
    MultiNodeSpec spec;
    spec.op = op;
    spec.count = count_for(op, n);
    spec.chunk_elements = 64;
    const Bytes in = simtest::random_inputs(spec.dtype, n, spec.count, kBaseSeed);
    const Bytes want = expected(op, spec.dtype, spec.count, in);
    for (uint64_t seed = 1; seed <= 150; ++seed) {
      ASSERT_EQ(simtest::first_difference(run(seeded(nodes, local, seed), spec, in), want, 2), "")
          << op_name(op) << " seed " << seed;
    }
  }
  MultiNodeSpec spec;
  spec.count = 200;
  spec.chunk_elements = 64;
  const Bytes in = simtest::random_inputs(spec.dtype, 4, spec.count, kBaseSeed);
  NetworkOptions net = seeded(2, 2, 7);
  net.trace = true;
  MultiNodeTrace a, b;
  run(net, spec, in, &a, {0});
  run(net, spec, in, &b, {0});
  EXPECT_EQ(a.json_lines, b.json_lines);
}

// The exploration can tell a race from a correct schedule: with one result slot instead of two, a
// forwarding node (M >= 3) receives chunk j + 1 into the slot it is still sending chunk j from, and
// some delivery orders put the later chunk on the wire (caught at a printed seed); two slots pass
// the same seeds (ManySeedsAcrossTheBoundary).
TEST(MultiNodeExploration, OneResultSlotIsCaught) {
  MultiNodeSpec spec;
  spec.count = 200;
  spec.chunk_elements = 64;
  spec.result_slots = 1;
  const Bytes in = simtest::random_inputs(spec.dtype, 3, spec.count, kBaseSeed);
  const Bytes want = expected(Op::kAllReduce, spec.dtype, spec.count, in);
  int failing = 0;
  uint64_t first = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    if (simtest::first_difference(run(seeded(3, 1, seed), spec, in), want, 2).empty()) continue;
    if (failing++ == 0) first = seed;
  }
  std::printf("one result slot: wrong bits in %d of 100 seeds, first at seed %llu\n", failing,
              static_cast<unsigned long long>(first));
  EXPECT_GT(failing, 0);
}

// A message lost on the wire: a bounded wait that names the rank that waits and what never came
// (threads), or a deadlock report naming it (seeded); never a hang.
TEST(MultiNodeFaults, LostCarryIsNamed) {
  MultiNodeSpec spec;
  spec.count = 64;
  const Bytes in = simtest::random_inputs(spec.dtype, 4, spec.count, kBaseSeed);
  NetworkOptions net;
  net.layout = {2, 2};
  net.timeout = std::chrono::milliseconds(1000);  // room for a rank starved by a loaded CI machine
  net.drop = {{1, 3, 0}};                         // rank 1 (node 0) -> rank 3 (node 1): the first carry
  try {
    run(net, spec, in);
    FAIL() << "the run should have timed out";
  } catch (const sim::SimError& e) {
    EXPECT_EQ(e.kind(), sim::SimFailure::kTimeout);
    EXPECT_NE(std::string(e.what()).find("waited 1000 ms for"), std::string::npos) << e.what();
    EXPECT_NE(
        std::string(e.what()).find("rank 3 (node 1, local rank 1) waits for carry chunk 0 (128 bytes) from rank 1 "
                                   "(node 0, local rank 1), which never arrived"),
        std::string::npos)
        << e.what();
  }
  net = seeded(2, 2, 3);
  net.drop = {{1, 3, 0}};
  try {
    run(net, spec, in);
    FAIL() << "the run should have deadlocked";
  } catch (const sim::SimError& e) {
    EXPECT_EQ(e.kind(), sim::SimFailure::kDeadlock);
    EXPECT_NE(std::string(e.what()).find("rank 3 (node 1, local rank 1) waits for carry chunk 0"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("reproduce with --schedule-seed 3"), std::string::npos) << e.what();
  }
}

// The trace shows every message with the boundary it crossed, and the fold of a traced element
// continuing across nodes in global rank order.
TEST(MultiNodeTrace, MessagesNameTheirBoundaryAndTheFoldCrossesIt) {
  const int nodes = 3, local = 2;
  MultiNodeSpec spec;
  spec.count = 256;  // 4 chunks of 64
  spec.chunk_elements = 64;
  const Bytes in = simtest::random_inputs(spec.dtype, nodes * local, spec.count, kBaseSeed);
  NetworkOptions net = seeded(nodes, local, 11);
  net.trace = true;
  MultiNodeTrace trace;
  run(net, spec, in, &trace, {5});
  // Per rail and chunk: M - 1 carries forward, M - 1 results around the ring.
  EXPECT_EQ(trace.messages, static_cast<size_t>(2 * (nodes - 1) * 4 * local));
  const std::string& t = trace.json_lines;
  EXPECT_NE(t.find("\"event\":\"deliver\",\"from\":0,\"from_node\":0,\"to\":2,\"to_node\":1,\"boundary\":\"node 0 -> "
                   "node 1\",\"payload\":\"carry\",\"chunk\":0,\"bytes\":128"),
            std::string::npos);
  EXPECT_NE(t.find("\"boundary\":\"node 2 -> node 0\",\"payload\":\"result\""), std::string::npos);
  EXPECT_EQ(t.find("\"boundary\":\"node 2 -> node 0\",\"payload\":\"carry\""), std::string::npos);
  // Element 5 lies in local rank 0's slice: its folds run on rail 0 in global rank order 0..5.
  size_t at = 0;
  for (int r = 0; r < nodes * local; ++r) {
    at = t.find("\"event\":\"fold\"", at);
    ASSERT_NE(at, std::string::npos) << "fold of rank " << r;
    EXPECT_NE(t.find("\"index\":5,\"input_rank\":" + std::to_string(r), at), std::string::npos);
    at = t.find("\"index\":5,\"input_rank\":" + std::to_string(r), at) + 1;
  }
  EXPECT_NE(t.find("\"event\":\"round\""), std::string::npos);
}

TEST(MultiNodeLayout, BadLayoutsAreRejectedWithAClearMessage) {
  NodeLayout layout;
  EXPECT_EQ(layout_from_counts(6, 4, &layout),
            "6 ranks do not split into 4 nodes of equal size (every node must have the same number of ranks)");
  EXPECT_EQ(layout_from_counts(8, 2, &layout), "");
  EXPECT_EQ(layout.local_ranks, 4);
  EXPECT_NE(layout_from_counts(4, 0, &layout), "");
  // Node sizes that differ: node 0 has 2 ranks, node 1 has 1.
  std::vector<RankPlace> places = {{0, 0, 2}, {0, 1, 2}, {1, 0, 1}};
  std::string problem = layout_from_places(places, &layout);
  EXPECT_NE(problem.find("mismatched node sizes: node 0 has 2 ranks, node 1 has 1"), std::string::npos) << problem;
  // A rank that disagrees with its node about LOCAL_WORLD_SIZE.
  places = {{0, 0, 2}, {0, 1, 3}, {1, 0, 2}, {1, 1, 2}};
  problem = layout_from_places(places, &layout);
  EXPECT_NE(problem.find("rank 1 says node 0 has 3 ranks (LOCAL_WORLD_SIZE) but 2 ranks report node 0"),
            std::string::npos)
      << problem;
  // Interleaved numbering (rank 1 on node 1): not node-major.
  places = {{0, 0, 2}, {1, 0, 2}, {0, 1, 2}, {1, 1, 2}};
  problem = layout_from_places(places, &layout);
  EXPECT_NE(problem.find("rank 1 is node 1 local rank 0: ranks must be numbered node-major"), std::string::npos)
      << problem;
  places = {{0, 0, 2}, {0, 0, 2}};
  EXPECT_NE(layout_from_places(places, &layout).find("two ranks claim node 0 local rank 0"), std::string::npos);
  places = {{0, 0, 2}, {0, 1, 2}, {1, 0, 2}, {1, 1, 2}};
  EXPECT_EQ(layout_from_places(places, &layout), "");
  EXPECT_EQ(layout.nodes, 2);
  // The simulator refuses a bad spec before running anything.
  MultiNodeSpec spec;
  spec.op = Op::kReduceScatter;
  spec.count = 10;
  EXPECT_NE(check_multinode_spec(spec, NodeLayout{2, 2}).find("multiple of the 4 ranks"), std::string::npos);
  spec.op = Op::kAllReduce;
  spec.chunk_elements = 100;
  EXPECT_NE(check_multinode_spec(spec, NodeLayout{2, 2}).find("multiple of 64"), std::string::npos);
}

}  // namespace
}  // namespace exactcoll::multinode
