// run_fused's work for one storage type and contract (fused_sim_typed.cc, compiled once per pair so
// that the simulator's fused kernels build in parallel). Internal to sim/fused.
#pragma once

#include "core/contract.h"
#include "sim/fused/fused_sim.h"
#include "sim/world.h"

namespace exactcoll::fused {

// Runs spec on world with T elements folded under kFold: copies io's inputs into aligned per-rank
// buffers, enqueues the launches the GPU makes for spec.algo, runs the world and copies the outputs
// into io. Preconditions: check_fused_spec(spec, ...) is empty; io holds one pointer per rank in each
// list. Throws what the world's run throws (sim::SimError).
template <class T, Contract kFold>
void run_typed(sim::World& world, const FusedSpec& spec, const FusedIo& io);

}  // namespace exactcoll::fused
