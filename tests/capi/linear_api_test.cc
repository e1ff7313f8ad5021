// exactcoll_invariant_matmul's argument checks (include/exactcoll/exactcoll.h, "TP-invariant matrix
// products"): every refusal happens before any GPU work, so it is the same on this CPU machine, with
// or without CUDA in the build. The products themselves are checked on a GPU
// (python/tests/gpu_invariant_matmul_check.py).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "exactcoll/exactcoll.h"
#include "tests/capi/expect_status.h"

namespace exactcoll {
namespace {

using capitest::expect_error;

// 16-byte aligned host memory standing in for device pointers (nothing is dereferenced).
struct Operands {
  alignas(16) uint16_t a[64] = {}, b[64] = {}, c[64] = {};
};

// A valid call's arguments, which each test changes one at a time.
struct Call {
  Operands* o;
  const void* a;
  const void* b;
  void* c;
  int64_t m = 2, k = 8, n = 8, batch = 1, lda = 8, ldb = 8, ldc = 8, stride_a = 0, stride_b = 0, stride_c = 0;
  int dtype = EXACTCOLL_BF16;
  explicit Call(Operands* operands) : o(operands), a(operands->a), b(operands->b), c(operands->c) {}
  int run() const {
    return exactcoll_invariant_matmul(a, b, c, m, k, n, batch, lda, ldb, ldc, stride_a, stride_b, stride_c, dtype, -1,
                                      nullptr);
  }
};

TEST(InvariantMatmulApi, RefusesBadArgumentsBeforeAnyGpuWork) {
  Operands o;
  {
    Call call(&o);
    call.dtype = EXACTCOLL_FP32;
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "EXACTCOLL_BF16 or EXACTCOLL_FP16");
  }
  {
    Call call(&o);
    call.dtype = 7;
    EXPECT_EQ(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT);
  }
  {
    Call call(&o);
    call.k = 0;
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "k must be");
  }
  {
    Call call(&o);
    call.batch = 0;
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "batch must be");
  }
  {
    Call call(&o);
    call.lda = 4;
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "lda must be 8..");
  }
  {
    Call call(&o);
    call.ldc = 12;
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "ldc = 12 elements is not a multiple of 16 bytes");
  }
  {
    Call call(&o);
    call.a = nullptr;
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "a is NULL");
  }
  {
    Call call(&o);
    call.b = o.b + 1;  // 2 bytes past an aligned address
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "b must be 16-byte aligned");
  }
  {
    Call call(&o);
    call.batch = 2, call.stride_a = 16, call.stride_b = 0, call.stride_c = 8;  // C[1] would start inside C[0]
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "overlap");
  }
  {
    Call call(&o);
    call.batch = 2, call.stride_a = 20, call.stride_c = 16;
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "stride_a = 20 elements");
  }
  {
    Call call(&o);
    call.stride_a = -8;
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "strides must be >= 0");
  }
  {
    Call call(&o);
    call.c = o.a;  // in place: the product would overwrite A while reading it
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "c overlaps a");
  }
  {
    Call call(&o);
    call.c = o.b + 8;  // C's first row is B's second (k = 8 rows of ldb = 8)
    expect_error(call.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "c overlaps b");
  }
  expect_error(exactcoll_invariant_matmul(o.a, o.b, o.c, 1, 8, 8, 1, 8, 8, 8, 0, 0, 0, EXACTCOLL_BF16, -2, nullptr),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "device must be -1");
}

// A valid pair call's arguments (2 leaves of A side by side in each row, 2 of B one above the
// other), which each test changes one at a time.
struct PairCall {
  Operands* o;
  const void* a;
  const void* b;
  void* c;
  int64_t m = 2, k = 8, n = 8, pairs = 1, lda = 16, ldb = 8, ldc = 8, stride_a_leaf = 8, stride_b_leaf = 64,
          stride_c_pair = 0;
  int dtype = EXACTCOLL_BF16;
  explicit PairCall(Operands* operands) : o(operands), a(operands->a), b(operands->b), c(operands->c) {}
  int run() const {
    return exactcoll_invariant_matmul_pairs(a, b, c, m, k, n, pairs, lda, ldb, ldc, stride_a_leaf, stride_b_leaf,
                                            stride_c_pair, dtype, -1, nullptr);
  }
};

// Room for 2 pairs: A 2 rows x 4 leaves of 8, B 4 leaves of 8 x 8, C 2 pairs of 2 x 8.
struct PairOperands : Operands {
  alignas(16) uint16_t a4[64] = {}, b4[256] = {}, c4[32] = {};
};

