// exactcoll's own invariant matrix product (tile_matmul.h says why its bits are invariant).
#include "cuda_backend/linear/tile_matmul.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

namespace exactcoll::cuda::linear {
namespace {

// K is loaded 128 at a time (16 loads of 16 bytes in flight per thread: at decode, m <= 64, the
// product streams B and the loop is bound by how many bytes are in flight; the next step's loads
// are issued before this step's MMAs) and multiplied 16 at a time in order, so the order of an
// element's MMAs (k 0..15, 16..31, ...) does not depend on it. Blocks of C have 64 columns and
// kRows = 64 rows (2 x 2 warps of 32 x 32), or 16 rows for m <= 32 (4 warps of 16 x 16 side by
// side: a quarter of the MMAs a block of 64 rows spends on rows past m; at m = 64 and H 8192 the
// four 16-row blocks that each reread B took 37.7 us against 24.3 for 64-row blocks, 4 x H100,
// 2026-11-27). An element is in the same place of its 16 x 16 fragment either way (blocks start at
// multiples of 16), so the choice changes which block computes it, never its bits: the Llama check
// gave the same sha256 before and after this choice existed.
constexpr int kBlockN = 64, kStepK = 128, kThreads = 128;
constexpr int kPadA = kStepK + 8;  // shared rows padded (ldm a multiple of 8 elements, fewer bank conflicts)
constexpr int kPadB = kBlockN + 8;
constexpr int kPadC = kBlockN + 4;  // fp32: a multiple of 4
constexpr int kSmallRows = 16;      // the 16-row blocks serve m <= kSmallM
constexpr int64_t kSmallM = 32;

// One shared buffer: the A and B tiles during the K loop, then the fp32 C tile (after the last sync).
template <class E, int kRows>
struct alignas(128) TileSmem {
  union {
    struct {
      E a[kRows][kPadA];
      E b[kStepK][kPadB];
    } ab;
    float c[kRows][kPadC];
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

// One K step's operands, held in registers between their loads and their shared stores.
template <class E, int kRows>
struct StepRegisters {
  static constexpr int kLoadsA = kRows * (kStepK / 8) / kThreads, kLoadsB = kStepK * (kBlockN / 8) / kThreads;
  static_assert(kLoadsA >= 1 && kRows * (kStepK / 8) % kThreads == 0, "A's groups of 8 split evenly over the threads");
  uint4 a[kLoadsA], b[kLoadsB];

  // A's rows [row0, +kRows) x [k0, +128) and B's [k0, +128) x [col0, +64), zeros past m, k, n.
  __device__ __forceinline__ void fetch(const E* a_block, const E* b_block, const TileArgs& args, int64_t row0,
                                        int64_t col0, int64_t k0) {
#pragma unroll
    for (int t = 0; t < kLoadsA; ++t) {
      const int v = static_cast<int>(threadIdx.x) + t * kThreads, r = v / (kStepK / 8), e = (v % (kStepK / 8)) * 8;
      const int64_t row = row0 + r, kk = k0 + e;
      a[t] = fetch8(a_block + row * args.lda + kk, row < args.m ? clamp8(args.k - kk) : 0);
    }
#pragma unroll
    for (int t = 0; t < kLoadsB; ++t) {
      const int v = static_cast<int>(threadIdx.x) + t * kThreads, r = v / (kBlockN / 8), e = (v % (kBlockN / 8)) * 8;
      const int64_t kk = k0 + r, col = col0 + e;
      b[t] = fetch8(b_block + kk * args.ldb + col, kk < args.k ? clamp8(args.n - col) : 0);
    }
  }

