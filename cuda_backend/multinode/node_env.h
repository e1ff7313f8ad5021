// Where a worker sits in a multi-node job, from its launcher's variables (plain C++, no CUDA):
//   node             GROUP_RANK (torchrun), else EXACTCOLL_NODE_RANK (exactcoll launch sets both),
//                    else NODE_RANK
//   local rank       LOCAL_RANK (as bootstrap/worker_env.h reads it)
//   ranks per node   LOCAL_WORLD_SIZE (torchrun and exactcoll launch set it)
// With none of the node variables set the job is one node: node 0, LOCAL_WORLD_SIZE ranks
// (default WORLD_SIZE). The places of all ranks are then checked together
// (multinode::layout_from_places: equal nodes, node-major numbering), which is what turns a
// launcher that numbers ranks differently into a clear error instead of wrong bits.
#pragma once

#include "core/multinode_layout.h"
#include "bootstrap/worker_env.h"

namespace exactcoll::cuda {

// Returns the place. Throws BootstrapError naming every malformed variable (not a whole number, a
// negative node, LOCAL_RANK not below LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE not dividing WORLD_SIZE,
// a node variable without LOCAL_WORLD_SIZE).
// Example: torchrun --nnodes 2 --nproc-per-node 4, rank 5: GROUP_RANK=1 LOCAL_RANK=1
// LOCAL_WORLD_SIZE=4 gives {node 1, local rank 1, local world size 4}.
multinode::RankPlace node_place_from_env(const EnvLookup& lookup, const WorkerEnv& env);

// Returns the place of `rank` of `world_size` for a caller that knows its rank but maybe not its
// node (the C API and Python): `node` when >= 0, else the node variables above (none set: node 0);
// `local_world_size` when > 0, else LOCAL_WORLD_SIZE, else world_size (one node). Ranks are
// numbered node-major, so the local rank is rank - node * local_world_size. Throws BootstrapError
// naming every problem: a malformed variable, a node variable without LOCAL_WORLD_SIZE, a
// local_world_size that does not divide world_size, a rank outside its node.
// Example: node_place(lookup, 5, 8, -1, 0) with GROUP_RANK=1 LOCAL_WORLD_SIZE=4 set
//   -> {node 1, local rank 1, local world size 4}; node_place(lookup, 5, 8, 1, 4) the same with none.
multinode::RankPlace node_place(const EnvLookup& lookup, int rank, int world_size, int node, int local_world_size);

}  // namespace exactcoll::cuda
