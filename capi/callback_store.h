// A Store (core/store.h) over the caller's C callbacks (exactcoll_store_callbacks): how a
// communicator forms over whatever key-value store the program already has (torch.distributed's
// c10d store, a Ray actor, MPI, ...).
//
// The callbacks provide set, get-with-timeout, add and (optionally) erase. The barrier is
// core/key_barrier.h's, built on those keys alone: a timeout names the ranks that never arrived,
// and a name can be reused. Without an erase callback the barrier's spent keys stay in the store.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/store.h"
#include "exactcoll/exactcoll.h"

namespace exactcoll::capi {

class CallbackStore final : public Store {
 public:
  // Preconditions: callbacks has set, get and add; 0 <= rank < world_size.
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

  exactcoll_store_callbacks callbacks_;
  int rank_;
  int world_size_;
};

// The message a callback left with exactcoll_set_store_error (this thread), then cleared.
std::string take_store_callback_message();

}  // namespace exactcoll::capi
