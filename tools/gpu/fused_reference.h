// What the GPU's fused results are compared with, under one of the library's contracts (canonical,
// tree: the all-reduce's; the residual add and RMSNorm are canonical under both): the simulator
// (sim/fused/fused_sim.h: the same core templates on the simulated world, with its own contexts,
// buffers and scheduler) and the scalar reference (sim/fused/reference.h: the contract written out
// without the templates).
#pragma once

#include <cstdint>
#include <vector>

#include "core/fused_rmsnorm.h"
#include "core/registry.h"
#include "core/storage.h"
#include "tools/inputs/fused_inputs.h"

namespace exactcoll::sim {
class World;
}

namespace exactcoll::gpu {

// One rank's outputs, [rows, H] each, as storage bits.
struct FusedOutputs {
  std::vector<uint8_t> residual_out, out;
};

// Returns every rank's outputs of `algo` on the simulated world (world.ranks() == in.ranks) under
// `contract` (FusedSpec::contract). Throws sim::SimError when the simulated run fails,
// std::invalid_argument for a contract that is not the library's.
std::vector<FusedOutputs> simulate_fused(sim::World& world, FusedAlgorithm algo, const FusedInputs& in, float eps,
                                         int blocks, Contract contract = Contract::kCanonical);

// Returns the outputs (the same on every rank) of `contract` from the scalar reference
// (fused_reference(contract, ...)).
FusedOutputs reference_fused(const FusedInputs& in, float eps, Contract contract = Contract::kCanonical);

}  // namespace exactcoll::gpu
