// run_typed<T, kFold> for the one storage type and contract that EXACTCOLL_INSTANCE_T and
// EXACTCOLL_INSTANCE_CONTRACT name: sim/fused/BUILD compiles this file six times
// (sim/typed_instances.bzl says why).
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
#include "sim/fused/fused_sim.h"
#include "sim/fused/fused_sim_typed.h"

#if !defined(EXACTCOLL_INSTANCE_T) || !defined(EXACTCOLL_INSTANCE_CONTRACT)
#error "compiled by sim/typed_instances.bzl, which defines EXACTCOLL_INSTANCE_T and EXACTCOLL_INSTANCE_CONTRACT"
#endif

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
// time where the GPU's fused kernels have it (dispatch_fused_world_size: 2, 3, 4 and 8 ranks).
template <class T, class Ctx>
void run_fused_kernel(Ctx& ctx, FusedAlgorithm algo, const FusedRmsNormArgs<T>& a) {
  dispatch_fused_world_size(ctx.world_size(), [&](auto ranks) {
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

}  // namespace

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

template void run_typed<EXACTCOLL_INSTANCE_T, Contract::EXACTCOLL_INSTANCE_CONTRACT>(sim::World&, const FusedSpec&,
                                                                                     const FusedIo&);

}  // namespace exactcoll::fused
