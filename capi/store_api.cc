// The C API's stores (exactcoll.h, "stores"): the caller's callbacks, or the library's TCP store.
#include "capi/store_api.h"

#include <chrono>
#include <string>

#include "capi/api_support.h"
#include "capi/callback_store.h"
#include "bootstrap/worker_env.h"
#include "bootstrap/worker_store.h"

using namespace exactcoll;
using namespace exactcoll::capi;

namespace {

// A store behind a handle, with the size of the job it was made for (its barriers need it).
struct StoreEntry {
  std::shared_ptr<Store> store;
  int world_size = 1;
};

HandleTable<StoreEntry>& stores() {
  static HandleTable<StoreEntry>* table = new HandleTable<StoreEntry>();  // never destroyed: usable at exit
  return *table;
}

void check_rank(int rank, int world_size) {
  if (world_size < 1) bad_argument("world_size must be >= 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size) {
    bad_argument("rank " + std::to_string(rank) + " is outside 0.." + std::to_string(world_size - 1));
  }
}

exactcoll_store publish(std::shared_ptr<Store> store, int world_size) {
  return exactcoll_store{stores().add(std::make_shared<StoreEntry>(StoreEntry{std::move(store), world_size}))};
}

// Connects through the worker bootstrap (rank 0 serves, every rank connects), turning a bad
// environment into INVALID_ARGUMENT.
std::shared_ptr<Store> connect(const WorkerEnv& env, std::chrono::milliseconds connect_timeout) {
  WorkerStoreOptions options;
  options.connect_timeout = connect_timeout;
  return connect_worker_store(env, options);
}

}  // namespace

namespace exactcoll::capi {

std::shared_ptr<Store> store_of(exactcoll_store store) { return stores().get(store.id, "store")->store; }

}  // namespace exactcoll::capi

extern "C" {

int exactcoll_store_create(const exactcoll_store_callbacks* callbacks, int rank, int world_size,
                           exactcoll_store* store) {
  return guarded("exactcoll_store_create", [&] {
    require(callbacks, "callbacks");
    require(store, "the result pointer");
    require_struct_size(callbacks->struct_size, sizeof(exactcoll_store_callbacks), "exactcoll_store_callbacks");
    if (callbacks->set == nullptr || callbacks->get == nullptr || callbacks->add == nullptr) {
      bad_argument("the set, get and add callbacks are required (erase may be NULL)");
    }
    check_rank(rank, world_size);
    *store = publish(std::make_shared<CallbackStore>(*callbacks, rank, world_size), world_size);
  });
}

int exactcoll_store_create_tcp(const char* host, int port, const char* bind_address, const char* token, int rank,
                               int world_size, int64_t connect_timeout_ms, exactcoll_store* store) {
  return guarded("exactcoll_store_create_tcp", [&] {
    require(host, "host");
    require(token, "token");
    require(store, "the result pointer");
    check_rank(rank, world_size);
    if (port < 1 || port > 65535) bad_argument("port must be 1..65535, got " + std::to_string(port));
    if (connect_timeout_ms < 1) bad_argument("connect_timeout_ms must be >= 1");
    // The same checks as a worker's environment, by the same code.
    const std::string port_text = std::to_string(port);
    const std::string rank_text = std::to_string(rank), world_text = std::to_string(world_size);
    const std::string bind = bind_address == nullptr ? "127.0.0.1" : bind_address;
    WorkerEnv env;
    try {
      env = parse_worker_env([&](const std::string& name) -> std::optional<std::string> {
        if (name == "RANK" || name == "LOCAL_RANK") return rank_text;
        if (name == "WORLD_SIZE") return world_text;
        if (name == "MASTER_ADDR") return std::string(host);
        if (name == "EXACTCOLL_STORE_PORT") return port_text;
        if (name == "EXACTCOLL_STORE_TOKEN") return std::string(token);
        if (name == "EXACTCOLL_STORE_BIND") return bind;
        return std::nullopt;
      });
    } catch (const BootstrapError& e) {
      bad_argument(e.what());
    }
    *store = publish(connect(env, std::chrono::milliseconds(connect_timeout_ms)), world_size);
  });
}

int exactcoll_store_create_from_env(exactcoll_store* store, int* rank, int* world_size) {
  return guarded("exactcoll_store_create_from_env", [&] {
    require(store, "the result pointer");
    WorkerEnv env;
    try {
      env = parse_worker_env(process_environment());
    } catch (const BootstrapError& e) {
      bad_argument(e.what());
    }
    *store = publish(connect(env, std::chrono::milliseconds(60000)), env.world_size);
    if (rank != nullptr) *rank = env.rank;
    if (world_size != nullptr) *world_size = env.world_size;
  });
}

int exactcoll_store_barrier(exactcoll_store store, const char* name, int64_t timeout_ms) {
  return guarded("exactcoll_store_barrier", [&] {
    require(name, "name");
    if (timeout_ms < 0) bad_argument("timeout_ms must be >= 0, got " + std::to_string(timeout_ms));
    const std::shared_ptr<StoreEntry> entry = stores().get(store.id, "store");
    entry->store->barrier(std::string("user/") + name, entry->world_size, std::chrono::milliseconds(timeout_ms));
  });
}

int exactcoll_store_destroy(exactcoll_store store) {
  return guarded("exactcoll_store_destroy", [&] { stores().remove(store.id, "store"); });
}

}  // extern "C"
