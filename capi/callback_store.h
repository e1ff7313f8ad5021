// A Store (core/store.h) over the caller's C callbacks (exactcoll_store_callbacks): how a
// communicator forms over whatever key-value store the program already has (torch.distributed's
// c10d store, a Ray actor, MPI, ...).
//
// The callbacks provide set, get-with-timeout, add and (optionally) erase. The barrier is
// core/key_barrier.h's, built on those keys alone: a timeout names the ranks that never arrived,
// and a name can be reused. Without an erase callback the barrier's spent keys stay in the store.
//
// Thread-safe: the callbacks of one store run one at a time (a mutex held for each call; a get
// that waits holds it while it waits), as exactcoll.h promises, whichever threads use the store.
// A callback that uses its own store through the library is a StoreError, not a wait on itself.
// What a callback reports is checked: a get that returns EXACTCOLL_OK without a length, or with a
// length no value of the library can have, is a StoreError naming the key, never a value.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <string>

#include "core/store.h"
#include "exactcoll/exactcoll.h"
#include "store/wire.h"

namespace exactcoll::capi {

class CallbackStore final : public Store {
 public:
  // Preconditions: callbacks has set, get and add; 0 <= rank < world_size <= kMaxStoreRanks.
  CallbackStore(const exactcoll_store_callbacks& callbacks, int rank, int world_size);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool erase(const std::string& key) override;
  // rank kUnknownRank stands for this store's own rank.
  void barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) override;
  using Store::barrier;

 private:
  // Throws StoreError "store callback <what> failed with <status>: <message>" unless status is 0.
  void check(int status, const std::string& what) const;

  // Returns call() (one callback call) made under callback_mutex_. Throws StoreError naming `what`
  // when this thread is already inside a callback of this store (the mutex would wait forever).
  template <class Call>
  int serialized(const std::string& what, Call call);

  exactcoll_store_callbacks callbacks_;
  std::mutex callback_mutex_;                       // held for each callback call
  std::atomic<std::thread::id> callback_thread_{};  // the thread inside a callback, if any
  int rank_;
  int world_size_;
};

// The longest value a get callback may report: no value of the library is longer, since every one
// also travels through the TCP store, whose frames are at most this long.
inline constexpr size_t kMaxCallbackValueBytes = store_wire::kDefaultMaxFrameBytes;

// The message a callback left with exactcoll_set_store_error (this thread), then cleared.
std::string take_store_callback_message();

}  // namespace exactcoll::capi
