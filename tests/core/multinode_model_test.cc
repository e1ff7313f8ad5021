// The performance model (core/multinode_model.h): its byte counts are the simulator's (the
// model and the algorithm cannot drift apart), and its predictions behave as the derivation says.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sim/multinode/multinode_sim.h"
#include "tests/sim/sim_test_util.h"
#include "core/multinode_model.h"

namespace exactcoll::multinode {
namespace {

TEST(PerfModel, CrossNodeBytesAreTheSimulatorsCount) {
  for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
    for (int nodes : {2, 3, 4}) {
      for (int local : {1, 2, 3}) {
        for (DType dtype : {DType::kBF16, DType::kFP32}) {
          const int n = nodes * local;
          MultiNodeSpec spec;
          spec.op = op;
          spec.dtype = dtype;
          spec.count = static_cast<size_t>(n) * 96;
          spec.chunk_elements = 128;
          const auto in = simtest::random_inputs(dtype, n, spec.count, 5);
          const size_t esize = static_cast<size_t>(dtype_size(dtype));
          std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(output_count(op, spec.count, n) * esize));
          std::vector<const void*> inputs;
          std::vector<void*> outputs;
          for (int r = 0; r < n; ++r) {
            inputs.push_back(in[r].data());
            outputs.push_back(out[r].data());
          }
          NetworkOptions net;
          net.layout = {nodes, local};
          net.schedule = sim::Schedule::kSeeded;
          MultiNodeTrace trace;
          run_multinode(net, spec, inputs, outputs, &trace);
          ModelCase c;
          c.op = op;
          c.nodes = nodes;
          c.gpus_per_node = local;
          c.element_bytes = static_cast<int>(esize);
          c.bytes = spec.count * esize;
          EXPECT_EQ(static_cast<double>(trace.cross_node_bytes), chain_total_cross_node_bytes(c))
              << op_name(op) << " " << nodes << " x " << local << " " << dtype_name(dtype);
        }
      }
    }
  }
}

// The tree contract's exchange (recursive doubling, halving; all-gather is the same copy): the
// model's total is the simulator's count, on M and L powers of two.
TEST(PerfModel, TreeCrossNodeBytesAreTheSimulatorsCount) {
  for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
    for (int nodes : {1, 2, 4, 8}) {
      for (int local : {1, 2, 4}) {
        for (DType dtype : {DType::kBF16, DType::kFP32}) {
          const int n = nodes * local;
          MultiNodeSpec spec;
          spec.op = op;
          spec.dtype = dtype;
          spec.count = static_cast<size_t>(n) * 96;
          spec.chunk_elements = 128;
          spec.contract = Contract::kTree;
          const auto in = simtest::random_inputs(dtype, n, spec.count, 5);
          const size_t esize = static_cast<size_t>(dtype_size(dtype));
          std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(output_count(op, spec.count, n) * esize));
          std::vector<const void*> inputs;
          std::vector<void*> outputs;
          for (int r = 0; r < n; ++r) {
            inputs.push_back(in[r].data());
            outputs.push_back(out[r].data());
          }
          NetworkOptions net;
          net.layout = {nodes, local};
          net.schedule = sim::Schedule::kSeeded;
          MultiNodeTrace trace;
          run_multinode(net, spec, inputs, outputs, &trace);
          ModelCase c;
          c.op = op;
          c.nodes = nodes;
          c.gpus_per_node = local;
          c.element_bytes = static_cast<int>(esize);
          c.bytes = spec.count * esize;
          EXPECT_EQ(static_cast<double>(trace.cross_node_bytes), tree_total_cross_node_bytes(c))
              << op_name(op) << " " << nodes << " x " << local << " " << dtype_name(dtype);
        }
      }
    }
  }
}

