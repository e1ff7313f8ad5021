// The simulator's collective kernels for one storage type and contract (collectives_typed.cc,
// compiled once per pair so that they build in parallel). Internal to sim/collectives.
#pragma once

#include "core/contract.h"
#include "sim/collectives.h"
#include "sim/world.h"

namespace exactcoll::sim {

// Enqueues spec's kernel (`algorithm`, resolved: not auto) on world for storage type T under
// contract kFold, with the world size at compile time where dispatch_world_size has it (1..8 ranks:
// the GPU's code path, all loads issued before the first add), the run-time one beyond.
// Preconditions: check_spec(spec, world.ranks()) is empty; launch is spec's (launch_name, buffers).
template <class T, Contract kFold>
void enqueue_folding(World& world, const CollectiveSpec& spec, Algorithm algorithm, Launch launch);

}  // namespace exactcoll::sim
