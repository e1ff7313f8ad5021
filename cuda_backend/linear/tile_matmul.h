// exactcoll's own invariant matrix product (invariant_matmul.h's default kernel): CUDA kernels
// whose per-element order of operations is fixed by construction, so no assumption about a
// library's kernel choice is needed.
//
//   C[b] = A[b] @ B[b] (row-major, bf16 or fp16, fp32 accumulation, one rounding at the end),
//   the shapes, leading dimensions and strides of MatmulShape (matmul_args.h, already checked).
//
// Why each output element's bits depend only on its row of A, its column of B and K: each element's accumulator is the
// same sequence of tensor-core operations whatever the shape, the batch or which block computes it: 16 x 16 x 16
// MMAs with fp32 accumulation (HMMA.16816.F32 on sm_90), starting from +0.0f, over k 0..15, then 16..31, ..., up to K
// rounded up to a multiple of 128 (elements past K are zeros, identically for every M and N), then one rounding to
// the storage type (__float2bfloat16_rn / __float2half_rn). Rows past M and columns past N are computed from zeros and
// never stored. The tensor cores' order inside one MMA is the hardware's, the same for every call on the same GPU
// model (docs/numerics.md: leaf products are given inputs). Four variants compute it; which one runs is chosen
// from the shape, and changes which block computes an element, never its bits (blocks start at multiples of 16 rows
// and columns, so an element is in the same place of its 16 x 16 tile in every variant):
//   - 16-row blocks and 64-row blocks: 64 columns, 128 threads, wmma m16n16k16 from shared memory, K loaded 128 at a
//     time through registers (blockIdx.x over columns, .y over rows, .z over batch entries). The first kernel; since
//     the mid-M variant they run only when forced, as the reference the other variants are compared with;
//   - mid-M blocks (m < 256, decode): 64 rows x 128 columns (8 warps) or x 64 (4 warps, where fewer than 120 blocks
//     of 128 columns would run), 16 rows for m <= 32, K loaded 64 at a time into a ring of 6 (8 for 16 rows) shared
//     buffers by cp.async, ldmatrix and mma.sync m16n8k16 as the large blocks; row blocks fastest in the grid, so the
//     row blocks of one column block read its B together. For 64 < m < 256 where the large variant's 128 x 128 blocks
//     would be at least 120, those run instead (one 128-row block per column block instead of two rounds of 64-row
//     ones). On an H100, B streamed from device memory (python/tests/gpu_tile_variants_check.py --mid, 2026-11-27;
//     docs/benchmarks.md), the tree layer's batch-2 products at TP 4: M = 64 x 8192 x 1024 18.6 us (the 64-row
//     blocks: 24.7, 1.33 x; torch.matmul 15.6), M = 64 x 4096 x 512 7.5 us (11.7, 1.57 x; torch 5.9); M = 1 and 16
//     1.26-1.48 x faster than the 16-row blocks, M = 33, 65, 100, 128, 255 1.54-2.80 x faster than the 64-row ones;
//   - large blocks (m >= 256): 128 rows x 256 columns (128 x 128 where fewer than 100 such blocks would run), 256
//     threads, K loaded 32 (64 for 128 x 128) at a time into a ring of 4 shared buffers by cp.async, operands read with
//     ldmatrix and multiplied by mma.sync m16n8k16 (the instruction wmma m16n16k16 compiles to on sm_90,
//     HMMA.16816.F32, twice per 16 x 16 tile: per element one MMA over the same 16 k, in the same order), blocks in
//     groups of 8 block rows for L2 reuse. About 3.2-3.5 x faster than the 64-row blocks at M = 4096 (about half of
//     torch.matmul's speed) on an H100 (docs/benchmarks.md).
// The large variant was checked bit for bit against the 64-row one on an H100 (python/tests/gpu_tile_variants_check.py:
// M 256..4097, N 8..8200, K 8..4096 and K, N not multiples of 8, batch 1 and 2 with B shared or not, bf16 and fp16,
// with -0.0, inf and NaN; 0 of 8.7 x 10^9 elements differed for each large configuration), and so was each mid-M
// configuration (--mid: M 1..255, N 8..8200, K 8..1024 and K, N not multiples of 8, the same operands; 0 of
// 563 053 468 elements differed for each, and for the shape's own choice).
//
// The leaf-pair mode (launch_tile_matmul_pairs, for exactcoll_invariant_matmul_pairs): every variant but the mid-M
// blocks (whose pairs run as two plain products and launch_pair_add: tile_pairs_fused), given two leaves
// per pair, computes leaf 2p's tile, rounds and keeps it (shared memory), resets its accumulators, computes leaf
// 2p+1's tile by the same code, and stores the tree node round(float(leaf 2p) + float(leaf 2p+1)). Each leaf's
// product is the plain mode's, so the pair is bit for bit two plain products and torch's `+` (checked on an H100 by
// python/tests/gpu_pair_products_check.py, every variant forced and chosen); the plain mode's code is unchanged
// (its PTX has the same instructions, only address arithmetic moved, and the same register counts).
//
// EXACTCOLL_TILE_MATMUL_VARIANT (tests only, read on every call): "16", "64", "large", "large_128", "mid" (64 rows,
// the width chosen from the shape), "mid_128", "mid_64", "mid16" (16 rows, the width chosen from the shape),
// "mid16_128" or "mid16_64" forces that variant for every shape, so that a test compares their bits
// (python/tests/gpu_tile_variants_check.py); unset or "auto" chooses from the shape; another value makes the launch
// fail with cudaErrorInvalidValue.
#pragma once

