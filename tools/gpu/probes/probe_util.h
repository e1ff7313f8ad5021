// What the standalone probes built with nvcc alone (launch_floor_probe, lamport_step_probe) share:
// the check of a CUDA call, the opening of main and a launch's configuration. A probe is one
// translation unit that defines kProbeName (its name, the prefix of its error messages) before
// including this header; the functions are static, so each probe's copy sees its own name.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// Exits 1 with the call, CUDA's error and where, when `call` does not return cudaSuccess.
#define CHECK(call)                                                                                            \
  do {                                                                                                         \
    const cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess) {                                                                                   \
      std::fprintf(stderr, "%s: %s failed: %s (%s:%d)\n", kProbeName, #call, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                                  \
      std::exit(1);                                                                                            \
    }                                                                                                          \
  } while (0)

// Returns how many GPUs are visible, with GPU 0's properties in *gpu0; exits 1 naming the probe
// where there is none.
static inline int visible_gpus_or_exit(cudaDeviceProp* gpu0) {
  int gpus = 0;
  CHECK(cudaGetDeviceCount(&gpus));
  if (gpus < 1) {
    std::fprintf(stderr, "%s: no GPU\n", kProbeName);
    std::exit(1);
  }
  CHECK(cudaGetDeviceProperties(gpu0, 0));
  return gpus;
}

// A launch of blocks x threads on stream, with programmatic dependent launch (as exactcoll's kernels
// are launched) where `programmatic`. *attribute holds the attribute: it must outlive the launch.
static inline cudaLaunchConfig_t launch_config(int blocks, int threads, cudaStream_t stream, bool programmatic,
                                               cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.stream = stream;
  attribute->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute->val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 1 : 0;
  return config;
}
