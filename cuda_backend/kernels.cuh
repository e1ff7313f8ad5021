// The collective kernels: core/collectives.h's templates instantiated with DeviceCtx, one kernel
// per (storage type, compile-time world size, algorithm). Included by one .cu per storage type
// (kernels_bf16.cu, ...) so that nvcc compiles each type's instantiations in a separate action.
#pragma once

#include <cuda_runtime.h>

#include "core/collectives.h"
#include "core/lamport.h"
#include "core/push.h"
#include "cuda_backend/device_ctx.cuh"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda {

// Staged inputs: copies this rank's input from args.stage_from into its staging buffer
// (args.inputs[rank]), exactly the elements that block b of every rank (this one included) reads
// from this rank's input in the algorithm, so that block b's first barrier publishes them to the
// peers' block b (the barrier pairs equal block indices only). The shares are computed by the
// same core functions the algorithms use (block_share, two_shot_slice); the bits are copied
// unchanged.
template <class T, KernelKind kKind, class Ctx>
__device__ __forceinline__ void stage_own_input(Ctx& ctx, const KernelArgs& args) {
  constexpr int P = Storage<T>::kPack;
  const T* src = static_cast<const T*>(args.stage_from);
  T* dst = static_cast<T*>(const_cast<void*>(args.inputs[args.rank]));
  const size_t count = args.count;
  const int n = ctx.world_size();
  if constexpr (kKind == KernelKind::kOneShot || kKind == KernelKind::kAllGather || kKind == KernelKind::kPushOneShot) {
    copy_range<T>(ctx, block_share(0, count, P, ctx.block(), ctx.num_blocks()), src, dst, 0);
  } else if constexpr (kKind == KernelKind::kTwoShot || kKind == KernelKind::kPushTwoShot) {
    for (int p = 0; p < n; ++p) {
      const Slice s = two_shot_slice(count, P, p, n);
      copy_range<T>(ctx, block_share(s.begin, s.end, P, ctx.block(), ctx.num_blocks()), src, dst, 0);
    }
  } else {
    const size_t per = count / static_cast<size_t>(n);
    for (int p = 0; p < n; ++p) {
      const size_t begin = per * static_cast<size_t>(p);
      copy_range<T>(ctx, block_share(begin, begin + per, P, ctx.block(), ctx.num_blocks()), src, dst, 0);
    }
  }
}

// Programmatic dependent launch: wait until the previous kernel of the stream has completed and its
// writes are visible (a no-op when this launch had no programmatic dependency), then let the next
// kernel be scheduled early, so that its launch latency overlaps this kernel.
__device__ __forceinline__ void enter_after_previous_grid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// Returns this rank's entry of its graph input table row: the address its input was captured at,
// once the row is registered (null before, and null for a launch without a table). Loaded before the
// wait for the previous kernel, so that its latency overlaps it (only the host writes the table).
__device__ __forceinline__ const void* own_input_table_entry(const KernelArgs& args) {
  return args.input_table != nullptr ? reinterpret_cast<const void*>(__ldg(
                                           reinterpret_cast<const unsigned long long*>(args.input_table) + args.rank))
                                     : nullptr;
}

// Where the peers' inputs are read from in this launch: the registered table row (own_from_table,
// own_input_table_entry's result, not null), or the input views the launch publishes
// (args.publish_views), or else args.inputs as the host set them.
template <class Ctx>
__device__ __forceinline__ void open_input_views(Ctx& ctx, const KernelArgs& args, const void* own_from_table) {
  if (own_from_table != nullptr) {
    ctx.read_inputs_from_table();
  } else if (args.publish_views != 0) {
    ctx.publish_input_views();
  }
}

