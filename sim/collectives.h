// The collectives on the simulated world: core/collectives.h's templates launched on every
// (rank, block), for bf16, fp16 and fp32.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/op.h"
#include "core/storage.h"
#include "sim/world.h"

namespace exactcoll::sim {

// The collectives (core/registry.h: Op, its names; core/op.h: output sizes).
using exactcoll::Op;
using exactcoll::op_name;
using exactcoll::output_count;
// The registry's algorithms (core/registry.h); the simulator runs those with kOnSimulator: the
// all-reduce algorithms, and direct (reduce_scatter's and allgather's one kernel each).
using exactcoll::Algorithm;
using exactcoll::algorithm_name;
using exactcoll::Contract;

// `auto` picks one_shot below this many bytes per rank, two_shot at or above. one_shot reads n
// inputs per rank, two_shot reads each once plus one gather, so two_shot moves less data for large
// messages; small ones favour one_shot's single barrier round. The bits are the same either way.
inline constexpr size_t kAutoTwoShotBytes = 256 * 1024;

struct CollectiveSpec {
  Op op = Op::kAllReduce;
  Algorithm algorithm = Algorithm::kAuto;
  DType dtype = DType::kBF16;
  size_t count = 1;  // input elements per rank
  int blocks = 1;
  Contract contract = Contract::kCanonical;  // a library contract: canonical or tree
};

// Returns the algorithm named `text` among those the simulator runs (the registry's kOnSimulator
// entries: auto, one_shot, two_shot, push_one_shot, push_two_shot, lamport_one_shot, direct);
// false if none is.
bool parse_algorithm(const std::string& text, Algorithm* out);

// Returns the scratch bytes per rank that spec's algorithm needs on `ranks` ranks (two_shot: its
// slice; push_one_shot, push_two_shot: two halves of `ranks` receive slots; others: 0).
size_t scratch_bytes(const CollectiveSpec& spec, int ranks);

// Returns the Lamport region bytes per rank that spec's algorithm needs on `ranks` ranks
// (lamport_one_shot: three buffers of `ranks` slots, core/lamport.h; others: 0).
size_t lamport_bytes(const CollectiveSpec& spec, int ranks);

// Returns the algorithm that runs: reduce_scatter and allgather -> direct; an all-reduce's auto ->
// one_shot or two_shot by size; others unchanged.
Algorithm resolve_algorithm(const CollectiveSpec& spec);

// Returns "" when spec is valid on `ranks` ranks, else what is wrong (count < 1, reduce_scatter
// count not divisible by ranks, blocks outside 1..kMaxBlocks, ranks outside 1..kMaxRanks, an
// algorithm the simulator does not run, or one the op does not have: all-reduce takes auto and its
// own algorithms, reduce_scatter and allgather auto or direct; a contract that is not the
// library's: the emulations are the fused reference's only).
std::string check_spec(const CollectiveSpec& spec, int ranks);

// The launch name used in traces: "allreduce_one_shot", "allreduce_two_shot",
// "allreduce_push_one_shot", "allreduce_push_two_shot", "allreduce_lamport_one_shot",
// "allreduce_lamport_two_shot", "reduce_scatter", "allgather".
std::string launch_name(const CollectiveSpec& spec);

// Queues one collective on world. inputs[r]: rank r's count elements (storage bit patterns);
// outputs[r]: room for output_count() elements. Throws std::invalid_argument when check_spec fails.
void enqueue_collective(World& world, const CollectiveSpec& spec, const std::vector<const void*>& inputs,
                        const std::vector<void*>& outputs);

}  // namespace exactcoll::sim
