#include "tools/gpu/worker.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "bootstrap/worker_store.h"
#include "core/signal.h"
#include "cuda_backend/cuda_check.h"
#include "tools/cli.h"
#include "tools/launch/launcher.h"

namespace exactcoll::gpu {

std::optional<int> relaunch_unless_worker(int argc, char** argv, int64_t nproc, bool nproc_given,
                                          const std::string& command) {
  const char* rank = std::getenv("RANK");
  if (rank != nullptr && *rank != '\0') {
    const char* world = std::getenv("WORLD_SIZE");
    if (nproc_given && world != nullptr && std::to_string(nproc) != world) {
      std::cerr << "exactcoll " << command << ": --nproc " << nproc << " disagrees with WORLD_SIZE=" << world << "\n";
      return 2;
    }
    return std::nullopt;
  }
  if (!nproc_given) {
    std::cerr << "exactcoll " << command
              << ": give --nproc N (one process per GPU), or start workers with `exactcoll launch` or torchrun\n";
    return 2;
  }
  // One communicator links the workers (core/signal.h's kMaxRanks); more would start every worker
  // only for each to fail making it.
  if (nproc < 1 || nproc > kMaxRanks) {
    std::cerr << "exactcoll " << command << ": --nproc must be 1.." << kMaxRanks
              << " (the ranks one communicator links), got " << nproc << "; no worker was started\n";
    return 2;
  }
  // One check here, before any worker starts: without it every rank fails alike and the launcher
  // prints N interleaved CUDA errors.
  int devices = 0;
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  if (counted != cudaSuccess || devices < 1) {
    std::cerr << "exactcoll " << command << ": no usable GPU on this machine ("
              << (counted != cudaSuccess ? std::string(cudaGetErrorName(counted)) + ": " + cudaGetErrorString(counted)
                                         : std::string("no CUDA device is visible"))
              << "); no worker was started\n";
    return cli::kExitFailure;
  }
  launch::LaunchOptions options;
  options.executable = "/proc/self/exe";
  options.argv.push_back("exactcoll");
  for (int i = 0; i < argc; ++i) options.argv.push_back(argv[i]);
  options.nproc = static_cast<int>(nproc);
  return launch::run_workers(options);
}

Worker::Worker(const std::string& command) : command_(command) {
  env_ = parse_worker_env(process_environment());
  int count = 0;
  EXC_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < 1) throw cuda::CudaError("no CUDA device is visible");
  device_ = env_.local_rank % count;
  EXC_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  EXC_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  WorkerStoreOptions options;
  options.connect_timeout = std::chrono::milliseconds(60000);
  options.request_timeout = std::chrono::milliseconds(60000);
  store_ = connect_worker_store(env_, options);
}

Worker::~Worker() {
  // Unwinding from an error (a peer that never arrived, most often): the peers are failing too or
  // are dead, and their communicators are closed already, so this rank leaves without the final
  // barrier, which a dead rank would hold until its timeout ("the kernel bound + 1 s" within which
  // a dead peer's survivors exit, docs/reliability.md).
  if (std::uncaught_exceptions() > 0) return;
  const auto timeout = std::chrono::milliseconds(60000);
  try {
    store_->barrier(command_ + "/exit", env_.rank, env_.world_size, timeout);
  } catch (const std::exception& e) {
    std::cerr << "exactcoll " << command_ << ": rank " << env_.rank
              << " leaving without the final barrier: " << e.what() << "\n";
  }
}

int64_t Worker::sum(const std::string& name, int64_t value) {
  const std::string key = command_ + "/sum/" + name + "/" + std::to_string(serial_++);
  store_->add(key, value);
  store_->barrier(key + "/done", env_.rank, env_.world_size, store_timeout);
  return store_->add(key, 0);
}

std::vector<std::string> Worker::all_gather(const std::string& name, const std::string& value) {
  const std::string key = command_ + "/gather/" + name + "/" + std::to_string(serial_++);
  store_->set(key + "/" + std::to_string(env_.rank), value);
  std::vector<std::string> out;
  for (int r = 0; r < env_.world_size; ++r) out.push_back(store_->get(key + "/" + std::to_string(r), store_timeout));
  return out;
}

void Worker::barrier(const std::string& name) {
  store_->barrier(command_ + "/barrier/" + name + "/" + std::to_string(serial_++), env_.rank, env_.world_size,
                  store_timeout);
}

void print_leader(const Worker& worker, const std::string& text) {
  if (!worker.leader()) return;
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

}  // namespace exactcoll::gpu
