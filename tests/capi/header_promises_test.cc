// Issue 29: every promise include/exactcoll/exactcoll.h makes about stores, barriers, world sizes
// and traced elements, held against a hostile caller. Each test reproduces a finding of that
// review and failed on the code before its fix (the finding is quoted above the test).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "exactcoll/exactcoll.h"
#include "tests/capi/expect_status.h"
#include "tests/capi/memory_store.h"
#include "tools/launch/launcher.h"

namespace exactcoll {
namespace {

using capitest::expect_contains;
using capitest::expect_error;
using capitest::last_error;
using capitest::MemoryStore;
using Clock = std::chrono::steady_clock;

const char* const kToken = "0123456789abcdef0123";

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// ---- 1. the callbacks of one store never run concurrently -----------------------------------------

// A MemoryStore whose callbacks note every call made while another callback of it was running.
struct OverlapWatch {
  MemoryStore memory;
  std::atomic<int> inside{0};
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> overlaps{0};
};

template <class Call>
int watched(void* user, Call call) {
  auto* watch = static_cast<OverlapWatch*>(user);
  if (watch->inside.fetch_add(1) > 0) ++watch->overlaps;
  ++watch->calls;
  // Stay inside a little (20 us), so that an overlap the library allowed would show.
  const auto until = Clock::now() + std::chrono::microseconds(20);
  while (Clock::now() < until) {
  }
  const int status = call(&watch->memory);
  --watch->inside;
  return status;
}

exactcoll_store_callbacks watched_callbacks(OverlapWatch* watch) {
  exactcoll_store_callbacks cb{};
  cb.struct_size = sizeof cb;
  cb.user_data = watch;
  cb.set = [](void* user, const char* key, const void* value, size_t bytes) {
    return watched(user, [&](MemoryStore* m) { return capitest::memory_set(m, key, value, bytes); });
  };
  cb.get = [](void* user, const char* key, int64_t timeout_ms, void* buffer, size_t capacity, size_t* bytes) {
    return watched(user,
                   [&](MemoryStore* m) { return capitest::memory_get(m, key, timeout_ms, buffer, capacity, bytes); });
  };
  cb.add = [](void* user, const char* key, int64_t delta, int64_t* result) {
    return watched(user, [&](MemoryStore* m) { return capitest::memory_add(m, key, delta, result); });
  };
  cb.erase = [](void* user, const char* key, int* existed) {
    return watched(user, [&](MemoryStore* m) { return capitest::memory_erase(m, key, existed); });
  };
  return cb;
}

// Found: two threads calling exactcoll_store_barrier on one callback store overlapped add() 1,199
// times, six threads 5,375 times, although the header says "never concurrently for one store".
TEST(StoreCallbacks, AreNeverCalledConcurrentlyForOneStore) {
  OverlapWatch watch;
  const exactcoll_store_callbacks cb = watched_callbacks(&watch);
  exactcoll_store store{};
  ASSERT_EQ(exactcoll_store_create(&cb, 0, 1, &store), EXACTCOLL_OK) << last_error();
  constexpr int kThreads = 6, kBarriers = 200;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kBarriers && failures[t].empty(); ++i) {
        if (exactcoll_store_barrier(store, "together", 5000) != EXACTCOLL_OK) failures[t] = last_error();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  // Each barrier of one rank makes at least three calls (peek, count, set): the watch saw them all.
  EXPECT_GE(watch.calls.load(), int64_t{3} * kThreads * kBarriers);
  EXPECT_EQ(watch.overlaps.load(), 0) << "callbacks of one store ran at the same time";
  EXPECT_EQ(exactcoll_store_destroy(store), EXACTCOLL_OK);
}

// A store whose first add, from inside the callback, enters a barrier of the same store.
struct ReenteringStore {
  MemoryStore memory;
  exactcoll_store self{};
  bool entered = false;
  int inner_status = -1;
  std::string inner_message;
};

// With the callbacks serialized, a callback that uses its own store through the library would wait
// for itself forever; it gets EXACTCOLL_ERROR_STORE instead, and the outer call goes on.
TEST(StoreCallbacks, ACallbackThatUsesItsOwnStoreIsAnErrorNotAHang) {
  ReenteringStore reentering;
  exactcoll_store_callbacks cb = capitest::callbacks_for(&reentering.memory);
  cb.user_data = &reentering;
  cb.set = [](void* user, const char* key, const void* value, size_t bytes) {
    return capitest::memory_set(&static_cast<ReenteringStore*>(user)->memory, key, value, bytes);
  };
  cb.get = [](void* user, const char* key, int64_t timeout_ms, void* buffer, size_t capacity, size_t* bytes) {
    return capitest::memory_get(&static_cast<ReenteringStore*>(user)->memory, key, timeout_ms, buffer, capacity, bytes);
  };
  cb.add = [](void* user, const char* key, int64_t delta, int64_t* result) {
    auto* s = static_cast<ReenteringStore*>(user);
    if (!s->entered) {
      s->entered = true;
      s->inner_status = exactcoll_store_barrier(s->self, "inner", 100);
      s->inner_message = exactcoll_last_error();
    }
    return capitest::memory_add(&s->memory, key, delta, result);
  };
  cb.erase = [](void* user, const char* key, int* existed) {
    return capitest::memory_erase(&static_cast<ReenteringStore*>(user)->memory, key, existed);
  };
  ASSERT_EQ(exactcoll_store_create(&cb, 0, 1, &reentering.self), EXACTCOLL_OK) << last_error();
  EXPECT_EQ(exactcoll_store_barrier(reentering.self, "outer", 1000), EXACTCOLL_OK) << last_error();
  EXPECT_TRUE(reentering.entered);
  EXPECT_EQ(reentering.inner_status, EXACTCOLL_ERROR_STORE) << reentering.inner_message;
  expect_contains(reentering.inner_message,
                  "store callback add('user/inner/arrivals') was called from inside another callback of the same "
                  "store");
  EXPECT_EQ(exactcoll_store_destroy(reentering.self), EXACTCOLL_OK);
}

// ---- 2. every barrier timeout names the ranks that never arrived ------------------------------------

// Found: the TCP store's barrier said "only 2 of 3 callers arrived within 2000 ms (callers that
// give their rank are named)" where the header promises "naming a rank that never arrived".
TEST(StoreBarriers, TheTcpStoresTimeoutNamesTheRankThatNeverArrived) {
  const int port = launch::pick_free_port();
  const std::vector<int> present = {0, 2};  // rank 1 never comes, not even to make its store
  std::vector<exactcoll_store> stores(3);
  std::vector<int> status(3, -1);
  std::vector<std::string> message(3);
  std::vector<std::thread> ranks;
  for (int r : present) {
    ranks.emplace_back([&, r] {
      status[r] = exactcoll_store_create_tcp("127.0.0.1", port, nullptr, kToken, r, 3, 5000, &stores[r]);
      message[r] = last_error();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r : present) ASSERT_EQ(status[r], EXACTCOLL_OK) << "rank " << r << ": " << message[r];
  ranks.clear();
  for (int r : present) {
    ranks.emplace_back([&, r] {
      status[r] = exactcoll_store_barrier(stores[r], "start", 500);
      message[r] = last_error();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r : present) {
    EXPECT_EQ(status[r], EXACTCOLL_ERROR_STORE) << "rank " << r << ": " << message[r];
    expect_contains(message[r], "barrier 'user/start': rank 1 never arrived within 500 ms");
  }
  EXPECT_EQ(exactcoll_store_destroy(stores[2]), EXACTCOLL_OK);
  EXPECT_EQ(exactcoll_store_destroy(stores[0]), EXACTCOLL_OK);
}

// ---- 3. world_size is bounded, and so is the work of naming who is missing -------------------------

// Found: world_size 2^31 - 1 was accepted, and a timed-out barrier then called add() once per rank
// to list the missing ones (still running after 25 s).
TEST(StoreWorldSize, IsRefusedPastTheBoundWhenTheStoreIsMade) {
  MemoryStore memory;
  const exactcoll_store_callbacks cb = capitest::callbacks_for(&memory);
  exactcoll_store store{};
  for (const int world_size : {INT_MAX, EXACTCOLL_MAX_STORE_RANKS + 1}) {
    SCOPED_TRACE(world_size);
    expect_error(exactcoll_store_create(&cb, 0, world_size, &store), EXACTCOLL_ERROR_INVALID_ARGUMENT,
                 "world_size must be 1..1024 (EXACTCOLL_MAX_STORE_RANKS, the most ranks a store's job may have), got " +
                     std::to_string(world_size));
    // Refused before any connection (rank 1 would try to reach rank 0 for a second, in vain).
    const auto start = Clock::now();
    expect_error(
        exactcoll_store_create_tcp("127.0.0.1", launch::pick_free_port(), nullptr, kToken, 1, world_size, 1000, &store),
        EXACTCOLL_ERROR_INVALID_ARGUMENT, "world_size must be 1..1024");
    EXPECT_LT(seconds_since(start), 0.5);
  }
  ASSERT_EQ(exactcoll_store_create(&cb, EXACTCOLL_MAX_STORE_RANKS - 1, EXACTCOLL_MAX_STORE_RANKS, &store), EXACTCOLL_OK)
      << last_error();
  EXPECT_EQ(exactcoll_store_destroy(store), EXACTCOLL_OK);
}

// The largest job, and its last rank alone in a barrier: naming the 1023 missing ranks reads one
// key per rank, and the call returns soon after its timeout.
TEST(StoreWorldSize, ABarrierTimeoutAtTheBoundReturnsPromptly) {
  OverlapWatch watch;  // here only for its count of calls
  const exactcoll_store_callbacks cb = watched_callbacks(&watch);
  constexpr int kRanks = EXACTCOLL_MAX_STORE_RANKS;
  exactcoll_store store{};
  ASSERT_EQ(exactcoll_store_create(&cb, kRanks - 1, kRanks, &store), EXACTCOLL_OK) << last_error();
  const auto start = Clock::now();
  const int status = exactcoll_store_barrier(store, "alone", 100);
  const double seconds = seconds_since(start);
  EXPECT_EQ(status, EXACTCOLL_ERROR_STORE) << last_error();
  expect_contains(last_error(), "barrier 'user/alone': ranks 0, 1, 2, ");
  expect_contains(last_error(), ", 1022 never arrived within 100 ms (1 of 1024 waiting: rank 1023)");
  EXPECT_LT(seconds, 5.0) << "a timed-out barrier of " << kRanks << " ranks took " << seconds << " s";
  // The barrier's own calls (peek, its rank's count, its arrival, the wait, the count after it)
  // and one read per rank.
  EXPECT_LE(watch.calls.load(), kRanks + 5);
  EXPECT_EQ(exactcoll_store_destroy(store), EXACTCOLL_OK);
}

// ---- 4. a misbehaving callback store is an error, never a pass -------------------------------------

enum class Lie {
  kGetLengthHuge,         // get: OK with *value_bytes = 2^63
  kGetLengthUnset,        // get: OK without touching *value_bytes (or the buffer)
  kAddMinimum,            // add: OK with *result = -2^63, always
  kArrivalCountGoesBack,  // add: the barrier's arrival count (its add of 1) comes back as -2^63
};

struct LyingStore {
  MemoryStore memory;
  Lie lie = Lie::kGetLengthHuge;
};

exactcoll_store_callbacks lying_callbacks(LyingStore* store) {
  exactcoll_store_callbacks cb = capitest::callbacks_for(&store->memory);
  cb.user_data = store;
  cb.set = [](void* user, const char* key, const void* value, size_t bytes) {
    return capitest::memory_set(&static_cast<LyingStore*>(user)->memory, key, value, bytes);
  };
  cb.get = [](void* user, const char* key, int64_t timeout_ms, void* buffer, size_t capacity, size_t* bytes) {
    auto* s = static_cast<LyingStore*>(user);
    if (s->lie == Lie::kGetLengthHuge) {
      *bytes = size_t{1} << 63;
      return static_cast<int>(EXACTCOLL_OK);
    }
    if (s->lie == Lie::kGetLengthUnset) return static_cast<int>(EXACTCOLL_OK);
    return capitest::memory_get(&s->memory, key, timeout_ms, buffer, capacity, bytes);
  };
  cb.add = [](void* user, const char* key, int64_t delta, int64_t* result) {
    auto* s = static_cast<LyingStore*>(user);
    const std::string name = key;
    const bool arrival = delta == 1 && name.size() > 9 && name.compare(name.size() - 9, 9, "/arrivals") == 0;
    if (s->lie == Lie::kAddMinimum || (s->lie == Lie::kArrivalCountGoesBack && arrival)) {
      *result = INT64_MIN;
      return static_cast<int>(EXACTCOLL_OK);
    }
    return capitest::memory_add(&s->memory, key, delta, result);
  };
  cb.erase = [](void* user, const char* key, int* existed) {
    return capitest::memory_erase(&static_cast<LyingStore*>(user)->memory, key, existed);
  };
  return cb;
}

// Found: a get reporting 2^63 bytes was EXACTCOLL_ERROR_INTERNAL "basic_string::_M_replace_aux";
// a barrier of 2 passed with rank 1 absent when get returned 0 without a length, or when add
// returned -2^63. Here rank 0 enters a barrier of 2 alone: every lie must end in
// EXACTCOLL_ERROR_STORE naming the key and what the callback said.
TEST(StoreCallbacks, ALyingStoreIsAStoreErrorNeverAPass) {
  const struct {
    Lie lie;
    std::string expected;
  } cases[] = {
      {Lie::kGetLengthHuge,
       "store callback get('user/lie/0/done') reported a value of 9223372036854775808 bytes; no value of the "
       "library is longer than 16777216 bytes"},
      {Lie::kGetLengthUnset,
       "store callback get('user/lie/0/done') returned EXACTCOLL_OK without setting *value_bytes"},
      {Lie::kAddMinimum, "the store's add('user/lie/arrivals', 0) returned -9223372036854775808"},
      {Lie::kArrivalCountGoesBack,
       "the store's add('user/lie/arrivals', 1) returned -9223372036854775808, but that count lies in "
       "1..9223372036854775806"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expected);
    LyingStore lying;
    lying.lie = c.lie;
    const exactcoll_store_callbacks cb = lying_callbacks(&lying);
    exactcoll_store store{};
    ASSERT_EQ(exactcoll_store_create(&cb, 0, 2, &store), EXACTCOLL_OK) << last_error();
    expect_error(exactcoll_store_barrier(store, "lie", 200), EXACTCOLL_ERROR_STORE, c.expected);
    EXPECT_EQ(exactcoll_store_destroy(store), EXACTCOLL_OK);
  }
}

// ---- 5. traced elements are bounded before their array is read -------------------------------------

// Found: num_trace_elements 2^61 + 7 wrapped the pointer arithmetic and read past the caller's
// array, 2^62 was accepted, and 5,000 real elements were accepted although the CLI traces at most
// 4,096.
TEST(SimTraceElements, AreBoundedBeforeTheirArrayIsRead) {
  constexpr int kRanks = 2;
  constexpr size_t kCount = 8;
  std::vector<uint16_t> in(kRanks * kCount, 0x3f80), out(kRanks * kCount), ro(kRanks * kCount);
  std::vector<uint64_t> elements(5000);
  for (size_t i = 0; i < elements.size(); ++i) elements[i] = i % kCount;  // every one a real element
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  options.trace_elements = elements.data();
  auto collective = [&] {
    return exactcoll_sim_collective(EXACTCOLL_OP_ALLREDUCE, EXACTCOLL_ALGO_AUTO, EXACTCOLL_BF16, kRanks, kCount,
                                    in.data(), out.data(), &options, nullptr);
  };
  auto fused = [&] {
    return exactcoll_sim_fused_add_rmsnorm(EXACTCOLL_FUSED_AUTO, EXACTCOLL_CONTRACT_CANONICAL, EXACTCOLL_BF16, kRanks,
                                           1, kCount, 1e-6f, in.data(), in.data(), in.data(), ro.data(), out.data(),
                                           &options, nullptr);
  };
  const size_t too_many[] = {(size_t{1} << 61) + 7, size_t{1} << 62, SIZE_MAX, 5000, EXACTCOLL_MAX_TRACE_ELEMENTS + 1};
  for (const size_t n : too_many) {
    SCOPED_TRACE(n);
    options.num_trace_elements = n;
    const std::string expected = "num_trace_elements is " + std::to_string(n) +
                                 "; at most 4096 elements are traced (EXACTCOLL_MAX_TRACE_ELEMENTS)";
    expect_error(collective(), EXACTCOLL_ERROR_INVALID_ARGUMENT, expected);
    expect_error(fused(), EXACTCOLL_ERROR_INVALID_ARGUMENT, expected);
  }
  options.num_trace_elements = EXACTCOLL_MAX_TRACE_ELEMENTS;  // the bound itself is allowed
  EXPECT_EQ(collective(), EXACTCOLL_OK) << last_error();
  EXPECT_EQ(fused(), EXACTCOLL_OK) << last_error();
}

// ---- 6. exactcoll_store_create_from_env's connect timeout comes from the environment ---------------

// Sets (or, with nullopt, unsets) an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    set(value);
  }
  ~ScopedEnv() { set(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void set(const std::optional<std::string>& value) {
    if (value) {
      setenv(name_, value->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Found: the C API offered no connect timeout shorter than 60 s for
// exactcoll_store_create_from_env. EXACTCOLL_STORE_CONNECT_TIMEOUT_MS sets it, checked.
TEST(StoreFromEnv, TheConnectTimeoutComesFromTheEnvironmentAndIsChecked) {
  const std::string port = std::to_string(launch::pick_free_port());
  ScopedEnv rank("RANK", "0"), local_rank("LOCAL_RANK", "0"), world("WORLD_SIZE", "1");
  ScopedEnv master("MASTER_ADDR", "127.0.0.1"), store_port("EXACTCOLL_STORE_PORT", port);
  ScopedEnv token("EXACTCOLL_STORE_TOKEN", kToken), bind("EXACTCOLL_STORE_BIND", std::nullopt);
  ScopedEnv timeout("EXACTCOLL_STORE_CONNECT_TIMEOUT_MS", std::nullopt);
  exactcoll_store store{};
  // Rank 0 of 1 would form its store at once: each bad value must be refused first.
  for (const char* bad : {"", "0", "-5", "abc", "5s", "1.5", " 100", "2147483648", "99999999999999999999999"}) {
    SCOPED_TRACE(bad);
    timeout.set(bad);
    const int status = exactcoll_store_create_from_env(&store, nullptr, nullptr);
    expect_error(status, EXACTCOLL_ERROR_INVALID_ARGUMENT,
                 std::string("EXACTCOLL_STORE_CONNECT_TIMEOUT_MS='") + bad +
                     "' is not a whole number of milliseconds in 1..2147483647");
    if (status == EXACTCOLL_OK) exactcoll_store_destroy(store);
  }
  timeout.set(std::nullopt);
  world.set("1025");
  {
    const int status = exactcoll_store_create_from_env(&store, nullptr, nullptr);
    expect_error(status, EXACTCOLL_ERROR_INVALID_ARGUMENT, "WORLD_SIZE=1025 is more than 1024");
    if (status == EXACTCOLL_OK) exactcoll_store_destroy(store);
  }
  // Rank 1 of 2, and nobody serves the port: the store error comes after 300 ms, not 60 s.
  rank.set("1");
  local_rank.set("1");
  world.set("2");
  timeout.set("300");
  const auto start = Clock::now();
  expect_error(exactcoll_store_create_from_env(&store, nullptr, nullptr), EXACTCOLL_ERROR_STORE, "within 300 ms");
  const double seconds = seconds_since(start);
  EXPECT_GE(seconds, 0.25);
  EXPECT_LT(seconds, 3.0) << "a 300 ms connect timeout took " << seconds << " s";
}

}  // namespace
}  // namespace exactcoll
