#include "cuda_backend/overlap/flag_kernel.h"

namespace exactcoll::cuda {
namespace {

__global__ void write_flag_kernel(uint32_t* flag, uint32_t value) {
  // Everything this stream did before the kernel is complete (stream order); the fence and the
  // release store make it visible to the peer that acquires the flag.
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

}  // namespace

cudaError_t launch_write_flag(uint32_t* flag, uint32_t value, cudaStream_t stream) {
  write_flag_kernel<<<1, 1, 0, stream>>>(flag, value);
  return cudaGetLastError();
}

}  // namespace exactcoll::cuda
