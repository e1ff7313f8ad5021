// The worker bootstrap: environment parsing (every variable missing or malformed gets a clear
// error; the token is required) and connect_worker_store (rank 0 serves, every rank connects).
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "bootstrap/worker_env.h"
#include "bootstrap/worker_store.h"
#include "store/tcp_store_server.h"
#include "tools/launch/launcher.h"

namespace exactcoll {
namespace {

using Env = std::map<std::string, std::string>;

const std::string kToken = "feedfacecafebeef0123456789abcdef";

Env valid_env() {
  return {{"RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "1"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"EXACTCOLL_STORE_TOKEN", kToken}};
}

EnvLookup lookup_in(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

// Returns the BootstrapError message for env ("" when parsing succeeds).
std::string error_for(const Env& env) {
  try {
    parse_worker_env(lookup_in(env));
  } catch (const BootstrapError& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << text << "' lacks '" << part << "'";
}

TEST(WorkerEnvTest, ParsesTorchrunVariables) {
  Env env = valid_env();
  const WorkerEnv parsed = parse_worker_env(lookup_in(env));
  EXPECT_EQ(parsed.rank, 1);
  EXPECT_EQ(parsed.world_size, 4);
  EXPECT_EQ(parsed.local_rank, 1);
  EXPECT_EQ(parsed.master_addr, "127.0.0.1");
  EXPECT_EQ(parsed.master_port, 29500);
  EXPECT_EQ(parsed.store_port, 29501) << "the store defaults to MASTER_PORT + 1, never MASTER_PORT (torch's)";
  EXPECT_EQ(parsed.store_token, kToken);
  EXPECT_EQ(parsed.store_bind_address, "127.0.0.1");
  env["EXACTCOLL_STORE_BIND"] = "0.0.0.0";
  EXPECT_EQ(parse_worker_env(lookup_in(env)).store_bind_address, "0.0.0.0");
}

TEST(WorkerEnvTest, MissingVariablesAreAllNamed) {
  const std::string message = error_for({});
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    expect_contains(message, std::string(name) + " is not set");
  }
  expect_contains(message, "exactcoll launch --nproc N");
}

TEST(WorkerEnvTest, StorePortIsItsOwn) {
  Env env = valid_env();
  env["EXACTCOLL_STORE_PORT"] = "31000";
  WorkerEnv parsed = parse_worker_env(lookup_in(env));
  EXPECT_EQ(parsed.store_port, 31000);
  EXPECT_EQ(parsed.master_port, 29500);
  env.erase("MASTER_PORT");  // not needed once the store's port is given
  parsed = parse_worker_env(lookup_in(env));
  EXPECT_EQ(parsed.store_port, 31000);
  EXPECT_EQ(parsed.master_port, 0);
  env["EXACTCOLL_STORE_PORT"] = "0";
  expect_contains(error_for(env), "EXACTCOLL_STORE_PORT=0 is outside 1..65535");
  env["EXACTCOLL_STORE_PORT"] = "x";
  expect_contains(error_for(env), "EXACTCOLL_STORE_PORT='x' is not a whole number");
  env = valid_env();
  env["MASTER_PORT"] = "65535";
  expect_contains(error_for(env), "MASTER_PORT=65535 leaves no port above it for the exactcoll store");
}

TEST(WorkerEnvTest, MissingTokenSaysHowToSetIt) {
  Env env = valid_env();
  env.erase("EXACTCOLL_STORE_TOKEN");
  const std::string message = error_for(env);
  expect_contains(message, "EXACTCOLL_STORE_TOKEN is not set");
  expect_contains(message, "export EXACTCOLL_STORE_TOKEN=");
  expect_contains(message, "torchrun");
  env["EXACTCOLL_STORE_TOKEN"] = "";
  expect_contains(error_for(env), "EXACTCOLL_STORE_TOKEN is not set");
  env["EXACTCOLL_STORE_TOKEN"] = "short-secret";
  const std::string short_message = error_for(env);
  expect_contains(short_message, "EXACTCOLL_STORE_TOKEN has 12 characters; use at least 16");
  EXPECT_EQ(short_message.find("short-secret"), std::string::npos) << "the token must not be echoed";
}

TEST(WorkerEnvTest, ATokenTooLongForTheHelloIsRefusedWhenTheEnvironmentIsRead) {
  // Issue 15, item 8: 4,088 characters passed this check, then every hello was refused as an
  // oversized frame. 4,087 (1 + 4 + 4 + 4087 = the 4 KiB hello limit) is the longest that works.
  Env env = valid_env();
  env["EXACTCOLL_STORE_TOKEN"] = std::string(4087, 'a');
  EXPECT_EQ(parse_worker_env(lookup_in(env)).store_token.size(), 4087u);
  env["EXACTCOLL_STORE_TOKEN"] = std::string(4088, 'a');
  expect_contains(error_for(env), "EXACTCOLL_STORE_TOKEN has 4088 characters; the store's hello carries at most 4087");
}

TEST(WorkerEnvTest, MalformedValuesAreNamed) {
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"RANK", "one"}, "RANK='one' is not a whole number"},
      {{"RANK", ""}, "RANK='' is not a whole number"},
      {{"RANK", " 1"}, "RANK=' 1' is not a whole number"},
      {{"RANK", "1x"}, "RANK='1x' is not a whole number"},
      {{"RANK", "-1"}, "RANK=-1 is outside 0.."},
      {{"RANK", "4"}, "RANK=4 is not below WORLD_SIZE=4"},
      {{"RANK", "99999999999999999999"}, "RANK='99999999999999999999' is not a whole number"},
      {{"WORLD_SIZE", "0"}, "WORLD_SIZE=0 is outside 1.."},
      {{"LOCAL_RANK", "7"}, "LOCAL_RANK=7 is not below WORLD_SIZE=4"},
      {{"MASTER_PORT", "0"}, "MASTER_PORT=0 is outside 1..65535"},
      {{"MASTER_PORT", "65536"}, "MASTER_PORT=65536 is outside 1..65535"},
      {{"MASTER_PORT", "29500/tcp"}, "MASTER_PORT='29500/tcp' is not a whole number"},
      {{"MASTER_ADDR", ""}, "MASTER_ADDR='' is not a host name or address"},
      {{"MASTER_ADDR", "host name"}, "MASTER_ADDR='host name' is not a host name or address"},
      {{"EXACTCOLL_STORE_BIND", ""}, "EXACTCOLL_STORE_BIND='' is not an address"},
  };
  for (const auto& [assignment, expected] : cases) {
    Env env = valid_env();
    env[assignment.first] = assignment.second;
    SCOPED_TRACE(assignment.first + "=" + assignment.second);
    expect_contains(error_for(env), expected);
  }
}

// (Built with append: GCC 12 at -O3 misreports -Wrestrict on "literal" + std::string here.)
std::string key_of(int rank) { return std::string("r").append(std::to_string(rank)); }

TEST(WorkerStoreTest, RankZeroServesAndEveryRankConnects) {
  constexpr int kWorld = 3;
  const uint16_t port = launch::pick_free_port();
  std::vector<std::thread> ranks;
  std::vector<std::string> seen(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      Env env = valid_env();
      env["RANK"] = env["LOCAL_RANK"] = std::to_string(rank);
      env["WORLD_SIZE"] = std::to_string(kWorld);
      env["EXACTCOLL_STORE_PORT"] = std::to_string(port);
      try {
        WorkerStoreOptions options;
        options.connect_timeout = std::chrono::milliseconds(5000);
        auto store = connect_worker_store(parse_worker_env(lookup_in(env)), options);
        store->set(key_of(rank), std::to_string(rank * 10));
        for (int peer = 0; peer < kWorld; ++peer) {
          seen[rank] += store->get(key_of(peer), std::chrono::milliseconds(5000)) + ",";
        }
        store->barrier("done", kWorld, std::chrono::milliseconds(5000));  // rank 0 leaves last
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < kWorld; ++rank) EXPECT_EQ(seen[rank], "0,10,20,") << "rank " << rank;
}

TEST(WorkerStoreTest, WrongTokenAndBusyPortAreClearErrors) {
  const uint16_t port = launch::pick_free_port();
  Env env0 = valid_env();
  env0["RANK"] = env0["LOCAL_RANK"] = "0";
  env0["WORLD_SIZE"] = "2";
  env0["EXACTCOLL_STORE_PORT"] = std::to_string(port);
  auto rank0 = connect_worker_store(parse_worker_env(lookup_in(env0)));

  Env env1 = env0;
  env1["RANK"] = env1["LOCAL_RANK"] = "1";
  env1["EXACTCOLL_STORE_TOKEN"] = "another-job-token-0123456789";
  try {
    connect_worker_store(parse_worker_env(lookup_in(env1)));
    ADD_FAILURE() << "a rank with another token joined";
  } catch (const StoreError& e) {
    expect_contains(e.what(), "rank 1 of 2");
    expect_contains(e.what(), "wrong token");
  }
  // A second rank 0 on the same port (e.g. two jobs given one EXACTCOLL_STORE_PORT).
  try {
    connect_worker_store(parse_worker_env(lookup_in(env0)));
    ADD_FAILURE() << "two servers on one port";
  } catch (const StoreError& e) {
    expect_contains(e.what(), "rank 0 of 2 could not start the rendezvous store");
    expect_contains(e.what(), "is port " + std::to_string(port) + " taken? set EXACTCOLL_STORE_PORT");
  }
  rank0->set("still", "fine");
  EXPECT_EQ(rank0->get("still", std::chrono::milliseconds(0)), "fine");
}

// The torchrun case: torch's TCPStore already listens on MASTER_PORT in every worker's job. The
// exactcoll store must form anyway, on a port of its own (before 2026-11-24 it bound MASTER_PORT
// and failed with "Address already in use").
TEST(WorkerStoreTest, FormsWhileTorchHoldsMasterPort) {
  TcpStoreServerOptions torch_like;
  torch_like.token = "torch-holds-master-port-000000";
  TcpStoreServer torch_store(torch_like);  // port 0: any free one
  const uint16_t master_port = torch_store.port();
  const uint16_t store_port = launch::pick_free_port();
  ASSERT_NE(master_port, store_port);
  constexpr int kWorld = 2;
  std::vector<std::thread> ranks;
  std::vector<std::string> seen(kWorld);
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      Env env = valid_env();
      env["RANK"] = env["LOCAL_RANK"] = std::to_string(rank);
      env["WORLD_SIZE"] = std::to_string(kWorld);
      env["MASTER_PORT"] = std::to_string(master_port);
      env["EXACTCOLL_STORE_PORT"] = std::to_string(store_port);
      try {
        WorkerStoreOptions options;
        options.connect_timeout = std::chrono::milliseconds(5000);
        auto store = connect_worker_store(parse_worker_env(lookup_in(env)), options);
        store->set(key_of(rank), "here");
        seen[rank] = store->get(key_of(1 - rank), std::chrono::milliseconds(5000));
        store->barrier("done", kWorld, std::chrono::milliseconds(5000));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": " << e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(seen[0], "here");
  EXPECT_EQ(seen[1], "here");
}

}  // namespace
}  // namespace exactcoll
