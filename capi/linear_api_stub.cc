// The C API's TP-invariant matrix product in a library built without a CUDA toolkit: each function
// returns EXACTCOLL_ERROR_UNAVAILABLE and says so (as capi/gpu_api_stub.cc does for the GPU
// communicators).
#include "capi/api_support.h"
#include "exactcoll/exactcoll.h"

using namespace exactcoll::capi;

namespace {

int unavailable(const char* function) {
  return guarded(function, [] {
    fail(EXACTCOLL_ERROR_UNAVAILABLE,
         "this libexactcoll was built without CUDA (no toolkit at build time): the invariant matrix product runs on "
         "GPUs only");
  });
}

}  // namespace

extern "C" {

int exactcoll_invariant_matmul(const void*, const void*, void*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                               int64_t, int64_t, int64_t, int64_t, int, int, void*) {
  return unavailable("exactcoll_invariant_matmul");
}
int exactcoll_invariant_matmul_config(int, int64_t, int, char*, size_t) {
  return unavailable("exactcoll_invariant_matmul_config");
}

}  // extern "C"
