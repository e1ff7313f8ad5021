// An in-memory key-value store behind exactcoll_store_callbacks, shared by the threads (ranks) of
// one test: what a program's own store (torch's c10d store, Ray, MPI) is to the library.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "exactcoll/exactcoll.h"

namespace exactcoll::capitest {

struct MemoryStore {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::string> values;
  bool fail_sets = false;  // set() then fails with a message (exactcoll_set_store_error)
  int gets = 0;            // calls of get, for tests of the retry with a larger buffer
};

inline int memory_set(void* user, const char* key, const void* value, size_t bytes) {
  auto* s = static_cast<MemoryStore*>(user);
  std::lock_guard<std::mutex> lock(s->mutex);
  if (s->fail_sets) {
    exactcoll_set_store_error("the memory store refuses sets today");
    return EXACTCOLL_ERROR_STORE;
  }
  s->values[key] = std::string(static_cast<const char*>(value), bytes);
  s->changed.notify_all();
  return EXACTCOLL_OK;
}

inline int memory_get(void* user, const char* key, int64_t timeout_ms, void* buffer, size_t capacity, size_t* bytes) {
  auto* s = static_cast<MemoryStore*>(user);
  std::unique_lock<std::mutex> lock(s->mutex);
  ++s->gets;
  if (!s->changed.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return s->values.count(key) > 0; })) {
    return EXACTCOLL_ERROR_TIMEOUT;
  }
  const std::string& v = s->values[key];
  std::memcpy(buffer, v.data(), capacity < v.size() ? capacity : v.size());
  *bytes = v.size();
  return EXACTCOLL_OK;
}

inline int memory_add(void* user, const char* key, int64_t delta, int64_t* result) {
  auto* s = static_cast<MemoryStore*>(user);
  std::lock_guard<std::mutex> lock(s->mutex);
  std::string& v = s->values[key];
  *result = (v.empty() ? 0 : std::stoll(v)) + delta;
  v = std::to_string(*result);
  s->changed.notify_all();
  return EXACTCOLL_OK;
}

inline int memory_erase(void* user, const char* key, int* existed) {
  auto* s = static_cast<MemoryStore*>(user);
  std::lock_guard<std::mutex> lock(s->mutex);
  *existed = s->values.erase(key) > 0 ? 1 : 0;
  return EXACTCOLL_OK;
}

inline exactcoll_store_callbacks callbacks_for(MemoryStore* s) {
  exactcoll_store_callbacks cb{};
  cb.struct_size = sizeof cb;
  cb.user_data = s;
  cb.set = memory_set;
  cb.get = memory_get;
  cb.add = memory_add;
  cb.erase = memory_erase;
  return cb;
}

}  // namespace exactcoll::capitest