TEST(InvariantMatmulApi, PairsRefusesBadArgumentsBeforeAnyGpuWork) {
  PairOperands o;
  PairCall valid(&o);
  valid.b = o.b4;
  const auto call = [&] { return valid; };
  {
    PairCall p = call();
    p.pairs = 0;
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "pairs must be 1..32767");
  }
  {
    PairCall p = call();
    p.pairs = 32768;
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "pairs must be 1..32767");
  }
  {
    PairCall p = call();
    p.dtype = EXACTCOLL_FP32;
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "EXACTCOLL_BF16 or EXACTCOLL_FP16");
  }
  {
    PairCall p = call();
    p.stride_a_leaf = 4;  // two leaves always: the leaf stride must be 16-byte aligned even with one pair
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "stride_a_leaf = 4 elements");
  }
  {
    PairCall p = call();
    p.stride_b_leaf = -8;
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "stride_b_leaf=-8");
  }
  {
    PairCall p = call();
    p.a = o.a4, p.c = o.c4, p.pairs = 2, p.lda = 32, p.stride_c_pair = 8;  // C[1] would start in C[0]'s 2nd row
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "stride_c_pair 8 makes the pairs' outputs overlap");
  }
  {
    PairCall p = call();
    p.a = o.a4, p.c = o.c4, p.pairs = 2, p.lda = 32, p.stride_c_pair = 20;
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "stride_c_pair = 20 elements");
  }
  {
    PairCall p = call();
    p.c = o.b4 + 64;  // C is the second leaf's B: the first leaf alone would not meet it
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "c overlaps b");
  }
  {
    PairCall p = call();
    p.stride_c_pair = 7;  // ignored with one pair (as stride_c with batch 1): refused only for another reason
    p.c = nullptr;
    expect_error(p.run(), EXACTCOLL_ERROR_INVALID_ARGUMENT, "c is NULL");
  }
  {
    PairCall p = call();
    p.lda = 8;  // fine for one leaf of k = 8; the second leaf then starts at the next row (allowed: read only)
    p.stride_a_leaf = 8;
    const int status = p.run();
    EXPECT_NE(status, EXACTCOLL_ERROR_INVALID_ARGUMENT) << exactcoll_last_error();
  }
  expect_error(
      exactcoll_invariant_matmul_pairs(o.a, o.b4, o.c, 1, 8, 8, 1, 16, 8, 8, 8, 64, 0, EXACTCOLL_BF16, -2, nullptr),
      EXACTCOLL_ERROR_INVALID_ARGUMENT, "device must be -1");
  // m == 0 needs no pointers and no GPU.
  EXPECT_EQ(exactcoll_invariant_matmul_pairs(nullptr, nullptr, nullptr, 0, 8, 8, 2, 16, 8, 8, 8, 64, 16, EXACTCOLL_FP16,
                                             -1, nullptr),
            EXACTCOLL_OK)
      << exactcoll_last_error();
  // A valid call without a GPU (or without CUDA in the library) says why.
  const int status = valid.run();
  if (exactcoll_has_cuda()) {
    EXPECT_TRUE(status == EXACTCOLL_ERROR_CUDA || status == EXACTCOLL_ERROR_UNAVAILABLE || status == EXACTCOLL_OK)
        << exactcoll_status_name(status) << ": " << exactcoll_last_error();
  } else {
    expect_error(status, EXACTCOLL_ERROR_UNAVAILABLE, "built without CUDA");
  }
}

TEST(InvariantMatmulApi, EmptyProductDoesNothing) {
  // m == 0 needs no pointers and no GPU.
  EXPECT_EQ(
      exactcoll_invariant_matmul(nullptr, nullptr, nullptr, 0, 8, 8, 1, 8, 8, 8, 0, 0, 0, EXACTCOLL_FP16, -1, nullptr),
      EXACTCOLL_OK)
      << exactcoll_last_error();
}

TEST(InvariantMatmulApi, ConfigRefusesBadArguments) {
  char text[64];
  expect_error(exactcoll_invariant_matmul_config(EXACTCOLL_FP32, 64, -1, text, sizeof text),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "EXACTCOLL_BF16 or EXACTCOLL_FP16");
  expect_error(exactcoll_invariant_matmul_config(EXACTCOLL_BF16, 0, -1, text, sizeof text),
               EXACTCOLL_ERROR_INVALID_ARGUMENT, "k must be");
  expect_error(exactcoll_invariant_matmul_config(EXACTCOLL_BF16, 64, -1, nullptr, 8), EXACTCOLL_ERROR_INVALID_ARGUMENT,
               "text is NULL");
}

TEST(InvariantMatmulApi, WithoutGpuSaysWhy) {
  // A valid call on a machine without a GPU (or a library without CUDA) fails with a status that
  // names the reason, never crashes.
  Operands o;
  const int status = Call(&o).run();
  if (exactcoll_has_cuda()) {
    EXPECT_TRUE(status == EXACTCOLL_ERROR_CUDA || status == EXACTCOLL_ERROR_UNAVAILABLE || status == EXACTCOLL_OK)
        << exactcoll_status_name(status) << ": " << exactcoll_last_error();
  } else {
    expect_error(status, EXACTCOLL_ERROR_UNAVAILABLE, "built without CUDA");
  }
}

}  // namespace
}  // namespace exactcoll
