// exactcoll's own invariant matrix product (tile_matmul.h says why its bits are invariant).
#include "cuda_backend/linear/tile_matmul.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

namespace exactcoll::cuda::linear {
namespace {

// K is loaded 128 at a time (16 loads of 16 bytes in flight per thread: at decode, m <= 64, the
// product streams B and the loop is bound by how many bytes are in flight) and multiplied 16 at a
// time in order, so the order of an element's MMAs (k 0..15, 16..31, ...) does not depend on it.
constexpr int kBlockM = 64, kBlockN = 64, kStepK = 128, kThreads = 128;
constexpr int kPadA = kStepK + 8;   // shared rows padded (ldm a multiple of 8 elements, fewer bank conflicts)
constexpr int kPadB = kBlockN + 8;
constexpr int kPadC = kBlockN + 4;  // fp32: a multiple of 4
// One shared buffer: the A and B tiles during the K loop, then the fp32 C tile (after the last sync).
template <class E>
struct alignas(128) TileSmem {
  union {
    struct {
      E a[kBlockM][kPadA];
      E b[kStepK][kPadB];
    } ab;
    float c[kBlockM][kPadC];
  };
};

struct TileArgs {
  const void* a;
  const void* b;
  void* c;
  int64_t m, k, n;
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
};

template <class E>
__device__ __forceinline__ E zero_element();
template <>
__device__ __forceinline__ __nv_bfloat16 zero_element<__nv_bfloat16>() {
  return __float2bfloat16_rn(0.0f);
}
template <>
__device__ __forceinline__ __half zero_element<__half>() {
  return __float2half_rn(0.0f);
}

template <class E>
__device__ __forceinline__ E round_element(float f);
template <>
__device__ __forceinline__ __nv_bfloat16 round_element<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
template <>
__device__ __forceinline__ __half round_element<__half>(float f) {
  return __float2half_rn(f);
}

// Returns 8 consecutive elements src[0..7] of one row as 16 bytes, zeros past `valid` (0..8): one
// 16-byte load when all 8 are valid (the row start and the leading dimension are 16-byte aligned,
// and the 8 start at a multiple of 8).
template <class E>
__device__ __forceinline__ uint4 fetch8(const E* src, int valid) {
  if (valid == 8) return *reinterpret_cast<const uint4*>(src);
  E e8[8];
  for (int e = 0; e < 8; ++e) e8[e] = e < valid ? src[e] : zero_element<E>();
  uint4 out;
  __builtin_memcpy(&out, e8, sizeof out);
  return out;
}

__device__ __forceinline__ int clamp8(int64_t left) { return left >= 8 ? 8 : left <= 0 ? 0 : static_cast<int>(left); }

template <class E>
__global__ void __launch_bounds__(kThreads) tile_matmul_kernel(const TileArgs args) {
  using namespace nvcuda;
  __shared__ TileSmem<E> smem;
  auto& a_tile = smem.ab.a;
  auto& b_tile = smem.ab.b;
  auto& c_tile = smem.c;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kBlockM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBlockN;
  const E* a = static_cast<const E*>(args.a) + static_cast<int64_t>(blockIdx.z) * args.stride_a;
  const E* b = static_cast<const E*>(args.b) + static_cast<int64_t>(blockIdx.z) * args.stride_b;
  E* c = static_cast<E*>(args.c) + static_cast<int64_t>(blockIdx.z) * args.stride_c;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_row = (warp / 2) * 32, warp_col = (warp % 2) * 32;  // each warp: a 32 x 32 quarter
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  for (int64_t k0 = 0; k0 < args.k; k0 += kStepK) {
    // A block's rows [row0, +64) x [k0, +128) and B's [k0, +128) x [col0, +64), in groups of 8
    // elements: every load of the step issued before the first shared store.
    constexpr int kLoadsA = kBlockM * (kStepK / 8) / kThreads, kLoadsB = kStepK * (kBlockN / 8) / kThreads;
    uint4 ra[kLoadsA], rb[kLoadsB];
#pragma unroll
    for (int t = 0; t < kLoadsA; ++t) {
      const int v = static_cast<int>(threadIdx.x) + t * kThreads, r = v / (kStepK / 8), e = (v % (kStepK / 8)) * 8;
      const int64_t row = row0 + r, kk = k0 + e;
      ra[t] = fetch8(a + row * args.lda + kk, row < args.m ? clamp8(args.k - kk) : 0);
    }
#pragma unroll
    for (int t = 0; t < kLoadsB; ++t) {
      const int v = static_cast<int>(threadIdx.x) + t * kThreads, r = v / (kBlockN / 8), e = (v % (kBlockN / 8)) * 8;
      const int64_t kk = k0 + r, col = col0 + e;
      rb[t] = fetch8(b + kk * args.ldb + col, kk < args.k ? clamp8(args.n - col) : 0);
    }
#pragma unroll
    for (int t = 0; t < kLoadsA; ++t) {
      const int v = static_cast<int>(threadIdx.x) + t * kThreads;
      *reinterpret_cast<uint4*>(&a_tile[v / (kStepK / 8)][(v % (kStepK / 8)) * 8]) = ra[t];
    }
#pragma unroll
    for (int t = 0; t < kLoadsB; ++t) {
      const int v = static_cast<int>(threadIdx.x) + t * kThreads;
      *reinterpret_cast<uint4*>(&b_tile[v / (kBlockN / 8)][(v % (kBlockN / 8)) * 8]) = rb[t];
    }
    __syncthreads();
    for (int s = 0; s < kStepK; s += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> a_frag[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> b_frag[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a_frag[i], &a_tile[warp_row + 16 * i][s], kPadA);
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b_frag[j], &b_tile[s][warp_col + 16 * j], kPadB);
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  // The K loop's last __syncthreads: every warp is done reading the A and B tiles that c overlays.
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(&c_tile[warp_row + 16 * i][warp_col + 16 * j], acc[i][j], kPadC, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int v = static_cast<int>(threadIdx.x); v < kBlockM * kBlockN; v += kThreads) {
    const int r = v / kBlockN, e = v % kBlockN;
    const int64_t row = row0 + r, col = col0 + e;
    if (row < args.m && col < args.n) c[row * args.ldc + col] = round_element<E>(c_tile[r][e]);
  }
}

}  // namespace

cudaError_t launch_tile_matmul(const void* a, const void* b, void* c, DType dtype, const MatmulShape& s,
                               cudaStream_t stream) {
  const TileArgs args{a, b, c, s.m, s.k, s.n, s.lda, s.ldb, s.ldc, s.stride_a, s.stride_b, s.stride_c};
  const int64_t blocks_n = (s.n + kBlockN - 1) / kBlockN, blocks_m = (s.m + kBlockM - 1) / kBlockM;
  if (blocks_n > 0x7FFFFFFF || blocks_m > 65535 || s.batch > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks_n), static_cast<unsigned>(blocks_m), static_cast<unsigned>(s.batch));
  if (dtype == DType::kBF16) {
    tile_matmul_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(args);
  } else {
    tile_matmul_kernel<__half><<<grid, kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace exactcoll::cuda::linear