  __device__ __forceinline__ void store(TileSmem<E, kRows>& smem) const {
#pragma unroll
    for (int t = 0; t < kLoadsA; ++t) {
      const int v = static_cast<int>(threadIdx.x) + t * kThreads;
      *reinterpret_cast<uint4*>(&smem.ab.a[v / (kStepK / 8)][(v % (kStepK / 8)) * 8]) = a[t];
    }
#pragma unroll
    for (int t = 0; t < kLoadsB; ++t) {
      const int v = static_cast<int>(threadIdx.x) + t * kThreads;
      *reinterpret_cast<uint4*>(&smem.ab.b[v / (kBlockN / 8)][(v % (kBlockN / 8)) * 8]) = b[t];
    }
  }
};

template <class E, int kRows>
__global__ void __launch_bounds__(kThreads) tile_matmul_kernel(const TileArgs args) {
  using namespace nvcuda;
  // kRows 64: warps 2 x 2, each 32 x 32 (2 x 2 fragments); kRows 16: warps 1 x 4, each 16 x 16.
  constexpr int kFragsM = kRows == 64 ? 2 : 1, kFragsN = kRows == 64 ? 2 : 1;
  __shared__ TileSmem<E, kRows> smem;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBlockN;
  const E* a = static_cast<const E*>(args.a) + static_cast<int64_t>(blockIdx.z) * args.stride_a;
  const E* b = static_cast<const E*>(args.b) + static_cast<int64_t>(blockIdx.z) * args.stride_b;
  E* c = static_cast<E*>(args.c) + static_cast<int64_t>(blockIdx.z) * args.stride_c;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_row = kRows == 64 ? (warp / 2) * 32 : 0;
  const int warp_col = kRows == 64 ? (warp % 2) * 32 : warp * 16;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragsM][kFragsN];
  for (int i = 0; i < kFragsM; ++i) {
    for (int j = 0; j < kFragsN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  StepRegisters<E, kRows> step;
  step.fetch(a, b, args, row0, col0, 0);
  for (int64_t k0 = 0; k0 < args.k; k0 += kStepK) {
    step.store(smem);
    __syncthreads();
    if (k0 + kStepK < args.k) step.fetch(a, b, args, row0, col0, k0 + kStepK);  // in flight during the MMAs
    for (int s = 0; s < kStepK; s += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major> a_frag[kFragsM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major> b_frag[kFragsN];
      for (int i = 0; i < kFragsM; ++i) wmma::load_matrix_sync(a_frag[i], &smem.ab.a[warp_row + 16 * i][s], kPadA);
      for (int j = 0; j < kFragsN; ++j) wmma::load_matrix_sync(b_frag[j], &smem.ab.b[s][warp_col + 16 * j], kPadB);
      for (int i = 0; i < kFragsM; ++i) {
        for (int j = 0; j < kFragsN; ++j) wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  // The K loop's last __syncthreads: every warp is done reading the A and B tiles that c overlays.
  for (int i = 0; i < kFragsM; ++i) {
    for (int j = 0; j < kFragsN; ++j) {
      wmma::store_matrix_sync(&smem.c[warp_row + 16 * i][warp_col + 16 * j], acc[i][j], kPadC, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int v = static_cast<int>(threadIdx.x); v < kRows * kBlockN; v += kThreads) {
    const int r = v / kBlockN, e = v % kBlockN;
    const int64_t row = row0 + r, col = col0 + e;
    if (row < args.m && col < args.n) c[row * args.ldc + col] = round_element<E>(smem.c[r][e]);
  }
}

// One launch per group of at most 65535 row blocks (the grid's y limit), each on its rows of A and
// C: a row's products do not depend on which launch computes them.
template <class E, int kRows>
cudaError_t launch_rows(const TileArgs& args, int64_t batch, cudaStream_t stream) {
  constexpr int64_t kMaxBlocksY = 65535;
  const int64_t blocks_n = (args.n + kBlockN - 1) / kBlockN;
  if (blocks_n > 0x7FFFFFFF || batch > 65535) return cudaErrorInvalidConfiguration;
  for (int64_t first = 0; first < args.m; first += kMaxBlocksY * kRows) {
    TileArgs group = args;
    group.m = std::min<int64_t>(args.m - first, kMaxBlocksY * kRows);
    group.a = static_cast<const E*>(args.a) + first * args.lda;
    group.c = static_cast<E*>(args.c) + first * args.ldc;
    const int64_t blocks_m = (group.m + kRows - 1) / kRows;
    const dim3 grid(static_cast<unsigned>(blocks_n), static_cast<unsigned>(blocks_m), static_cast<unsigned>(batch));
    tile_matmul_kernel<E, kRows><<<grid, kThreads, 0, stream>>>(group);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class E>
cudaError_t launch_typed(const TileArgs& args, int64_t batch, cudaStream_t stream) {
  return args.m <= kSmallM ? launch_rows<E, kSmallRows>(args, batch, stream) : launch_rows<E, 64>(args, batch, stream);
}

}  // namespace

cudaError_t launch_tile_matmul(const void* a, const void* b, void* c, DType dtype, const MatmulShape& s,
                               cudaStream_t stream) {
  const TileArgs args{a, b, c, s.m, s.k, s.n, s.lda, s.ldb, s.ldc, s.stride_a, s.stride_b, s.stride_c};
  return dtype == DType::kBF16 ? launch_typed<__nv_bfloat16>(args, s.batch, stream)
                               : launch_typed<__half>(args, s.batch, stream);
}

}  // namespace exactcoll::cuda::linear
