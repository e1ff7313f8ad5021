// `exactcoll launch --nproc N [--nnodes M --node-rank K --master-addr A] [--master-port P] [--store-port Q]
// [--timeout-s S] -- <command …>`: runs N local workers of this same binary (/proc/self/exe) as one
// job, or as node K of a job of M nodes (tools/launch/launcher.h does the work).
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "tools/cli.h"
#include "tools/launch/launcher.h"

namespace exactcoll::launch {
namespace {

constexpr int64_t kMaxProcesses = 1024;
constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;

// True for an address that only this host can reach (the store may then stay on 127.0.0.1).
bool loopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

// The command's flags, as given (make_parser binds them).
struct LaunchFlags {
  int64_t nproc = 0;
  int64_t nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;
  int64_t store_port = 0;
  double timeout_s = 3600;
  double kill_grace_s = 5;
  bool no_prefix = false;
  std::vector<std::string> command;
};

cli::ArgParser make_parser(LaunchFlags* f) {
  cli::ArgParser parser(
      "exactcoll launch --nproc N [--nnodes M --node-rank K --master-addr A] [--master-port P] [--store-port Q] "
      "[--timeout-s S] -- <command> [args…]",
      "Runs N workers of one job on this machine: each is `exactcoll <command> [args…]` with\n"
      "RANK and LOCAL_RANK (0..N-1), WORLD_SIZE=N, MASTER_ADDR=127.0.0.1, MASTER_PORT (for\n"
      "torch.distributed in the workers), EXACTCOLL_STORE_PORT (where rank 0's rendezvous store\n"
      "listens; never MASTER_PORT, which torch's own store holds) and a fresh random\n"
      "EXACTCOLL_STORE_TOKEN (32 hex digits from /dev/urandom) that the store demands from every rank. The rest of the "
      "environment, CUDA_VISIBLE_DEVICES included,\n"
      "is passed through unchanged; workers pick their GPU from LOCAL_RANK.\n"
      "\n"
      "Each worker's stderr lines are prefixed with \"[rank R] \"; stdout is passed through as is.\n"
      "If a worker fails, the others get SIGTERM (SIGKILL after --kill-grace-s), and launch exits\n"
      "with that worker's exit status (128 + N if signal N killed it), naming the rank. It exits 0\n"
      "only if every worker exited 0, and 3 when the whole job outlives --timeout-s.\n"
      "\n"
      "Under torchrun instead: export EXACTCOLL_STORE_TOKEN yourself (the same value on every\n"
      "node, at least 16 characters), e.g.\n"
      "  export EXACTCOLL_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n"
      "and, if MASTER_PORT + 1 is taken, EXACTCOLL_STORE_PORT. (Python and C programs can\n"
      "bootstrap through their own store instead: exactcoll.torch, exactcoll_store_create.)\n"
      "\n"
      "Several hosts, torchrun-style: run one launch per host with the same --nnodes M,\n"
      "--master-addr (the host of node 0) and --master-port, and --node-rank 0..M-1. Workers get\n"
      "RANK = node_rank x N + local (node-major), WORLD_SIZE = M x N, LOCAL_RANK, LOCAL_WORLD_SIZE = N\n"
      "and GROUP_RANK = EXACTCOLL_NODE_RANK = node_rank. Every host must export the same\n"
      "EXACTCOLL_STORE_TOKEN (no launcher can make one the others know); rank 0's store then binds\n"
      "0.0.0.0 (unless --master-addr is a loopback address: nodes emulated on one host).\n"
      "\n"
      "example: exactcoll launch --nproc 2 -- gpu allreduce --input x.npy --output y.npy\n"
      "example: exactcoll launch --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 --nproc 8 -- "
      "multinode verify");
  parser.add_int("nproc", &f->nproc, "number of workers (ranks 0..N-1), 1.." + std::to_string(kMaxProcesses));
  parser.mark_required("nproc");
  parser.add_int("nnodes", &f->nnodes, "nodes (hosts) of the job; one launch per node");
  parser.add_int("node-rank", &f->node_rank, "this node's index, 0..nnodes-1");
  parser.add_string("master-addr", &f->master_addr, "MASTER_ADDR: the host of node 0, where rank 0's store listens");
  parser.add_int("master-port", &f->master_port,
                 "MASTER_PORT given to the workers (torch.distributed); 0 picks a free one");
  parser.set_default_note("master-port", "default: 0");
  parser.add_int("store-port", &f->store_port,
                 "EXACTCOLL_STORE_PORT: rank 0's store port on 127.0.0.1; 0 picks a free one (never MASTER_PORT)");
  parser.set_default_note("store-port", "default: 0");
  parser.add_double("timeout-s", &f->timeout_s, "seconds the whole job may take before every worker is stopped");
  parser.add_double("kill-grace-s", &f->kill_grace_s, "seconds between SIGTERM and SIGKILL when stopping workers");
  parser.add_bool("no-prefix", &f->no_prefix, "let workers write to stderr directly, without \"[rank R] \"");
  parser.set_rest(&f->command, "<command> [args…]: the exactcoll subcommand every worker runs");
  return parser;
}

// Checks the flags' ranges (the node's, ports and times). Returns nullopt to go on, or the exit
// code to return now (the message printed).
std::optional<int> check_ranges(const cli::ArgParser& parser, const LaunchFlags& f) {
  const int64_t nproc = f.nproc, nnodes = f.nnodes, node_rank = f.node_rank, master_port = f.master_port,
                store_port = f.store_port;
  const double timeout_s = f.timeout_s, kill_grace_s = f.kill_grace_s;
  const std::string& master_addr = f.master_addr;
  if (!parser.given("nproc")) return cli::fail("launch", "--nproc is required (e.g. --nproc 2)");
  if (nproc < 1 || nproc > kMaxProcesses) {
    return cli::fail("launch",
                     "--nproc must be 1.." + std::to_string(kMaxProcesses) + ", got " + std::to_string(nproc));
  }
  if (master_port < 0 || master_port > 65535) {
    return cli::fail("launch", "--master-port must be 0..65535, got " + std::to_string(master_port));
  }
  if (store_port < 0 || store_port > 65535) {
    return cli::fail("launch", "--store-port must be 0..65535, got " + std::to_string(store_port));
  }
  if (store_port != 0 && store_port == master_port) {
    return cli::fail("launch", "--store-port and --master-port must differ (torch's store holds MASTER_PORT)");
  }
  if (!(timeout_s > 0 && timeout_s <= kMaxTimeoutS)) {
    return cli::fail("launch", "--timeout-s must be > 0 and at most a week, got " + std::to_string(timeout_s));
  }
  if (!(kill_grace_s >= 0 && kill_grace_s <= 600)) {
    return cli::fail("launch", "--kill-grace-s must be 0..600, got " + std::to_string(kill_grace_s));
  }
  if (nnodes < 1 || nnodes > kMaxProcesses) {
    return cli::fail("launch",
                     "--nnodes must be 1.." + std::to_string(kMaxProcesses) + ", got " + std::to_string(nnodes));
  }
  if (node_rank < 0 || node_rank >= nnodes) {
    return cli::fail("launch",
                     "--node-rank must be 0.." + std::to_string(nnodes - 1) + ", got " + std::to_string(node_rank));
  }
  if (master_addr.empty() || master_addr.find_first_of(" \t\n") != std::string::npos) {
    return cli::fail("launch", "--master-addr must be a host name or address, got '" + master_addr + "'");
  }
  return std::nullopt;
}

// What the nodes of a job of several must agree on: the store's port (*store_port, master_port + 1
// unless given), the token every host exports (*token) and, for a store other hosts reach, its bind
// address (*store_bind). One node needs none of them but a loopback --master-addr. Returns nullopt
// to go on, or the exit code to return now (the message printed).
std::optional<int> node_settings(const LaunchFlags& f, int64_t* store_port, std::string* token,
                                 std::string* store_bind) {
  const int64_t master_port = f.master_port;
  if (f.nnodes > 1) {
    // Every node's launcher must agree on the ports and the token: none can be made up here.
    if (master_port == 0) return cli::fail("launch", "--nnodes > 1 needs --master-port (the same on every node)");
    if (*store_port == 0) {
      if (master_port == 65535)
        return cli::fail("launch", "--master-port 65535 leaves no port for the store: give --store-port");
      *store_port = master_port + 1;
    }
    // A store reachable from other hosts hands out GPU memory handles to whoever presents the token.
    const char* shared = std::getenv("EXACTCOLL_STORE_TOKEN");
    if (shared == nullptr || std::string(shared).size() < 16) {
      return cli::fail("launch",
                       "--nnodes > 1 needs the same EXACTCOLL_STORE_TOKEN (at least 16 characters) exported on every "
                       "node, e.g.\n  export EXACTCOLL_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n"
                       "made once and copied to every host");
    }
    *token = shared;
    if (!loopback(f.master_addr)) *store_bind = "0.0.0.0";
  } else if (!loopback(f.master_addr)) {
    return cli::fail("launch",
                     "--master-addr other than a loopback address needs --nnodes > 1 (one node serves itself)");
  }
  return std::nullopt;
}

int run_launch(int argc, char** argv) {
  LaunchFlags f;
  cli::ArgParser parser = make_parser(&f);
  if (const auto exit_code = parser.parse(argc, argv)) return *exit_code;

  if (const auto code = check_ranges(parser, f)) return *code;
  int64_t store_port = f.store_port;
  std::string token, store_bind;
  if (const auto code = node_settings(f, &store_port, &token, &store_bind)) return *code;
  const std::vector<std::string>& command = f.command;
  if (command.empty()) {
    return cli::fail("launch", "no command to run: put it after `--`, e.g. exactcoll launch --nproc 2 -- verify");
  }
  if (command[0] == "launch") return cli::fail("launch", "workers cannot run `launch` themselves");

  LaunchOptions options;
  options.executable = "/proc/self/exe";  // this very binary, even if its file was replaced since
  options.argv.push_back("exactcoll");
  options.argv.insert(options.argv.end(), command.begin(), command.end());
  options.nproc = static_cast<int>(f.nproc);
  options.master_port = static_cast<uint16_t>(f.master_port);
  options.store_port = static_cast<uint16_t>(store_port);
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000.0));
  options.kill_grace = std::chrono::milliseconds(static_cast<int64_t>(f.kill_grace_s * 1000.0));
  options.prefix_stderr = !f.no_prefix;
  options.nnodes = static_cast<int>(f.nnodes);
  options.node_rank = static_cast<int>(f.node_rank);
  options.master_addr = f.master_addr;
  options.token = token;
  options.store_bind = store_bind;
  return run_workers(options);
}

const cli::Registrar kRegistrar({"launch", "run N local workers of one job, or one node of several (torchrun-style)",
                                 run_launch});

}  // namespace
}  // namespace exactcoll::launch
