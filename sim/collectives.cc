#include "sim/collectives.h"

#include <stdexcept>

#include "core/collectives.h"
#include "core/lamport.h"
#include "core/push.h"
#include "sim/collectives_typed.h"

namespace exactcoll::sim {
namespace {

// The contract as the context's compile-time fold (check_spec admitted library contracts only).
template <class T>
void enqueue_typed(World& world, const CollectiveSpec& spec, Algorithm algorithm, Launch launch) {
  if (spec.contract == Contract::kTree) {
    enqueue_folding<T, Contract::kTree>(world, spec, algorithm, std::move(launch));
  } else {
    enqueue_folding<T, Contract::kCanonical>(world, spec, algorithm, std::move(launch));
  }
}

}  // namespace

bool parse_algorithm(const std::string& text, Algorithm* out) {
  const std::optional<Algorithm> a = parse_algorithm_name(text, kOnSimulator);
  if (!a) return false;
  *out = *a;
  return true;
}

size_t scratch_bytes(const CollectiveSpec& spec, int ranks) {
  if (spec.op != Op::kAllReduce) return 0;
  const size_t element = static_cast<size_t>(dtype_size(spec.dtype));
  switch (resolve_algorithm(spec)) {
    case Algorithm::kTwoShot: return spec.count * element;
    case Algorithm::kPushOneShot:
    case Algorithm::kPushTwoShot:
      return push_scratch_elements(spec.count, 16 / static_cast<int>(element), ranks) * element;
    default: return 0;
  }
}

size_t lamport_bytes(const CollectiveSpec& spec, int ranks) {
  const Algorithm algorithm = resolve_algorithm(spec);
  if (spec.op != Op::kAllReduce || info(algorithm).family != Family::kLamport) return 0;
  return lamport_region_bytes(algorithm, spec.count, static_cast<size_t>(dtype_size(spec.dtype)), ranks);
}

Algorithm resolve_algorithm(const CollectiveSpec& spec) {
  if (spec.op != Op::kAllReduce) return Algorithm::kDirect;  // one kernel each
  if (spec.algorithm != Algorithm::kAuto) return spec.algorithm;
  const size_t bytes = spec.count * static_cast<size_t>(dtype_size(spec.dtype));
  return bytes < kAutoTwoShotBytes ? Algorithm::kOneShot : Algorithm::kTwoShot;
}

std::string check_spec(const CollectiveSpec& spec, int ranks) {
  if (ranks < 1 || ranks > kMaxRanks) {
    return "ranks must be 1.." + std::to_string(kMaxRanks) + ", got " + std::to_string(ranks);
  }
  if (spec.count < 1) return "the element count per rank must be at least 1";
  if (spec.blocks < 1 || spec.blocks > kMaxBlocks) {
    return "blocks must be 1.." + std::to_string(kMaxBlocks) + ", got " + std::to_string(spec.blocks);
  }
  if (spec.op == Op::kReduceScatter && spec.count % static_cast<size_t>(ranks) != 0) {
    return "reduce_scatter needs a count divisible by the ranks: " + std::to_string(spec.count) + " elements over " +
           std::to_string(ranks) + " ranks";
  }
  if ((info(spec.algorithm).runs_on & kOnSimulator) == 0) {
    return std::string("the simulator does not run ") + algorithm_name(spec.algorithm) + " (it runs " +
           algorithm_names(kOnSimulator) + ")";
  }
  if (!info(spec.contract).library_contract) {
    return std::string("the collectives fold under the library's contracts (") + library_contract_names() + "), not " +
           contract_name(spec.contract) + " (an emulation of the fused op's reference only)";
  }
  if (spec.algorithm != Algorithm::kAuto && !implements(spec.algorithm, spec.op)) {
    return std::string(op_name(spec.op)) + " has no algorithm " + algorithm_name(spec.algorithm) + " (" +
           algorithm_names(kOnSimulator, spec.op) + ")";
  }
  return "";
}

std::string launch_name(const CollectiveSpec& spec) {
  if (spec.op != Op::kAllReduce) return op_name(spec.op);
  return std::string("allreduce_") + algorithm_name(resolve_algorithm(spec));
}

void enqueue_collective(World& world, const CollectiveSpec& spec, const std::vector<const void*>& inputs,
                        const std::vector<void*>& outputs) {
  const std::string problem = check_spec(spec, world.ranks());
  if (!problem.empty()) throw std::invalid_argument(problem);
  const Algorithm algorithm = resolve_algorithm(spec);
  const size_t element = static_cast<size_t>(dtype_size(spec.dtype));
  Launch launch;
  launch.name = launch_name(spec);
  launch.blocks = spec.blocks;
  launch.inputs = inputs;
  launch.input_bytes = spec.count * element;
  launch.scratch_bytes = scratch_bytes(spec, world.ranks());
  launch.lamport_bytes = lamport_bytes(spec, world.ranks());
  launch.outputs = outputs;
  launch.output_bytes = output_count(spec.op, spec.count, world.ranks()) * element;
  with_storage_type(spec.dtype,
                    [&](auto tag) { enqueue_typed<decltype(tag)>(world, spec, algorithm, std::move(launch)); });
}

}  // namespace exactcoll::sim
