// The C header's enum values reach the library's enums by name (capi/enum_names.h): every C name
// must parse in the library's own parser and print back the same, so the two cannot drift apart.
#include "capi/enum_names.h"

#include <gtest/gtest.h>

#include "cuda_backend/dispatch_table.h"
#include "core/fused_rmsnorm.h"
#include "cuda_backend/fused/fused_table.h"
#include "sim/collectives.h"
#include "sim/fused/reference.h"

namespace exactcoll::capi {
namespace {

TEST(EnumNames, EveryGpuAlgorithmNameIsTheBackends) {
  for (const char* name : kAlgoNames) {
    const auto a = cuda::parse_algorithm(name);
    ASSERT_TRUE(a.has_value()) << name;
    EXPECT_STREQ(cuda::algorithm_name(*a), name);
  }
  for (const char* name : kFusedAlgoNames) {
    const auto a = cuda::fused::parse_fused_algorithm(name);
    ASSERT_TRUE(a.has_value()) << name;
    EXPECT_STREQ(cuda::fused::fused_algorithm_name(*a), name);
  }
}

TEST(EnumNames, SimulatorNamesAreTheSame) {
  for (const char* name : {"auto", "one_shot", "two_shot", "push_one_shot", "push_two_shot", "lamport_one_shot"}) {
    sim::Algorithm a{};
    ASSERT_TRUE(sim::parse_algorithm(name, &a)) << name;
    EXPECT_GE(value_of(kAlgoNames, sim::algorithm_name(a)), 0) << name;
  }
  for (const auto op : {sim::Collective::kAllReduce, sim::Collective::kReduceScatter, sim::Collective::kAllGather}) {
    EXPECT_EQ(value_of(kOpNames, sim::op_name(op)), static_cast<int>(op));
  }
  for (const char* name : kContractNames) {
    fused::FusedContract c{};
    ASSERT_TRUE(fused::parse_contract(name, &c)) << name;
    EXPECT_STREQ(fused::contract_name(c), name);
  }
  // Every simulated fused algorithm has the C API's name, but push_one_stage_reg: the simulator's
  // name for the register kernel that the GPU (and the C API) run under push_one_stage.
  for (const FusedAlgo a : kFusedAlgos) {
    if (a == FusedAlgo::kPushOneStageReg) {
      EXPECT_LT(value_of(kFusedAlgoNames, fused_algo_name(a)), 0);
      continue;
    }
    EXPECT_GE(value_of(kFusedAlgoNames, fused_algo_name(a)), 0) << fused_algo_name(a);
  }
  for (const DType d : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    EXPECT_EQ(value_of(kDtypeNames, dtype_name(d)), static_cast<int>(d));
  }
}

}  // namespace
}  // namespace exactcoll::capi
