#include "sim/fused/fused_sim.h"

#include <stdexcept>
#include <string>

#include "core/contract.h"
#include "core/fused_rmsnorm_kernels.h"  // lamport_register_path
#include "sim/fused/fused_sim_typed.h"

namespace exactcoll::fused {
namespace {

// Whether algo is one of core/fused_rmsnorm_kernels.h's kernels with a register path that runs by
// default (lamport_one_stage and lamport_two_stage have one too, taken only with the threads given:
// fused_threads).
bool runs_register_kernel(FusedAlgorithm algo) {
  return algo == FusedAlgorithm::kGatherNorm || algo == FusedAlgorithm::kOneStageReg ||
         algo == FusedAlgorithm::kPushOneStageReg;
}

// The RMSNorm tree of spec's H and storage type (false for an invalid H).
bool make_tree(const FusedSpec& spec, contract::RmsNormTree* tree) {
  return spec.dtype == DType::kFP32 ? contract::make_rmsnorm_tree<float>(spec.hidden, tree)
                                    : contract::make_rmsnorm_tree<bf16>(spec.hidden, tree);
}

}  // namespace

int fused_threads(const FusedSpec& spec) {
  if (spec.threads > 0) return spec.threads;
  if (!runs_register_kernel(spec.algo)) return 1;
  contract::RmsNormTree tree;
  return make_tree(spec, &tree) ? tree.lanes : 1;
}

bool fused_register_path(const FusedSpec& spec) {
  contract::RmsNormTree tree;
  if (!make_tree(spec, &tree)) return false;
  if (spec.algo == FusedAlgorithm::kLamportOneStage || spec.algo == FusedAlgorithm::kLamportTwoStage) {
    return lamport_register_path(fused_threads(spec), tree);
  }
  if (!runs_register_kernel(spec.algo)) return false;
  return fused_threads(spec) == tree.lanes && tree.num_packs <= 2 * tree.lanes;  // register_path_fits<2>
}

std::string check_fused_spec(const FusedSpec& spec, int ranks, sim::Schedule schedule) {
  if (ranks < 1 || ranks > kMaxRanks) {
    return "ranks must be 1.." + std::to_string(kMaxRanks) + ", got " + std::to_string(ranks);
  }
  if (spec.rows < 1) return "rows must be at least 1, got " + std::to_string(spec.rows);
  if (spec.algo == FusedAlgorithm::kAuto || (info(spec.algo).runs_on & kOnSimulator) == 0) {
    return std::string("the simulator runs the fused algorithms ") +
           joined_names(kFusedAlgorithmInfos, ", ",
                        [](const FusedAlgorithmInfo& e) {
                          return (e.runs_on & kOnSimulator) != 0 && e.algorithm != FusedAlgorithm::kAuto;
                        }) +
           " (auto is a choice its caller resolves), not " + fused_algorithm_name(spec.algo);
  }
  if (!info(spec.contract).library_contract) {
    return std::string("the fused kernels fold under the library's contracts (") + library_contract_names() +
           "), not " + contract_name(spec.contract) + " (an emulation of the scalar reference only)";
  }
  const int pack = spec.dtype == DType::kFP32 ? Storage<float>::kPack : Storage<bf16>::kPack;
  if (spec.hidden <= 0 || spec.hidden % pack != 0) {
    return "hidden size " + std::to_string(spec.hidden) + " is not a positive multiple of the " +
           dtype_name(spec.dtype) + " pack (" + std::to_string(pack) + " elements)";
  }
  if (spec.blocks < 1 || spec.blocks > kMaxBlocks) {
    return "blocks must be 1.." + std::to_string(kMaxBlocks) + ", got " + std::to_string(spec.blocks);
  }
  if (spec.threads < 0 || spec.threads > contract::kMaxLanes) {
    return "threads must be 1.." + std::to_string(contract::kMaxLanes) + " (or 0: the algorithm's default), got " +
           std::to_string(spec.threads);
  }
  const int threads = fused_threads(spec);
  const int64_t live = static_cast<int64_t>(ranks) * spec.blocks * threads;
  if (schedule == sim::Schedule::kSeeded && threads > 1 && live > kMaxSeededThreads) {
    return "a seeded run of " + std::string(fused_algorithm_name(spec.algo)) + " would hold " + std::to_string(live) +
           " simulated threads at once (" + std::to_string(ranks) + " ranks x " + std::to_string(spec.blocks) +
           " blocks x " + std::to_string(threads) + " threads), more than " + std::to_string(kMaxSeededThreads) +
           ": use fewer ranks, blocks or threads, or the threads schedule";
  }
  return "";
}

void run_fused(sim::World& world, const FusedSpec& spec, const FusedIo& io) {
  const std::string problem = check_fused_spec(spec, world.ranks(), world.options().schedule);
  if (!problem.empty()) throw std::invalid_argument(problem);
  const size_t n = static_cast<size_t>(world.ranks());
  if (io.x.size() != n || io.residual.size() != n || io.weight.size() != n || io.residual_out.size() != n ||
      io.out.size() != n) {
    throw std::invalid_argument("run_fused: every buffer list needs one pointer per rank");
  }
  with_storage_type(spec.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (spec.contract == Contract::kTree) {
      run_typed<T, Contract::kTree>(world, spec, io);
    } else {
      run_typed<T, Contract::kCanonical>(world, spec, io);
    }
  });
}

}  // namespace exactcoll::fused
