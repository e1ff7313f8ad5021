// A matrix product whose every output element's bits depend only on its row of A, its column of B
// and K: not on M, N, the batch count, where the operands sit in memory, or which call (column-
// or row-parallel layer, one leaf or eight, one request or 64) it belongs to. The building block of
// the tree contract's TP-invariant linear layers (issue 25, item 3; python/exactcoll/linear.py).
//
//   C[b] [m, n] = A[b] [m, k] @ B[b] [k, n]   for b in 0..batch-1, row-major, bf16 or fp16,
//   float accumulation (CUBLAS_COMPUTE_32F), each output rounded once to the storage type;
//   A[b] at a + b * stride_a with rows lda elements apart (lda >= k), B[b] at b + b * stride_b
//   (ldb >= n), C[b] at c + b * stride_c (ldc >= n). stride_b may be 0 (one B for every batch).
//
// How it is invariant. cuBLASLt (dlopened, cuda_backend/overlap/cublaslt_api.h) computes the
// product with the column-major mapping of cuda_backend/overlap/lt_matmul.h: C^T [n, m] =
// B^T [n, k] @ A^T [k, m], with no transposes. What a heuristic would change from shape to shape
// is the algorithm: kernel, tile, stages, split-K and its reduction. Here ONE configuration is
// pinned per (device, dtype, K): chosen once, the first time that K is used, from the heuristic's
// list at a fixed reference shape (m = kReferenceM, n = kReferenceN, batch 1, whatever the call),
// keeping only configurations with
//   - split-K 1 and reduction scheme none: one CTA computes each output tile over the whole K, so
//     an element's sum is the kernel's fixed K loop (its k-tiles in order, the tensor cores' own
//     order inside each MMA) whatever the tile's position;
//   - no workspace, at the reference shape and at every shape run: nothing is accumulated outside
//     the output tile's CTA (a stream-K or split-K scheme needs a workspace for its partials), and
//     calls on different streams share nothing;
//   - a minimum alignment of at most 16 bytes for every operand;
//   - cublasLtMatmulAlgoCheck passing at small probe shapes (m = 1 with n = 8 and 4096, m = 17,
//     m = 256);
// and that configuration is then used for every call with that K. A call the configuration runs
// whole (batched, without workspace) is one cuBLASLt call. Otherwise it runs one batch entry at a
// time, in blocks of C's rows and columns (halving the columns down to 1024, then the rows down to
// 64, then the columns down to 8, until the configuration runs the block without workspace), each
// block one call with the same configuration on sub-matrices of the same operands. What was seen
// on an H100 (cuBLASLt 13, CUDA 13.0, 2026-11-27): every candidate the heuristic offers at the
// reference shape is an sm90 "algo 66" configuration with split-K 1, and each refuses a batched
// m = 1 layout and, without workspace, m = 4096 x n = 16384 (so those run in blocks).
// Batch entries, blocks and boundary tiles only change which CTA (and which call) computes an
// element, never the order of its sum, so an element's bits are a function of its row of A, its
// column of B and K alone. A shape the pinned configuration cannot run even in blocks is refused
// (MatmulRefused), never run with another configuration, and so is a pointer, leading dimension or
// stride the configuration's alignment does not allow.
//
// What is assumed, and has NOT yet been checked on a GPU (python/tests/gpu_invariant_matmul_check.py
// checks it; the two runs of 2026-11-27 pinned nothing, see above): that a cuBLASLt kernel, given a
// fixed configuration and no workspace, computes each output element with the same sequence of
// operations whatever the problem's M, N and batch (true of tiled kernels without split-K or
// stream-K: the K loop is per CTA and does not depend on the grid); that the heuristic, given the
// same device model, cuBLASLt version and reference shape, returns the same list (so every process
// of a TP job and of its trainer pins the same configuration: exactcoll_invariant_matmul_config
// says which, to compare across runs). K tiles past K are padded identically for every M and N.
// Different GPUs, cuBLASLt versions or an override below may pin a different configuration, with
// different bits.
//
// Overrides, for experiments (every process whose bits are compared must set the same):
//   EXACTCOLL_INVARIANT_MATMUL_CANDIDATE=i  the i-th configuration that passes the filters (0)
//   EXACTCOLL_INVARIANT_MATMUL_REFERENCE=MxN  the reference shape (kReferenceM x kReferenceN)
// read when a (dtype, K) is first used.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "core/storage.h"
#include "cuda_backend/linear/matmul_args.h"

namespace exactcoll::cuda::linear {

// The reference shape at which the configuration for a K is chosen.
inline constexpr int64_t kReferenceM = 256;
inline constexpr int64_t kReferenceN = 4096;

// cuBLASLt could not be loaded (libcublasLt.so.13 missing).
struct MatmulUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The configuration pinned for one (device, dtype, K).
struct PinnedConfig {
  cublasLtMatmulAlgo_t algo{};
  // "bf16 K=4096: algo 66 tile 18 splitK 1 reduction 0 swizzle 0 custom 3 stages 35 inner 0
  //  cluster 5 (candidate 0 of 8 at m=256 n=4096; batched m=1 looped, m=64 native; cuBLASLt ...)"
  std::string text;
  uint32_t align_bytes = 16;  // what pointers, leading dimensions and strides must be multiples of
};

// The process's invariant products on one GPU: its cuBLASLt handle, the pinned configurations and
// the descriptors of the shapes it has run (kept, at most a few thousand). Thread-safe.
class InvariantMatmul {
 public:
  // Returns the object of `device`, made on first use. Precondition: `device` is the calling
  // thread's current device (the cuBLASLt handle is made there). Throws MatmulUnavailable without
  // cuBLASLt.
  static InvariantMatmul& on_device(int device);

  // Returns the configuration pinned for (dtype, k), choosing it on the first call. Throws
  // MatmulRefused when no configuration passes the filters.
  const PinnedConfig& pinned(DType dtype, int64_t k);

  // Enqueues the product on stream (check_call first, then the pinned configuration; refused, not
  // switched, where that configuration cannot run the shape). m == 0 enqueues nothing. Throws
  // MatmulRefused, or CublasError when cuBLASLt fails a call.
  void run(const void* a, const void* b, void* c, DType dtype, const MatmulShape& shape, cudaStream_t stream);

  InvariantMatmul(const InvariantMatmul&) = delete;
  InvariantMatmul& operator=(const InvariantMatmul&) = delete;

 private:
  InvariantMatmul();
  struct State;  // handle, pinned configurations, descriptor cache (invariant_matmul.cc)
  std::unique_ptr<State> state_;
};

}  // namespace exactcoll::cuda::linear
