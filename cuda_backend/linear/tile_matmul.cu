// exactcoll's own invariant matrix product (tile_matmul.h says why its bits are invariant).
#include "cuda_backend/linear/tile_matmul.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

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
// gave the same sha256 before and after this choice existed. Since the mid-M variant (below) these
// blocks run only when forced ("16", "64"): the reference the other variants are compared with.
constexpr int kBlockN = 64, kStepK = 128, kThreads = 128;
constexpr int kPadA = kStepK + 8;  // shared rows padded (ldm a multiple of 8 elements, fewer bank conflicts)
constexpr int kPadB = kBlockN + 8;
constexpr int kPadC = kBlockN + 4;  // fp32: a multiple of 4
constexpr int kSmallRows = 16;      // the 16-row blocks ("16"); the mid-M ones of 16 rows serve m <= kSmallM
constexpr int64_t kSmallM = 32;
constexpr int64_t kLargeM = 256;  // the large-M variant (below) serves m >= kLargeM (and some m > 64: choose_mid)

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

template <class E>
__device__ __forceinline__ float widen_element(E e);
template <>
__device__ __forceinline__ float widen_element<__nv_bfloat16>(__nv_bfloat16 e) {
  return __bfloat162float(e);
}
template <>
__device__ __forceinline__ float widen_element<__half>(__half e) {
  return __half2float(e);
}

// Two elements in one 32-bit word (the first in the low half) and back.
template <class E>
__device__ __forceinline__ uint32_t pack2(E low, E high) {
  uint16_t l, h;
  __builtin_memcpy(&l, &low, sizeof l);
  __builtin_memcpy(&h, &high, sizeof h);
  return static_cast<uint32_t>(l) | static_cast<uint32_t>(h) << 16;
}
template <class E>
__device__ __forceinline__ E low_element(uint32_t word) {
  const uint16_t bits = static_cast<uint16_t>(word & 0xFFFFu);
  E e;
  __builtin_memcpy(&e, &bits, sizeof e);
  return e;
}
template <class E>
__device__ __forceinline__ E high_element(uint32_t word) {
  const uint16_t bits = static_cast<uint16_t>(word >> 16);
  E e;
  __builtin_memcpy(&e, &bits, sizeof e);
  return e;
}

// The tree contract's node of two rounded leaf products (core/contract.h's tree_node): one fp32 add
// (__fadd_rn, never contracted), before its one rounding to storage (round_element, the caller's).
template <class E>
__device__ __forceinline__ float pair_sum(E left, E right) {
  return __fadd_rn(widen_element<E>(left), widen_element<E>(right));
}

// The leaf-pair mode (kPairs): blockIdx.z is pair p; the block computes leaf 2p's product (A and B at entry 2p of
// stride_a, stride_b), rounds it and keeps it, then leaf 2p+1's (entry 2p+1) the same way from accumulators reset to
// +0.0f, and stores round_element(pair_sum(leaf 2p, leaf 2p+1)) at C entry p (stride_c). Each leaf's product is the
// one the plain mode computes (the same code, per leaf); without kPairs, blockIdx.z is the batch entry of A, B and C.
template <class E, int kRows, bool kPairs>
__global__ void __launch_bounds__(kThreads) tile_matmul_kernel(const TileArgs args) {
  using namespace nvcuda;
  // kRows 64: warps 2 x 2, each 32 x 32 (2 x 2 fragments); kRows 16: warps 1 x 4, each 16 x 16.
  constexpr int kFragsM = kRows == 64 ? 2 : 1, kFragsN = kRows == 64 ? 2 : 1;
  constexpr int kLeaves = kPairs ? 2 : 1;
  __shared__ TileSmem<E, kRows> smem;
  // Leaf 2p's rounded products, each element written and read back by the same thread (no sync).
  __shared__ E kept[kPairs ? kRows * kBlockN : 1];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kBlockN;
  E* c = static_cast<E*>(args.c) + static_cast<int64_t>(blockIdx.z) * args.stride_c;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_row = kRows == 64 ? (warp / 2) * 32 : 0;
  const int warp_col = kRows == 64 ? (warp % 2) * 32 : warp * 16;
#pragma unroll 1
  for (int leaf = 0; leaf < kLeaves; ++leaf) {
    const int64_t entry = kPairs ? 2 * static_cast<int64_t>(blockIdx.z) + leaf : static_cast<int64_t>(blockIdx.z);
    const E* a = static_cast<const E*>(args.a) + entry * args.stride_a;
    const E* b = static_cast<const E*>(args.b) + entry * args.stride_b;
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
    if (kPairs && leaf == 0) {
      for (int v = static_cast<int>(threadIdx.x); v < kRows * kBlockN; v += kThreads) {
        kept[v] = round_element<E>(smem.c[v / kBlockN][v % kBlockN]);
      }
      __syncthreads();  // every thread has read smem.c before the next leaf's tiles overwrite it
    }
  }
  for (int v = static_cast<int>(threadIdx.x); v < kRows * kBlockN; v += kThreads) {
    const int r = v / kBlockN, e = v % kBlockN;
    const int64_t row = row0 + r, col = col0 + e;
    if (row < args.m && col < args.n) {
      if constexpr (kPairs) {
        c[row * args.ldc + col] = round_element<E>(pair_sum<E>(kept[v], round_element<E>(smem.c[r][e])));
      } else {
        c[row * args.ldc + col] = round_element<E>(smem.c[r][e]);
      }
    }
  }
}

// One launch per group of at most 65535 row blocks (the grid's y limit), each on its rows of A and
// C: a row's products do not depend on which launch computes them.
template <class E, int kRows, bool kPairs>
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
    tile_matmul_kernel<E, kRows, kPairs><<<grid, kThreads, 0, stream>>>(group);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// ---- The large-M variant ------------------------------------------------------------------------------------------
