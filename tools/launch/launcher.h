// Starts N local worker processes of one job and supervises them: the engine of `exactcoll launch`.
// POSIX only (fork/exec, pipes, waitpid); knows nothing of CUDA.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace exactcoll::launch {

struct LaunchOptions {
  std::string executable;         // what every worker execs (`exactcoll launch` uses /proc/self/exe)
  std::vector<std::string> argv;  // each worker's argv, argv[0] included
  int nproc = 1;                  // workers, ranks 0..nproc-1
  uint16_t master_port = 0;       // MASTER_PORT for torch.distributed in the workers; 0: pick a free one
  uint16_t store_port = 0;        // EXACTCOLL_STORE_PORT, rank 0's store; 0: pick a free one (never MASTER_PORT)
  std::chrono::milliseconds timeout{std::chrono::hours(1)};  // for the whole job
  // After the first failure (or the timeout) the others get SIGTERM, then SIGKILL this much later.
  std::chrono::milliseconds kill_grace{std::chrono::seconds(5)};
  // Several hosts, torchrun-style: this launcher starts node `node_rank`'s nproc workers of a job of
  // nnodes x nproc ranks (RANK = node_rank * nproc + local index, LOCAL_RANK, LOCAL_WORLD_SIZE =
  // nproc, GROUP_RANK = EXACTCOLL_NODE_RANK = node_rank). Every node's launcher is given the same
  // nnodes, master_addr, master_port (then not 0) and token.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: where rank 0 (on node 0) serves the store
  std::string token;                      // EXACTCOLL_STORE_TOKEN; "" makes a fresh random one (one node only)
  std::string store_bind;                 // EXACTCOLL_STORE_BIND for the workers; "" leaves the store on 127.0.0.1
  // Forward each worker's stderr line by line as "[rank R] line"; false: workers inherit stderr.
  // stdout is always inherited untouched (it may carry data, e.g. a table).
  bool prefix_stderr = true;
};

// Runs the job: picks the ports and a fresh token (unless given), starts this node's workers with
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, EXACTCOLL_NODE_RANK, MASTER_ADDR,
// MASTER_PORT, EXACTCOLL_STORE_PORT, EXACTCOLL_STORE_TOKEN (and EXACTCOLL_STORE_BIND) set (the rest
// of the environment, CUDA_VISIBLE_DEVICES included, is passed through), and waits for them.
// Returns 0 when every worker exited 0. Otherwise stops the rest (SIGTERM, then SIGKILL after
// kill_grace), prints to stderr which rank failed and how, and returns: the first failed worker's
// exit status (128 + signal number when a signal killed it), 3 on the job timeout or when workers
// could not be started, 128 + signal when the launcher itself was interrupted (SIGINT, SIGTERM,
// SIGHUP).
int run_workers(const LaunchOptions& options);

// Returns a TCP port on 127.0.0.1 that was free a moment ago (bound with port 0, then released).
// Another process may take it before rank 0 binds it; rank 0 then fails with a clear message.
// Throws std::runtime_error when no socket can be made.
uint16_t pick_free_port();

// Returns a free port on 127.0.0.1 other than `taken` (e.g. the store's beside MASTER_PORT).
// Throws std::runtime_error when none is found in 100 tries.
uint16_t pick_free_port_except(uint16_t taken);

// Returns `bytes` bytes from /dev/urandom as 2 * bytes lowercase hex digits.
// Throws std::runtime_error when /dev/urandom cannot be read.
std::string random_token_hex(size_t bytes);

}  // namespace exactcoll::launch
