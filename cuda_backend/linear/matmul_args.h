// The arguments of the invariant matrix product (invariant_matmul.h) and their checks: plain C++,
// no CUDA, so that a library built without CUDA refuses a bad call exactly as one built with it
// (capi/linear_api_stub.cc).
#pragma once

#include <cstdint>
#include <stdexcept>

#include "core/storage.h"

namespace exactcoll::cuda::linear {

// Bounds of one call (cuBLASLt's int32 dimensions; batches beyond the grid's z limit refused).
inline constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxBatch = 65535;

// One strided-batched row-major product (the header's comment says what each field means).
struct MatmulShape {
  int64_t m = 0, k = 0, n = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// One leaf-pair product (exactcoll_invariant_matmul_pairs): 2 * pairs leaves, leaf l's A at
// a + l * stride_a_leaf (m x k, rows lda apart) and B at b + l * stride_b_leaf (k x n, ldb apart);
// pair p's C at c + p * stride_c_pair (m x n, ldc apart) receives the tree node of leaves 2p and
// 2p + 1's rounded products.
struct PairShape {
  int64_t m = 0, k = 0, n = 0, pairs = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a_leaf = 0, stride_b_leaf = 0, stride_c_pair = 0;
};

// A call refused: a bad argument, or a shape or alignment the pinned configuration cannot run.
struct MatmulRefused : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Checks a shape and its pointers before anything runs: dtype bf16 or fp16; 0 <= m, n, k <=
// kMaxDim, k >= 1, n >= 1; 1 <= batch <= kMaxBatch; lda >= k, ldb >= n, ldc >= n; strides >= 0
// and, with batch > 1, stride_c large enough that no two batches' C overlap; pointers not null
// (when m > 0) and pointers, leading dimensions and strides multiples of 16 bytes. Throws
// MatmulRefused naming the first problem.
void check_call(const void* a, const void* b, const void* c, DType dtype, const MatmulShape& shape);

// check_call's checks for a leaf-pair product: 1 <= pairs <= kMaxBatch / 2; A's and B's spans over
// every leaf, C's over every pair; stride_a_leaf and stride_b_leaf multiples of 16 bytes (there
// are always two leaves), stride_c_pair when pairs > 1, and large enough that no two pairs' C
// overlap. The messages name the pair arguments (pairs, stride_a_leaf, ...). Throws MatmulRefused.
void check_pairs_call(const void* a, const void* b, const void* c, DType dtype, const PairShape& shape);

// Which kernel computes the product: exactcoll's own tiles (tile_matmul.h: invariant by
// construction; the default) or the pinned cuBLASLt configuration (invariant_matmul.h: invariant
// only if that configuration's kernel is, an experiment), from EXACTCOLL_INVARIANT_MATMUL = tiles
// (or unset) | cublaslt. Every process whose bits are compared must use the same one. Throws
// MatmulRefused for another value.
enum class InvariantKernel { kTiles, kCublasLt };
InvariantKernel invariant_kernel();

}  // namespace exactcoll::cuda::linear
