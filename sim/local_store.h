// An in-process Store (core/store.h) for the simulator: ranks are threads of one process, so the
// rendezvous service is a map under a mutex. Waits are real (a condition variable) and bounded:
// a get or barrier that does not complete within its timeout throws StoreError naming the key or
// barrier and, for barriers, the ranks that never arrived (core/store.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/store.h"

namespace exactcoll::sim {

class LocalStore final : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool erase(const std::string& key) override;
  using Store::barrier;
  void barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) override;

  // Returns how many keys are stored (tests check that exchanges clean up after themselves).
  size_t size() const;

 private:
  struct Barrier {
    int arrived = 0;
    std::vector<int> ranks;   // of the callers waiting now that gave one, sorted
    std::vector<int> left;    // of callers that came and gave up before the round ended, sorted
    uint64_t generation = 0;  // completed rounds; a waiter leaves when it changes
  };
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
  std::map<std::string, Barrier> barriers_;
};

}  // namespace exactcoll::sim
