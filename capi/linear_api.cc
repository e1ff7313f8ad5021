// The C API's TP-invariant matrix product (exactcoll.h, "TP-invariant matrix products"), over
// cuda::linear::InvariantMatmul. Compiled only with a CUDA toolkit; capi/linear_api_stub.cc stands
// in without one.
#include <cuda_runtime_api.h>

#include <string>

#include "capi/api_support.h"
#include "capi/linear_checks.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/linear/invariant_matmul.h"
#include "cuda_backend/linear/tile_matmul.h"
#include "cuda_backend/overlap/cublaslt_api.h"
#include "exactcoll/exactcoll.h"

using namespace exactcoll;
using namespace exactcoll::capi;

namespace {

using cuda::DeviceScope;  // cuda_backend/cuda_check.h

// Runs body on `device` (-1: the current one), with the module's exceptions as statuses: a refused
// call is INVALID_ARGUMENT, cuBLASLt missing is UNAVAILABLE, a CUDA or cuBLASLt failure is CUDA.
template <class Body>
void on_device(int device, Body&& body) {
  try {
    if (device == -1) EXC_CUDA_CHECK(cudaGetDevice(&device));
    DeviceScope scope(device);
    body(device);
  } catch (const cuda::linear::MatmulRefused& e) {
    bad_argument(e.what());
  } catch (const cuda::linear::MatmulUnavailable& e) {
    fail(EXACTCOLL_ERROR_UNAVAILABLE, e.what());
  } catch (const cuda::CublasError& e) {
    fail(EXACTCOLL_ERROR_CUDA, e.what());
  } catch (const cuda::CudaError& e) {
    fail(EXACTCOLL_ERROR_CUDA, e.what());
  }
}

}  // namespace

extern "C" {

int exactcoll_invariant_matmul(const void* a, const void* b, void* c, int64_t m, int64_t k, int64_t n, int64_t batch,
                               int64_t lda, int64_t ldb, int64_t ldc, int64_t stride_a, int64_t stride_b,
                               int64_t stride_c, int dtype, int device, void* stream) {
  return guarded("exactcoll_invariant_matmul", [&] {
    // Every argument before any GPU work, so a bad call is refused the same with or without a GPU.
    const DType type = product_dtype(dtype);
    const cuda::linear::MatmulShape shape =
        checked_matmul(a, b, c, m, k, n, batch, lda, ldb, ldc, stride_a, stride_b, stride_c, type, device);
    if (m == 0) return;
    on_device(device, [&](int current) {
      if (cuda::linear::invariant_kernel() == cuda::linear::InvariantKernel::kTiles) {
        EXC_CUDA_CHECK(cuda::linear::launch_tile_matmul(a, b, c, type, shape, static_cast<cudaStream_t>(stream)));
      } else {
        cuda::linear::InvariantMatmul::on_device(current).run(a, b, c, type, shape, static_cast<cudaStream_t>(stream));
      }
    });
  });
}

int exactcoll_invariant_matmul_config(int dtype, int64_t k, int device, char* text, size_t size) {
  return guarded("exactcoll_invariant_matmul_config", [&] {
    const DType type = product_dtype(dtype);
    check_config(k, device, text, size);
    on_device(device, [&](int current) {
      const std::string pinned = cuda::linear::invariant_kernel() == cuda::linear::InvariantKernel::kTiles
                                     ? std::string(cuda::linear::kTileMatmulText)
                                     : cuda::linear::InvariantMatmul::on_device(current).pinned(type, k).text;
      const size_t n = pinned.size() < size - 1 ? pinned.size() : size - 1;
      pinned.copy(text, n);
      text[n] = '\0';
    });
  });
}

}  // extern "C"
