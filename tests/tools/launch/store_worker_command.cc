// `store_worker`: a tiny job for testing `launch` and the bootstrap end to end. Each worker reads
// its environment, joins the store, passes a barrier, publishes its rank, reads every peer's, and
// exits 0. Flags make one rank fail, hang or die by a signal, to test how launch handles that.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "bootstrap/worker_env.h"
#include "bootstrap/worker_store.h"
#include "tools/cli.h"

namespace exactcoll {
namespace {

int run_store_worker(int argc, char** argv) {
  int64_t fail_rank = -1;
  int64_t hang_rank = -1;
  int64_t kill_rank = -1;
  std::string kill_at = "after_start";
  int64_t timeout_ms = 20000;
  cli::ArgParser parser("store_worker [--fail-rank R] [--hang-rank R] [--kill-rank R]",
                        "Test worker: barrier, set/get of every rank's key, barrier, exit 0.");
  parser.add_int("fail-rank", &fail_rank, "this rank exits 3 after the first barrier");
  parser.add_int("hang-rank", &hang_rank, "this rank sleeps (up to 60 s) instead of joining the barrier");
  parser.add_int("kill-rank", &kill_rank, "this rank kills itself with SIGKILL (see --kill-at)");
  parser.add_choice("kill-at", &kill_at, {"start", "after_start"},
                    "where --kill-rank dies: before the first barrier, or after it");
  parser.add_int("timeout-ms", &timeout_ms, "timeout of every store wait");
  if (const auto exit_code = parser.parse(argc, argv)) return *exit_code;

  WorkerEnv env;
  try {
    env = parse_worker_env(process_environment());
  } catch (const BootstrapError& e) {
    return cli::fail("store_worker", e.what(), cli::kExitUsage);
  }
  const std::chrono::milliseconds timeout(timeout_ms);
  const std::string me = std::to_string(env.rank);
  try {
    WorkerStoreOptions options;
    options.connect_timeout = timeout;
    auto store = connect_worker_store(env, options);
    if (env.rank == hang_rank) {
      std::this_thread::sleep_for(std::chrono::seconds(60));  // launch's timeout must end this
      return cli::kExitFailure;
    }
    if (env.rank == kill_rank && kill_at == "start") raise(SIGKILL);
    store->barrier("start", env.rank, env.world_size, timeout);
    if (env.rank == fail_rank) {
      std::cerr << "store_worker: rank " << me << " failing on purpose\n";
      return 3;
    }
    if (env.rank == kill_rank && kill_at == "after_start") raise(SIGKILL);
    store->set("rank/" + me, "hello from " + me);
    for (int peer = 0; peer < env.world_size; ++peer) {
      const std::string value = store->get("rank/" + std::to_string(peer), timeout);
      if (value != "hello from " + std::to_string(peer)) {
        return cli::fail("store_worker", "rank " + me + " read '" + value + "' for rank " + std::to_string(peer),
                         cli::kExitFailure);
      }
    }
    store->add("arrived", 1);
    store->barrier("end", env.rank, env.world_size, timeout);
    const std::string arrived = store->get("arrived", timeout);
    if (arrived != std::to_string(env.world_size)) {
      return cli::fail("store_worker", "arrived=" + arrived, cli::kExitFailure);
    }
    // Rank 0 owns the server: it must leave after everyone has read `arrived`.
    store->barrier("leave", env.rank, env.world_size, timeout);
  } catch (const StoreError& e) {
    return cli::fail("store_worker", e.what(), cli::kExitFailure);
  }
  const char* devices = std::getenv("CUDA_VISIBLE_DEVICES");
  // One write() for the whole line: with `launch --no-prefix` the ranks share one stderr, and
  // piecewise writes would interleave.
  const std::string line = "store_worker: rank " + me + " of " + std::to_string(env.world_size) + " ok (local_rank " +
                           std::to_string(env.local_rank) +
                           ", CUDA_VISIBLE_DEVICES=" + (devices ? devices : "<unset>") + ")\n";
  const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  return written == static_cast<ssize_t>(line.size()) ? 0 : cli::kExitFailure;
}

const cli::Registrar kRegistrar({"store_worker", "test worker for launch and the store bootstrap", run_store_worker});

}  // namespace
}  // namespace exactcoll
