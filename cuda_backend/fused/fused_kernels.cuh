// The fused kernels: core/fused_rmsnorm.h's one_stage and two_stage, and
// core/fused_rmsnorm_kernels.h's one_stage_reg, push_one_stage_reg, lamport_one_stage_reg,
// gather_norm and residual_rmsnorm_rows, instantiated with the device context (DeviceCtx, whose row_sum_squares
// computes the canonical tree with warp shuffles, plus sum_lane_partials for the register path).
// One kernel per (storage type, compile-time world size, kind); included by one .cu per storage
// type.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/fused_rmsnorm.h"
#include "core/fused_rmsnorm_kernels.h"
#include "cuda_backend/device_ctx.cuh"
#include "cuda_backend/fused/fused_kernel_args.h"
#include "cuda_backend/kernels.cuh"

namespace exactcoll::cuda::fused {

// The device context plus core/fused_rmsnorm_kernels.h's register-path extension,
// sum_lane_partials: thread t holds lane t's partial (blockDim == tree.lanes, so warp w is group
// w); a 32-lane xor butterfly of contract::add by shuffles gives each group's value; lane 0 stores
// it; the values, padded with 0.0f to 32, get the second butterfly in every warp after one
// __syncthreads (the same tree as contract::sum_squares). Two shared arrays alternate between
// calls, so one __syncthreads per call suffices (call k+2 reuses call k's array only after every
// thread passed call k+1's sync).
template <class T, int kRanks, Contract kFold = Contract::kCanonical>
class FusedDeviceCtx : public DeviceCtx<T, kRanks, kFold> {
 public:
  using DeviceCtx<T, kRanks, kFold>::DeviceCtx;

  __device__ float sum_lane_partials(const contract::RmsNormTree& tree, float partial) {
    __shared__ float group_values[2][contract::kWarp];
    float* values = group_values[calls_++ & 1u];
    const int lane = static_cast<int>(threadIdx.x) % contract::kWarp;
    const int warp = static_cast<int>(threadIdx.x) / contract::kWarp;
    const float v = warp_butterfly(partial);
    if (lane == 0) values[warp] = v;
    return combine_group_values(tree, values, lane);
  }

  // The same with two lanes a thread (2 blockDim == tree.lanes, blockDim a multiple of 32): thread t
  // holds lanes t and t + blockDim, so warp w holds groups w and w + warps; both butterflies, then
  // the same second step.
  __device__ float sum_two_lane_partials(const contract::RmsNormTree& tree, float first, float second) {
    __shared__ float group_values[2][contract::kWarp];
    float* values = group_values[calls_++ & 1u];
    const int lane = static_cast<int>(threadIdx.x) % contract::kWarp;
    const int warp = static_cast<int>(threadIdx.x) / contract::kWarp;
    const int warps = static_cast<int>(blockDim.x) / contract::kWarp;
    float a = first, b = second;
    warp_butterflies(&a, &b);
    if (lane == 0) {
      values[warp] = a;
      values[warp + warps] = b;
    }
    return combine_group_values(tree, values, lane);
  }

