// core/key_barrier.h over the simulator's in-process store, using only its set, get, add and erase:
// rounds of every rank pass, a timeout names the ranks that never arrived, keys are cleaned up.
#include "core/key_barrier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sim/local_store.h"

namespace exactcoll {
namespace {

using namespace std::chrono_literals;

TEST(KeyBarrier, EveryRoundReleasesEveryRankAndCleansUp) {
  sim::LocalStore store;
  constexpr int kRanks = 4, kRounds = 40;
  std::atomic<int> passed{0};
  std::atomic<int> in_round[kRounds] = {};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      for (int round = 0; round < kRounds; ++round) {
        ++in_round[round];
        key_barrier(store, "b", r % 2 == 0 ? r : kUnknownRank, kRanks, 5000ms);
        // Nobody leaves round k before all have entered it.
        EXPECT_EQ(in_round[round].load(), kRanks);
        ++passed;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(passed.load(), kRanks * kRounds);
  // Left: the arrival counter and the last round's done key.
  EXPECT_EQ(store.size(), 2u);
}

TEST(KeyBarrier, ATimeoutNamesTheRanksThatNeverArrived) {
  sim::LocalStore store;
  std::string message;
  std::thread rank0([&] {
    try {
      key_barrier(store, "start", 0, 3, 300ms);
    } catch (const StoreError& e) {
      message = e.what();
    }
  });
  std::this_thread::sleep_for(50ms);
  try {
    key_barrier(store, "start", 2, 3, 100ms);
    ADD_FAILURE() << "no timeout";
  } catch (const StoreError& e) {
    EXPECT_NE(
        std::string(e.what()).find("barrier 'start': rank 1 never arrived within 100 ms (2 of 3 waiting: ranks 0, 2)"),
        std::string::npos)
        << e.what();
  }
  rank0.join();
  EXPECT_NE(message.find("rank 1 never arrived within 300 ms"), std::string::npos) << message;
  EXPECT_THROW(key_barrier(store, "x", 3, 3, 10ms), StoreError);
  EXPECT_THROW(key_barrier(store, "x", 0, 0, 10ms), StoreError);
}

// Issue 29: naming the missing ranks reads one key per rank, so the world is bounded.
TEST(KeyBarrier, WorldSizeIsBounded) {
  sim::LocalStore store;
  for (const int world_size : {0, kMaxStoreRanks + 1, INT_MAX}) {
    try {
      key_barrier(store, "huge", 0, world_size, 10ms);
      ADD_FAILURE() << "world_size " << world_size << " was accepted";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("world_size must be 1..1024, got " + std::to_string(world_size)),
                std::string::npos)
          << e.what();
    }
  }
}

// A broken store: its add of `lying_delta` to keys that end in `lying_suffix` returns `lie`.
class LyingCountStore final : public Store {
 public:
  LyingCountStore(std::string lying_suffix, int64_t lying_delta, int64_t lie)
      : suffix_(std::move(lying_suffix)), delta_(lying_delta), lie_(lie) {}
  void set(const std::string& key, const std::string& value) override { store_.set(key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return store_.get(key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    const bool lie = delta == delta_ && key.size() >= suffix_.size() &&
                     key.compare(key.size() - suffix_.size(), suffix_.size(), suffix_) == 0;
    return lie ? lie_ : store_.add(key, delta);
  }
  bool erase(const std::string& key) override { return store_.erase(key); }
  using Store::barrier;
  void barrier(const std::string&, int, int, std::chrono::milliseconds) override {}

 private:
  sim::LocalStore store_;
  std::string suffix_;
  int64_t delta_;
  int64_t lie_;
};

// Issue 29: a barrier of 2 passed with rank 1 absent when add returned -2^63 (and computed
// arrival - 1 on it, a signed overflow; a peek of 2^63 - 1 overflowed the same way). Every
// impossible count is now an error naming its key.
TEST(KeyBarrier, ACountThatCannotBeIsAnErrorNotAPass) {
  const struct {
    std::string suffix;
    int64_t delta;
    int64_t lie;
    std::string expected;
  } cases[] = {
      {"/arrivals", 0, INT64_MIN, "add('b/arrivals', 0) returned -9223372036854775808, but that count lies in 0.."},
      {"/arrivals", 0, INT64_MAX, "add('b/arrivals', 0) returned 9223372036854775807, but that count lies in 0.."},
      {"/arrivals", 1, INT64_MIN, "add('b/arrivals', 1) returned -9223372036854775808, but that count lies in 1.."},
      {"/arrivals", 1, 0, "add('b/arrivals', 1) returned 0, but that count lies in 1..9223372036854775806"},
      {"/rank/0", 1, INT64_MIN, "add('b/0/rank/0', 1) returned -9223372036854775808, but that count lies in 1.."},
  };
  for (const auto& c : cases) {
    LyingCountStore store(c.suffix, c.delta, c.lie);
    try {
      key_barrier(store, "b", 0, 2, 100ms);
      ADD_FAILURE() << "the barrier passed with rank 1 absent (" << c.expected << ")";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace exactcoll