// The tree row: appended after NCCL's (the C API's order kept), only where the tree runs; its NIC
// bytes are log2(M) rounded slices (all-reduce) or (M-1)/M of a rail's share (reduce-scatter).
TEST(PerfModel, TreeRowFollowsTheDerivation) {
  const LinkRates rates;
  ModelCase c;
  c.bytes = size_t{64} << 20;
  c.gpus_per_node = 8;
  for (int m : {2, 4, 8, 16, 32, 64}) {
    c.nodes = m;
    c.op = Op::kAllReduce;
    auto p = predict(c, rates);
    ASSERT_EQ(p.size(), 6u);
    ASSERT_EQ(p[4].name, "nccl tree");
    ASSERT_EQ(p[5].name, "exactcoll tree");
    const double S = static_cast<double>(c.bytes), L = c.gpus_per_node;
    EXPECT_DOUBLE_EQ(p[5].nic_bytes, std::log2(m) * S / L);
    EXPECT_GT(p[5].chunk_elements, 0u);
    c.op = Op::kReduceScatter;
    p = predict(c, rates);
    ASSERT_EQ(p.back().name, "exactcoll tree");
    EXPECT_DOUBLE_EQ(p.back().nic_bytes, (m - 1.0) / m * S / L);
  }
  // log2(64) = 6 exchanges against the chain's J + 2 (M - 1) steps: far less latency at 1 MiB.
  c.op = Op::kAllReduce;
  c.bytes = size_t{1} << 20;
  c.nodes = 64;
  auto p = predict(c, rates);
  EXPECT_LT(p[5].time_us, p[0].time_us / 4) << "log2(64) = 6 steps against the chain's J + 126";
  // No tree row where the tree does not run across nodes, nor for the all-gather (a copy).
  c.nodes = 3;
  EXPECT_EQ(predict(c, rates).back().name, "nccl tree");
  c.nodes = 4;
  c.gpus_per_node = 6;
  EXPECT_EQ(predict(c, rates).back().name, "nccl tree");
  c.gpus_per_node = 8;
  c.op = Op::kAllGather;
  EXPECT_EQ(predict(c, rates).back().name, "nccl ring");
}

TEST(PerfModel, PredictionsFollowTheDerivation) {
  const LinkRates rates;
  ModelCase c;
  c.bytes = size_t{256} << 20;
  // The chain's busiest NIC: bf16, 3+ nodes: (4 + 2) bytes per element of a rail's slice, i.e.
  // 1.5x NCCL ring's 2 (n-1)/n x S / L as n grows; fp32: (4 + 4), 1x.
  c.nodes = 16;
  auto p = predict(c, rates);
  ASSERT_EQ(p[0].name, "exactcoll chain");
  ASSERT_EQ(p[1].name, "chain, overlapped");
  ASSERT_EQ(p[3].name, "nccl ring");
  EXPECT_NEAR(p[0].nic_bytes / p[3].nic_bytes, 1.5 * 128.0 / 127.0, 1e-9);
  EXPECT_LT(p[1].time_us, p[0].time_us);
  c.element_bytes = 4;
  p = predict(c, rates);
  EXPECT_NEAR(p[0].nic_bytes / p[3].nic_bytes, 128.0 / 127.0, 1e-9);
  // The direct reduce-scatter + all-gather sends L times the chain's network bytes, about.
  c.element_bytes = 2;
  p = predict(c, rates);
  ASSERT_EQ(p[2].name, "exactcoll direct");
  EXPECT_GT(p[2].nic_bytes, 4 * p[0].nic_bytes);
  // Times grow with the node count (the chain's fill, the ring's steps).
  double last_chain = 0, last_ring = 0;
  for (int m : {2, 4, 8, 16, 32, 64}) {
    c.nodes = m;
    p = predict(c, rates);
    EXPECT_GT(p[0].time_us, last_chain);
    EXPECT_GT(p[3].time_us, last_ring);
    last_chain = p[0].time_us;
    last_ring = p[3].time_us;
  }
}

}  // namespace
}  // namespace exactcoll::multinode
