#include "capi/api_support.h"

#include <exception>

#include "core/store.h"
#include "sim/world.h"

namespace exactcoll::capi {
namespace {

thread_local std::string last_error;

}  // namespace

void set_last_error(const std::string& message) { last_error = message; }

const std::string& current_last_error() { return last_error; }

int status_of_current_exception(const char* function) noexcept {
  exactcoll_status status = EXACTCOLL_ERROR_INTERNAL;
  std::string message;
  try {
    try {
      throw;
    } catch (const ApiError& e) {
      status = e.status;
      message = e.what();
    } catch (const std::invalid_argument& e) {
      status = EXACTCOLL_ERROR_INVALID_ARGUMENT;
      message = e.what();
    } catch (const std::bad_alloc&) {
      status = EXACTCOLL_ERROR_OUT_OF_MEMORY;
      message = "out of host memory";
    } catch (const StoreError& e) {
      status = EXACTCOLL_ERROR_STORE;
      message = e.what();
    } catch (const sim::SimError& e) {
      status = status_of(e);
      message = e.what();
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "unknown exception";
    }
    last_error = std::string(function) + ": " + message;
  } catch (...) {
    // Building the message itself failed (no memory): keep the status, say so briefly.
    status = status == EXACTCOLL_OK ? EXACTCOLL_ERROR_INTERNAL : status;
  }
  return status;
}

exactcoll_status status_of(const sim::SimError& error) {
  switch (error.kind()) {
    case sim::SimFailure::kTimeout: return EXACTCOLL_ERROR_TIMEOUT;
    case sim::SimFailure::kError: return EXACTCOLL_ERROR_INTERNAL;
    case sim::SimFailure::kDeadlock:
    case sim::SimFailure::kLivelock:
    case sim::SimFailure::kRankDied:  // fault injection (exactcoll_sim_options fail_rank)
      return EXACTCOLL_ERROR_SIMULATION;
  }
  return EXACTCOLL_ERROR_INTERNAL;
}

DType to_dtype(int dtype) {
  switch (dtype) {
    case EXACTCOLL_BF16: return DType::kBF16;
    case EXACTCOLL_FP16: return DType::kFP16;
    case EXACTCOLL_FP32: return DType::kFP32;
    default: break;
  }
  bad_argument("dtype " + std::to_string(dtype) +
               " is none of EXACTCOLL_BF16 (0), EXACTCOLL_FP16 (1), EXACTCOLL_FP32 (2)");
}

void require_struct_size(size_t given, size_t first_version_size, const char* struct_name) {
  if (given < first_version_size) {
    bad_argument(std::string(struct_name) + ".struct_size is " + std::to_string(given) + ", smaller than the " +
                 std::to_string(first_version_size) + " bytes of its first version (call " + struct_name +
                 "_init, or set it to sizeof(" + struct_name + "))");
  }
}

}  // namespace exactcoll::capi

extern "C" const char* exactcoll_status_name(int status) {
  switch (status) {
    case EXACTCOLL_OK: return "EXACTCOLL_OK";
    case EXACTCOLL_ERROR_INVALID_ARGUMENT: return "EXACTCOLL_ERROR_INVALID_ARGUMENT";
    case EXACTCOLL_ERROR_TIMEOUT: return "EXACTCOLL_ERROR_TIMEOUT";
    case EXACTCOLL_ERROR_STORE: return "EXACTCOLL_ERROR_STORE";
    case EXACTCOLL_ERROR_CUDA: return "EXACTCOLL_ERROR_CUDA";
    case EXACTCOLL_ERROR_UNAVAILABLE: return "EXACTCOLL_ERROR_UNAVAILABLE";
    case EXACTCOLL_ERROR_UNUSABLE: return "EXACTCOLL_ERROR_UNUSABLE";
    case EXACTCOLL_ERROR_OUT_OF_MEMORY: return "EXACTCOLL_ERROR_OUT_OF_MEMORY";
    case EXACTCOLL_ERROR_SIMULATION: return "EXACTCOLL_ERROR_SIMULATION";
    case EXACTCOLL_ERROR_INTERNAL: return "EXACTCOLL_ERROR_INTERNAL";
    default: return "unknown status";
  }
}
