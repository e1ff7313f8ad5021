// A barrier built from a Store's keys alone (set, get with a timeout, add), for stores that have
// no barrier of their own, such as one whose operations are callbacks into another runtime: its
// barrier() can be `key_barrier(*this, name, rank, world_size, timeout)`. Like the stores' own
// barriers, a timeout names the ranks that never arrived (core/store.h, barrier_timeout_message).
//
// Keys under `name` (every caller uses the same world_size):
//   name/arrivals               an add counter: caller k (from 1) is in round (k - 1) / world_size
//   name/<round>/rank/<rank>    a counter a caller that gives its rank adds 1 to, before it
//                               counts itself (a counter, not a value: after a timeout the
//                               ranks present are read with add(key, 0), which never waits, so
//                               no timed get follows a timed-out one: some stores' connections
//                               are unreliable after a get timed out, c10d's TCPStore in torch 1.x)
//   name/<round>/done           set by the round's last caller; the others wait for it
// The last caller of round r also erases round r - 1's done key (everyone has left round r - 1
// by then: they all arrived in round r); a caller erases its rank key once it passes.
// Unlike LocalStore and the TCP store, a caller that times out stays counted: after a timeout the
// barrier's name is spent (its next round would be one caller short).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/store.h"

namespace exactcoll {

// Returns once world_size callers have entered barrier `name` of `store`. Preconditions:
// 1 <= world_size <= kMaxStoreRanks; rank is kUnknownRank or 0 <= rank < world_size. Throws
// StoreError naming the barrier and the ranks that never arrived after `timeout`; listing them
// costs at most world_size + 1 adds of 0. Throws StoreError naming the key when the store's add
// returns a count that cannot be (negative, 2^63 - 1, or an arrival count that did not grow): a
// broken store is an error, never a barrier that passes with a rank absent.
// Example: key_barrier(store, "start", rank, world_size, std::chrono::seconds(30));
inline void key_barrier(Store& store, const std::string& name, int rank, int world_size,
                        std::chrono::milliseconds timeout) {
  if (world_size < 1 || world_size > kMaxStoreRanks) {
    throw StoreError("store barrier '" + name + "': world_size must be 1.." + std::to_string(kMaxStoreRanks) +
                     ", got " + std::to_string(world_size));
  }
  if (rank != kUnknownRank && (rank < 0 || rank >= world_size)) {
    throw StoreError("store barrier '" + name + "': rank " + std::to_string(rank) + " is outside 0.." +
                     std::to_string(world_size - 1));
  }
  // Every count this barrier reads lies in least..kMostCount (a count of callers, or of this
  // caller): a count outside can only come from a broken store, and the arithmetic on counts
  // below (count + 1, count - 1, round * world_size) cannot overflow inside it.
  constexpr int64_t kMostCount = INT64_MAX - 1;
  auto count = [&](const std::string& key, int64_t delta, int64_t least) {
    const int64_t value = store.add(key, delta);
    if (value < least || value > kMostCount) {
      throw StoreError("store barrier '" + name + "': the store's add('" + key + "', " + std::to_string(delta) +
                       ") returned " + std::to_string(value) + ", but that count lies in " + std::to_string(least) +
                       ".." + std::to_string(kMostCount) + " (the store's add is broken)");
    }
    return value;
  };
  // The round this caller joins: a peek at the counter (an add of 0), then the add that counts it.
  // A caller that counts itself into a later round than it peeked at moves its rank key along.
  const std::string arrivals = name + "/arrivals";
  const int64_t peeked = count(arrivals, 0, 0);
  auto round_key = [&](int64_t round, const std::string& what) {
    return name + "/" + std::to_string(round) + "/" + what;
  };
  auto rank_key = [&](int64_t round) { return round_key(round, "rank/" + std::to_string(rank)); };
  int64_t round = peeked / world_size;
  if (rank != kUnknownRank) count(rank_key(round), 1, 1);
  // 1-based over every round; the counter never shrinks, so this caller's count passes the peek.
  // (The check also keeps arrival - 1 from overflowing.)
  const int64_t arrival = count(arrivals, 1, peeked + 1);
  if ((arrival - 1) / world_size != round) {
    if (rank != kUnknownRank) {
      store.erase(rank_key(round));
      round = (arrival - 1) / world_size;
      count(rank_key(round), 1, 1);
    } else {
      round = (arrival - 1) / world_size;
    }
  }
  const std::string done = round_key(round, "done");
  if (arrival % world_size == 0) {
    store.set(done, "1");
    if (round > 0) store.erase(round_key(round - 1, "done"));
  } else {
    try {
      store.get(done, timeout);
    } catch (const StoreError& wait_error) {
      // Who is here: how many counted themselves into the round, then the round's ranks that
      // counted their keys, read until every counted caller is found (world_size reads at most).
      // (add(key, 0) creates a missing rank's key at 0 in some stores: the spent name keeps it.)
      const int64_t counted = count(arrivals, 0, arrival) - round * world_size;
      const size_t arrived = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(counted, 0), world_size));
      std::vector<int> present;
      for (int p = 0; p < world_size && present.size() < arrived; ++p) {
        if (store.add(round_key(round, "rank/" + std::to_string(p)), 0) > 0) present.push_back(p);
      }
      // The wait's own error comes last: a store that failed rather than timed out says so there.
      throw StoreError(
          "store " +
          barrier_timeout_message(name, world_size, std::max(arrived, present.size()), present, {}, timeout) +
          " [waiting for '" + done + "': " + wait_error.what() + "]");
    }
  }
  if (rank != kUnknownRank) store.erase(rank_key(round));
}

}  // namespace exactcoll