// Blocks of kBM x kBN of C, 8 warps of (kBM / WarpsM) x (kBN / WarpsN), K loaded kBK at a time into a ring of kStages
// shared buffers by cp.async (16 bytes each; at the edges of m, k and n the copy's source size is what lies inside,
// and the copy zero-fills the rest), the loads of stage s + kStages - 1 in flight while stage s is multiplied; inside a
// stage, each warp's fragments for the next 16 of K load (ldmatrix) while the MMAs of the current 16 run
// (tile_matmul_pipelined_kernel with LargeTraits). Grid: blockIdx.x walks the blocks in groups of 8 block rows
// (place_block, for L2 reuse), .z the batch entries.
//
// Why its bits are the other variants': an element's accumulator is a float that starts at +0.0f and takes one
// mma.sync m16n8k16 per 16 of K, k 0..15, then 16..31, ..., up to K rounded up to kStepK (128: the same count of MMAs
// as the 64-row kernel, the last ones on zeros), then round_element. wmma m16n16k16 on sm_90 is two HMMA.16816.F32
// (one per 8 columns), and mma.sync m16n8k16 is one, each over the same 16 k of the element's row and column (the
// SASS of both kernels shows HMMA.16816.F32.BF16 / HMMA.16816.F32 and no other MMA); the operands are the same
// values, zeros past m, k and n as in the 64-row kernel (the two bring the operands into registers differently, which
// moves values, not the sums). python/tests/gpu_tile_variants_check.py compares it with the 64-row kernel bit for
// bit on a GPU.
template <int BM, int BN, int BK, int Stages, int WarpsM, int WarpsN>
struct LargeConfig {
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kStages = Stages, kWarpsN = WarpsN;
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kWarpM = BM / WarpsM, kWarpN = BN / WarpsN;
  static constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 16;
  static constexpr int kLdA = BK + 8, kLdB = BN + 8, kLdC = kWarpN + 8;  // padded rows (ldmatrix without conflicts)
  static constexpr int kStageA = BM * kLdA, kStageB = BK * kLdB;         // elements
  static constexpr int kChunksA = BM * BK / 8 / kThreads, kChunksB = BK * BN / 8 / kThreads;
  // The leaf-pair mode's kept products: per thread, its accumulators' elements rounded, two to a 32-bit word.
  static constexpr int kKeptWords = kFragsM * 2 * kFragsN * 2;
  template <class E>
  static constexpr int main_bytes() {  // the ring of stages, then the epilogue's fp32 rows over it
    constexpr int pipeline = Stages * (kStageA + kStageB) * static_cast<int>(sizeof(E));
    constexpr int epilogue = WarpsM * WarpsN * 16 * kLdC * static_cast<int>(sizeof(float));
    return pipeline > epilogue ? pipeline : epilogue;
  }
  template <class E, bool kPairs>
  static constexpr int smem_bytes() {  // with kPairs, the kept words after the rest (128-byte aligned)
    return kPairs ? (main_bytes<E>() + 127) / 128 * 128 + kKeptWords * kThreads * 4 : main_bytes<E>();
  }
  static_assert(kStepK % BK == 0, "a K step of 128 is a whole number of loads");
  static_assert(BM * BK / 8 % kThreads == 0 && BK * BN / 8 % kThreads == 0, "loads split evenly over the threads");
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && BK % 16 == 0, "whole fragments");
  static_assert(kStageA % 64 == 0 && kStageB % 64 == 0, "every stage 128-byte aligned");
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
template <class E>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The block of C a linear block index computes: groups of kGroupRows row blocks, walked column by column inside a
// group, so that the blocks in flight share A's and B's tiles in L2.
struct BlockPlace {
  int64_t tile_m, tile_n;
};
__device__ __forceinline__ BlockPlace place_block(int64_t id, int64_t tiles_m, int64_t tiles_n) {
  constexpr int64_t kGroupRows = 8;
  const int64_t group_size = kGroupRows * tiles_n, group = id / group_size, first = group * kGroupRows;
  const int64_t rows = tiles_m - first < kGroupRows ? tiles_m - first : kGroupRows, in_group = id % group_size;
  return {first + in_group % rows, in_group / rows};
}

// The kernel of the large-M and mid-M variants (their sections say how each uses it), one body for both; compile-time
// traits choose what differs. kRasterized: blocks placed by place_block from blockIdx.x (tiles_n, the grid's column
// blocks, for it), else blockIdx.x the row block and .y the column block. kBFirst: a stage's copies of B issued before
// A's. kEarlyBreak: the epilogue stops at the first of the warp's groups of 16 rows that lies past m. kPointersFirst:
// A's and B's pointers (the batch entry's, so never with kPairs) computed at the start rather than in the leaf loop;
// this moves instructions in the machine code, never a value, and each variant keeps the machine code it was measured
// with. kPairs: the leaf-pair mode of tile_matmul_kernel (blockIdx.z the pair; leaf 2p's product rounded and kept in
// shared memory, the accumulators reset, leaf 2p+1's computed by the same loop, their node stored). min_blocks: the
// launch bounds' blocks per SM.
template <bool Pairs>
struct LargeTraits {  // the large-M variant
  static constexpr bool kRasterized = true, kBFirst = false, kEarlyBreak = false, kPointersFirst = false,
                        kPairs = Pairs;
  template <class Cfg>
  static constexpr int min_blocks() {
    return 256 / Cfg::kThreads;
  }
};
struct MidTraits {  // the mid-M variant (no pair mode)
  static constexpr bool kRasterized = false, kBFirst = true, kEarlyBreak = true, kPointersFirst = true, kPairs = false;
  template <class Cfg>
  static constexpr int min_blocks() {
    return Cfg::kMinBlocks;
  }
};

