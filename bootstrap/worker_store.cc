#include "bootstrap/worker_store.h"

#include <string>

#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"

namespace exactcoll {
namespace {

// A worker's Store: its client, plus on rank 0 the server. The client is declared last so that it
// is destroyed first, before the server it talks to.
class WorkerStore final : public Store {
 public:
  WorkerStore(std::unique_ptr<TcpStoreServer> server, std::unique_ptr<TcpStoreClient> client)
      : server_(std::move(server)), client_(std::move(client)) {}

  void set(const std::string& key, const std::string& value) override { client_->set(key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return client_->get(key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return client_->add(key, delta); }
  bool erase(const std::string& key) override { return client_->erase(key); }
  using Store::barrier;
  void barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) override {
    client_->barrier(name, rank, world_size, timeout);
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
};

bool is_loopback(const std::string& host) { return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0; }

}  // namespace

std::unique_ptr<Store> connect_worker_store(const WorkerEnv& env, const WorkerStoreOptions& options) {
  const std::string who = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size);
  TcpStoreClientOptions client_options;
  client_options.token = env.store_token;
  client_options.port = env.store_port;
  client_options.connect_timeout = options.connect_timeout;
  client_options.request_timeout = options.request_timeout;
  client_options.server_owner = "rank 0";  // a lost connection then names the rank that died

  // 1. Rank 0 serves first, so that the others' connection retries find it.
  std::unique_ptr<TcpStoreServer> server;
  if (env.rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.bind_address = env.store_bind_address;
    server_options.port = env.store_port;
    server_options.token = env.store_token;
    try {
      server = std::make_unique<TcpStoreServer>(server_options);
    } catch (const StoreError& e) {
      throw StoreError(who + " could not start the rendezvous store: " + e.what() + " (is port " +
                       std::to_string(env.store_port) +
                       " taken? set EXACTCOLL_STORE_PORT to a free port; the default is MASTER_PORT + 1)");
    }
    // Rank 0 reaches its own server on the address it bound (loopback when it bound every interface).
    const std::string& bound = env.store_bind_address;
    client_options.host = bound == "0.0.0.0" ? "127.0.0.1" : bound == "::" ? "::1" : bound;
  } else {
    client_options.host = env.master_addr;
  }

  // 2. Every rank connects and authenticates.
  std::unique_ptr<TcpStoreClient> client;
  try {
    client = std::make_unique<TcpStoreClient>(client_options);
  } catch (const StoreError& e) {
    std::string hint;
    if (env.rank != 0 && !is_loopback(env.master_addr)) {
      hint =
          " (rank 0's store binds 127.0.0.1 unless EXACTCOLL_STORE_BIND is set; for ranks on other hosts set "
          "EXACTCOLL_STORE_BIND=0.0.0.0 for rank 0)";
    }
    throw StoreError(who + ": " + e.what() + hint);
  }
  return std::make_unique<WorkerStore>(std::move(server), std::move(client));
}

}  // namespace exactcoll
