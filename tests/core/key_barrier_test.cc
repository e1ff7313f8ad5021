// core/key_barrier.h over the simulator's in-process store, using only its set, get, add and erase:
// rounds of every rank pass, a timeout names the ranks that never arrived, keys are cleaned up.
#include "core/key_barrier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
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

}  // namespace
}  // namespace exactcoll
