// What `exactcoll verify` and `bench` compare the GPU's fused op with (tools/gpu/fused_reference.h),
// on CPU: under each library contract the simulator's run of every simulated algorithm equals the
// scalar reference on every rank, on inputs with specials; tree's bits are not canonical's (so a
// contract that was dropped on the way shows); an emulation is refused by the simulator.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/fused_rmsnorm.h"
#include "core/registry.h"
#include "core/storage.h"
#include "sim/world.h"
#include "tools/gpu/fused_reference.h"
#include "tools/inputs/fused_inputs.h"

namespace exactcoll::gpu {
namespace {

TEST(FusedReference, SimulatedAlgorithmsEqualTheReferenceUnderEachLibraryContract) {
  for (const int n : {2, 3, 4}) {
    sim::WorldOptions options;
    options.ranks = n;
    sim::World world(options);
    for (const DType d : {DType::kBF16, DType::kFP16}) {
      const FusedInputs in = make_fused_inputs(d, n, 7, 256, 5, true);
      std::vector<FusedOutputs> by_contract;
      for (const Contract c : {Contract::kCanonical, Contract::kTree}) {
        const FusedOutputs want = reference_fused(in, 1e-6f, c);
        by_contract.push_back(want);
        for (const FusedAlgorithm a : kFusedAlgorithmsOnSimulator) {
          const std::vector<FusedOutputs> got = simulate_fused(world, a, in, 1e-6f, 2, c);
          for (int r = 0; r < n; ++r) {
            EXPECT_TRUE(got[static_cast<size_t>(r)].out == want.out)
                << contract_name(c) << " " << fused_algorithm_name(a) << " " << dtype_name(d) << " n=" << n << " rank "
                << r;
            EXPECT_TRUE(got[static_cast<size_t>(r)].residual_out == want.residual_out)
                << contract_name(c) << " " << fused_algorithm_name(a) << " " << dtype_name(d) << " n=" << n << " rank "
                << r;
          }
        }
      }
      if (n >= 3) {
        EXPECT_FALSE(by_contract[0].residual_out == by_contract[1].residual_out)
            << dtype_name(d) << " n=" << n << ": tree gave canonical's bits";
      }
    }
  }
}

TEST(FusedReference, TheSimulatorRefusesAnEmulation) {
  sim::WorldOptions options;
  options.ranks = 2;
  sim::World world(options);
  const FusedInputs in = make_fused_inputs(DType::kBF16, 2, 1, 64, 1, false);
  EXPECT_THROW(simulate_fused(world, FusedAlgorithm::kOneStage, in, 1e-6f, 1, Contract::kF32Residual),
               std::invalid_argument);
}

}  // namespace
}  // namespace exactcoll::gpu