template <class E, class Cfg, class Traits>
__global__ void __launch_bounds__(Cfg::kThreads, Traits::template min_blocks<Cfg>())
    tile_matmul_pipelined_kernel(const TileArgs args, int64_t tiles_n) {
  constexpr bool kPairs = Traits::kPairs;
  static_assert(!(kPairs && Traits::kPointersFirst), "with kPairs, A's and B's pointers are each leaf's");
  extern __shared__ __align__(128) unsigned char pipelined_smem[];
  E* const smem_e = reinterpret_cast<E*>(pipelined_smem);
  constexpr int kE = static_cast<int>(sizeof(E));
  const BlockPlace place = Traits::kRasterized
                               ? place_block(blockIdx.x, (args.m + Cfg::kBM - 1) / Cfg::kBM, tiles_n)
                               : BlockPlace{static_cast<int64_t>(blockIdx.x), static_cast<int64_t>(blockIdx.y)};
  const int64_t row0 = place.tile_m * Cfg::kBM, col0 = place.tile_n * Cfg::kBN;
  const E* const a_z = static_cast<const E*>(args.a) + static_cast<int64_t>(blockIdx.z) * args.stride_a;
  const E* const b_z = static_cast<const E*>(args.b) + static_cast<int64_t>(blockIdx.z) * args.stride_b;
  E* const c = static_cast<E*>(args.c) + static_cast<int64_t>(blockIdx.z) * args.stride_c;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int warp_row = (warp / Cfg::kWarpsN) * Cfg::kWarpM, warp_col = (warp % Cfg::kWarpsN) * Cfg::kWarpN;
  // Accumulators: [i][j] is rows [16 i, +16) and columns [8 j, +8) of the warp's tile, each element's sum starting
  // from +0.0f (for each leaf).
  float acc[Cfg::kFragsM][2 * Cfg::kFragsN][4];
  constexpr int kLeaves = kPairs ? 2 : 1;
#pragma unroll 1
  for (int leaf = 0; leaf < kLeaves; ++leaf) {
    const int64_t entry = kPairs ? 2 * static_cast<int64_t>(blockIdx.z) + leaf : static_cast<int64_t>(blockIdx.z);
    const E* const a = Traits::kPointersFirst ? a_z : static_cast<const E*>(args.a) + entry * args.stride_a;
    const E* const b = Traits::kPointersFirst ? b_z : static_cast<const E*>(args.b) + entry * args.stride_b;

    // This thread's 16-byte chunks of a stage: A's rows ra + t * kPassA (t < kChunksA), columns [ea, +8) of the stage's
    // K; B's K rows rb + t * kPassB, columns [eb, +8) of the block's.
    constexpr int kPassA = Cfg::kThreads / (Cfg::kBK / 8), kPassB = Cfg::kThreads / (Cfg::kBN / 8);
    const int ra = tid / (Cfg::kBK / 8), ea = (tid % (Cfg::kBK / 8)) * 8;
    const int rb = tid / (Cfg::kBN / 8), eb = (tid % (Cfg::kBN / 8)) * 8;
    const E* const a_base = a + (row0 + ra) * args.lda + ea;  // dereferenced only for rows inside m
    const E* const b_base = b + static_cast<int64_t>(rb) * args.ldb + col0 + eb;
    unsigned a_rows_inside = 0;  // bit t: A's row ra + t * kPassA is inside m
#pragma unroll
    for (int t = 0; t < Cfg::kChunksA; ++t) a_rows_inside |= (row0 + ra + t * kPassA < args.m ? 1u : 0u) << t;
    const int b_bytes = clamp8(args.n - (col0 + eb)) * kE;
    const bool block_inside = row0 + Cfg::kBM <= args.m && col0 + Cfg::kBN <= args.n;
    // Stage `stage` <- A's [row0, +kBM) x [k0, +kBK) and B's [k0, +kBK) x [col0, +kBN) (B's copies first with
    // kBFirst). At the edges of m, k and n a chunk copies only the bytes inside (from A's or B's first element when
    // none) and the copy zero-fills the rest. B's loops are written out before and after A's: a lambda for them, called
    // in either order, changed both variants' machine code.
    const auto load_stage = [&](int stage, int64_t k0) {
      E* const dst_a = smem_e + stage * (Cfg::kStageA + Cfg::kStageB);
      E* const dst_b = dst_a + Cfg::kStageA;
      if (block_inside && k0 + Cfg::kBK <= args.k) {
        if constexpr (Traits::kBFirst) {
#pragma unroll
          for (int t = 0; t < Cfg::kChunksB; ++t) {
            cp_async16(dst_b + (rb + t * kPassB) * Cfg::kLdB + eb, b_base + (k0 + t * kPassB) * args.ldb, 16);
          }
        }
#pragma unroll
        for (int t = 0; t < Cfg::kChunksA; ++t) {
          cp_async16(dst_a + (ra + t * kPassA) * Cfg::kLdA + ea, a_base + t * kPassA * args.lda + k0, 16);
        }
        if constexpr (!Traits::kBFirst) {
#pragma unroll
          for (int t = 0; t < Cfg::kChunksB; ++t) {
            cp_async16(dst_b + (rb + t * kPassB) * Cfg::kLdB + eb, b_base + (k0 + t * kPassB) * args.ldb, 16);
          }
        }
      } else {
        if constexpr (Traits::kBFirst) {
#pragma unroll
          for (int t = 0; t < Cfg::kChunksB; ++t) {
            const int bytes = k0 + rb + t * kPassB < args.k ? b_bytes : 0;
            cp_async16(dst_b + (rb + t * kPassB) * Cfg::kLdB + eb,
                       bytes != 0 ? b_base + (k0 + t * kPassB) * args.ldb : b, bytes);
          }
        }
        const int a_bytes = clamp8(args.k - (k0 + ea)) * kE;
#pragma unroll
        for (int t = 0; t < Cfg::kChunksA; ++t) {
          const int bytes = (a_rows_inside >> t & 1u) != 0 ? a_bytes : 0;
          cp_async16(dst_a + (ra + t * kPassA) * Cfg::kLdA + ea, bytes != 0 ? a_base + t * kPassA * args.lda + k0 : a,
                     bytes);
        }
        if constexpr (!Traits::kBFirst) {
#pragma unroll
          for (int t = 0; t < Cfg::kChunksB; ++t) {
            const int bytes = k0 + rb + t * kPassB < args.k ? b_bytes : 0;
            cp_async16(dst_b + (rb + t * kPassB) * Cfg::kLdB + eb,
                       bytes != 0 ? b_base + (k0 + t * kPassB) * args.ldb : b, bytes);
          }
        }
      }
    };

    // The warp's 16 x 16 fragments of A and B for K columns [kk, +16) of a stage (ldmatrix.x4: lane l gives the
    // address of row l % 16, columns (l / 16) * 8 of a 16 x 16 tile; B transposed): the operands mma.m16n8k16 takes.
    uint32_t a_reg[2][Cfg::kFragsM][4], b_reg[2][Cfg::kFragsN][4];
    const auto load_fragments = [&](int buffer, int stage, int kk) {
      const E* const sa = smem_e + stage * (Cfg::kStageA + Cfg::kStageB);
      const E* const sb = sa + Cfg::kStageA;
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i) {
        ldmatrix_x4(a_reg[buffer][i], sa + (warp_row + 16 * i + lane % 16) * Cfg::kLdA + kk + (lane / 16) * 8);
      }
#pragma unroll
      for (int j = 0; j < Cfg::kFragsN; ++j) {
        ldmatrix_x4_trans(b_reg[buffer][j], sb + (kk + lane % 16) * Cfg::kLdB + warp_col + 16 * j + (lane / 16) * 8);
      }
    };
#pragma unroll
    for (int i = 0; i < Cfg::kFragsM; ++i) {
#pragma unroll
      for (int j = 0; j < 2 * Cfg::kFragsN; ++j) {
#pragma unroll
        for (int x = 0; x < 4; ++x) acc[i][j][x] = 0.0f;
      }
    }
    const auto multiply = [&](int buffer) {  // one m16n8k16 per accumulator: the next 16 of K, in order
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < 2 * Cfg::kFragsN; ++j) {
          mma_16816<E>(acc[i][j], a_reg[buffer][i], b_reg[buffer][j / 2][2 * (j % 2)],
                       b_reg[buffer][j / 2][2 * (j % 2) + 1]);
        }
      }
    };

    // The 64-row kernel's count of MMAs: K rounded up to a multiple of kStepK.
    const int64_t steps = (args.k + kStepK - 1) / kStepK * (kStepK / Cfg::kBK);
    constexpr int kSlices = Cfg::kBK / 16;
