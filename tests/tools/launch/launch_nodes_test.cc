// `exactcoll launch --nnodes M --node-rank K --master-addr A --master-port P`: two launchers on this
// host stand for two nodes (the network is loopback), their workers meet in one store and agree on
// a node-major layout; the token is required; bad flags are refused. Also the node-place parsing
// (cuda_backend/multinode/node_env.h) on its own.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "cuda_backend/multinode/node_env.h"
#include "tests/support/command_runner.h"
#include "tools/launch/launcher.h"

namespace exactcoll {
namespace {

std::string binary() { return test_support::runfile("tests/tools/launch/node_test_worker"); }

struct Outcome {
  int code = -1;
  std::string text;
};

// Starts `command` in the background with its output in a file; wait() returns its outcome.
class Background {
 public:
  Background(const std::string& command, const std::string& name) {
    out_ = test_support::temp_path(name + ".txt");
    pipe_ = popen((command + " >" + out_ + " 2>&1; echo $?").c_str(), "r");
  }
  Outcome wait() {
    Outcome o;
    char code[16] = {};
    if (pipe_ != nullptr && std::fgets(code, sizeof code, pipe_) != nullptr) o.code = std::atoi(code);
    if (pipe_ != nullptr) pclose(pipe_);
    pipe_ = nullptr;
    o.text = test_support::read_file(out_);
    return o;
  }
  ~Background() {
    if (pipe_ != nullptr) pclose(pipe_);
  }

 private:
  std::string out_;
  FILE* pipe_ = nullptr;
};

std::string launch_node(int nnodes, int node, int nproc, uint16_t port, uint16_t store_port) {
  return "EXACTCOLL_STORE_TOKEN=0123456789abcdef0123 " + binary() + " launch --nnodes " + std::to_string(nnodes) +
         " --node-rank " + std::to_string(node) + " --nproc " + std::to_string(nproc) +
         " --master-addr 127.0.0.1 --master-port " + std::to_string(port) + " --store-port " +
         std::to_string(store_port) + " --timeout-s 60 -- node_worker";
}

TEST(LaunchNodes, TwoLaunchersFormOneNodeMajorJob) {
  // The store's port is picked free too: its default, MASTER_PORT + 1, may be anyone's (a test
  // beside this one once held it: "bind: Address already in use").
  const uint16_t port = launch::pick_free_port();
  const uint16_t store_port = launch::pick_free_port_except(port);
  Background node1(launch_node(2, 1, 2, port, store_port), "node1");  // node 1 may start first: its ranks wait
  Background node0(launch_node(2, 0, 2, port, store_port), "node0");
  const Outcome a = node0.wait(), b = node1.wait();
  ASSERT_EQ(a.code, 0) << a.text;
  ASSERT_EQ(b.code, 0) << b.text;
  for (const char* line : {"node_worker: rank 0 node 0 local 0: 2 nodes x 2 local ranks",
                           "node_worker: rank 1 node 0 local 1: 2 nodes x 2 local ranks"}) {
    EXPECT_NE(a.text.find(line), std::string::npos) << a.text;
  }
  for (const char* line : {"node_worker: rank 2 node 1 local 0: 2 nodes x 2 local ranks",
                           "node_worker: rank 3 node 1 local 1: 2 nodes x 2 local ranks"}) {
    EXPECT_NE(b.text.find(line), std::string::npos) << b.text;
  }
}

// tools/multinode/emulate_nodes.sh (the recipe for issue 17's emulated nodes): 3 nodes of 2 ranks
// on this host, each node seeing its own GPUs, meeting in one store.
TEST(LaunchNodes, EmulateNodesScript) {
  const std::string script = test_support::runfile("tools/multinode/emulate_nodes.sh");
  const uint16_t port = launch::pick_free_port();
  const uint16_t store_port = launch::pick_free_port_except(port);
  Background run("EXACTCOLL=" + binary() + " MASTER_PORT=" + std::to_string(port) +
                     " EXACTCOLL_STORE_PORT=" + std::to_string(store_port) + " bash " + script + " 3 2 node_worker",
                 "emulate");
  const Outcome o = run.wait();
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("node_worker: rank 0 node 0 local 0: 3 nodes x 2 local ranks (CUDA_VISIBLE_DEVICES=0,1)"),
            std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("node_worker: rank 5 node 2 local 1: 3 nodes x 2 local ranks (CUDA_VISIBLE_DEVICES=4,5)"),
            std::string::npos)
      << o.text;
}

TEST(LaunchNodes, SeveralNodesNeedTheTokenAndThePort) {
  Outcome o;
  {
    Background no_token("env -u EXACTCOLL_STORE_TOKEN " + binary() +
                            " launch --nnodes 2 --node-rank 0 --nproc 1 --master-port 29999 -- node_worker",
                        "no_token");
    o = no_token.wait();
  }
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("--nnodes > 1 needs the same EXACTCOLL_STORE_TOKEN"), std::string::npos) << o.text;
  {
    Background no_port("EXACTCOLL_STORE_TOKEN=0123456789abcdef0123 " + binary() +
                           " launch --nnodes 2 --node-rank 1 --nproc 1 -- node_worker",
                       "no_port");
    o = no_port.wait();
  }
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("--nnodes > 1 needs --master-port"), std::string::npos) << o.text;
  {
    Background bad_rank(binary() + " launch --nnodes 2 --node-rank 2 --nproc 1 --master-port 29999 -- node_worker",
                        "bad_rank");
    o = bad_rank.wait();
  }
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.text.find("--node-rank must be 0..1, got 2"), std::string::npos) << o.text;
}

