#include "sim/local_store.h"

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

void LocalStore::barrier(const std::string& name, int world_size, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  Barrier& b = barriers_[name];
  const uint64_t generation = b.generation;
  if (++b.arrived == world_size) {
    b.arrived = 0;
    ++b.generation;
    lock.unlock();
    changed_.notify_all();
    return;
  }
  const bool done = changed_.wait_for(lock, timeout, [&] { return barriers_[name].generation != generation; });
  if (!done) {
    Barrier& late = barriers_[name];
    const int arrived = late.arrived;
    --late.arrived;  // this caller gives up: it no longer counts toward the round
    throw StoreError("store barrier '" + name + "' timed out after " + std::to_string(timeout.count()) + " ms: " +
                     std::to_string(arrived) + " of " + std::to_string(world_size) + " ranks arrived");
  }
}

size_t LocalStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.size();
}

}  // namespace exactcoll::sim
