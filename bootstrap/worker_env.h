// A worker's view of its job, read from the environment: torchrun's variables (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT) plus the store's port and token, so that a worker started
// by `exactcoll launch` and one started by torchrun bootstrap the same way.
//
// The rendezvous store never listens on MASTER_PORT: torch's own TCPStore holds that port in every
// torchrun job. It uses EXACTCOLL_STORE_PORT, or MASTER_PORT + 1 when that is not set.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace exactcoll {

// A missing or malformed variable. The message lists every problem found, one per line, each
// naming the variable and what it should hold.
struct BootstrapError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline constexpr size_t kMinStoreTokenChars = 16;

struct WorkerEnv {
  int rank = 0;              // RANK: 0 <= rank < world_size
  int world_size = 1;        // WORLD_SIZE: >= 1
  int local_rank = 0;        // LOCAL_RANK: index on this host (picks the GPU), 0 <= local_rank < world_size
  std::string master_addr;   // MASTER_ADDR: where rank 0's store listens
  uint16_t master_port = 0;  // MASTER_PORT: 1..65535 (0 when unset and EXACTCOLL_STORE_PORT is set)
  // EXACTCOLL_STORE_PORT: where rank 0's store listens, 1..65535; default MASTER_PORT + 1.
  uint16_t store_port = 0;
  std::string store_token;  // EXACTCOLL_STORE_TOKEN: 16..4087 characters, shared by every rank
  // EXACTCOLL_STORE_BIND (optional): the address rank 0's store binds; 127.0.0.1 keeps the store
  // off the network. Multi-host jobs set it to 0.0.0.0 or the interface MASTER_ADDR names.
  std::string store_bind_address = "127.0.0.1";
};

// Looks up one environment variable; nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Returns a lookup into this process's environment (std::getenv).
EnvLookup process_environment();

// Returns the worker's environment, checked.
// Throws BootstrapError listing every missing or malformed variable (e.g. "RANK='x' is not a whole
// number", "RANK=3 is not below WORLD_SIZE=2"); a missing token's message says how to make one.
// Example: parse_worker_env(process_environment()) under `exactcoll launch --nproc 2` on rank 1
// gives {rank 1, world_size 2, local_rank 1, "127.0.0.1", <master port>, <store port>, <token>,
// "127.0.0.1"}.
WorkerEnv parse_worker_env(const EnvLookup& lookup);

}  // namespace exactcoll
