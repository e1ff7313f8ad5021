#include "capi/callback_store.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "capi/api_support.h"
#include "core/key_barrier.h"

namespace exactcoll::capi {
namespace {

thread_local std::string callback_message;

constexpr size_t kFirstGetBytes = 4096;

}  // namespace

std::string take_store_callback_message() {
  std::string message;
  message.swap(callback_message);
  return message;
}

CallbackStore::CallbackStore(const exactcoll_store_callbacks& callbacks, int rank, int world_size)
    : callbacks_(callbacks), rank_(rank), world_size_(world_size) {}

template <class Call>
int CallbackStore::serialized(const std::string& what, Call call) {
  const std::thread::id self = std::this_thread::get_id();
  if (callback_thread_.load() == self) {
    throw StoreError("store callback " + what +
                     " was called from inside another callback of the same store (its callbacks run one at a "
                     "time: a callback must not use its own store through the library)");
  }
  std::lock_guard<std::mutex> lock(callback_mutex_);
  struct Inside {  // marks this thread as inside a callback until the call returns
    std::atomic<std::thread::id>& thread;
    ~Inside() { thread.store(std::thread::id()); }
  } inside{callback_thread_};
  callback_thread_.store(self);
  return call();
}

void CallbackStore::check(int status, const std::string& what) const {
  const std::string message = take_store_callback_message();
  if (status == EXACTCOLL_OK) return;
  throw StoreError("store callback " + what + " failed with " + exactcoll_status_name(status) +
                   (message.empty() ? std::string() : ": " + message));
}

void CallbackStore::set(const std::string& key, const std::string& value) {
  take_store_callback_message();
  const std::string what = "set('" + key + "')";
  const int status =
      serialized(what, [&] { return callbacks_.set(callbacks_.user_data, key.c_str(), value.data(), value.size()); });
  check(status, what);
}

std::string CallbackStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  // What *value_bytes holds when the callback did not set it (no real length is this large).
  constexpr size_t kLengthNotSet = SIZE_MAX;
  std::string value(kFirstGetBytes, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t length = kLengthNotSet;
    take_store_callback_message();
    const int status = serialized("get('" + key + "')", [&] {
      return callbacks_.get(callbacks_.user_data, key.c_str(), timeout.count(), value.data(), value.size(), &length);
    });
    if (status == EXACTCOLL_ERROR_TIMEOUT) {
      const std::string message = take_store_callback_message();
      throw StoreError("key '" + key + "' never appeared in the store within " + std::to_string(timeout.count()) +
                       " ms" + (message.empty() ? std::string() : " (" + message + ")"));
    }
    check(status, "get('" + key + "')");
    if (length == kLengthNotSet) {
      throw StoreError("store callback get('" + key +
                       "') returned EXACTCOLL_OK without setting *value_bytes, the value's length (it still "
                       "holds SIZE_MAX, the library's mark for unset; the callback is broken)");
    }
    if (length > kMaxCallbackValueBytes) {
      throw StoreError("store callback get('" + key + "') reported a value of " + std::to_string(length) +
                       " bytes; no value of the library is longer than " + std::to_string(kMaxCallbackValueBytes) +
                       " bytes (the callback is broken)");
    }
    if (length <= value.size()) {
      value.resize(length);
      return value;
    }
    value.assign(length, '\0');  // the value is there now: the second call returns it at once
  }
  throw StoreError("store callback get('" + key + "') reported a longer value on each of two calls");
}

int64_t CallbackStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  take_store_callback_message();
  const std::string what = "add('" + key + "')";
  const int status =
      serialized(what, [&] { return callbacks_.add(callbacks_.user_data, key.c_str(), delta, &result); });
  check(status, what);
  return result;
}

bool CallbackStore::erase(const std::string& key) {
  if (callbacks_.erase == nullptr) return false;
  int existed = 0;
  take_store_callback_message();
  const std::string what = "erase('" + key + "')";
  const int status = serialized(what, [&] { return callbacks_.erase(callbacks_.user_data, key.c_str(), &existed); });
  check(status, what);
  return existed != 0;
}

void CallbackStore::barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) {
  // A barrier of a subset of the job (a node's ranks, numbered 0..world_size-1 among themselves)
  // names its callers' ranks; one without a rank is this store's whole job, where the store's own
  // rank stands in.
  if (rank == kUnknownRank ? world_size != world_size_ : world_size < 1 || world_size > world_size_) {
    throw StoreError("barrier '" + name + "' for " + std::to_string(world_size) + " ranks on a store made for " +
                     std::to_string(world_size_) +
                     (rank == kUnknownRank ? " (a barrier of fewer ranks names its "
                                             "caller's rank)"
                                           : ""));
  }
  if (rank != kUnknownRank && (rank < 0 || rank >= world_size)) {
    throw StoreError("barrier '" + name + "': rank " + std::to_string(rank) + " is outside 0.." +
                     std::to_string(world_size - 1));
  }
  key_barrier(*this, name, rank == kUnknownRank ? rank_ : rank, world_size, timeout);
}

}  // namespace exactcoll::capi

extern "C" void exactcoll_set_store_error(const char* message) {
  try {
    exactcoll::capi::callback_message = message == nullptr ? "" : message;
  } catch (...) {
  }
}
