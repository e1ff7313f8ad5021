// What every part of the C API shares: the per-thread last error, the guard that turns every C++
// exception into a status (so none crosses the C boundary), the handle tables (ids never reused, so
// a destroyed handle is an error, not a dangling pointer), and the enum translations between the
// C header's values and the library's own enums.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/storage.h"
#include "exactcoll/exactcoll.h"

namespace exactcoll::sim {
class SimError;
}

namespace exactcoll::capi {

// An error with its C status, thrown inside the API and turned into the return value by guarded().
struct ApiError : std::runtime_error {
  ApiError(exactcoll_status s, const std::string& message) : std::runtime_error(message), status(s) {}
  exactcoll_status status;
};

[[noreturn]] inline void fail(exactcoll_status status, const std::string& message) { throw ApiError(status, message); }
[[noreturn]] inline void bad_argument(const std::string& message) {
  throw ApiError(EXACTCOLL_ERROR_INVALID_ARGUMENT, message);
}

// Records message as the calling thread's last error; returns it (exactcoll_last_error).
void set_last_error(const std::string& message);
const std::string& current_last_error();

// Runs body() and returns EXACTCOLL_OK, or the status of what it threw (ApiError's own,
// invalid_argument -> INVALID_ARGUMENT, bad_alloc -> OUT_OF_MEMORY, StoreError -> STORE, a
// simulator failure -> TIMEOUT or SIMULATION, anything else -> INTERNAL) after recording
// "<function>: <message>" as the thread's last error. Never throws.
template <class Body>
int guarded(const char* function, Body&& body) noexcept;

// Returns the status for the exception being handled (call only inside a catch block) and
// records its message; the non-template part of guarded().
int status_of_current_exception(const char* function) noexcept;

template <class Body>
int guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return EXACTCOLL_OK;
  } catch (...) {
    return status_of_current_exception(function);
  }
}

// The status of a simulator failure: TIMEOUT for a wait that timed out, SIMULATION for a deadlock
// or livelock, INTERNAL for an exception inside a kernel.
exactcoll_status status_of(const sim::SimError& error);

// Checks that a pointer argument is not null.
inline void require(const void* pointer, const char* name) {
  if (pointer == nullptr) bad_argument(std::string(name) + " is NULL");
}

// Returns the DType of a C dtype value; INVALID_ARGUMENT for anything else.
DType to_dtype(int dtype);

// Checks struct_size of a caller's extensible struct: at least the first version's size (a caller
// built against an older header passes a smaller but still complete prefix) — INVALID_ARGUMENT
// otherwise, naming the struct.
void require_struct_size(size_t given, size_t first_version_size, const char* struct_name);

// Fills a fixed-size char field with text, truncated and NUL-terminated.
template <size_t N>
void copy_text(char (&field)[N], const std::string& text) {
  const size_t n = text.size() < N - 1 ? text.size() : N - 1;
  text.copy(field, n);
  field[n] = '\0';
}

// Objects behind C handles. Ids count up from 1 and are never reused; lookups return a shared
// owner, so an object destroyed by one thread stays alive until another thread's call using it
// returns.
template <class T>
class HandleTable {
 public:
  uint64_t add(std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t id = next_id_++;
    objects_.emplace(id, std::move(object));
    return id;
  }
  // Returns the object of id; INVALID_ARGUMENT naming `what` when id is 0, unknown or destroyed.
  std::shared_ptr<T> get(uint64_t id, const char* what) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = objects_.find(id);
    if (it == objects_.end()) missing(id, what);
    return it->second;
  }
  // Removes id and returns its object (destroyed when the last owner lets go, outside the lock).
  std::shared_ptr<T> remove(uint64_t id, const char* what) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = objects_.find(id);
    if (it == objects_.end()) missing(id, what);
    std::shared_ptr<T> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }

 private:
  [[noreturn]] void missing(uint64_t id, const char* what) const {
    if (id == 0) bad_argument(std::string(what) + " handle is 0 (never created)");
    if (id >= next_id_) bad_argument(std::string(what) + " handle " + std::to_string(id) + " was never created");
    bad_argument(std::string(what) + " handle " + std::to_string(id) + " was destroyed");
  }

  mutable std::mutex mutex_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<T>> objects_;
};

}  // namespace exactcoll::capi
