// What one launch of a fused kernel needs, as plain data (no CUDA headers): filled by the host
// (fused_rmsnorm.cc, g++), passed by value as a __grid_constant__ kernel parameter
// (fused_kernels.cuh, nvcc).
#pragma once

#include <cstdint>

#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda::fused {

// Preconditions (checked by the host API): every pointer 16-byte aligned; hidden a positive
// multiple of the pack; 1 <= rows; base from Communicator::ipc_kernel_args (inputs[r] = rank r's
// x for these rows, staged or registered; kPushOneStage reads only inputs[rank], this rank's x
// where the caller keeps it) except for kResidualRmsNorm, which reads none of it.
struct FusedKernelArgs {
  KernelArgs base;         // symmetric buffers, rank, world size, error record, flag timeout
  const void* stage_from;  // this rank's x (rows of this launch) to copy into its staging buffer
                           // first, or nullptr when base.inputs are registered buffers (and
                           // always for kPushOneStage)
  const void* s;           // kResidualRmsNorm only: the all-reduce's output [rows, H] (may be out)
  const void* residual;    // [rows, H]
  const void* weight;      // [H]
  void* residual_out;      // [rows, H]
  void* out;               // [rows, H]
  int32_t rows;
  int32_t hidden;
  float eps;
};

// The largest thread-block cluster lamport_one_stage launches (CUDA's portable cluster size).
inline constexpr int kMaxClusterBlocks = 8;

// How many blocks of `threads` threads hold one lamport_one_stage row of `lanes` RMSNorm tree lanes
// and `packs` packs on the register path (one lane, one pack a thread: core/fused_rmsnorm_kernels.h,
// lamport_register_path): 1 where threads == lanes (one block a row); C = lanes / threads where
// that divides evenly, 2 <= C <= kMaxClusterBlocks and threads is a multiple of the warp (a
// thread-block cluster of C blocks, fused_kernels.cuh's ClusterRowCtx); 0 where the row has more
// packs than lanes, or no such C exists (core's path, fused_kernel). The host launches clusters of
// that many blocks (LaunchConfig::cluster) and a multiple of it as the grid.
// Example: lanes 1024 (H 8192 bf16): threads 1024 -> 1, 512 -> 2, 256 -> 4, 128 -> 8, 64 -> 0.
inline int lamport_cluster_blocks(int threads, int lanes, int packs) {
  if (threads <= 0 || packs > lanes) return 0;
  if (threads == lanes) return 1;
  if (threads > lanes || lanes % threads != 0 || threads % 32 != 0) return 0;
  const int blocks = lanes / threads;
  return blocks <= kMaxClusterBlocks ? blocks : 0;
}

}  // namespace exactcoll::cuda::fused
