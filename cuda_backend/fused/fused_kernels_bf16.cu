// The bf16 instantiations of the fused kernels (fused_kernels.cuh).
#include "cuda_backend/fused/fused_kernels.cuh"
#include "cuda_backend/fused/fused_kernels.h"

namespace exactcoll::cuda::fused {

cudaError_t launch_fused_bf16(FusedKernelKind kind, const FusedKernelArgs& args, LaunchConfig cfg,
                              cudaStream_t stream) {
  return launch_fused_typed<bf16>(kind, args, cfg, stream);
}

}  // namespace exactcoll::cuda::fused
