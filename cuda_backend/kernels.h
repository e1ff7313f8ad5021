// Host entry points of the collective kernels (one per storage type, each in its own .cu file so
// nvcc compiles them in parallel actions). Host code includes this with the CUDA runtime headers
// only; the kernels themselves are in kernels.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include "core/storage.h"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda {

// Launches one collective kernel on stream. Returns the launch's error (cudaGetLastError).
// Preconditions: args filled for this rank (KernelArgs), cfg valid (LaunchConfig).
cudaError_t launch_collective_bf16(KernelKind kind, const KernelArgs& args, LaunchConfig cfg, cudaStream_t stream);
cudaError_t launch_collective_fp16(KernelKind kind, const KernelArgs& args, LaunchConfig cfg, cudaStream_t stream);
cudaError_t launch_collective_fp32(KernelKind kind, const KernelArgs& args, LaunchConfig cfg, cudaStream_t stream);

inline cudaError_t launch_collective(DType dtype, KernelKind kind, const KernelArgs& args, LaunchConfig cfg,
                                     cudaStream_t stream) {
  switch (dtype) {
    case DType::kBF16: return launch_collective_bf16(kind, args, cfg, stream);
    case DType::kFP16: return launch_collective_fp16(kind, args, cfg, stream);
    case DType::kFP32: return launch_collective_fp32(kind, args, cfg, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace exactcoll::cuda