 private:
  uint32_t calls_ = 0;
};

template <class T>
__device__ __forceinline__ FusedRmsNormArgs<T> fused_args(const FusedKernelArgs& args) {
  FusedRmsNormArgs<T> a;
  a.residual = static_cast<const T*>(args.residual);
  a.weight = static_cast<const T*>(args.weight);
  a.residual_out = static_cast<T*>(args.residual_out);
  a.out = static_cast<T*>(args.out);
  a.rows = args.rows;
  a.hidden = args.hidden;
  a.eps = args.eps;
  return a;
}

template <class T, int kRanks, FusedKernelKind kKind, Contract kFold>
__global__ void __launch_bounds__(1024) fused_kernel(const __grid_constant__ FusedKernelArgs args) {
  enter_after_previous_grid();  // programmatic dependent launch (launch_kernel, kernels.cuh)
  __shared__ int aborted;
  if (threadIdx.x == 0) aborted = 0;
  // No __syncthreads here: every kind with waits starts with a barrier whose first step is
  // sync_block, which orders this store before any wait reads it.
  FusedDeviceCtx<T, kRanks, kFold> ctx(args.base, &aborted);
  if constexpr (kKind == FusedKernelKind::kPushOneStage) {
    // No staging: base.inputs[rank] is this rank's x where the caller keeps it (only this kernel
    // reads it; the peers read the copies it pushes).
    fused_rmsnorm_push_one_stage_reg<T, kRanks>(ctx, fused_args<T>(args));
  } else if constexpr (kKind == FusedKernelKind::kLamportOneStage) {
    // Core's path (lamport_one_stage_held_kernel runs the register path). No staging either:
    // base.inputs[rank] is this rank's x where the caller keeps it.
    fused_rmsnorm_lamport_one_stage<T, kRanks>(ctx, fused_args<T>(args));
  } else {
    if (args.stage_from != nullptr) {
      stage_fused_input<T>(ctx, kKind, static_cast<const T*>(args.stage_from),
                           static_cast<T*>(const_cast<void*>(args.base.inputs[args.base.rank])), args.rows,
                           args.hidden);
    }
    const FusedRmsNormArgs<T> a = fused_args<T>(args);
    if constexpr (kKind == FusedKernelKind::kOneStage) {
      fused_rmsnorm_one_stage<T, kRanks>(ctx, a);
    } else if constexpr (kKind == FusedKernelKind::kTwoStage) {
      fused_rmsnorm_two_stage<T, kRanks>(ctx, a);
    } else if constexpr (kKind == FusedKernelKind::kOneStageReg) {
      fused_rmsnorm_one_stage_reg<T, kRanks>(ctx, a);
    } else {
      fused_rmsnorm_gather_norm<T, kRanks>(ctx, a);
    }
  }
}

// lamport_one_stage on the register path, kLanes lanes (and packs) a thread: the kernels the host
// launches where lamport_register_lanes(threads, tree) is 1 or 2, else fused_kernel's core path.
// What core/fused_rmsnorm_kernels.h's fused_rmsnorm_lamport_one_stage_reg (the simulator's) picks
// at run time, as separate kernels so that each is compiled with only its own registers: two
// lanes a thread run 512-thread blocks at most, so ptxas may give them 128 registers a thread.
template <class T, int kRanks, int kLanes, Contract kFold>
__global__ void __launch_bounds__(kLanes == 2 ? 512 : 1024)
    lamport_one_stage_held_kernel(const __grid_constant__ FusedKernelArgs args) {
  enter_after_previous_grid();
  __shared__ int aborted;
  if (threadIdx.x == 0) aborted = 0;  // begin_lamport_call's sync_block orders it before any poll
  FusedDeviceCtx<T, kRanks, kFold> ctx(args.base, &aborted);
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  lamport_one_stage_held<T, kRanks, kLanes, LamportProtocol>(ctx, fused_args<T>(args), tree);
}

template <class T, int kRanks, int kLanes>
cudaError_t launch_lamport_held(const FusedKernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  if (args.base.contract == static_cast<int32_t>(Contract::kTree)) {
    return launch_kernel(lamport_one_stage_held_kernel<T, kRanks, kLanes, Contract::kTree>, args, cfg, stream);
  }
  return launch_kernel(lamport_one_stage_held_kernel<T, kRanks, kLanes, Contract::kCanonical>, args, cfg, stream);
}

// The split paths' residual + RMSNorm (and exactcoll_add_rmsnorm), one kernel per path, so each
// is compiled with only its own registers: kHeld = 1 pack a thread on the register path
// (residual_rmsnorm_held: 57 registers, bf16; 2 packs would spill at 64), 0 the memory path
// (residual_rmsnorm_memory: 31 registers, two 1024-thread blocks a multiprocessor). No barriers,
// no peers.
template <class T, int kHeld>
__global__ void __launch_bounds__(1024) residual_rmsnorm_kernel(const __grid_constant__ FusedKernelArgs args) {
  enter_after_previous_grid();
  __shared__ int aborted;
  if (threadIdx.x == 0) aborted = 0;
  FusedDeviceCtx<T, 1> ctx(args.base, &aborted);
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  const T* s = static_cast<const T*>(args.s);
  const T* residual = static_cast<const T*>(args.residual);
  const T* weight = static_cast<const T*>(args.weight);
  T* residual_out = static_cast<T*>(args.residual_out);
  T* out = static_cast<T*>(args.out);
  if constexpr (kHeld == 0) {
    residual_rmsnorm_memory<T>(ctx, tree, s, residual, weight, residual_out, out, args.rows, args.eps);
  } else {
    residual_rmsnorm_held<T, kHeld>(ctx, tree, s, residual, weight, residual_out, out, args.rows, args.eps);
  }
}

// Which path, measured on H100 (docs/benchmarks.md, "The canonical residual + RMSNorm"): the
// register path reads each input once and hides the next row's loads behind this row's reduction,
// but its registers allow one 1024-thread block a multiprocessor; the memory path rereads
// residual_out (from L2) with twice the blocks in flight. The register path is faster while the
// working set (x, residual and the two outputs) fits the L2 cache, where the rereads are cheap
// anyway and latency rules; the memory path from there on, where DRAM bandwidth does. Register
// path: blocks capped at what the GPU holds at once (they loop over rows, prefetching the next);
// memory path: one block per row (new blocks fill in as rows finish). Rows of more than one pack
// a thread (bf16 H > 8192, fp32 H > 4096) take the memory path.
template <class T>
cudaError_t launch_residual_rmsnorm_typed(const FusedKernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  contract::RmsNormTree tree;
  if (!contract::make_rmsnorm_tree<T>(args.hidden, &tree)) return cudaErrorInvalidValue;
  int device = 0, l2_bytes = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
  if (e != cudaSuccess) return e;
  const uint64_t working_set = 4ull * static_cast<uint64_t>(args.rows) * static_cast<uint64_t>(args.hidden) * sizeof(T);
  if (working_set > static_cast<uint64_t>(l2_bytes) || residual_rmsnorm_held_packs(cfg.threads, tree) != 1) {
    return launch_kernel(residual_rmsnorm_kernel<T, 0>, args, cfg, stream);
  }
  int sms = 0, per_sm = 0;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) {
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, residual_rmsnorm_kernel<T, 1>, cfg.threads, 0);
  }
  if (e != cudaSuccess) return e;
  LaunchConfig resident = cfg;
  resident.blocks = std::min(cfg.blocks, std::max(1, sms * per_sm));
  return launch_kernel(residual_rmsnorm_kernel<T, 1>, args, resident, stream);
}

