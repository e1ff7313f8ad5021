// What one launch of a fused kernel needs, as plain data (no CUDA headers): filled by the host
// (fused_rmsnorm.cc, g++), passed by value as a __grid_constant__ kernel parameter
// (fused_kernels.cuh, nvcc).
#pragma once

#include <cstdint>

#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda::fused {

// Preconditions (checked by the host API): every pointer 16-byte aligned; hidden a positive
// multiple of the pack; 1 <= rows; base from Communicator::ipc_kernel_args (inputs[r] = rank r's
// x for these rows, staged or registered; kPushOneStage and the Lamport kinds read only
// inputs[rank], this rank's x where the caller keeps it) except for kResidualRmsNorm, which reads
// none of it.
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

// The largest thread-block cluster lamport_one_stage launches (CUDA's portable cluster size): the
// max_blocks of core/fused_rmsnorm_kernels.h's lamport_register_blocks on the GPU, which gives the
// blocks that hold a row (1: one block, 2..kMaxClusterBlocks: a cluster, 0: core's path).
inline constexpr int kMaxClusterBlocks = 8;

}  // namespace exactcoll::cuda::fused
