// The fused kernels: core/fused_rmsnorm.h's one_stage and two_stage, and
// core/fused_rmsnorm_kernels.h's one_stage_reg, push_one_stage_reg, lamport_one_stage_reg,
// gather_norm and residual_rmsnorm_rows, instantiated with the device context (DeviceCtx, whose row_sum_squares
// computes the canonical tree with warp shuffles, plus sum_lane_partials for the register path).
// One kernel per (storage type, compile-time world size, kind); included by one .cu per storage
// type.
#pragma once

#include <cooperative_groups.h>
#include <cuda/ptx>
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

 private:
  uint32_t calls_ = 0;
};

// Shared memory of one block of a cluster for ClusterRowCtx's exchange of group values: two arrays
// of the 32 values and an mbarrier for each, used by alternate exchanges.
struct ClusterExchange {
  alignas(8) uint64_t arrived[2];
  float values[2][contract::kWarp];
};

// A thread-block cluster of C blocks as one block of C x blockDim threads, for core's templates
// (lamport_one_stage on the register path with a row of `lanes` lanes on C blocks of lanes / C
// threads, one lane a thread: the row is folded and normalized by C blocks where one block would
// fold it alone):
//   thread() = the block's rank in its cluster x blockDim + threadIdx.x, num_threads() = C x
//   blockDim, block() = the cluster's index, num_blocks() = the grid's clusters;
//   sync_block(): the first call (begin_lamport_call's, after every thread read the call number) is
//   the cluster's barrier with release and acquire at cluster scope, which orders memory for every
//   thread of the cluster as __syncthreads does for a block's; nothing is pending then, so it is
//   cheap. Later calls (end_lamport_call's, the only other one in lamport_one_stage_rows) are
//   __syncthreads and a relaxed cluster barrier: what end_lamport_call's sync orders across blocks,
//   every block's read of the call number before the write of the next, the first sync ordered
//   already; a release there would first wait for every push over NVLink to be written (with every
//   sync a release and the exchange a cluster barrier, one GPU with no peer took 5.41 us at 1 row of
//   H 8192 on a cluster of 2, against 4.61 with relaxed syncs and this exchange: docs/benchmarks.md);
//   sync_before_polls() (core/fused_rmsnorm.h, lamport_one_stage's step 4) = nothing: the GPU needs
//   no order there, and a cluster barrier's release would first wait for every push to be written;
//   sum_lane_partials(tree, partial): thread t of the cluster holds lane t's partial, so warp w of
//   cluster block c holds group c x warps + w. The warp's butterfly gives the group's value; its
//   lane 0 stores it into every block's values[group] with st.async, each store completing bytes
//   on the receiving block's mbarrier; every thread waits for its own block's mbarrier to count all
//   tree.groups values, then runs the second butterfly over the 32 (padded with 0.0f once, at
//   construction): the same tree, so the same bits, as one block of C x blockDim threads, which is
//   what the simulator runs. No cluster barrier and no release of the thread's earlier global
//   stores (the row's residual_out) is needed for it.
// Why two arrays and two mbarriers suffice: a block sends exchange k + 2's values into array k mod 2
// of every block only after its own exchange k + 1 completed, which needs every block's exchange
// k + 1 values, which every warp of every block sends only after its own exchange k completed and
// it read exchange k's values: no block's array k mod 2 is still being read, and no block's
// mbarrier k mod 2 is still counting exchange k (an expect_tx arriving after some of exchange k + 2's
// bytes is allowed: the mbarrier's count of pending bytes goes below zero until it arrives).
// Preconditions: launched with clusters of C blocks (LaunchConfig::cluster), gridDim.x a multiple
// of C, C x blockDim == tree.lanes; every thread of the cluster makes the same calls. The first
// sync_block (begin_lamport_call's) comes before any exchange: every block of the cluster has
// started and initialized its mbarriers before any st.async reaches it. No block exits while
// another's values may still be on their way to it, because it waits for every exchange's values
// before it goes on (the last sync_block, relaxed, orders no st.async); a wait that gives up
// (below) breaks that, and the launch may then fault after the error is recorded.
// The exchange's wait is bounded by twice the flag timeout: a sibling block still polling a slow
// peer sends its values within one flag timeout of its first poll (a poll that gives up records
// the peer's error, which then ends the block's later polls at once), so the poll's error, the
// cause, is recorded first.
template <class T, int kRanks, Contract kFold = Contract::kCanonical>
class ClusterRowCtx : public FusedDeviceCtx<T, kRanks, kFold> {
 public:
  __device__ ClusterRowCtx(const KernelArgs& args, volatile int* aborted, ClusterExchange* exchange,
                           const contract::RmsNormTree& tree)
      : FusedDeviceCtx<T, kRanks, kFold>(args, aborted),
        exchange_(exchange),
        cluster_rank_(static_cast<int>(cooperative_groups::this_cluster().block_rank())),
        cluster_blocks_(static_cast<int>(cooperative_groups::this_cluster().num_blocks())) {
    if (threadIdx.x == 0) {
      ::cuda::ptx::mbarrier_init(&exchange_->arrived[0], 1);
      ::cuda::ptx::mbarrier_init(&exchange_->arrived[1], 1);
      ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
    }
    if (static_cast<int>(threadIdx.x) < contract::kWarp && static_cast<int>(threadIdx.x) >= tree.groups) {
      exchange_->values[0][threadIdx.x] = 0.0f;
      exchange_->values[1][threadIdx.x] = 0.0f;
    }
  }

