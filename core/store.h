// The rendezvous store interface: a small key-value service every rank of a job reaches. The CUDA
// backend's TCP store (store) and the simulator's in-process store (sim/) implement
// it, so the handle-exchange protocol (core/handle_exchange.h) is one piece of code, tested in the
// simulator and run on the GPUs. Host-only; bootstrap path, so virtual calls are fine here.
#pragma once

#include <algorithm>
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

// The most ranks one store's job, and so one barrier, may have. It is the TCP store's count of job
// slots (TcpStoreServerOptions::max_connections: one connection per rank), and it bounds what a
// barrier timeout does to list the missing ranks (core/key_barrier.h reads one key per rank).
// The C API refuses a larger world_size when a store is made (EXACTCOLL_MAX_STORE_RANKS).
inline constexpr int kMaxStoreRanks = 1024;

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
// alike. `present` (sorted) are the ranks of the callers waiting at the deadline (the caller that
// timed out among them), `arrived` how many callers wait in all (callers without a rank count
// here only), and `left` (sorted) the ranks that came but left before the end (their own timeout,
// or their process ended). When every waiting caller gave its rank, the message names the ranks
// that never came.
// Example: barrier_timeout_message("start", 3, 1, {2}, {0}, 500ms) ==
//   "barrier 'start': rank 1 never arrived within 500 ms (1 of 3 waiting: rank 2; rank 0 came
//    but left before the end: its own timeout, or its process ended)"
// Without ranks: "barrier 'start': only 1 of 3 callers arrived within 500 ms (callers that give
// their rank are named)".
inline std::string barrier_timeout_message(const std::string& name, int world_size, size_t arrived,
                                           const std::vector<int>& present, const std::vector<int>& left,
                                           std::chrono::milliseconds timeout) {
  auto ranks_text = [](const std::vector<int>& values) {
    std::string text = values.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
    return text;
  };
  const std::string within = " within " + std::to_string(timeout.count()) + " ms";
  const std::string left_text =
      left.empty() ? ""
                   : "; " + ranks_text(left) + " came but left before the end: its own timeout, or its process ended";
  if (present.size() == arrived) {
    std::vector<int> missing;
    for (int r = 0; r < world_size; ++r) {
      const bool came =
          std::binary_search(present.begin(), present.end(), r) || std::binary_search(left.begin(), left.end(), r);
      if (!came) missing.push_back(r);
    }
    if (!missing.empty()) {
      return "barrier '" + name + "': " + ranks_text(missing) + " never arrived" + within + " (" +
             std::to_string(arrived) + " of " + std::to_string(world_size) + " waiting" +
             (present.empty() ? "" : ": " + ranks_text(present)) + left_text + ")";
    }
  }
  return "barrier '" + name + "': only " + std::to_string(arrived) + " of " + std::to_string(world_size) +
         " callers arrived" + within + (present.empty() ? "" : " (among them " + ranks_text(present) + ")") +
         left_text + (present.size() == arrived ? "" : " (callers that give their rank are named)");
}

}  // namespace exactcoll