#include <cuda_runtime_api.h>

#include "core/storage.h"
#include "cuda_backend/linear/matmul_args.h"

namespace exactcoll::cuda::linear {

// The kernel's order of operations, named in the configuration text callers compare across runs. The text is older
// than the large variant (its first words name the first variant's blocks) and is kept: the bits it stands for did
// not change.
inline constexpr const char* kTileMatmulText =
    "exactcoll tiles: C blocks of 64 columns, K in order from 0 by wmma m16n16k16, fp32 accumulate, one rounding";

// Enqueues the product. Preconditions: check_call passed (bf16 or fp16; 16-byte aligned pointers,
// leading dimensions and strides); m >= 1. Returns the launch's CUDA error.
cudaError_t launch_tile_matmul(const void* a, const void* b, void* c, DType dtype, const MatmulShape& shape,
                               cudaStream_t stream);

// Enqueues the leaf-pair product: for each pair p, C_p = round(float(P_2p) + float(P_2p+1)) (contract::tree_node),
// P_l = leaf l's product exactly as launch_tile_matmul computes it (the same kernels, the same MMAs per element,
// rounded once), the node's add in fp32 (__fadd_rn) and one rounding. One launch per group of rows: a block computes
// leaf 2p's tile, rounds and keeps it (shared memory), resets its accumulators, computes leaf 2p+1's tile over its K,
// rounds it and stores the node; the two leaf products are never written to memory. Every variant has the mode (the
// same choice from the shape, with the pairs as the batch), except the mid-M blocks (m < 256), which have none.
// Preconditions: check_pairs_call passed; m >= 1; tile_pairs_fused(shape). Returns the launch's CUDA error
// (cudaErrorInvalidValue where the shape runs on the mid-M blocks).
cudaError_t launch_tile_matmul_pairs(const void* a, const void* b, void* c, DType dtype, const PairShape& shape,
                                     cudaStream_t stream);

// Returns whether launch_tile_matmul_pairs has a fused kernel for this shape: false where the plain product runs on
// the mid-M blocks (m < 256 unless the large blocks serve it, or a forced "mid*" variant). There the caller runs the
// even and the odd leaves as two plain products (launch_tile_matmul) and adds them with launch_pair_add: the same
// bits, since each leaf product is the plain one either way and launch_pair_add computes the node as the fused
// kernels do (and at m < 256 the leaves' extra write and read are small).
bool tile_pairs_fused(const PairShape& shape);

// c[p] <- round(float(c[p]) + float(right[p])) for p < pairs, m x n elements each (the tree node, as
// launch_tile_matmul_pairs computes it): the cuBLASLt mode's pair products, whose leaves are cuBLASLt calls.
struct PairAddShape {
  int64_t m = 0, n = 0, pairs = 1;
  int64_t ldc = 0, stride_c = 0, ld_right = 0, stride_right = 0;
};
// Preconditions: c and right 16-byte aligned, leading dimensions and strides multiples of 8 elements, pairs <= 65535;
// c and right do not overlap. Returns the launch's CUDA error.
cudaError_t launch_pair_add(void* c, const void* right, DType dtype, const PairAddShape& shape, cudaStream_t stream);

}  // namespace exactcoll::cuda::linear
