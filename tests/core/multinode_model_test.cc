// The performance model (core/multinode_model.h): its byte counts are the simulator's (the
// model and the algorithm cannot drift apart), and its predictions behave as the derivation says.
#include <gtest/gtest.h>

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
