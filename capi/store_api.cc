// The C API's stores (exactcoll.h, "stores"): the caller's callbacks, or the library's TCP store.
#include "capi/store_api.h"

#include <charconv>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include "capi/api_support.h"
#include "capi/callback_store.h"
#include "bootstrap/worker_env.h"
#include "bootstrap/worker_store.h"

using namespace exactcoll;
using namespace exactcoll::capi;

namespace {

// The environment variable of exactcoll_store_create_from_env's connect timeout, its default and
// its largest value (about 24.8 days, the longest wait the TCP store's client asks for).
constexpr const char* kConnectTimeoutVariable = "EXACTCOLL_STORE_CONNECT_TIMEOUT_MS";
constexpr int64_t kDefaultConnectTimeoutMs = 60000;
constexpr int64_t kLongestConnectTimeoutMs = (int64_t{1} << 31) - 1;

static_assert(EXACTCOLL_MAX_STORE_RANKS == kMaxStoreRanks, "the header states the library's bound");

// A store behind a handle, with this process's place in the job it was made for (its barriers
// name the ranks that never arrived with it).
struct StoreEntry {
  std::shared_ptr<Store> store;
  int rank = 0;
  int world_size = 1;
};

HandleTable<StoreEntry>& stores() {
  static HandleTable<StoreEntry>* table = new HandleTable<StoreEntry>();  // never destroyed: usable at exit
  return *table;
}

// The TCP store as the C API hands it out: a barrier of the whole job whose caller does not say
// its rank (the communicator's own barriers) gives this process's rank, so that its timeout names
// the ranks that never arrived rather than counting callers, as the callback store's does.
class JobStore final : public Store {
 public:
  // Preconditions: store is not null; 0 <= rank < world_size.
  JobStore(std::unique_ptr<Store> store, int rank, int world_size)
      : store_(std::move(store)), rank_(rank), world_size_(world_size) {}

  void set(const std::string& key, const std::string& value) override { store_->set(key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return store_->get(key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  bool erase(const std::string& key) override { return store_->erase(key); }
  using Store::barrier;
  void barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) override {
    const bool whole_job = rank == kUnknownRank && world_size == world_size_;
    store_->barrier(name, whole_job ? rank_ : rank, world_size, timeout);
  }

 private:
  std::unique_ptr<Store> store_;
  int rank_;
  int world_size_;
};

// INVALID_ARGUMENT unless 1 <= world_size <= kMaxStoreRanks and 0 <= rank < world_size.
void check_rank(int rank, int world_size) {
  if (world_size < 1 || world_size > kMaxStoreRanks) {
    bad_argument("world_size must be 1.." + std::to_string(kMaxStoreRanks) +
                 " (EXACTCOLL_MAX_STORE_RANKS, the most ranks a store's job may have), got " +
                 std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    bad_argument("rank " + std::to_string(rank) + " is outside 0.." + std::to_string(world_size - 1));
  }
}

exactcoll_store publish(std::shared_ptr<Store> store, int rank, int world_size) {
  return exactcoll_store{stores().add(std::make_shared<StoreEntry>(StoreEntry{std::move(store), rank, world_size}))};
}

// Connects through the worker bootstrap (rank 0 serves, every rank connects).
std::shared_ptr<Store> connect(const WorkerEnv& env, std::chrono::milliseconds connect_timeout) {
  WorkerStoreOptions options;
  options.connect_timeout = connect_timeout;
  return std::make_shared<JobStore>(connect_worker_store(env, options), env.rank, env.world_size);
}

// The connect timeout exactcoll_store_create_from_env uses: EXACTCOLL_STORE_CONNECT_TIMEOUT_MS, a
// whole number of milliseconds in 1..kLongestConnectTimeoutMs, or kDefaultConnectTimeoutMs when
// it is not set. INVALID_ARGUMENT naming the variable and its value otherwise.
// Example: EXACTCOLL_STORE_CONNECT_TIMEOUT_MS=5000 gives 5000 ms; "5s", "0" and "" are refused.
std::chrono::milliseconds connect_timeout_from(const EnvLookup& lookup) {
  const std::optional<std::string> text = lookup(kConnectTimeoutVariable);
  if (!text) return std::chrono::milliseconds(kDefaultConnectTimeoutMs);
  int64_t value = 0;
  const char* end = text->data() + text->size();
  const auto [stop, error] = std::from_chars(text->data(), end, value);
  if (text->empty() || error != std::errc() || stop != end || value < 1 || value > kLongestConnectTimeoutMs) {
    bad_argument(std::string(kConnectTimeoutVariable) + "='" + *text +
                 "' is not a whole number of milliseconds in 1.." + std::to_string(kLongestConnectTimeoutMs) +
                 " (unset, the default is " + std::to_string(kDefaultConnectTimeoutMs) + ")");
  }
  return std::chrono::milliseconds(value);
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
    *store = publish(std::make_shared<CallbackStore>(*callbacks, rank, world_size), rank, world_size);
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
    if (connect_timeout_ms < 1 || connect_timeout_ms > kLongestConnectTimeoutMs) {
      bad_argument("connect_timeout_ms must be 1.." + std::to_string(kLongestConnectTimeoutMs) +
                   " (about 24.8 days), got " + std::to_string(connect_timeout_ms));
    }
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
    *store = publish(connect(env, std::chrono::milliseconds(connect_timeout_ms)), rank, world_size);
  });
}

int exactcoll_store_create_from_env(exactcoll_store* store, int* rank, int* world_size) {
  return guarded("exactcoll_store_create_from_env", [&] {
    require(store, "the result pointer");
    const EnvLookup environment = process_environment();
    WorkerEnv env;
    try {
      env = parse_worker_env(environment);
    } catch (const BootstrapError& e) {
      bad_argument(e.what());
    }
    if (env.world_size > kMaxStoreRanks) {
      bad_argument("WORLD_SIZE=" + std::to_string(env.world_size) + " is more than " + std::to_string(kMaxStoreRanks) +
                   " (EXACTCOLL_MAX_STORE_RANKS, the most ranks a store's job may have)");
    }
    const std::chrono::milliseconds connect_timeout = connect_timeout_from(environment);
    *store = publish(connect(env, connect_timeout), env.rank, env.world_size);
    if (rank != nullptr) *rank = env.rank;
    if (world_size != nullptr) *world_size = env.world_size;
  });
}

int exactcoll_store_barrier(exactcoll_store store, const char* name, int64_t timeout_ms) {
  return guarded("exactcoll_store_barrier", [&] {
    require(name, "name");
    if (timeout_ms < 0) bad_argument("timeout_ms must be >= 0, got " + std::to_string(timeout_ms));
    const std::shared_ptr<StoreEntry> entry = stores().get(store.id, "store");
    entry->store->barrier(std::string("user/") + name, entry->rank, entry->world_size,
                          std::chrono::milliseconds(timeout_ms));
  });
}

int exactcoll_store_destroy(exactcoll_store store) {
  return guarded("exactcoll_store_destroy", [&] { stores().remove(store.id, "store"); });
}

}  // extern "C"