template <class T, int kRanks, KernelKind kKind, Contract kFold>
__global__ void __launch_bounds__(1024) collective_kernel(const __grid_constant__ KernelArgs args) {
  // The Lamport algorithms read their own input in place (peers never read it: the registry's
  // input_private), so the host never gives their launches an input table or views to publish and
  // never stages them (Communicator::launch_lamport sets inputs[rank] alone). Where it was measured
  // faster, a Lamport kernel is built without that code, though none of it ran (docs/benchmarks.md,
  // "lamport_two_shot step by step"; tools/gpu/probes/lamport_step_probe.cu's "collective prologue"):
  // lamport_two_shot (0.26-0.62 us faster at 16 KB-1 MiB on 4 x H200, 0.06-0.11 on 2; built so on
  // every world size, 3 and 5-8 not measured) and lamport_one_shot on 2 ranks (0.13-0.22 us on
  // 2 x H200). lamport_one_shot on 4 ranks keeps it (without it, 0.03-0.09 us slower there), and on
  // the world sizes not measured. Communicator::launch refuses a Lamport launch that carries any of it.
  constexpr bool kLamport = kKind == KernelKind::kLamportOneShot || kKind == KernelKind::kLamportTwoShot;
  constexpr bool kNoInputViews =
      kKind == KernelKind::kLamportTwoShot || (kKind == KernelKind::kLamportOneShot && kRanks == 2);
  const void* own_from_table = kNoInputViews ? nullptr : own_input_table_entry(args);
  enter_after_previous_grid();
  __shared__ int aborted;
  __shared__ const void* views[kMaxRanks];
  if (threadIdx.x == 0) aborted = 0;
  // No __syncthreads here: every algorithm starts with a barrier whose first step is sync_block,
  // which orders this store before any wait reads it.
  DeviceCtx<T, kRanks, kFold> ctx(args, &aborted, views);
  if constexpr (!kNoInputViews) open_input_views(ctx, args, own_from_table);
  // A call captured in place stages only until its row is registered; an eager call in place
  // stages only where this rank's input is not mapped by every peer (the host sets stage_from then).
  if (!kLamport && args.stage_from != nullptr && own_from_table == nullptr) {
    stage_own_input<T, kKind>(ctx, args);
    // push_one_shot and push_two_shot read their own staged input before any barrier (same block
    // shares as the staging, other threads): make every thread's staging stores visible to the
    // block (the other kernels publish them with their first barrier).
    if constexpr (kKind == KernelKind::kPushOneShot || kKind == KernelKind::kPushTwoShot) ctx.sync_block();
  }
  if constexpr (kKind == KernelKind::kOneShot) {
    allreduce_one_shot<T, kRanks>(ctx, args.count);
  } else if constexpr (kKind == KernelKind::kTwoShot) {
    allreduce_two_shot<T, kRanks>(ctx, args.count);
  } else if constexpr (kKind == KernelKind::kPushOneShot) {
    allreduce_push_one_shot<T, kRanks>(ctx, args.count);
  } else if constexpr (kKind == KernelKind::kPushTwoShot) {
    allreduce_push_two_shot<T, kRanks>(ctx, args.count);
  } else if constexpr (kKind == KernelKind::kLamportOneShot) {
    allreduce_lamport_one_shot<T, kRanks>(ctx, args.count);
  } else if constexpr (kKind == KernelKind::kLamportTwoShot) {
    allreduce_lamport_two_shot<T, kRanks>(ctx, args.count);
  } else if constexpr (kKind == KernelKind::kReduceScatter) {
    reduce_scatter<T, kRanks>(ctx, args.count);
  } else {
    allgather<T, kRanks>(ctx, args.count);
  }
}

