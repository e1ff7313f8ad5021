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
  // Forward each worker's stderr line by line as "[rank R] line"; false: workers inherit stderr.
  // stdout is always inherited untouched (it may carry data, e.g. a table).
  bool prefix_stderr = true;
};

// Runs the job: picks the ports and a fresh token, starts the workers with RANK, WORLD_SIZE,
// LOCAL_RANK (= RANK), MASTER_ADDR=127.0.0.1, MASTER_PORT, EXACTCOLL_STORE_PORT and
// EXACTCOLL_STORE_TOKEN set (the rest
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

// Returns `bytes` bytes from /dev/urandom as 2 * bytes lowercase hex digits.
// Throws std::runtime_error when /dev/urandom cannot be read.
std::string random_token_hex(size_t bytes);

}  // namespace exactcoll::launch
