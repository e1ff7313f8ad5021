#include "sim/fused/fused_sim.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/fused_rmsnorm_kernels.h"
#include "core/push.h"
#include "sim/collectives.h"

namespace exactcoll::fused {
namespace {

// 16-byte aligned storage, zeroed.
struct Aligned {
  explicit Aligned(size_t bytes) : data(static_cast<std::byte*>(::operator new (bytes + 16, std::align_val_t{16}))) {
    std::memset(data, 0, bytes + 16);
  }
  ~Aligned() { ::operator delete (data, std::align_val_t{16}); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  std::byte* data;
};

// Fills n elements at p with a NaN that no algorithm writes (NaN results are the canonical
// 0x7FFF / 0x7FFFFFFF), so that an element read before anyone wrote it, or never written, shows in
// the bits.
template <class T>
void fill_unwritten(void* p, size_t n) {
  T v;
  if constexpr (sizeof(T) == 4) {
    v = bits_to_float(0x7FC00001u);
  } else {
    v = T{0x7FC1};
  }
  std::fill(static_cast<T*>(p), static_cast<T*>(p) + n, v);
}

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

// The kernel kind whose rows stage_fused_input copies (core/fused_rmsnorm_kernels.h), for the
// algorithms that read every rank's x from its staging buffer (the GPU stages x inside the kernel
// unless the caller registered it); nullopt for those that read only their own x, in place, and for
// unfused.
std::optional<FusedKernelKind> staged_kernel_kind(FusedAlgorithm a) {
  switch (a) {
    case FusedAlgorithm::kOneStage: return FusedKernelKind::kOneStage;
    case FusedAlgorithm::kTwoStage: return FusedKernelKind::kTwoStage;
    case FusedAlgorithm::kGatherNorm: return FusedKernelKind::kGatherNorm;
    case FusedAlgorithm::kOneStageReg: return FusedKernelKind::kOneStageReg;
    case FusedAlgorithm::kPushOneStage:
    case FusedAlgorithm::kPushOneStageReg:
    case FusedAlgorithm::kLamportOneStage:
    case FusedAlgorithm::kLamportTwoStage:
    case FusedAlgorithm::kUnfused:
    case FusedAlgorithm::kAuto:
    case FusedAlgorithm::kNcclSplit: return std::nullopt;
  }
  return std::nullopt;
}

// Scratch elements one launch of `algo` needs on every rank (as cuda_backend/fused/fused_rmsnorm.cc
// sizes the communicator's buffers for it).
template <class T>
size_t scratch_elements(FusedAlgorithm algo, int rows, int hidden, int ranks) {
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
  switch (algo) {
    case FusedAlgorithm::kTwoStage: return fused_two_stage_scratch_elements(rows, hidden);
    case FusedAlgorithm::kGatherNorm: return gather_norm_scratch_elements(rows, hidden);
    case FusedAlgorithm::kPushOneStage:
    case FusedAlgorithm::kPushOneStageReg: return push_scratch_elements(count, Storage<T>::kPack, ranks);
    case FusedAlgorithm::kOneStage:
    case FusedAlgorithm::kOneStageReg:
    case FusedAlgorithm::kLamportOneStage:  // the Lamport region, not scratch
    case FusedAlgorithm::kLamportTwoStage:
    case FusedAlgorithm::kUnfused:
    case FusedAlgorithm::kAuto:
    case FusedAlgorithm::kNcclSplit: return 0;
  }
  return 0;
}

// One block of one fused kernel launch: the algorithm's template, with the world size at compile
// time where dispatch_world_size has it (as the GPU's kernels for 2, 3, 4 and 8 ranks).
template <class T, class Ctx>
void run_fused_kernel(Ctx& ctx, FusedAlgorithm algo, const FusedRmsNormArgs<T>& a) {
  dispatch_world_size(ctx.world_size(), [&](auto ranks) {
    constexpr int kRanks = decltype(ranks)::value;
    switch (algo) {
      case FusedAlgorithm::kOneStage: fused_rmsnorm_one_stage<T, kRanks>(ctx, a); break;
      case FusedAlgorithm::kTwoStage: fused_rmsnorm_two_stage<T, kRanks>(ctx, a); break;
      case FusedAlgorithm::kPushOneStage: fused_rmsnorm_push_one_stage<T, kRanks>(ctx, a); break;
      case FusedAlgorithm::kLamportOneStage: fused_rmsnorm_lamport_reg<T, kRanks>(ctx, a); break;
      case FusedAlgorithm::kLamportTwoStage:
        fused_rmsnorm_lamport_reg<T, kRanks, LamportProtocol, LamportFused::kTwoStage>(ctx, a);
        break;
      case FusedAlgorithm::kGatherNorm: fused_rmsnorm_gather_norm<T, kRanks>(ctx, a); break;
      case FusedAlgorithm::kOneStageReg: fused_rmsnorm_one_stage_reg<T, kRanks>(ctx, a); break;
      case FusedAlgorithm::kPushOneStageReg: fused_rmsnorm_push_one_stage_reg<T, kRanks>(ctx, a); break;
      case FusedAlgorithm::kUnfused: throw std::logic_error("run_fused_kernel: unfused is three launches");
      case FusedAlgorithm::kAuto:
      case FusedAlgorithm::kNcclSplit:
        throw std::logic_error(std::string("run_fused_kernel: the simulator has no kernel ") +
                               fused_algorithm_name(algo));
    }
  });
}

template <class T, Contract kFold>
void run_typed(sim::World& world, const FusedSpec& spec, const FusedIo& io) {
  const int n = world.ranks();
  const size_t count = static_cast<size_t>(spec.rows) * spec.hidden;
  const size_t bytes = count * sizeof(T);
  const size_t weight_bytes = static_cast<size_t>(spec.hidden) * sizeof(T);
  // 1. Aligned per-rank copies of the inputs and room for the outputs (the GPU's buffers); the
  //    outputs hold the unwritten pattern until the kernels write them.
  std::vector<std::unique_ptr<Aligned>> x, residual, weight, residual_out, out;
  std::vector<const T*> x_ptrs;
  std::vector<FusedRmsNormArgs<T>> args(n);
  for (int r = 0; r < n; ++r) {
    x.push_back(std::make_unique<Aligned>(bytes));
    residual.push_back(std::make_unique<Aligned>(bytes));
    weight.push_back(std::make_unique<Aligned>(weight_bytes));
    residual_out.push_back(std::make_unique<Aligned>(bytes));
    out.push_back(std::make_unique<Aligned>(bytes));
    std::memcpy(x[r]->data, io.x[r], bytes);
    std::memcpy(residual[r]->data, io.residual[r], bytes);
    std::memcpy(weight[r]->data, io.weight[r], weight_bytes);
    fill_unwritten<T>(residual_out[r]->data, count);
    fill_unwritten<T>(out[r]->data, count);
    x_ptrs.push_back(reinterpret_cast<const T*>(x[r]->data));
    FusedRmsNormArgs<T>& a = args[r];
    a.residual = reinterpret_cast<const T*>(residual[r]->data);
    a.weight = reinterpret_cast<const T*>(weight[r]->data);
    a.residual_out = reinterpret_cast<T*>(residual_out[r]->data);
    a.out = reinterpret_cast<T*>(out[r]->data);
    a.rows = spec.rows;
    a.hidden = spec.hidden;
    a.eps = spec.eps;
    if (const char* problem = fused_rmsnorm_args_error(a)) throw std::invalid_argument(problem);
  }
  FusedBlockOptions block;
  block.threads = fused_threads(spec);
  if (world.options().schedule == sim::Schedule::kSeeded) block.thread_order_seed = world.options().schedule_seed;
  std::unique_ptr<Aligned> unreadable;      // peers' x as the in-place kernels would see it: unwritten
  std::vector<std::unique_ptr<Aligned>> s;  // unfused: the all-reduce's output
  // 2. The launches.
  if (spec.algo == FusedAlgorithm::kUnfused) {
    for (int r = 0; r < n; ++r) s.push_back(std::make_unique<Aligned>(bytes));
    sim::CollectiveSpec ar;
    ar.op = sim::Op::kAllReduce;
    ar.algorithm = spec.unfused_two_shot ? sim::Algorithm::kTwoShot : sim::Algorithm::kOneShot;
    ar.dtype = spec.dtype;
    ar.count = count;
    ar.blocks = spec.blocks;
    ar.contract = kFold;
    std::vector<void*> s_ptrs;
    for (int r = 0; r < n; ++r) s_ptrs.push_back(s[r]->data);
    sim::enqueue_collective(world, ar, io.x, s_ptrs);
    sim::Launch add;
    add.name = "residual_add";
    add.blocks = spec.blocks;
    world.enqueue<T>(add, [args, s_ptrs, count, block](auto& ctx) {
      with_fused_ctx(ctx, block, [&](auto& fctx) {
        const FusedRmsNormArgs<T>& a = args[fctx.rank()];
        residual_add_step<T>(fctx, static_cast<const T*>(s_ptrs[fctx.rank()]), a.residual, a.residual_out, count);
      });
    });
    sim::Launch norm;
    norm.name = "rmsnorm";
    norm.blocks = spec.blocks;
    world.enqueue<T>(norm, [args, block](auto& ctx) {
      with_fused_ctx(ctx, block, [&](auto& fctx) {
        const FusedRmsNormArgs<T>& a = args[fctx.rank()];
        rmsnorm_step<T>(fctx, a.residual_out, a.weight, a.out, a.rows, a.hidden, a.eps);
      });
    });
  } else {
    const FusedAlgorithm algo = spec.algo;
    const std::optional<FusedKernelKind> staged = staged_kernel_kind(algo);
    const size_t scratch = scratch_elements<T>(algo, spec.rows, spec.hidden, n);
    if (!staged) {
      unreadable = std::make_unique<Aligned>(bytes);
      fill_unwritten<T>(unreadable->data, count);
    }
    sim::Launch launch;
    launch.name = std::string("fused_rmsnorm_") + fused_algorithm_name(algo);
    launch.blocks = spec.blocks;
    launch.input_bytes = staged ? bytes : 0;  // the staging buffers; nothing copied before the launch
    launch.scratch_bytes = scratch * sizeof(T);
    launch.lamport_bytes = algo == FusedAlgorithm::kLamportOneStage ? lamport_region_bytes(count, sizeof(T), n)
                           : algo == FusedAlgorithm::kLamportTwoStage
                               ? lamport_two_stage_region_bytes(spec.rows, spec.hidden, sizeof(T), n)
                               : 0;
    // In stream order before the kernel: what the staging buffer and the two-stage scratch hold
    // before this call is unknown to it; the pattern makes a read of a row not written in this
    // call show. (Not the push scratch: a fast peer may already be pushing this call's rows.)
    const bool fill_scratch = algo == FusedAlgorithm::kTwoStage || algo == FusedAlgorithm::kGatherNorm;
    launch.before = [&world, staged, fill_scratch, count, scratch](int rank) {
      if (staged) fill_unwritten<T>(world.local_input(rank), count);
      if (fill_scratch) fill_unwritten<T>(world.local_scratch(rank), scratch);
    };
    const T* unreadable_x = unreadable ? reinterpret_cast<const T*>(unreadable->data) : nullptr;
    world.enqueue<T, kFold>(launch, [args, x_ptrs, unreadable_x, staged, algo, block](auto& ctx) {
      const int rank = ctx.rank();
      FusedBlockOptions options = block;
      if (!staged) {
        options.own_x = x_ptrs[rank];
        options.unreadable_x = unreadable_x;
      }
      with_fused_ctx(ctx, options, [&](auto& fctx) {
        const FusedRmsNormArgs<T>& a = args[rank];
        if (staged) {
          stage_fused_input<T>(fctx, *staged, x_ptrs[rank], const_cast<T*>(fctx.input(rank)), a.rows, a.hidden);
        }
        run_fused_kernel<T>(fctx, algo, a);
      });
    });
  }
  world.run();
  // 3. Copy the outputs out.
  for (int r = 0; r < n; ++r) {
    std::memcpy(io.residual_out[r], residual_out[r]->data, bytes);
    std::memcpy(io.out[r], out[r]->data, bytes);
  }
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