// The fused kernel of kKind under the launch's contract (args.base.contract: canonical or tree).
template <class T, int kRanks, FusedKernelKind kKind>
cudaError_t launch_fused_under_contract(const FusedKernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  if (args.base.contract == static_cast<int32_t>(Contract::kTree)) {
    return launch_kernel(fused_kernel<T, kRanks, kKind, Contract::kTree>, args, cfg, stream);
  }
  return launch_kernel(fused_kernel<T, kRanks, kKind, Contract::kCanonical>, args, cfg, stream);
}

template <class T, int kRanks>
cudaError_t launch_fused_for_ranks(FusedKernelKind kind, const FusedKernelArgs& args, LaunchConfig cfg,
                                   cudaStream_t stream) {
  switch (kind) {
    case FusedKernelKind::kOneStage:
      return launch_fused_under_contract<T, kRanks, FusedKernelKind::kOneStage>(args, cfg, stream);
    case FusedKernelKind::kTwoStage:
      return launch_fused_under_contract<T, kRanks, FusedKernelKind::kTwoStage>(args, cfg, stream);
    case FusedKernelKind::kGatherNorm:
      return launch_fused_under_contract<T, kRanks, FusedKernelKind::kGatherNorm>(args, cfg, stream);
    case FusedKernelKind::kOneStageReg:
      return launch_fused_under_contract<T, kRanks, FusedKernelKind::kOneStageReg>(args, cfg, stream);
    case FusedKernelKind::kPushOneStage:
      return launch_fused_under_contract<T, kRanks, FusedKernelKind::kPushOneStage>(args, cfg, stream);
    case FusedKernelKind::kLamportOneStage: {
      contract::RmsNormTree tree;
      if (!contract::make_rmsnorm_tree<T>(args.hidden, &tree)) return cudaErrorInvalidValue;
      switch (lamport_register_lanes(cfg.threads, tree)) {
        case 1: return launch_lamport_held<T, kRanks, 1>(args, cfg, stream);
        case 2: return launch_lamport_held<T, kRanks, 2>(args, cfg, stream);
        default: return launch_fused_under_contract<T, kRanks, FusedKernelKind::kLamportOneStage>(args, cfg, stream);
      }
    }
    case FusedKernelKind::kResidualRmsNorm:
      return cudaErrorInvalidValue;  // not per world size: launch_fused_typed launches it
  }
  return cudaErrorInvalidValue;
}

// Compile-time world sizes 2, 3, 4 and 8 (the machines' shapes); other sizes run the run-time-n
// kernels (same bits; the loads are issued rank by rank).
template <class T>
cudaError_t launch_fused_typed(FusedKernelKind kind, const FusedKernelArgs& args, LaunchConfig cfg,
                               cudaStream_t stream) {
  if (kind == FusedKernelKind::kResidualRmsNorm) return launch_residual_rmsnorm_typed<T>(args, cfg, stream);
  switch (args.base.world_size) {
    case 2: return launch_fused_for_ranks<T, 2>(kind, args, cfg, stream);
    case 3: return launch_fused_for_ranks<T, 3>(kind, args, cfg, stream);
    case 4: return launch_fused_for_ranks<T, 4>(kind, args, cfg, stream);
    case 8: return launch_fused_for_ranks<T, 8>(kind, args, cfg, stream);
    default: return launch_fused_for_ranks<T, 0>(kind, args, cfg, stream);
  }
}

}  // namespace exactcoll::cuda::fused