  __device__ __forceinline__ int block() const { return static_cast<int>(blockIdx.x) / cluster_blocks_; }
  __device__ __forceinline__ int num_blocks() const { return static_cast<int>(gridDim.x) / cluster_blocks_; }
  __device__ __forceinline__ int thread() const {
    return cluster_rank_ * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
  }
  __device__ __forceinline__ int num_threads() const { return cluster_blocks_ * static_cast<int>(blockDim.x); }
  __device__ __forceinline__ void sync_block() {
    if (syncs_++ == 0) {
      cooperative_groups::this_cluster().sync();
    } else {
      __syncthreads();
      ::cuda::ptx::barrier_cluster_arrive(::cuda::ptx::sem_relaxed);
      ::cuda::ptx::barrier_cluster_wait();
    }
  }
  __device__ __forceinline__ void sync_before_polls() const {}

  __device__ float sum_lane_partials(const contract::RmsNormTree& tree, float partial) {
    const uint32_t exchange = exchanges_++;
    float* values = exchange_->values[exchange & 1u];
    uint64_t* arrived = &exchange_->arrived[exchange & 1u];
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int lane = static_cast<int>(threadIdx.x) % contract::kWarp;
    const int group = cluster_rank_ * (static_cast<int>(blockDim.x) / contract::kWarp) +
                      static_cast<int>(threadIdx.x) / contract::kWarp;
    const float v = warp_butterfly(partial);
    if (threadIdx.x == 0) {
      ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                             ::cuda::ptx::space_shared, arrived,
                                             static_cast<uint32_t>(tree.groups) * sizeof(float));
    }
    if (lane == 0) {
      for (int c = 0; c < cluster_blocks_; ++c) {
        ::cuda::ptx::st_async(cluster.map_shared_rank(values + group, c), v, cluster.map_shared_rank(arrived, c));
      }
    }
    // After a give-up (a bug: every block sends) later exchanges do not wait; the launch's result is
    // garbage and the recorded error fails the call (Communicator::check).
    if (!exchange_failed_) {
      const uint32_t parity = (exchange >> 1) & 1u;
      exchange_failed_ = !this->spin_until(
          [&] {
            return ::cuda::ptx::mbarrier_try_wait_parity(::cuda::ptx::sem_acquire, ::cuda::ptx::scope_cluster, arrived,
                                                         parity);
          },
          kErrorClusterTimeout, this->rank(), cluster_rank_, exchange, 2);
    }
    return warp_butterfly(values[lane]);
  }

 private:
  ClusterExchange* exchange_;
  int cluster_rank_, cluster_blocks_;
  uint32_t syncs_ = 0, exchanges_ = 0;
  bool exchange_failed_ = false;
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
  } else if constexpr (kKind == FusedKernelKind::kLamportOneStage || kKind == FusedKernelKind::kLamportTwoStage) {
    // Core's path (lamport_held_kernel runs the register path). No staging either:
    // base.inputs[rank] is this rank's x where the caller keeps it.
    fused_rmsnorm_lamport<T, kRanks, LamportProtocol, lamport_fused_of(kKind)>(ctx, fused_args<T>(args));
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

// lamport_one_stage or lamport_two_stage (kLamport) on the register path, one lane (and pack) a
// thread: the kernel the host launches where a block holds a row's lanes (threads == lanes:
// lamport_register_blocks 1), else lamport_cluster_kernel (a cluster of C blocks holds them) or
// fused_kernel's core path. What core/fused_rmsnorm_kernels.h's fused_rmsnorm_lamport_reg (the
// simulator's) picks at run time, as separate kernels so that each is compiled with only its own
// registers.
template <class T, int kRanks, Contract kFold, LamportFused kLamport>
__global__ void __launch_bounds__(1024) lamport_held_kernel(const __grid_constant__ FusedKernelArgs args) {
  enter_after_previous_grid();
  __shared__ int aborted;
  if (threadIdx.x == 0) aborted = 0;  // begin_lamport_call's sync_block orders it before any poll
  FusedDeviceCtx<T, kRanks, kFold> ctx(args.base, &aborted);
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  lamport_held<T, kRanks, LamportProtocol, kLamport>(ctx, fused_args<T>(args), tree);
}

// The same on the register path over thread-block clusters (ClusterRowCtx): C blocks of lanes / C
// threads hold a row, one lane a thread. Blocks of at most 512 threads (C >= 2), so ptxas may give
// a thread 128 registers.
template <class T, int kRanks, Contract kFold, LamportFused kLamport>
__global__ void __launch_bounds__(512) lamport_cluster_kernel(const __grid_constant__ FusedKernelArgs args) {
  enter_after_previous_grid();
  __shared__ int aborted;
  __shared__ ClusterExchange exchange;
  if (threadIdx.x == 0) aborted = 0;  // begin_lamport_call's sync_block (the cluster's) orders it
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  ClusterRowCtx<T, kRanks, kFold> ctx(args.base, &aborted, &exchange, tree);
  lamport_held<T, kRanks, LamportProtocol, kLamport>(ctx, fused_args<T>(args), tree);
}

// A Lamport fused kernel (kKind: lamport_one_stage or lamport_two_stage) for cfg:
// lamport_register_blocks(cfg.threads, tree, kMaxClusterBlocks)
// blocks hold a row: 2..kMaxClusterBlocks, the cluster kernel (cfg.cluster must be that, and
// cfg.blocks a multiple of it: FusedRmsNorm::run sets both); 1, the one-block register kernel;
// 0, fused_kernel's core path. cudaErrorInvalidValue for a cfg.cluster that does not match.
template <class T, int kRanks, Contract kFold, FusedKernelKind kKind>
cudaError_t launch_lamport_fused(const FusedKernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  constexpr LamportFused kLamport = lamport_fused_of(kKind);
  contract::RmsNormTree tree;
  if (!contract::make_rmsnorm_tree<T>(args.hidden, &tree)) return cudaErrorInvalidValue;
  const int row_blocks = lamport_register_blocks(cfg.threads, tree, kMaxClusterBlocks);
  if (std::max(cfg.cluster, 1) != std::max(row_blocks, 1) || cfg.blocks % std::max(cfg.cluster, 1) != 0) {
    return cudaErrorInvalidValue;
  }
  if (row_blocks > 1) return launch_kernel(lamport_cluster_kernel<T, kRanks, kFold, kLamport>, args, cfg, stream);
  if (row_blocks == 1) return launch_kernel(lamport_held_kernel<T, kRanks, kFold, kLamport>, args, cfg, stream);
  return launch_kernel(fused_kernel<T, kRanks, kKind, kFold>, args, cfg, stream);
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
    case FusedKernelKind::kLamportOneStage:
      if (args.base.contract == static_cast<int32_t>(Contract::kTree)) {
        return launch_lamport_fused<T, kRanks, Contract::kTree, FusedKernelKind::kLamportOneStage>(args, cfg, stream);
      }
      return launch_lamport_fused<T, kRanks, Contract::kCanonical, FusedKernelKind::kLamportOneStage>(args, cfg,
                                                                                                      stream);
    case FusedKernelKind::kLamportTwoStage:
      if (args.base.contract == static_cast<int32_t>(Contract::kTree)) {
        return launch_lamport_fused<T, kRanks, Contract::kTree, FusedKernelKind::kLamportTwoStage>(args, cfg, stream);
      }
      return launch_lamport_fused<T, kRanks, Contract::kCanonical, FusedKernelKind::kLamportTwoStage>(args, cfg,
                                                                                                      stream);
    case FusedKernelKind::kResidualRmsNorm:
      return cudaErrorInvalidValue;  // not per world size: launch_fused_typed launches it
  }
  return cudaErrorInvalidValue;
}

// Compile-time world sizes 2, 3, 4 and 8 (core's dispatch_fused_world_size); other sizes run the
// run-time-n kernels (same bits; the loads are issued rank by rank).
template <class T>
cudaError_t launch_fused_typed(FusedKernelKind kind, const FusedKernelArgs& args, LaunchConfig cfg,
                               cudaStream_t stream) {
  if (kind == FusedKernelKind::kResidualRmsNorm) return launch_residual_rmsnorm_typed<T>(args, cfg, stream);
  cudaError_t launched = cudaSuccess;
  dispatch_fused_world_size(args.base.world_size, [&](auto ranks) {
    launched = launch_fused_for_ranks<T, decltype(ranks)::value>(kind, args, cfg, stream);
  });
  return launched;
}

}  // namespace exactcoll::cuda::fused
