// The rendezvous store interface: a small key-value service every rank of a job reaches. The CUDA
// backend's TCP store (cuda_backend/store) and the simulator's in-process store (sim/) implement
// it, so the handle-exchange protocol (core/handle_exchange.h) is one piece of code, tested in the
// simulator and run on the GPUs. Host-only; bootstrap path, so virtual calls are fine here.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace exactcoll {

// Every failure of a store call (timeout, refused, connection lost) throws this, with a message
// that names the operation and the key or barrier that did not complete.
struct StoreError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Store {
 public:
  virtual ~Store() = default;

  // Sets key to value (overwrites).
  virtual void set(const std::string& key, const std::string& value) = 0;

  // Returns the value of key, waiting until some rank sets it. Throws StoreError naming the key
  // after `timeout`.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;

  // Adds delta to the integer at key (missing = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Deletes key; returns whether it existed.
  virtual bool erase(const std::string& key) = 0;

  // Returns once `world_size` callers have entered barrier `name`. Throws StoreError naming the
  // barrier and how many arrived after `timeout`. A name may be reused once every caller has left.
  virtual void barrier(const std::string& name, int world_size, std::chrono::milliseconds timeout) = 0;
};

}  // namespace exactcoll
