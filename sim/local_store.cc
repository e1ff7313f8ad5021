#include "sim/local_store.h"

#include <algorithm>
#include <cstdlib>

namespace exactcoll::sim {

void LocalStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::string LocalStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool found = changed_.wait_for(lock, timeout, [&] { return values_.count(key) != 0; });
  if (!found) {
    throw StoreError("store get '" + key + "' timed out after " + std::to_string(timeout.count()) +
                     " ms: no rank set it");
  }
  return values_.at(key);
}

int64_t LocalStore::add(const std::string& key, int64_t delta) {
  int64_t now = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    if (it != values_.end()) {
      char* end = nullptr;
      now = std::strtoll(it->second.c_str(), &end, 10);
      if (end == nullptr || *end != '\0' || it->second.empty()) {
        throw StoreError("store add '" + key + "': the value '" + it->second + "' is not an integer");
      }
    }
    now += delta;
    values_[key] = std::to_string(now);
  }
  changed_.notify_all();
  return now;
}

bool LocalStore::erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.erase(key) != 0;
}

void LocalStore::barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) {
  if (world_size < 1) throw StoreError("store barrier '" + name + "': world_size must be at least 1");
  if (rank != kUnknownRank && (rank < 0 || rank >= world_size)) {
    throw StoreError("store barrier '" + name + "': rank " + std::to_string(rank) + " is outside 0.." +
                     std::to_string(world_size - 1));
  }
  std::unique_lock<std::mutex> lock(mutex_);
  Barrier& b = barriers_[name];
  if (rank != kUnknownRank) {
    const auto at = std::lower_bound(b.ranks.begin(), b.ranks.end(), rank);
    if (at != b.ranks.end() && *at == rank) {
      throw StoreError("store barrier '" + name + "': rank " + std::to_string(rank) +
                       " entered while a caller with the same rank waits in it");
    }
    b.ranks.insert(at, rank);
  }
  const uint64_t generation = b.generation;
  if (++b.arrived == world_size) {
    b.arrived = 0;
    b.ranks.clear();
    b.left.clear();
    ++b.generation;
    lock.unlock();
    changed_.notify_all();
    return;
  }
  const bool done = changed_.wait_for(lock, timeout, [&] { return barriers_[name].generation != generation; });
  if (!done) {
    Barrier& late = barriers_[name];
    const std::string message =
        barrier_timeout_message(name, world_size, static_cast<size_t>(late.arrived), late.ranks, late.left, timeout);
    // This caller gives up: it no longer counts toward the round, but is named as one that came.
    --late.arrived;
    if (rank != kUnknownRank) {
      late.ranks.erase(std::lower_bound(late.ranks.begin(), late.ranks.end(), rank));
      late.left.insert(std::lower_bound(late.left.begin(), late.left.end(), rank), rank);
    }
    if (late.arrived == 0) {
      late.ranks.clear();
      late.left.clear();
    }
    throw StoreError("store " + message);
  }
}

size_t LocalStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.size();
}

}  // namespace exactcoll::sim
