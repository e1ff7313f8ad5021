// A Store (core/store.h) over the caller's C callbacks (exactcoll_store_callbacks): how a
// communicator forms over whatever key-value store the program already has (torch.distributed's
// c10d store, a Ray actor, MPI, ...).
//
// The callbacks provide set, get-with-timeout, add and (optionally) erase. The barrier is built on
// set and get: entering barrier `name` for the k-th time, rank r sets "<name>/<k>/<r>" and then
// gets every rank's key of round k within the one deadline, so a timeout names the first rank that
// never arrived. Every rank counts its entries per name the same way (barriers are collective), so
// a name can be reused; after passing round k a rank erases its key of round k - 1 (every rank has
// then left round k - 1).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
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
  void barrier(const std::string& name, int world_size, std::chrono::milliseconds timeout) override;

 private:
  // Throws StoreError "store callback <what> failed with <status>: <message>" unless status is 0.
  void check(int status, const std::string& what) const;

  exactcoll_store_callbacks callbacks_;
  int rank_;
  int world_size_;
  std::map<std::string, uint64_t> barrier_rounds_;  // name -> rounds entered
};

// The message a callback left with exactcoll_set_store_error (this thread), then cleared.
std::string take_store_callback_message();

}  // namespace exactcoll::capi