#pragma unroll
    for (int s = 0; s < Cfg::kStages - 1; ++s) {
      if (s < steps) load_stage(s, static_cast<int64_t>(s) * Cfg::kBK);
      cp_async_commit();
    }
    // Fragments one slice ahead: slice kk + 1's (the next stage's first at the last slice) load while slice kk's MMAs
    // run. The next stage is waited for, and the stage refilled next released, at each stage's last slice.
    static_assert(kSlices % 2 == 0, "the fragment buffers alternate across stages");
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();
    load_fragments(0, 0, 0);
    for (int64_t step = 0; step < steps; ++step) {
      const int stage = static_cast<int>(step % Cfg::kStages);
#pragma unroll
      for (int kk = 0; kk < kSlices; ++kk) {
        if (kk == 0) {
          const int64_t next = step + Cfg::kStages - 1;
          if (next < steps) load_stage(static_cast<int>(next % Cfg::kStages), next * Cfg::kBK);
          cp_async_commit();
        }
        if (kk == kSlices - 1) {
          cp_async_wait<Cfg::kStages - 2>();  // step + 1's stage has landed (for this thread) ...
          __syncthreads();  // ... for every thread, and every warp has loaded its last fragments of this stage
          if (step + 1 < steps) load_fragments((kk + 1) % 2, static_cast<int>((step + 1) % Cfg::kStages), 0);
        } else {
          load_fragments((kk + 1) % 2, stage, 16 * (kk + 1));
        }
        multiply(kk % 2);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages (the next leaf's loads, or the epilogue, may reuse them)
    if constexpr (kPairs) {
      if (leaf == 0) {  // leaf 2p's products, rounded, into this thread's own words (no sync needed)
        uint32_t* const kept =
            reinterpret_cast<uint32_t*>(pipelined_smem + (Cfg::template main_bytes<E>() + 127) / 128 * 128);
#pragma unroll
        for (int i = 0; i < Cfg::kFragsM; ++i) {
#pragma unroll
          for (int j = 0; j < 2 * Cfg::kFragsN; ++j) {
#pragma unroll
            for (int x = 0; x < 4; x += 2) {
              const int word = (i * 2 * Cfg::kFragsN + j) * 2 + x / 2;
              kept[word * Cfg::kThreads + tid] =
                  pack2<E>(round_element<E>(acc[i][j][x]), round_element<E>(acc[i][j][x + 1]));
            }
          }
        }
      }
    }
  }
  // Pair mode: the node, leaf 2p's kept product + leaf 2p+1's in fp32, rounded once by the epilogue below.
  if constexpr (kPairs) {
    const uint32_t* const kept =
        reinterpret_cast<const uint32_t*>(pipelined_smem + (Cfg::template main_bytes<E>() + 127) / 128 * 128);
#pragma unroll
    for (int i = 0; i < Cfg::kFragsM; ++i) {
#pragma unroll
      for (int j = 0; j < 2 * Cfg::kFragsN; ++j) {
#pragma unroll
        for (int x = 0; x < 4; x += 2) {
          const int word = (i * 2 * Cfg::kFragsN + j) * 2 + x / 2;
          const uint32_t left = kept[word * Cfg::kThreads + tid];
          acc[i][j][x] = pair_sum<E>(low_element<E>(left), round_element<E>(acc[i][j][x]));
          acc[i][j][x + 1] = pair_sum<E>(high_element<E>(left), round_element<E>(acc[i][j][x + 1]));
        }
      }
    }
  }
  // Each warp now stages its C through its own 16 rows of floats.

  // Epilogue: 16 rows of the warp's tile at a time, fp32 through shared memory, each lane rounding 8 consecutive
  // elements (round_element, as the other variants) and storing them as 16 bytes (element by element at n's edge).
  float* const sc = reinterpret_cast<float*>(pipelined_smem) + warp * 16 * Cfg::kLdC;
  constexpr int kChunksPerRow = Cfg::kWarpN / 8, kChunks = 16 * kChunksPerRow;
  const int g = lane / 4, t2 = 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i) {
    if constexpr (Traits::kEarlyBreak) {
      if (row0 + warp_row + 16 * i >= args.m) break;  // these 16 rows and the warp's next ones lie past m
    }
    // mma.m16n8k16's accumulator: c0, c1 at row lane / 4, columns 2 (lane % 4) + 0, 1; c2, c3 eight rows below.
#pragma unroll
    for (int j = 0; j < 2 * Cfg::kFragsN; ++j) {
      *reinterpret_cast<float2*>(sc + g * Cfg::kLdC + 8 * j + t2) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(sc + (g + 8) * Cfg::kLdC + 8 * j + t2) = make_float2(acc[i][j][2], acc[i][j][3]);
    }
    __syncwarp();
#pragma unroll
    for (int v = lane; v < kChunks; v += 32) {
      const int r = v / kChunksPerRow, e = (v % kChunksPerRow) * 8;
      const int64_t row = row0 + warp_row + 16 * i + r, col = col0 + warp_col + e;
      if (row < args.m && col < args.n) {
        const float* const f = sc + r * Cfg::kLdC + e;
        E* const dst = c + row * args.ldc + col;
        if (col + 8 <= args.n) {
          E e8[8];
#pragma unroll
          for (int x = 0; x < 8; ++x) e8[x] = round_element<E>(f[x]);
          uint4 out;
          __builtin_memcpy(&out, e8, sizeof out);
          *reinterpret_cast<uint4*>(dst) = out;
        } else {
          for (int x = 0; x < args.n - col; ++x) dst[x] = round_element<E>(f[x]);
        }
      }
    }
    __syncwarp();
  }
}

