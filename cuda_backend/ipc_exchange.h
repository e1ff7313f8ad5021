// core/handle_exchange.h over CUDA IPC: the open and close callbacks and the exported record of a
// region, shared by the communicator (cuda_backend/communicator.cc) and the overlap pipeline
// (cuda_backend/overlap/pipeline.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
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

// The peer allocations this process has mapped through CUDA IPC, by handle bytes. CUDA maps a
// handle once per process (a second cudaIpcOpenMemHandle of it fails with "resource already
// mapped"), so every user (each communicator's handle exchange and eager directory, the overlap
// pipelines) opens through this one table, and a mapping closes when its last user closes it.
// Thread-safe. Users open through an IpcOpens, which gives its share back when it goes.
class IpcMappings {
 public:
  static IpcMappings& process() {
    static IpcMappings* mappings = new IpcMappings();  // never destroyed: usable until exit
    return *mappings;
  }
  // Returns this process's address of the handle's allocation base (lazy peer access), the same
  // address for a handle mapped already. Throws CudaError (cuda_check.h) when the open fails.
  void* open(const cudaIpcMemHandle_t& handle) {
    const std::string key(reinterpret_cast<const char*>(&handle), sizeof handle);
    std::lock_guard<std::mutex> lock(mutex_);
    for (Mapping& m : mappings_) {
      if (m.handle == key) {
        ++m.users;
        return m.address;
      }
    }
    void* address = nullptr;
    EXC_CUDA_CHECK(cudaIpcOpenMemHandle(&address, handle, cudaIpcMemLazyEnablePeerAccess));
    mappings_.push_back(Mapping{key, address, 1});
    return address;
  }
  // Drops one user of an address open returned; the last user unmaps it.
  void close(void* address) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < mappings_.size(); ++i) {
      if (mappings_[i].address != address) continue;
      if (--mappings_[i].users == 0) {
        (void)cudaIpcCloseMemHandle(address);
        mappings_.erase(mappings_.begin() + static_cast<std::ptrdiff_t>(i));
      }
      return;
    }
  }

 private:
  struct Mapping {
    std::string handle;
    void* address = nullptr;
    int users = 0;
  };
  std::mutex mutex_;
  std::vector<Mapping> mappings_;
};

// One owner's share of the process's IPC mappings: what it opened, given back when it goes.
class IpcOpens {
 public:
  IpcOpens() = default;
  IpcOpens(const IpcOpens&) = delete;
  IpcOpens& operator=(const IpcOpens&) = delete;
  ~IpcOpens() {
    for (void* address : opened_) IpcMappings::process().close(address);
  }
  void* open(const cudaIpcMemHandle_t& handle) {
    void* address = IpcMappings::process().open(handle);
    opened_.push_back(address);
    return address;
  }
  void close(void* address) {
    const auto it = std::find(opened_.begin(), opened_.end(), address);
    if (it == opened_.end()) return;
    opened_.erase(it);
    IpcMappings::process().close(address);
  }

 private:
  std::vector<void*> opened_;
};

// Returns a HandleExchange whose handles are CUDA IPC memory handles, opened and closed through
// *mappings. A handle of the wrong size throws Error("IPC handle of the wrong size from a peer").
// Preconditions: *mappings outlives the exchange.
template <class Error>
std::unique_ptr<HandleExchange> make_ipc_exchange(Store& store, int rank, int world_size, IpcOpens* mappings,
                                                  const HandleExchangeOptions& options) {
  return std::make_unique<HandleExchange>(
      store, rank, world_size,
      [mappings](int /*peer*/, const ExportedBuffer& b) {
        cudaIpcMemHandle_t h{};
        if (b.handle.size() != sizeof h) throw Error("IPC handle of the wrong size from a peer");
        std::memcpy(&h, b.handle.data(), sizeof h);
        return mappings->open(h);
      },
      [mappings](int /*peer*/, void* address) { mappings->close(address); }, options);
}

}  // namespace exactcoll::cuda
