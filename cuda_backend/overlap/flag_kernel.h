// A one-thread kernel that stores a flag with system-scope release: the fallback for the get
// protocol's signals where cuStreamWriteValue32 cannot write a peer's IPC-mapped memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace exactcoll::cuda {

// Enqueues *flag = value (after a system-scope fence) on stream; returns the launch's error.
cudaError_t launch_write_flag(uint32_t* flag, uint32_t value, cudaStream_t stream);

}  // namespace exactcoll::cuda
