// Host entry points of the fused kernels (one per storage type, each in its own .cu file so that
// nvcc compiles them in parallel actions). Host code includes this with the CUDA runtime headers
// only; the kernels are in fused_kernels.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include "core/fused_rmsnorm_kernels.h"
#include "core/storage.h"
#include "cuda_backend/fused/fused_kernel_args.h"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda::fused {

// Launches one fused kernel on stream. Returns the launch's error (cudaGetLastError).
// Preconditions: args filled for this rank (FusedKernelArgs); cfg: 1 <= blocks (<= kMaxBlocks for
// the kinds with barriers), threads a multiple of 32 in [64, 1024].
cudaError_t launch_fused_bf16(FusedKernelKind kind, const FusedKernelArgs& args, LaunchConfig cfg, cudaStream_t stream);
cudaError_t launch_fused_fp16(FusedKernelKind kind, const FusedKernelArgs& args, LaunchConfig cfg, cudaStream_t stream);
cudaError_t launch_fused_fp32(FusedKernelKind kind, const FusedKernelArgs& args, LaunchConfig cfg, cudaStream_t stream);

inline cudaError_t launch_fused(DType dtype, FusedKernelKind kind, const FusedKernelArgs& args, LaunchConfig cfg,
                                cudaStream_t stream) {
  switch (dtype) {
    case DType::kBF16: return launch_fused_bf16(kind, args, cfg, stream);
    case DType::kFP16: return launch_fused_fp16(kind, args, cfg, stream);
    case DType::kFP32: return launch_fused_fp32(kind, args, cfg, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace exactcoll::cuda::fused
