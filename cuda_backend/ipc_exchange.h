// core/handle_exchange.h over CUDA IPC: the open and close callbacks and the exported record of a
// region, shared by the communicator (cuda_backend/communicator.cc) and the overlap pipeline
// (cuda_backend/overlap/pipeline.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/handle_exchange.h"
#include "core/store.h"
#include "cuda_backend/cuda_check.h"

namespace exactcoll::cuda {

// Returns the exported record of `region` (the whole allocation of `bytes` bytes, offset 0) with
// its IPC handle `handle` (from cudaIpcGetMemHandle).
inline ExportedBuffer exported_ipc_region(const cudaIpcMemHandle_t& handle, void* region, uint64_t bytes) {
  return ExportedBuffer{std::string(reinterpret_cast<const char*>(&handle), sizeof handle),
                        reinterpret_cast<uint64_t>(region), bytes, 0};
}

// Returns a HandleExchange whose handles are CUDA IPC memory handles. Opening maps a peer's
// allocation (cudaIpcOpenMemHandle with lazy peer access) and appends it to *opened; closing
// unmaps it and drops it from *opened. The owner closes what is left in *opened when it is done.
// A handle of the wrong size throws Error("IPC handle of the wrong size from a peer").
// Preconditions: *opened outlives the exchange.
template <class Error>
std::unique_ptr<HandleExchange> make_ipc_exchange(Store& store, int rank, int world_size, std::vector<void*>* opened,
                                                  const HandleExchangeOptions& options) {
  return std::make_unique<HandleExchange>(
      store, rank, world_size,
      [opened](int /*peer*/, const ExportedBuffer& b) {
        cudaIpcMemHandle_t h{};
        if (b.handle.size() != sizeof h) throw Error("IPC handle of the wrong size from a peer");
        std::memcpy(&h, b.handle.data(), sizeof h);
        void* address = nullptr;
        EXC_CUDA_CHECK(cudaIpcOpenMemHandle(&address, h, cudaIpcMemLazyEnablePeerAccess));
        opened->push_back(address);
        return address;
      },
      [opened](int /*peer*/, void* address) {
        (void)cudaIpcCloseMemHandle(address);
        opened->erase(std::remove(opened->begin(), opened->end(), address), opened->end());
      },
      options);
}

}  // namespace exactcoll::cuda
