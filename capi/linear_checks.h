// The argument checks of exactcoll_invariant_matmul, exactcoll_invariant_matmul_pairs and
// exactcoll_invariant_matmul_config, made before any GPU work by capi/linear_api.cc and by its stub
// in a library built without CUDA (capi/linear_api_stub.cc), so that a bad call gets the same
// INVALID_ARGUMENT and message from both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "capi/api_support.h"
#include "core/storage.h"
#include "cuda_backend/linear/matmul_args.h"
#include "exactcoll/exactcoll.h"

namespace exactcoll::capi {

// bf16 or fp16: INVALID_ARGUMENT for fp32 and for values that are no dtype.
inline DType product_dtype(int dtype) {
  const DType type = to_dtype(dtype);
  if (type != DType::kBF16 && type != DType::kFP16) {
    bad_argument(std::string("dtype must be EXACTCOLL_BF16 or EXACTCOLL_FP16, got ") + dtype_name(type));
  }
  return type;
}

inline void check_device(int device) {
  if (device < -1) bad_argument("device must be -1 (the current one) or a device index, got " + std::to_string(device));
}

// Runs check (cuda::linear's argument checks of `shape`), its MatmulRefused as INVALID_ARGUMENT,
// then the device's; returns shape.
template <class Shape, class Check>
Shape checked_shape(const Shape& shape, int device, const Check& check) {
  try {
    check();
  } catch (const cuda::linear::MatmulRefused& e) {
    bad_argument(e.what());
  }
  check_device(device);
  return shape;
}

// Every check of exactcoll_invariant_matmul's arguments (cuda::linear::check_call's, as
// INVALID_ARGUMENT); returns the shape.
inline cuda::linear::MatmulShape checked_matmul(const void* a, const void* b, const void* c, int64_t m, int64_t k,
                                                int64_t n, int64_t batch, int64_t lda, int64_t ldb, int64_t ldc,
                                                int64_t stride_a, int64_t stride_b, int64_t stride_c, DType type,
                                                int device) {
  cuda::linear::MatmulShape shape;
  shape.m = m, shape.k = k, shape.n = n, shape.batch = batch;
  shape.lda = lda, shape.ldb = ldb, shape.ldc = ldc;
  shape.stride_a = stride_a, shape.stride_b = stride_b, shape.stride_c = stride_c;
  return checked_shape(shape, device, [&] { cuda::linear::check_call(a, b, c, type, shape); });
}

// Every check of exactcoll_invariant_matmul_pairs's arguments (cuda::linear::check_pairs_call's,
// as INVALID_ARGUMENT); returns the shape.
inline cuda::linear::PairShape checked_pairs(const void* a, const void* b, const void* c, int64_t m, int64_t k,
                                             int64_t n, int64_t pairs, int64_t lda, int64_t ldb, int64_t ldc,
                                             int64_t stride_a_leaf, int64_t stride_b_leaf, int64_t stride_c_pair,
                                             DType type, int device) {
  cuda::linear::PairShape shape;
  shape.m = m, shape.k = k, shape.n = n, shape.pairs = pairs;
  shape.lda = lda, shape.ldb = ldb, shape.ldc = ldc;
  shape.stride_a_leaf = stride_a_leaf, shape.stride_b_leaf = stride_b_leaf, shape.stride_c_pair = stride_c_pair;
  return checked_shape(shape, device, [&] { cuda::linear::check_pairs_call(a, b, c, type, shape); });
}

// exactcoll_invariant_matmul_config's checks.
inline void check_config(int64_t k, int device, const char* text, size_t size) {
  if (k < 1 || k > cuda::linear::kMaxDim) bad_argument("k must be 1..2^31-1, got " + std::to_string(k));
  require(text, "text");
  if (size == 0) bad_argument("size is 0: no room for the text");
  check_device(device);
}

}  // namespace exactcoll::capi
