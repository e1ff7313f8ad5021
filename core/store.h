// The rendezvous store interface: a small key-value service every rank of a job reaches. The CUDA
// backend's TCP store (cuda_backend/store) and the simulator's in-process store (sim/) implement
// it, so the handle-exchange protocol (core/handle_exchange.h) is one piece of code, tested in the
// simulator and run on the GPUs. Host-only; bootstrap path, so virtual calls are fine here.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace exactcoll {

// Every failure of a store call (timeout, refused, connection lost) throws this, with a message
// that names the operation and the key or barrier that did not complete.
struct StoreError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The rank a barrier caller gives when it does not say who it is.
inline constexpr int kUnknownRank = -1;

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

  // Returns once `world_size` callers have entered barrier `name`. `rank` is the caller's rank
  // (0 <= rank < world_size), or kUnknownRank. After `timeout` throws StoreError naming the
  // barrier and the ranks that never arrived — every caller that did gave its rank — or else how
  // many callers arrived (barrier_timeout_message() words it). A name may be reused once every
  // caller has left; two callers giving the same rank at once is an error.
  virtual void barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) = 0;

  // The same without the caller's rank: a timeout can only say how many arrived.
  // (Implementations add `using Store::barrier;` so that it stays visible beside their override.)
  void barrier(const std::string& name, int world_size, std::chrono::milliseconds timeout) {
    barrier(name, kUnknownRank, world_size, timeout);
  }
};

// Returns the message of a barrier timeout, shared by the stores so that every one words it
// alike: `arrived` callers came within `timeout`, and `ranks` (sorted) are those of them that
// gave their rank. When every arrival gave one, the message names the ranks that never came.
// Example: barrier_timeout_message("start", 3, 2, {0, 1}, 500ms) ==
//   "barrier 'start': rank 2 never arrived within 500 ms (2 of 3 arrived: ranks 0, 1)"
inline std::string barrier_timeout_message(const std::string& name, int world_size, size_t arrived,
                                           const std::vector<int>& ranks, std::chrono::milliseconds timeout) {
  auto list = [](const std::vector<int>& values) {
    std::string text;
    for (const int v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
    return text;
  };
  const std::string within = " within " + std::to_string(timeout.count()) + " ms";
  const std::string counted = std::to_string(arrived) + " of " + std::to_string(world_size) + " arrived";
  if (ranks.size() == arrived) {
    std::vector<int> missing;
    size_t next = 0;
    for (int r = 0; r < world_size; ++r) {
      if (next < ranks.size() && ranks[next] == r) {
        ++next;
      } else {
        missing.push_back(r);
      }
    }
    if (!missing.empty()) {
      return "barrier '" + name + "': " + (missing.size() == 1 ? "rank " : "ranks ") + list(missing) +
             " never arrived" + within + " (" + counted + (ranks.empty() ? "" : ": ranks " + list(ranks)) + ")";
    }
  }
  return "barrier '" + name + "': only " + counted + within +
         (ranks.empty() ? " (callers that give their rank would be named)" : " (among them ranks " + list(ranks) + ")");
}

}  // namespace exactcoll
