// The C header's enum values and names are the registry's (core/registry.h), and every layer that
// claims an entry parses its name to the same value: the C functions, the simulator's parsers and
// the GPU backend's (host code, no GPU needed).
#include "capi/enum_names.h"

#include <gtest/gtest.h>

#include <iterator>
#include <string>

#include "core/fused_rmsnorm.h"
#include "core/registry.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/dispatch_table.h"
#include "cuda_backend/fused/fused_table.h"
#include "exactcoll/exactcoll.h"
#include "sim/collectives.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/reference.h"

namespace exactcoll::capi {
namespace {

TEST(EnumNames, TheCFunctionsGiveTheRegistrysNamesAndValues) {
  for (const OpInfo& e : kOpInfos) {
    EXPECT_STREQ(exactcoll_op_name(static_cast<int>(e.op)), e.name);
  }
  for (const AlgorithmInfo& e : kAlgorithmInfos) {
    EXPECT_STREQ(exactcoll_algo_name(static_cast<int>(e.algorithm)), e.name);
    int value = -1;
    ASSERT_EQ(exactcoll_algo_from_name(e.name, &value), EXACTCOLL_OK) << e.name;
    EXPECT_EQ(value, static_cast<int>(e.algorithm)) << e.name;
  }
  for (const FusedAlgorithmInfo& e : kFusedAlgorithmInfos) {
    EXPECT_STREQ(exactcoll_fused_algo_name(static_cast<int>(e.algorithm)), e.name);
    int value = -1;
    ASSERT_EQ(exactcoll_fused_algo_from_name(e.name, &value), EXACTCOLL_OK) << e.name;
    EXPECT_EQ(value, static_cast<int>(e.algorithm)) << e.name;
  }
  for (const ContractInfo& e : kContractInfos) {
    EXPECT_STREQ(exactcoll_contract_name(static_cast<int>(e.contract)), e.name);
    int value = -1;
    ASSERT_EQ(exactcoll_contract_from_name(e.name, &value), EXACTCOLL_OK) << e.name;
    EXPECT_EQ(value, static_cast<int>(e.contract)) << e.name;
  }
  // One past each table: no name.
  EXPECT_EQ(exactcoll_op_name(static_cast<int>(std::size(kOpInfos))), nullptr);
  EXPECT_EQ(exactcoll_algo_name(static_cast<int>(std::size(kAlgorithmInfos))), nullptr);
  EXPECT_EQ(exactcoll_fused_algo_name(static_cast<int>(std::size(kFusedAlgorithmInfos))), nullptr);
  EXPECT_EQ(exactcoll_contract_name(static_cast<int>(std::size(kContractInfos))), nullptr);
  EXPECT_EQ(exactcoll_algo_name(-1), nullptr);
  for (const DType d : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    EXPECT_EQ(value_of(kDtypeNames, dtype_name(d)), static_cast<int>(d));
  }
}

// Each layer parses exactly the names of the entries that claim it.
TEST(EnumNames, EachLayerParsesTheEntriesThatRunOnIt) {
  for (const AlgorithmInfo& e : kAlgorithmInfos) {
    const auto gpu = cuda::parse_algorithm(e.name);
    EXPECT_EQ(gpu.has_value(), (e.runs_on & kOnGpu) != 0) << e.name;
    if (gpu) {
      EXPECT_EQ(*gpu, e.algorithm) << e.name;
    }
    sim::Algorithm a{};
    const bool simulated = sim::parse_algorithm(e.name, &a);
    EXPECT_EQ(simulated, (e.runs_on & kOnSimulator) != 0) << e.name;
    if (simulated) {
      EXPECT_EQ(a, e.algorithm) << e.name;
    }
  }
  for (const FusedAlgorithmInfo& e : kFusedAlgorithmInfos) {
    const auto gpu = cuda::fused::parse_fused_algorithm(e.name);
    EXPECT_EQ(gpu.has_value(), (e.runs_on & kOnGpu) != 0) << e.name;
    if (gpu) {
      EXPECT_EQ(*gpu, e.algorithm) << e.name;
    }
    // The simulator runs every kOnSimulator entry but auto (which its callers resolve).
    fused::FusedSpec spec;
    spec.algo = e.algorithm;
    spec.rows = 1;
    spec.hidden = 64;
    const bool simulated = fused::check_fused_spec(spec, 2, sim::Schedule::kThreads).empty();
    EXPECT_EQ(simulated, (e.runs_on & kOnSimulator) != 0 && e.algorithm != FusedAlgorithm::kAuto) << e.name;
  }
  for (const ContractInfo& e : kContractInfos) {
    fused::Contract c{};
    ASSERT_TRUE(fused::parse_contract(e.name, &c)) << e.name;
    EXPECT_EQ(c, e.contract);
  }
  EXPECT_FALSE(cuda::parse_algorithm("one-shot").has_value());
}

// The GPU's auto chooses among the registry's picked_by_auto entries of each op, and only those.
TEST(EnumNames, TheGpusAutoCandidatesAreTheRegistrys) {
  for (const Op op : kOps) {
    for (const AlgorithmInfo& e : kAlgorithmInfos) {
      const auto candidates = cuda::ipc_algorithms(op);
      const bool listed = std::find(candidates.begin(), candidates.end(), e.algorithm) != candidates.end();
      EXPECT_EQ(listed, e.picked_by_auto && implements(e.algorithm, op) && (e.runs_on & kOnGpu) != 0)
          << op_name(op) << " " << e.name;
      EXPECT_TRUE(!listed || e.exact) << e.name << ": auto must never pick an algorithm without the contract's bits";
    }
  }
  for (const FusedAlgorithmInfo& e : kFusedAlgorithmInfos) {
    const auto candidates = cuda::fused::fused_ipc_algorithms();
    const bool listed = std::find(candidates.begin(), candidates.end(), e.algorithm) != candidates.end();
    EXPECT_EQ(listed, e.picked_by_auto && (e.runs_on & kOnGpu) != 0) << e.name;
    EXPECT_TRUE(!listed || e.exact) << e.name;
  }
}

// Every IPC algorithm of the registry has a launcher in the communicator and an SM kernel or the
// copy engine for each op it implements, and none for the ops it does not.
TEST(EnumNames, EveryGpuAlgorithmHasALauncherForItsOps) {
  for (const AlgorithmInfo& e : kAlgorithmInfos) {
    for (const Op op : kOps) {
      const bool ipc = e.picked_by_auto && (e.runs_on & kOnGpu) != 0 && implements(e.algorithm, op);
      EXPECT_EQ(cuda::Communicator::has_launcher(op, e.algorithm), ipc) << op_name(op) << " " << e.name;
      if (ipc && e.algorithm != Algorithm::kCopyEngine) {
        EXPECT_TRUE(cuda::sm_kernel_kind(op, e.algorithm).has_value()) << op_name(op) << " " << e.name;
      }
      if (!ipc) {
        EXPECT_FALSE(cuda::sm_kernel_kind(op, e.algorithm).has_value()) << op_name(op) << " " << e.name;
      }
    }
  }
}

TEST(EnumNames, NameListsComeFromTheTables) {
  EXPECT_EQ(algorithm_names(kOnSimulator, Op::kAllReduce),
            "auto, one_shot, two_shot, push_one_shot, push_two_shot, lamport_one_shot, lamport_two_shot");
  EXPECT_EQ(algorithm_names(kOnGpu, Op::kAllGather), "auto, direct, copy_engine, nccl");
  EXPECT_EQ(contract_names(), "canonical, f32_residual, bf16_accumulate, rotated_two_shot, tree");
  EXPECT_EQ(library_contract_names(), "canonical, tree");
  EXPECT_EQ(library_contract_names(kOnMultiNode), "canonical, tree");
  EXPECT_EQ(op_names(" | "), "allreduce | reduce_scatter | allgather");
}

}  // namespace
}  // namespace exactcoll::capi
