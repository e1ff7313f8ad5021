// `node_worker`: a test job for multi-host launches. Each worker reads its environment and its node
// place (cuda_backend/multinode/node_env.h), joins the job's store, publishes its place, reads
// everyone's and checks them together (multinode::layout_from_places), then prints one line:
// "node_worker: rank R node K local L of M nodes x N: <layout or the problem>". Exit 0 when the
// layout is good, 3 when it is not (the same verdict on every rank), 2 on a bad environment.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/multinode_layout.h"
#include "bootstrap/worker_env.h"
#include "bootstrap/worker_store.h"
#include "cuda_backend/multinode/node_env.h"
#include "tools/cli.h"

namespace exactcoll {
namespace {

int run_node_worker(int argc, char** argv) {
  cli::ArgParser parser("node_worker", "Test worker: node place from the environment, agreed through the store.");
  if (const auto code = parser.parse(argc, argv)) return *code;
  WorkerEnv env;
  multinode::RankPlace place;
  try {
    env = parse_worker_env(process_environment());
    place = cuda::node_place_from_env(process_environment(), env);
  } catch (const BootstrapError& e) {
    return cli::fail("node_worker", e.what(), cli::kExitUsage);
  }
  const std::chrono::milliseconds timeout(20000);
  std::string verdict;
  try {
    WorkerStoreOptions options;
    options.connect_timeout = timeout;
    auto store = connect_worker_store(env, options);
    store->set("place/" + std::to_string(env.rank), std::to_string(place.node) + " " +
                                                        std::to_string(place.local_rank) + " " +
                                                        std::to_string(place.local_world_size));
    std::vector<multinode::RankPlace> places(static_cast<size_t>(env.world_size));
    for (int r = 0; r < env.world_size; ++r) {
      multinode::RankPlace& p = places[static_cast<size_t>(r)];
      std::sscanf(store->get("place/" + std::to_string(r), timeout).c_str(), "%d %d %d", &p.node, &p.local_rank,
                  &p.local_world_size);
    }
    multinode::NodeLayout layout;
    const std::string problem = multinode::layout_from_places(places, &layout);
    verdict = problem.empty() ? multinode::layout_text(layout) : "bad layout: " + problem;
    store->barrier("leave", env.world_size, timeout);  // rank 0 owns the server: everyone has read
  } catch (const StoreError& e) {
    return cli::fail("node_worker", e.what(), cli::kExitFailure);
  }
  const char* devices = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string line = "node_worker: rank " + std::to_string(env.rank) + " node " + std::to_string(place.node) +
                           " local " + std::to_string(place.local_rank) + ": " + verdict +
                           " (CUDA_VISIBLE_DEVICES=" + (devices ? devices : "<unset>") + ")\n";
  const ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  if (written != static_cast<ssize_t>(line.size())) return cli::kExitFailure;
  return verdict.rfind("bad layout", 0) == 0 ? cli::kExitFailure : 0;
}

const cli::Registrar kRegistrar({"node_worker", "test worker for multi-node launches", run_node_worker});

}  // namespace
}  // namespace exactcoll