EnvLookup lookup_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(NodeEnv, TorchrunAndLaunchVariables) {
  WorkerEnv env;
  env.rank = 5;
  env.world_size = 8;
  env.local_rank = 1;
  multinode::RankPlace p = cuda::node_place_from_env(lookup_of({{"GROUP_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}), env);
  EXPECT_EQ(p.node, 1);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world_size, 4);
  p = cuda::node_place_from_env(lookup_of({{"NODE_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}), env);
  EXPECT_EQ(p.node, 1);
  // No node variable: one node of every rank.
  p = cuda::node_place_from_env(lookup_of({}), env);
  EXPECT_EQ(p.node, 0);
  EXPECT_EQ(p.local_world_size, 8);
  auto error = [&](std::map<std::string, std::string> vars) {
    try {
      cuda::node_place_from_env(lookup_of(vars), env);
    } catch (const BootstrapError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({{"GROUP_RANK", "x"}, {"LOCAL_WORLD_SIZE", "4"}}).find("GROUP_RANK='x' is not a whole number"),
            std::string::npos);
  EXPECT_NE(error({{"GROUP_RANK", "1"}}).find("LOCAL_WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error({{"GROUP_RANK", "1"}, {"LOCAL_WORLD_SIZE", "3"}})
                .find("WORLD_SIZE=8 is not a multiple of LOCAL_WORLD_SIZE=3"),
            std::string::npos);
  EXPECT_NE(
      error({{"GROUP_RANK", "1"}, {"LOCAL_WORLD_SIZE", "1"}}).find("LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1"),
      std::string::npos);
}

// node_place: the C API's and Python's way (the caller gives its rank; fields override the
// variables; the local rank follows from node-major numbering).
TEST(NodeEnv, PlaceFromFieldsOrVariables) {
  multinode::RankPlace p = cuda::node_place(lookup_of({{"GROUP_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}), 5, 8, -1, 0);
  EXPECT_EQ(p.node, 1);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world_size, 4);
  p = cuda::node_place(lookup_of({}), 5, 8, 1, 4);  // the fields alone
  EXPECT_EQ(p.node, 1);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world_size, 4);
  p = cuda::node_place(lookup_of({{"GROUP_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}}), 6, 8, 3, 2);  // fields win
  EXPECT_EQ(p.node, 3);
  EXPECT_EQ(p.local_rank, 0);
  EXPECT_EQ(p.local_world_size, 2);
  p = cuda::node_place(lookup_of({}), 5, 8, -1, 0);  // nothing: one node
  EXPECT_EQ(p.node, 0);
  EXPECT_EQ(p.local_rank, 5);
  EXPECT_EQ(p.local_world_size, 8);
  auto error = [&](std::map<std::string, std::string> vars, int rank, int node, int local_world) {
    try {
      cuda::node_place(lookup_of(vars), rank, 8, node, local_world);
    } catch (const BootstrapError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error({{"GROUP_RANK", "1"}}, 5, -1, 0).find("LOCAL_WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(error({}, 5, -1, 3).find("world_size 8 is not a multiple of 3 ranks per node"), std::string::npos);
  EXPECT_NE(error({}, 5, 0, 4).find("rank 5 is not on node 0 of 4 ranks"), std::string::npos);
  EXPECT_NE(error({{"LOCAL_WORLD_SIZE", "-2"}}, 5, 0, 0).find("LOCAL_WORLD_SIZE='-2' is not a whole number"),
            std::string::npos);
}

}  // namespace
}  // namespace exactcoll
