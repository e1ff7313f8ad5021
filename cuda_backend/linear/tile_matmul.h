// exactcoll's own invariant matrix product (invariant_matmul.h's default kernel): one CUDA kernel
// whose per-element order of operations is fixed by construction, so no assumption about a
// library's kernel choice is needed.
//
//   C[b] = A[b] @ B[b] (row-major, bf16 or fp16, fp32 accumulation, one rounding at the end),
//   the shapes, leading dimensions and strides of MatmulShape (matmul_args.h, already checked).
//
// Why each output element's bits depend only on its row of A, its column of B and K: the grid
// tiles C in blocks of 64 columns and 64 rows (16 rows when m <= 32) (blockIdx.x over columns, .y over rows, .z over
// batch entries); a block walks K from 0 (loading 128 at a time), and each element's accumulator is the same sequence
// of tensor-core operations (wmma m16n16k16, fp32 accumulate: k 0..15, then 16..31, ...), starting from +0.0f, whatever
// the block's position, M, N or the batch. Elements past K (the last step) are loaded as zeros, identically for every M
// and N. Rows past M and columns past N are computed from zeros and never stored. The tensor cores' order inside one
// MMA is the hardware's, the same for every call on the same GPU model (docs/numerics.md: leaf products are given
// inputs).
#pragma once

#include <cuda_runtime_api.h>

#include "core/storage.h"
#include "cuda_backend/linear/matmul_args.h"

namespace exactcoll::cuda::linear {

// The kernel's fixed tiling, named in the configuration text callers compare across runs.
inline constexpr const char* kTileMatmulText =
    "exactcoll tiles: C blocks of 64 columns, K in order from 0 by wmma m16n16k16, fp32 accumulate, one rounding";

// Enqueues the product. Preconditions: check_call passed (bf16 or fp16; 16-byte aligned pointers,
// leading dimensions and strides); m >= 1. Returns the launch's CUDA error.
cudaError_t launch_tile_matmul(const void* a, const void* b, void* c, DType dtype, const MatmulShape& shape,
                               cudaStream_t stream);

}  // namespace exactcoll::cuda::linear
