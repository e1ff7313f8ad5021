// One cuBLASLt matrix product configuration: row-major C [m, n] = A [m, k] @ B [k, n] for bf16 or
// fp16 storage, float accumulation (CUBLAS_COMPUTE_32F), C in the storage type.
//
// cuBLASLt is column-major; a row-major [r, c] matrix is a column-major [c, r] one, so the product
// is computed as C^T [n, m] = B^T [n, k] @ A^T [k, m] with no transposes: cuBLAS's "A" is our B
// (ld n), its "B" is our A (ld k), its C is our C (ld n). Consecutive rows of A and C are
// consecutive columns there, so a block of A's rows gives the same block of C's rows.
//
// The algorithm (kernel, tile, split-K, stages, ...) is fixed at construction: the heuristic's
// first choice for this shape, or one passed in (e.g. a tuned one: the AG->matmul pipeline and the
// unpipelined reference multiply the same row blocks with the same configuration per row count,
// so their bits can be compared). cuBLASLt is reached through CublasLtApi (dlopen).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/storage.h"
#include "cuda_backend/overlap/cublaslt_api.h"

namespace exactcoll::cuda {

class LtMatmul {
 public:
  // Preconditions: dtype bf16 or fp16; m, k, n >= 1; workspace of workspace_bytes device bytes,
  // used by every run() (so runs on different streams need different LtMatmul objects or must be
  // ordered). algo: empty = the heuristic's first choice. Throws CublasError when cuBLASLt offers
  // no algorithm, or when `algo` does not support this shape (cublasLtMatmulAlgoCheck).
  LtMatmul(cublasLtHandle_t handle, DType dtype, size_t m, size_t k, size_t n, void* workspace, size_t workspace_bytes,
           std::optional<cublasLtMatmulAlgo_t> algo = std::nullopt);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Returns whether `algo` can run this shape (no throw).
  static bool supports(cublasLtHandle_t handle, DType dtype, size_t m, size_t k, size_t n, size_t workspace_bytes,
                       const cublasLtMatmulAlgo_t& algo);

  // Returns up to `count` algorithms the heuristic offers for this shape (its order: best
  // estimate first), each usable with workspace_bytes. Throws CublasError when it offers none.
  static std::vector<cublasLtMatmulAlgo_t> candidates(cublasLtHandle_t handle, DType dtype, size_t m, size_t k,
                                                      size_t n, size_t workspace_bytes, int count);

  // Enqueues C = A @ B on stream (row-major, as above).
  void run(const void* a, const void* b, void* c, cudaStream_t stream) const;

  const cublasLtMatmulAlgo_t& algo() const { return algo_; }
  // "algo 21 tile 31 splitK 1 reduction 0 swizzle 0 stages 20 cluster 2" (the configuration's attributes).
  std::string algo_text() const;
  double flops() const { return 2.0 * static_cast<double>(m_) * static_cast<double>(k_) * static_cast<double>(n_); }

 private:
  cublasLtHandle_t handle_;
  size_t m_, k_, n_;
  void* workspace_;
  size_t workspace_bytes_;
  struct Descriptors;  // the matmul descriptor and the three layouts (lt_matmul.cc)
  std::unique_ptr<Descriptors> d_;
  cublasLtMatmulAlgo_t algo_{};
};

}  // namespace exactcoll::cuda