// Sets the kernel's dynamic shared memory limit once per device (at most 64 devices remembered; others set it on
// every launch).
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes, unsigned long long& done_devices) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const unsigned long long bit = device < 64 ? 1ull << device : 0;
  if (bit != 0 && (__atomic_load_n(&done_devices, __ATOMIC_ACQUIRE) & bit) != 0) return cudaSuccess;
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      e != cudaSuccess) {
    return e;
  }
  __atomic_fetch_or(&done_devices, bit, __ATOMIC_RELEASE);
  return cudaSuccess;
}

// One launch per group of rows whose blocks fit the grid's x limit (each on its rows of A and C, as launch_rows).
template <class E, class Cfg, bool kPairs>
cudaError_t launch_large(const TileArgs& args, int64_t batch, cudaStream_t stream) {
  constexpr int64_t kMaxBlocksX = 0x7FFFFFFF;
  constexpr int kSmem = Cfg::template smem_bytes<E, kPairs>();
  static_assert(kSmem <= 227 * 1024, "fits an sm_90 block's shared memory");
  static unsigned long long done_devices = 0;
  const auto kernel = tile_matmul_pipelined_kernel<E, Cfg, LargeTraits<kPairs>>;
  if (const cudaError_t e = allow_smem(kernel, kSmem, done_devices); e != cudaSuccess) return e;
  const int64_t tiles_n = (args.n + Cfg::kBN - 1) / Cfg::kBN;
  if (tiles_n > kMaxBlocksX || batch > 65535) return cudaErrorInvalidConfiguration;
  const int64_t rows_per_launch = kMaxBlocksX / tiles_n * Cfg::kBM;
  for (int64_t first = 0; first < args.m; first += rows_per_launch) {
    TileArgs group = args;
    group.m = std::min<int64_t>(args.m - first, rows_per_launch);
    group.a = static_cast<const E*>(args.a) + first * args.lda;
    group.c = static_cast<E*>(args.c) + first * args.ldc;
    const int64_t blocks = (group.m + Cfg::kBM - 1) / Cfg::kBM * tiles_n;
    const dim3 grid(static_cast<unsigned>(blocks), 1, static_cast<unsigned>(batch));
    kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(group, tiles_n);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// Measured on an H100 (python/tests/gpu_tile_variants_check.py, 2026-11-27; docs/benchmarks_history.md) against
// 128 x 256 blocks with K 64 at a time (3 or 4 stages: within 6 % either way), 128 x 128 blocks of 4 warps (two
// blocks per SM) and no fragment prefetch (1.15-1.3 x as long at M = 4096): all gave the same bits.
using LargeTiles = LargeConfig<128, 256, 32, 4, 2, 4>;     // 8 warps of 64 x 64
using LargeTiles128 = LargeConfig<128, 128, 64, 4, 2, 4>;  // 8 warps of 64 x 32: where few 128 x 256 blocks would run

// ---- The mid-M variant (decode: m <= 255) -------------------------------------------------------------------------
// At decode (m 1..255) the product streams B, the weights: each of B's bytes is read once from device memory while
// the MMAs are a fraction of the time, so what counts is how many of B's bytes are in flight per SM. Blocks of kBM x
// kBN of C (kBM 64, or 16 for m <= 32), 4 or 8 warps, K loaded kBK = 64 at a time into a deep ring of kStages shared
// buffers by cp.async (up to kStages - 1 stages, 80 KB and more of B, in flight per SM), operands read with ldmatrix
// and multiplied by mma.sync m16n8k16 as in the large variant (the same kernel, tile_matmul_pipelined_kernel with
// MidTraits: same helpers, same fragment layout). Grid: blockIdx.x walks the row blocks (fastest, so the few row blocks
// of one column block read its B together, once from device memory), .y the column blocks (in groups of at most 65535
// per launch), .z the batch entries.
//
// Why its bits are the other variants': exactly the large variant's argument. An element's accumulator is a float that
// starts at +0.0f and takes one mma.sync m16n8k16 (HMMA.16816.F32, half of the 64-row kernel's wmma m16n16k16) per 16
// of K, k 0..15, 16..31, ..., up to K rounded up to kStepK (128: the same count of MMAs as the 64-row kernel, the last
// ones on zeros), then round_element; operands past m, k and n are zeros, as in the 64-row kernel. Only the block
// shape and the pipeline differ, which move values, not sums. python/tests/gpu_tile_variants_check.py (--mid)
// compares it with the 64-row kernel bit for bit on a GPU.
template <int BM, int BN, int BK, int Stages, int WarpsM, int WarpsN, int MinBlocks>
struct MidConfig {
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kStages = Stages, kWarpsN = WarpsN, kMinBlocks = MinBlocks;
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kWarpM = BM / WarpsM, kWarpN = BN / WarpsN;
  static constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 16;
  static constexpr int kLdA = BK + 8, kLdB = BN + 8, kLdC = kWarpN + 8;  // padded rows (ldmatrix without conflicts)
  static constexpr int kStageA = BM * kLdA, kStageB = BK * kLdB;         // elements
  static constexpr int kChunksA = BM * BK / 8 / kThreads, kChunksB = BK * BN / 8 / kThreads;
  template <class E>
  static constexpr int smem_bytes() {
    constexpr int pipeline = Stages * (kStageA + kStageB) * static_cast<int>(sizeof(E));
    constexpr int epilogue = WarpsM * WarpsN * 16 * kLdC * static_cast<int>(sizeof(float));
    return pipeline > epilogue ? pipeline : epilogue;
  }
  static_assert(kStepK % BK == 0, "a K step of 128 is a whole number of loads");
  static_assert(kChunksA >= 1 && kChunksA <= 32 && BM * BK / 8 % kThreads == 0 && BK * BN / 8 % kThreads == 0,
                "loads split evenly over the threads");
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && BK % 16 == 0 && (BK / 16) % 2 == 0, "whole fragments");
  static_assert(kStageA % 64 == 0 && kStageB % 64 == 0, "every stage 128-byte aligned");
};

// One launch per group of at most 65535 column blocks (the grid's y limit), each on its columns of B and C: a column's
// products do not depend on which launch computes them.
template <class E, class Cfg>
cudaError_t launch_mid(const TileArgs& args, int64_t batch, cudaStream_t stream) {
  constexpr int64_t kMaxBlocksY = 65535;
  constexpr int kSmem = Cfg::template smem_bytes<E>();
  static_assert(kSmem <= 227 * 1024, "fits an sm_90 block's shared memory");
  static unsigned long long done_devices = 0;
  const auto kernel = tile_matmul_pipelined_kernel<E, Cfg, MidTraits>;
  if (const cudaError_t e = allow_smem(kernel, kSmem, done_devices); e != cudaSuccess) return e;
  const int64_t tiles_m = (args.m + Cfg::kBM - 1) / Cfg::kBM;
  if (tiles_m > 0x7FFFFFFF || batch > 65535) return cudaErrorInvalidConfiguration;
  for (int64_t first = 0; first < args.n; first += kMaxBlocksY * Cfg::kBN) {
    TileArgs group = args;
    group.n = std::min<int64_t>(args.n - first, kMaxBlocksY * Cfg::kBN);
    group.b = static_cast<const E*>(args.b) + first;
    group.c = static_cast<E*>(args.c) + first;
    const int64_t tiles_n = (group.n + Cfg::kBN - 1) / Cfg::kBN;
    const dim3 grid(static_cast<unsigned>(tiles_m), static_cast<unsigned>(tiles_n), static_cast<unsigned>(batch));
    kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(group, tiles_n);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// The configurations (which one runs never changes the bits). Measured on an H100 (python/tests/
// gpu_tile_variants_check.py --mid, 2026-11-27, B from device memory; docs/benchmarks.md): at M = 64 x 8192 x 1024,
// batch 2, 64 x 128 blocks 18.4 us, 64 x 64 20.2; at M = 64 x 4096 x 512 (64 blocks of 128 columns) 8.3 and 7.4; at
// M = 1 and 16 the 16-row blocks 15.1-15.7 us (x 8192 x 1024) and 5.5-6.7 (x 4096 x 512), the 64-row ones 0.4-1.5
// us slower. Tried the same day, with the same bits and no gain (removed): 7 stages of 64 x 128 (18.5 us at M = 64),
// K 32 at a time in 12 stages (19.0), B's copies with an L2 prefetch of 256 bytes (18.9), 11 stages of 16 x 128
// (15.3 at M = 1). At M = 64 each SM takes in about 21 GB/s (384 KB per block, a third of it A's 64 rows, which
// every column block reads), near the 25 GB/s of M = 1 with B in L2; deeper rings did not raise it: what is left
// there is the bytes per SM, not the bytes in flight.
using MidTiles = MidConfig<64, 128, 64, 6, 2, 4, 1>;     // 8 warps of 32 x 32, 156 KB: one block per SM
using MidTiles64 = MidConfig<64, 64, 64, 6, 2, 2, 2>;    // 4 warps of 32 x 32, 108 KB: two blocks per SM
using SmallTiles = MidConfig<16, 128, 64, 8, 1, 4, 1>;   // 4 warps of 16 x 32, 154 KB
using SmallTiles64 = MidConfig<16, 64, 64, 8, 1, 4, 2>;  // 4 warps of 16 x 16, 90 KB

// The mid-M blocks for a shape: 16 rows for m <= 32; kBN 128 where at least kMidWideBlocks such blocks run, else 64
// (more blocks, more SMs streaming B).
constexpr int64_t kMidWideBlocks = 120;
template <class E>
cudaError_t launch_mid_auto(const TileArgs& args, int64_t batch, cudaStream_t stream, bool small) {
  const int64_t rows = small ? 16 : 64;
  const int64_t wide_blocks = (args.m + rows - 1) / rows * ((args.n + 127) / 128) * batch;
  if (small) {
    return wide_blocks >= kMidWideBlocks ? launch_mid<E, SmallTiles>(args, batch, stream)
                                         : launch_mid<E, SmallTiles64>(args, batch, stream);
  }
  return wide_blocks >= kMidWideBlocks ? launch_mid<E, MidTiles>(args, batch, stream)
                                       : launch_mid<E, MidTiles64>(args, batch, stream);
}

// EXACTCOLL_TILE_MATMUL_VARIANT's names for the mid-M blocks (tests only; the launcher asks here before its own names):
// "mid" and "mid16" (64 or 16 rows, the width chosen from the shape as above), "mid_128", "mid_64", "mid16_128" and
// "mid16_64" (that width).
enum class MidVariant { kNone, kMid, kMid128, kMid64, kMid16, kMid16x128, kMid16x64 };
MidVariant forced_mid_variant() {
  const char* text = std::getenv("EXACTCOLL_TILE_MATMUL_VARIANT");
  if (text == nullptr || std::strncmp(text, "mid", 3) != 0) return MidVariant::kNone;
  static const std::pair<const char*, MidVariant> kNames[] = {
      {"mid", MidVariant::kMid},     {"mid_128", MidVariant::kMid128},      {"mid_64", MidVariant::kMid64},
      {"mid16", MidVariant::kMid16}, {"mid16_128", MidVariant::kMid16x128}, {"mid16_64", MidVariant::kMid16x64}};
  for (const auto& [name, variant] : kNames) {
    if (std::strcmp(text, name) == 0) return variant;
  }
  return MidVariant::kNone;  // the launcher's own names decide (an unknown name fails there)
}

// The blocks that serve m < kLargeM (the launcher asks here), never changing the bits: the mid-M blocks of 16 rows for
// m <= 32, of 64 rows for m <= 64, and above 64 unless the large variant's 128 x 128 blocks would be at least
// kMidWideBlocks (one 128-row block covers what takes two or more rounds of 64-row blocks on the GPU's SMs; measured on
// an H100, python/tests/gpu_tile_variants_check.py --mid): kNone, the large variant's choice.
inline MidVariant choose_mid(const TileArgs& args, int64_t batch) {
  if (args.m <= kSmallM) return MidVariant::kMid16;
  if (args.m <= 64) return MidVariant::kMid;
  const int64_t blocks_128 = (args.m + 127) / 128 * ((args.n + 127) / 128) * batch;
  return blocks_128 >= kMidWideBlocks ? MidVariant::kNone : MidVariant::kMid;
}

template <class E>
cudaError_t launch_mid_variant(const TileArgs& args, int64_t batch, cudaStream_t stream, MidVariant variant) {
  switch (variant) {
    case MidVariant::kMid: return launch_mid_auto<E>(args, batch, stream, false);
    case MidVariant::kMid128: return launch_mid<E, MidTiles>(args, batch, stream);
    case MidVariant::kMid64: return launch_mid<E, MidTiles64>(args, batch, stream);
    case MidVariant::kMid16: return launch_mid_auto<E>(args, batch, stream, true);
    case MidVariant::kMid16x128: return launch_mid<E, SmallTiles>(args, batch, stream);
    case MidVariant::kMid16x64: return launch_mid<E, SmallTiles64>(args, batch, stream);
    default: return cudaErrorInvalidValue;
  }
}
// ---- End of the mid-M variant -------------------------------------------------------------------------------------

// EXACTCOLL_TILE_MATMUL_VARIANT (tests only, read on every call; tile_matmul.h): unset or "auto" chooses from the
// shape; "16", "64", "large" and "large_128" force that variant for every shape.
enum class Variant { kAuto, kRows16, kRows64, kLarge, kLarge128, kUnknown };
Variant forced_variant() {
  const char* text = std::getenv("EXACTCOLL_TILE_MATMUL_VARIANT");
  if (text == nullptr || *text == '\0' || std::strcmp(text, "auto") == 0) return Variant::kAuto;
  static const std::pair<const char*, Variant> kNames[] = {{"16", Variant::kRows16},
                                                           {"64", Variant::kRows64},
                                                           {"large", Variant::kLarge},
                                                           {"large_128", Variant::kLarge128}};
  for (const auto& [name, variant] : kNames) {
    if (std::strcmp(text, name) == 0) return variant;
  }
  return Variant::kUnknown;
}

// Which variant runs changes which block computes an element, never its bits (tile_matmul.h), so it may depend on
// anything: here m, and the count of 128 x 256 blocks.
// The mid-M blocks that serve this call (forced, or chosen from the shape), or kNone.
MidVariant mid_variant_for(const TileArgs& args, int64_t batch) {
  if (const MidVariant mid = forced_mid_variant(); mid != MidVariant::kNone) return mid;
  if (forced_variant() != Variant::kAuto || args.m >= kLargeM) return MidVariant::kNone;
  return choose_mid(args, batch);
}

template <class E, bool kPairs>
cudaError_t launch_typed(const TileArgs& args, int64_t batch, cudaStream_t stream) {
  // m < 256: the mid-M blocks (their section above) where choose_mid says so; the 16- and 64-row blocks stay the
  // references, forced with "16" and "64". The mid-M blocks have no pair mode: callers ask tile_pairs_fused first
  // and run such pairs as two plain products and launch_pair_add.
  if (const MidVariant mid = mid_variant_for(args, batch); mid != MidVariant::kNone) {
    return kPairs ? cudaErrorInvalidValue : launch_mid_variant<E>(args, batch, stream, mid);
  }
  Variant variant = forced_variant();
  if (variant == Variant::kAuto) {
    // 128 x 256 blocks, or 128 x 128 where the wider blocks would be fewer than the GPU's SMs (under 100).
    const int64_t wide_blocks = (args.m + 127) / 128 * ((args.n + 255) / 256) * batch;
    variant = wide_blocks < 100 ? Variant::kLarge128 : Variant::kLarge;
  }
  switch (variant) {
    case Variant::kRows16: return launch_rows<E, kSmallRows, kPairs>(args, batch, stream);
    case Variant::kRows64: return launch_rows<E, 64, kPairs>(args, batch, stream);
    case Variant::kLarge: return launch_large<E, LargeTiles, kPairs>(args, batch, stream);
    case Variant::kLarge128: return launch_large<E, LargeTiles128, kPairs>(args, batch, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_tile_matmul(const void* a, const void* b, void* c, DType dtype, const MatmulShape& s,
                               cudaStream_t stream) {
  const TileArgs args{a, b, c, s.m, s.k, s.n, s.lda, s.ldb, s.ldc, s.stride_a, s.stride_b, s.stride_c};
  return dtype == DType::kBF16 ? launch_typed<__nv_bfloat16, false>(args, s.batch, stream)
                               : launch_typed<__half, false>(args, s.batch, stream);
}

bool tile_pairs_fused(const PairShape& s) {
  const TileArgs args{nullptr,         nullptr,         nullptr,        s.m, s.k, s.n, s.lda, s.ldb, s.ldc,
                      s.stride_a_leaf, s.stride_b_leaf, s.stride_c_pair};
  return mid_variant_for(args, s.pairs) == MidVariant::kNone;
}

cudaError_t launch_tile_matmul_pairs(const void* a, const void* b, void* c, DType dtype, const PairShape& s,
                                     cudaStream_t stream) {
  // The kernels' pair mode: A and B strides per leaf (entry 2p + leaf), C's per pair (grid z = pairs).
  const TileArgs args{a, b, c, s.m, s.k, s.n, s.lda, s.ldb, s.ldc, s.stride_a_leaf, s.stride_b_leaf, s.stride_c_pair};
  return dtype == DType::kBF16 ? launch_typed<__nv_bfloat16, true>(args, s.pairs, stream)
                               : launch_typed<__half, true>(args, s.pairs, stream);
}

namespace {

// c[p] <- round(float(c[p]) + float(right[p])) element by element (pair_sum, round_element), 8 consecutive elements
// of a row per thread where they are whole (16-byte loads), one at a time at n's edge.
template <class E>
__global__ void pair_add_kernel(E* c, const E* right, int64_t m, int64_t n, int64_t ldc, int64_t stride_c,
                                int64_t ld_right, int64_t stride_right) {
  const int64_t groups = (n + 7) / 8;
  const int64_t p = blockIdx.y;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < m * groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = g / groups, col = (g % groups) * 8;
    E* const dst = c + p * stride_c + row * ldc + col;
    const E* const src = right + p * stride_right + row * ld_right + col;
    if (col + 8 <= n) {
      uint4 left_bits = *reinterpret_cast<const uint4*>(dst), right_bits = *reinterpret_cast<const uint4*>(src);
      E l8[8], r8[8];
      __builtin_memcpy(l8, &left_bits, sizeof l8);
      __builtin_memcpy(r8, &right_bits, sizeof r8);
#pragma unroll
      for (int x = 0; x < 8; ++x) l8[x] = round_element<E>(pair_sum<E>(l8[x], r8[x]));
      __builtin_memcpy(&left_bits, l8, sizeof l8);
      *reinterpret_cast<uint4*>(dst) = left_bits;
    } else {
      for (int64_t x = 0; x < n - col; ++x) dst[x] = round_element<E>(pair_sum<E>(dst[x], src[x]));
    }
  }
}

template <class E>
cudaError_t launch_pair_add_typed(void* c, const void* right, const PairAddShape& s, cudaStream_t stream) {
  if (s.m == 0) return cudaSuccess;
  if (s.pairs > 65535) return cudaErrorInvalidConfiguration;
  constexpr int kAddThreads = 256;
  const int64_t groups = s.m * ((s.n + 7) / 8);
  const int64_t blocks = std::min<int64_t>((groups + kAddThreads - 1) / kAddThreads, 4096);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(s.pairs));
  pair_add_kernel<E><<<grid, kAddThreads, 0, stream>>>(static_cast<E*>(c), static_cast<const E*>(right), s.m, s.n,
                                                       s.ldc, s.stride_c, s.ld_right, s.stride_right);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_pair_add(void* c, const void* right, DType dtype, const PairAddShape& shape, cudaStream_t stream) {
  return dtype == DType::kBF16 ? launch_pair_add_typed<__nv_bfloat16>(c, right, shape, stream)
                               : launch_pair_add_typed<__half>(c, right, shape, stream);
}

}  // namespace exactcoll::cuda::linear
