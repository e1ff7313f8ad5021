// Builds a worker's connection to its job's rendezvous store from its WorkerEnv: rank 0 starts the
// server (store) on EXACTCOLL_STORE_PORT (default MASTER_PORT + 1) first, then every rank, rank 0 too, connects to it.
#pragma once

#include <chrono>
#include <memory>

#include "core/store.h"
#include "bootstrap/worker_env.h"

namespace exactcoll {

struct WorkerStoreOptions {
  // How long a rank keeps trying to reach rank 0's store (rank 0 may start later).
  std::chrono::milliseconds connect_timeout{60000};
  // How long set/add/erase may take (see TcpStoreClientOptions::request_timeout).
  std::chrono::milliseconds request_timeout{30000};
};

// Returns this worker's Store, connected and authenticated with env.store_token.
// On rank 0 the returned object also owns the server, which stops when it is destroyed: so rank 0
// should leave last (e.g. every rank passes a final barrier, and rank 0 destroys its store after
// it); the other ranks' stores then see their connection drop.
// Throws StoreError when rank 0 cannot listen on the store port (in use: set EXACTCOLL_STORE_PORT) or a rank
// cannot reach the store within connect_timeout; the message names the address, port and rank.
std::unique_ptr<Store> connect_worker_store(const WorkerEnv& env, const WorkerStoreOptions& options = {});

}  // namespace exactcoll
