// The fp32 instantiations of the collective kernels (kernels.cuh).
#include "cuda_backend/kernels.cuh"
#include "cuda_backend/kernels.h"

namespace exactcoll::cuda {

cudaError_t launch_collective_fp32(KernelKind kind, const KernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  return launch_typed<float>(kind, args, cfg, stream);
}

}  // namespace exactcoll::cuda
