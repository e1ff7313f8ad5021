// CUDA runtime error checking for host code: every runtime call's result goes through
// EXC_CUDA_CHECK, which throws CudaError naming the call, the file and line, and the runtime's
// message.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace exactcoll::cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw CudaError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                  cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

}  // namespace exactcoll::cuda

#define EXC_CUDA_CHECK(expr) ::exactcoll::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)

namespace exactcoll::cuda {

// Returns the CUDA driver's function `name` (its CUDA 12 version) through the runtime's entry-point
// query, so that the binary needs no link to libcuda, or null where the driver lacks it.
// Example: driver_entry<CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr)>("cuMemGetAddressRange").
template <class Fn>
Fn driver_entry(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(f);
}

// Makes `device` the calling thread's current device for a scope and restores the caller's
// afterwards (the C API's calls on a communicator's or an operand's GPU). Throws CudaError when
// either runtime call fails on the way in.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    EXC_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) EXC_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace exactcoll::cuda