// One barrier of the production protocol (block_barrier over block b's flags), nothing else.
template <class T>
__global__ void __launch_bounds__(1024) barrier_kernel(const __grid_constant__ KernelArgs args) {
  enter_after_previous_grid();
  __shared__ int aborted;
  if (threadIdx.x == 0) aborted = 0;
  DeviceCtx<T, 0> ctx(args, &aborted);
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<TwoSetProtocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// Launches kernel(args) on cfg's grid, with the programmatic-dependent-launch attribute when
// cfg.programmatic (captured into CUDA graphs as a programmatic edge) and clusters of cfg.cluster
// blocks when it is above 1. Preconditions: the kernel calls enter_after_previous_grid() before it
// touches memory (the collective and fused kernels); cfg.blocks a multiple of cfg.cluster.
template <class Args>
inline cudaError_t launch_kernel(void (*kernel)(const Args), const Args& args, LaunchConfig cfg, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cfg.blocks));
  config.blockDim = dim3(static_cast<unsigned>(cfg.threads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  unsigned attributes = 0;
  if (cfg.programmatic) {
    attribute[attributes].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[attributes].val.programmaticStreamSerializationAllowed = 1;
    ++attributes;
  }
  if (cfg.cluster > 1) {
    attribute[attributes].id = cudaLaunchAttributeClusterDimension;
    attribute[attributes].val.clusterDim.x = static_cast<unsigned>(cfg.cluster);
    attribute[attributes].val.clusterDim.y = 1;
    attribute[attributes].val.clusterDim.z = 1;
    ++attributes;
  }
  config.attrs = attribute;
  config.numAttrs = attributes;
  return cudaLaunchKernelEx(&config, kernel, args);
}

// The kernel of kKind under the launch's contract (args.contract: canonical or tree; the host
// refuses any other). allgather folds nothing: one kernel serves both contracts.
template <class T, int kRanks, KernelKind kKind>
cudaError_t launch_under_contract(const KernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  if (kKind != KernelKind::kAllGather && args.contract == static_cast<int32_t>(Contract::kTree)) {
    return launch_kernel(collective_kernel<T, kRanks, kKind, Contract::kTree>, args, cfg, stream);
  }
  return launch_kernel(collective_kernel<T, kRanks, kKind, Contract::kCanonical>, args, cfg, stream);
}

template <class T, int kRanks>
cudaError_t launch_for_ranks(KernelKind kind, const KernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  switch (kind) {
    case KernelKind::kOneShot: return launch_under_contract<T, kRanks, KernelKind::kOneShot>(args, cfg, stream);
    case KernelKind::kTwoShot: return launch_under_contract<T, kRanks, KernelKind::kTwoShot>(args, cfg, stream);
    case KernelKind::kReduceScatter:
      return launch_under_contract<T, kRanks, KernelKind::kReduceScatter>(args, cfg, stream);
    case KernelKind::kAllGather: return launch_under_contract<T, kRanks, KernelKind::kAllGather>(args, cfg, stream);
    case KernelKind::kPushOneShot: return launch_under_contract<T, kRanks, KernelKind::kPushOneShot>(args, cfg, stream);
    case KernelKind::kPushTwoShot: return launch_under_contract<T, kRanks, KernelKind::kPushTwoShot>(args, cfg, stream);
    case KernelKind::kLamportOneShot:
      return launch_under_contract<T, kRanks, KernelKind::kLamportOneShot>(args, cfg, stream);
    case KernelKind::kLamportTwoShot:
      return launch_under_contract<T, kRanks, KernelKind::kLamportTwoShot>(args, cfg, stream);
    case KernelKind::kBarrier: return launch_kernel(barrier_kernel<T>, args, cfg, stream);
  }
  return cudaErrorInvalidValue;
}

// World sizes 1..8 as compile-time constants (core's dispatch_world_size: every rank's loads are
// issued before the first add); larger worlds run the run-time-n kernels (same bits, loads issued
// rank by rank).
template <class T>
cudaError_t launch_typed(KernelKind kind, const KernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  cudaError_t result = cudaErrorInvalidValue;
  dispatch_world_size(args.world_size, [&](auto ranks) {
    result = launch_for_ranks<T, decltype(ranks)::value>(kind, args, cfg, stream);
  });
  return result;
}

}  // namespace exactcoll::cuda
