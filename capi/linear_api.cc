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

// Stream-ordered scratch (cudaMallocAsync; freed with cudaFreeAsync on the same stream, also when what
// uses it throws, so that it can be captured in a CUDA graph).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    EXC_CUDA_CHECK(cudaMallocAsync(&pointer_, bytes, stream));
  }
  ~StreamScratch() {
    if (pointer_ != nullptr) cudaFreeAsync(pointer_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* get() const { return pointer_; }

 private:
  void* pointer_ = nullptr;
  cudaStream_t stream_;
};

// The pair product from plain products, where no kernel fuses it (the pinned cuBLASLt
// configuration, and the tile product's mid-M blocks): the even leaves' products into c (one call
// batched over the pairs), the odd leaves' into a scratch, then c <- node(c, scratch) (the tree
// node, as the tile kernels' pair mode computes it). Each leaf product is the one
// exactcoll_invariant_matmul computes in the same mode (`product` runs it: same kernel, same k).
template <class Product>
void split_pairs(const Product& product, const void* a, const void* b, void* c, DType type,
                 const cuda::linear::PairShape& p, cudaStream_t stream) {
  const int64_t size = dtype_size(type);
  cuda::linear::MatmulShape even;
  even.m = p.m, even.k = p.k, even.n = p.n, even.batch = p.pairs;
  even.lda = p.lda, even.ldb = p.ldb, even.ldc = p.ldc;
  even.stride_a = 2 * p.stride_a_leaf, even.stride_b = 2 * p.stride_b_leaf, even.stride_c = p.stride_c_pair;
  product(a, b, c, even);
  cuda::linear::MatmulShape odd = even;
  odd.ldc = (p.n + 7) / 8 * 8;  // the scratch's rows: 16-byte multiples
  odd.stride_c = p.m * odd.ldc;
  StreamScratch scratch(static_cast<size_t>(p.pairs * odd.stride_c * size), stream);
  product(static_cast<const char*>(a) + p.stride_a_leaf * size, static_cast<const char*>(b) + p.stride_b_leaf * size,
          scratch.get(), odd);
  cuda::linear::PairAddShape add;
  add.m = p.m, add.n = p.n, add.pairs = p.pairs;
  add.ldc = p.ldc, add.stride_c = p.stride_c_pair, add.ld_right = odd.ldc, add.stride_right = odd.stride_c;
  EXC_CUDA_CHECK(cuda::linear::launch_pair_add(c, scratch.get(), type, add, stream));
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

int exactcoll_invariant_matmul_pairs(const void* a, const void* b, void* c, int64_t m, int64_t k, int64_t n,
                                     int64_t pairs, int64_t lda, int64_t ldb, int64_t ldc, int64_t stride_a_leaf,
                                     int64_t stride_b_leaf, int64_t stride_c_pair, int dtype, int device,
                                     void* stream) {
  return guarded("exactcoll_invariant_matmul_pairs", [&] {
    const DType type = product_dtype(dtype);
    const cuda::linear::PairShape shape = checked_pairs(a, b, c, m, k, n, pairs, lda, ldb, ldc, stride_a_leaf,
                                                        stride_b_leaf, stride_c_pair, type, device);
    if (m == 0) return;
    on_device(device, [&](int current) {
      const auto s = static_cast<cudaStream_t>(stream);
      if (cuda::linear::invariant_kernel() != cuda::linear::InvariantKernel::kTiles) {
        cuda::linear::InvariantMatmul& pinned = cuda::linear::InvariantMatmul::on_device(current);
        split_pairs([&](const void* x, const void* w, void* out,
                        const cuda::linear::MatmulShape& leaf) { pinned.run(x, w, out, type, leaf, s); },
                    a, b, c, type, shape, s);
      } else if (cuda::linear::tile_pairs_fused(shape)) {
        EXC_CUDA_CHECK(cuda::linear::launch_tile_matmul_pairs(a, b, c, type, shape, s));
      } else {
        split_pairs(
            [&](const void* x, const void* w, void* out, const cuda::linear::MatmulShape& leaf) {
              EXC_CUDA_CHECK(cuda::linear::launch_tile_matmul(x, w, out, type, leaf, s));
            },
            a, b, c, type, shape, s);
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
