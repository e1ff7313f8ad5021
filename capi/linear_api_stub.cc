// The C API's TP-invariant matrix product in a library built without a CUDA toolkit: a bad call is
// refused as in a CUDA build (capi/linear_checks.h), an empty product does nothing, and anything
// else returns EXACTCOLL_ERROR_UNAVAILABLE and says so (as capi/gpu_api_stub.cc does for the GPU
// communicators).
#include "capi/api_support.h"
#include "capi/linear_checks.h"
#include "exactcoll/exactcoll.h"

using namespace exactcoll::capi;

namespace {

[[noreturn]] void unavailable() {
  fail(EXACTCOLL_ERROR_UNAVAILABLE,
       "this libexactcoll was built without CUDA (no toolkit at build time): the invariant matrix product runs on GPUs "
       "only");
}

}  // namespace

extern "C" {

int exactcoll_invariant_matmul(const void* a, const void* b, void* c, int64_t m, int64_t k, int64_t n, int64_t batch,
                               int64_t lda, int64_t ldb, int64_t ldc, int64_t stride_a, int64_t stride_b,
                               int64_t stride_c, int dtype, int device, void*) {
  return guarded("exactcoll_invariant_matmul", [&] {
    checked_matmul(a, b, c, m, k, n, batch, lda, ldb, ldc, stride_a, stride_b, stride_c, product_dtype(dtype), device);
    if (m != 0) unavailable();
  });
}
int exactcoll_invariant_matmul_pairs(const void* a, const void* b, void* c, int64_t m, int64_t k, int64_t n,
                                     int64_t pairs, int64_t lda, int64_t ldb, int64_t ldc, int64_t stride_a_leaf,
                                     int64_t stride_b_leaf, int64_t stride_c_pair, int dtype, int device, void*) {
  return guarded("exactcoll_invariant_matmul_pairs", [&] {
    checked_pairs(a, b, c, m, k, n, pairs, lda, ldb, ldc, stride_a_leaf, stride_b_leaf, stride_c_pair,
                  product_dtype(dtype), device);
    if (m != 0) unavailable();
  });
}
int exactcoll_invariant_matmul_config(int dtype, int64_t k, int device, char* text, size_t size) {
  return guarded("exactcoll_invariant_matmul_config", [&] {
    product_dtype(dtype);
    check_config(k, device, text, size);
    unavailable();
  });
}

}  // extern "C"
