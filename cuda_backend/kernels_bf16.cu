// The bf16 instantiations of the collective kernels (kernels.cuh).
#include "cuda_backend/kernels.cuh"
#include "cuda_backend/kernels.h"

namespace exactcoll::cuda {

cudaError_t launch_collective_bf16(KernelKind kind, const KernelArgs& args, LaunchConfig cfg, cudaStream_t stream) {
  return launch_typed<bf16>(kind, args, cfg, stream);
}

}  // namespace exactcoll::cuda
