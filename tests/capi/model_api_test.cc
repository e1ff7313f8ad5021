// exactcoll_model_multinode: the library's performance model (core/multinode_model.h) through the
// C API, the same numbers as the model itself; its limits are INVALID_ARGUMENT naming the bound.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/multinode_model.h"
#include "exactcoll/exactcoll.h"
#include "tests/capi/expect_status.h"

namespace {

using exactcoll::capitest::expect_error;

TEST(CApiModel, PredictionsAreTheModels) {
  exactcoll_link_rates rates;
  exactcoll_link_rates_init(&rates);
  rates.network_gbps = 25;
  for (const int op : {EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_OP_REDUCE_SCATTER, EXACTCOLL_OP_ALLGATHER}) {
    for (const int nodes : {1, 2, 8, 64}) {
      exactcoll_model_prediction p[EXACTCOLL_MODEL_MAX_PREDICTIONS];
      int count = -1;
      ASSERT_EQ(exactcoll_model_multinode(op, EXACTCOLL_BF16, nodes, 4, size_t{16} << 20, &rates, p,
                                          EXACTCOLL_MODEL_MAX_PREDICTIONS, &count),
                EXACTCOLL_OK)
          << exactcoll_last_error();
      exactcoll::multinode::ModelCase c;
      c.op = static_cast<exactcoll::Op>(op);
      c.nodes = nodes;
      c.gpus_per_node = 4;
      c.bytes = size_t{16} << 20;
      c.element_bytes = 2;
      exactcoll::multinode::LinkRates r;
      r.network_gbps = 25;
      const auto want = exactcoll::multinode::predict(c, r);
      ASSERT_EQ(count, static_cast<int>(want.size()));
      ASSERT_GE(count, 3);  // exactcoll's chain, NCCL's ring and tree at least
      for (int i = 0; i < count; ++i) {
        EXPECT_EQ(std::string(p[i].algorithm), want[static_cast<size_t>(i)].name);
        EXPECT_EQ(p[i].time_us, want[static_cast<size_t>(i)].time_us);
        EXPECT_EQ(p[i].nic_bytes, want[static_cast<size_t>(i)].nic_bytes);
        EXPECT_EQ(p[i].chunk_elements, want[static_cast<size_t>(i)].chunk_elements);
        EXPECT_GT(p[i].time_us, 0) << p[i].algorithm;
      }
      EXPECT_EQ(std::string(p[0].algorithm), "exactcoll chain");
    }
  }
}

TEST(CApiModel, BadInputsAreRefusedNamingTheBound) {
  exactcoll_model_prediction p[EXACTCOLL_MODEL_MAX_PREDICTIONS];
  int count = -1;
  std::memset(p, 0x5a, sizeof p);  // a refused call leaves the predictions as they were
  const int inv = EXACTCOLL_ERROR_INVALID_ARGUMENT;
  expect_error(exactcoll_model_multinode(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 0, 8, 1 << 20, nullptr, p, 8, &count),
               inv, "nodes must be 1..1024, got 0");
  expect_error(exactcoll_model_multinode(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 17, 1 << 20, nullptr, p, 8, &count),
               inv, "GPUs per node must be 1..16");
  expect_error(exactcoll_model_multinode(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 8, 8, nullptr, p, 8, &count), inv,
               "bytes must be 64..2^40");
  expect_error(exactcoll_model_multinode(9, EXACTCOLL_BF16, 2, 8, 1 << 20, nullptr, p, 8, &count), inv, "op 9");
  expect_error(exactcoll_model_multinode(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 8, 1 << 20, nullptr, p, 1, &count),
               inv, "capacity 1 is less than the");
  exactcoll_link_rates rates;
  exactcoll_link_rates_init(&rates);
  rates.network_gbps = 0;
  expect_error(exactcoll_model_multinode(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 8, 1 << 20, &rates, p, 8, &count),
               inv, "link rates must be finite and > 0");
  exactcoll_link_rates_init(&rates);
  rates.struct_size = 3;
  expect_error(exactcoll_model_multinode(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 8, 1 << 20, &rates, p, 8, &count),
               inv, "exactcoll_link_rates");
  // Nothing half-written: no prediction is reported, and none was written.
  EXPECT_EQ(count, 0);
  count = -1;
  expect_error(exactcoll_model_multinode(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_BF16, 2, 8, 1 << 20, nullptr, p, 1, &count),
               inv, "capacity 1");
  EXPECT_EQ(count, 0);
  const auto* bytes = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < sizeof p; ++i) ASSERT_EQ(bytes[i], 0x5a) << "byte " << i << " was written";
}

}  // namespace
