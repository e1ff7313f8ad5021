// The process model of the GPU commands (gpu, verify, bench, tune): one process per GPU.
//
// A command started by a user with --nproc N re-executes itself N times through the launcher
// library (tools/launch/launcher.h), which gives every worker RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT and a fresh store token. A process that already has RANK in its
// environment (started by `exactcoll launch` or torchrun) is a worker and runs the command.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/store.h"
#include "bootstrap/worker_env.h"

namespace exactcoll::gpu {

// Returns nullopt in a worker (RANK is set; then --nproc, if given, must equal WORLD_SIZE).
// Otherwise runs `nproc` workers of this same command line and returns the job's exit code.
std::optional<int> relaunch_unless_worker(int argc, char** argv, int64_t nproc, bool nproc_given,
                                          const std::string& command);

// One worker: its environment, its GPU (LOCAL_RANK modulo the visible GPUs, made current) and
// its connection to the job's store. Destroying it passes a final store barrier first, so rank
// 0 (whose store object owns the server) leaves last.
class Worker {
 public:
  // Throws BootstrapError (environment), StoreError (store), CudaError (no GPU).
  explicit Worker(const std::string& command);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  bool leader() const { return env_.rank == 0; }
  int device() const { return device_; }
  Store& store() { return *store_; }
  const std::string& device_name() const { return device_name_; }

  // Sum of `value` over ranks. Collective; `name` must be fresh for each call.
  int64_t sum(const std::string& name, int64_t value);
  // Every rank's `value`, in rank order. Collective; `name` fresh for each call.
  std::vector<std::string> all_gather(const std::string& name, const std::string& value);
  // Store barrier named `name` (fresh per call).
  void barrier(const std::string& name);

  std::chrono::milliseconds store_timeout{300000};

 private:
  std::string command_;
  WorkerEnv env_;
  std::unique_ptr<Store> store_;
  int device_ = -1;
  std::string device_name_;
  uint64_t serial_ = 0;
};

// Prints `text` on rank 0's stdout (workers' stdout is passed through untouched by the launcher).
void print_leader(const Worker& worker, const std::string& text);

}  // namespace exactcoll::gpu
