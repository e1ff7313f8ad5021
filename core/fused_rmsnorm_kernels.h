// The pieces of the fused all-reduce + residual + RMSNorm that the GPU's kernels add to
// core/fused_rmsnorm.h, written the same way: templates over the execution context
// (core/collectives.h, plus core/fused_rmsnorm.h's row_sum_squares hook), so that they compile
// under g++ and nvcc, run on the simulator too (sim/fused, with blocks of several threads so that
// the register path runs: sim/block_threads.h) and on the CPU test world of tests/core (fused_algorithms_test), and
// bit for bit give the contract's results (docs/numerics.md, "Fused all-reduce + residual +
// RMSNorm"):
//   s = fold over ranks of x (rounded), residual_out = residual_add(s, residual),
//   out = the canonical RMSNorm of residual_out.
//
//   fused_rmsnorm_gather_norm  a two-stage split that suits NVLink better than core's two_stage:
//                              ranks reduce row slices and publish only residual_out; every rank
//                              gathers the other slices' residual_out and normalizes them itself.
//                              The gather moves half the bytes of two_stage (which gathers
//                              residual_out AND out); the norm of the same bits gives the same out.
//   fused_rmsnorm_one_stage_reg  one_stage with each row held in registers: the lane partials of
//                              the sum of squares come from the registers (no read-back of
//                              residual_out), the weight is loaded once per block before the first
//                              barrier. Needs the Ctx extension below (sum_lane_partials) and a
//                              block of exactly the tree's lanes; other grids take core's path.
//   fused_rmsnorm_push_one_stage_reg  core's push_one_stage (x pushed into the peers' scratch,
//                              one barrier, no end barrier) with the rows held in registers as in
//                              one_stage_reg, the weight loaded between the pushes and the
//                              barrier; other grids take core's fused_rmsnorm_push_one_stage.
//   fused_rmsnorm_lamport_reg  core's lamport_one_stage or lamport_two_stage (Lamport pushes, no
//                              barrier) with the rows held in registers as in one_stage_reg, the
//                              weight loaded between the pushes and the polls; other grids take
//                              core's fused_rmsnorm_lamport.
//   residual_rmsnorm_rows      the split path's separate residual + RMSNorm kernel (after any
//                              all-reduce into s; also exactcoll_add_rmsnorm): one launch, no
//                              peers, no barrier; rows in registers where threads == lanes.
//   stage_fused_input          copies this rank's x into its staging buffer: exactly the rows that
//                              block b of every rank reads from it, so that block b's first
//                              barrier publishes them (barriers pair equal block indices only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "core/platform.h"
#include "core/push.h"
#include "core/signal.h"
#include "core/storage.h"

// Unrolls a loop with a compile-time trip count on the GPU (register arrays indexed by the loop
// variable stay in registers only when unrolled); host code (g++, nvcc's host pass) needs none.
#if defined(__CUDA_ARCH__)
#define EXC_FUSED_UNROLL _Pragma("unroll")
#else
#define EXC_FUSED_UNROLL
#endif

namespace exactcoll {

// Scratch elements gather_norm needs on every rank: its slice's residual_out rows at their row
// positions, [rows, H].
EXC_HD inline size_t gather_norm_scratch_elements(int rows, int hidden) {
  return static_cast<size_t>(rows) * static_cast<size_t>(hidden);
}

// out_row = the canonical RMSNorm of v_row, every thread of the block taking part. v_row must be
// complete in memory that the block can read (written before a sync_block). Ends with sync_block,
// so the caller may overwrite what the reduction used. out_row may not alias v_row.
template <class T, class Ctx>
EXC_HD void normalize_row(Ctx& ctx, const contract::RmsNormTree& tree, const T* v_row, const T* weight, float eps,
                          T* out_row) {
  constexpr int P = Storage<T>::kPack;
  const float ss = ctx.row_sum_squares(tree, [v_row](int j) { return to_float(v_row[j]); });
  const float inv = contract::rmsnorm_inverse(ss, tree.hidden, eps);
  for (int p = ctx.thread(); p < tree.num_packs; p += ctx.num_threads()) {
    const size_t j = static_cast<size_t>(p) * P;
    const Pack<T> v = ctx.load(reinterpret_cast<const Pack<T>*>(v_row + j));
    const Pack<T> w = ctx.load(reinterpret_cast<const Pack<T>*>(weight + j));
    Pack<T> y;
    for (int e = 0; e < P; ++e) y.v[e] = contract::rmsnorm_scale<T>(to_float(v.v[e]), inv, w.v[e]);
    ctx.store(reinterpret_cast<Pack<T>*>(out_row + j), y);
  }
  ctx.sync_block();
}

// Packs of the next row that a thread holds in registers while the block normalizes the current
// one (gather_rows): enough for H = 16384 bf16 with 512 threads.
inline constexpr int kHeldPacks = 4;

// For each row in [range.begin, range.end): copies the row from src (a peer's scratch, [rows, H])
// into residual_out, then normalizes it into out. When a thread's packs of a row fit in
// kHeldPacks registers, the next row's loads are issued before the current row is normalized, so
// the peer-read latency overlaps the norm (the bits are those of a plain copy either way).
template <class T, class Ctx>
EXC_HD void gather_rows(Ctx& ctx, const contract::RmsNormTree& tree, RowRange range, const T* src, T* residual_out,
                        const T* weight, float eps, T* out) {
  constexpr int P = Storage<T>::kPack;
  const size_t H = static_cast<size_t>(tree.hidden);
  const int np = tree.num_packs;
  const int t = ctx.thread(), nt = ctx.num_threads();
  const bool held = np <= kHeldPacks * nt;
  Pack<T> next[kHeldPacks];
  auto fetch = [&](int row) {
    EXC_FUSED_UNROLL
    for (int k = 0; k < kHeldPacks; ++k) {
      const int p = t + k * nt;
      if (p < np) next[k] = ctx.load(reinterpret_cast<const Pack<T>*>(src + static_cast<size_t>(row) * H + p * P));
    }
  };
  if (held && range.begin < range.end) fetch(range.begin);
  for (int row = range.begin; row < range.end; ++row) {
    T* ro_row = residual_out + static_cast<size_t>(row) * H;
    if (held) {
      EXC_FUSED_UNROLL
      for (int k = 0; k < kHeldPacks; ++k) {
        const int p = t + k * nt;
        if (p < np) ctx.store(reinterpret_cast<Pack<T>*>(ro_row + p * P), next[k]);
      }
      if (row + 1 < range.end) fetch(row + 1);
    } else {
      const T* src_row = src + static_cast<size_t>(row) * H;
      for (int p = t; p < np; p += nt) {
        ctx.store(reinterpret_cast<Pack<T>*>(ro_row + p * P),
                  ctx.load(reinterpret_cast<const Pack<T>*>(src_row + p * P)));
      }
    }
    ctx.sync_block();
    normalize_row<T>(ctx, tree, ro_row, weight, eps, out + static_cast<size_t>(row) * H);
  }
}

// ---- The register row engine ------------------------------------------------------------------
// Ctx extension used by the register path (the device context of cuda_backend/fused, the
// simulator's sim/fused context and the CPU test world provide it):
//   float sum_lane_partials(const contract::RmsNormTree& tree, float partial)
//       Called by every thread of a block of exactly tree.lanes threads; thread t passes lane t's
//       partial (contract::lane_sum_squares: packs t, t + lanes, ... in order, elements in order,
//       from 0.0f). Returns ss (the two 32-lane butterflies of contract::sum_squares) to every
//       thread.
// With blockDim == lanes, thread t's packs t, t + nt, ... ARE lane t's packs, so a thread that
// holds its packs in registers has its lane partial without reading the row back.

// Whether the register path serves this block: threads == lanes and at most kMax packs a thread
// (the kernels use kMax = 2).
template <int kMax, class Ctx>
EXC_HD inline bool register_path_fits(const Ctx& ctx, const contract::RmsNormTree& tree) {
  return ctx.num_threads() == tree.lanes && tree.num_packs <= kMax * tree.lanes;
}

// Packs per thread (1, 2 or 4) that the register path holds for this tree (threads == lanes). The
// kernels take the register path for 1 and 2 (up to H = 16384 bf16/fp16, 8192 fp32): holding 4
// would spill under the 64-register cap of 1024-thread blocks.
EXC_HD inline int register_packs(const contract::RmsNormTree& tree) {
  return tree.num_packs <= tree.lanes ? 1 : tree.num_packs <= 2 * tree.lanes ? 2 : 4;
}

// This thread's packs of the weight (packs t + k * nt, k < kHeld), loaded once per block.
template <class T, int kHeld, class Ctx>
EXC_HD void load_weight_packs(Ctx& ctx, const contract::RmsNormTree& tree, const T* weight, Pack<T> (&w)[kHeld]) {
  constexpr int P = Storage<T>::kPack;
  EXC_FUSED_UNROLL
  for (int k = 0; k < kHeld; ++k) {
    const int p = ctx.thread() + k * ctx.num_threads();
    if (p < tree.num_packs) w[k] = ctx.load(reinterpret_cast<const Pack<T>*>(weight + static_cast<size_t>(p) * P));
  }
}

// Normalizes a row whose residual_out packs this thread holds in ro (packs t + k * nt): lane
// partial from the registers, ss through sum_lane_partials, out = rmsnorm_scale into out_row.
template <class T, int kHeld, class Ctx>
EXC_HD void normalize_held_row(Ctx& ctx, const contract::RmsNormTree& tree, const Pack<T> (&ro)[kHeld],
                               const Pack<T> (&w)[kHeld], float eps, T* out_row) {
  constexpr int P = Storage<T>::kPack;
  const int t = ctx.thread(), nt = ctx.num_threads();
  float partial = 0.0f;
  EXC_FUSED_UNROLL
  for (int k = 0; k < kHeld; ++k) {
    if (t + k * nt < tree.num_packs) {
      for (int e = 0; e < P; ++e) {
        const float v = to_float(ro[k].v[e]);
        partial = contract::add(partial, contract::mul(v, v));
      }
    }
  }
  const float ss = ctx.sum_lane_partials(tree, partial);
  const float inv = contract::rmsnorm_inverse(ss, tree.hidden, eps);
  EXC_FUSED_UNROLL
  for (int k = 0; k < kHeld; ++k) {
    const int p = t + k * nt;
    if (p < tree.num_packs) {
      Pack<T> y;
      for (int e = 0; e < P; ++e) y.v[e] = contract::rmsnorm_scale<T>(to_float(ro[k].v[e]), inv, w[k].v[e]);
      ctx.store(reinterpret_cast<Pack<T>*>(out_row + static_cast<size_t>(p) * P), y);
    }
  }
}

// core's fused_row with the row in registers: s = fold_of(row_begin + j), the folded pack at element
// row_begin + j of x (row_begin is the row's first element in x), and residual_out =
// residual_add(s, residual) for this thread's packs (the residual's load issued before the fold's),
// stored to residual_out (and copy_residual_out when not null), then normalize_held_row. As core's
// fused_row_from: lamport_one_stage passes its polled fold; fused_row_held folds core's x_of.
template <class T, int kRanks, int kHeld, class Ctx, class FoldOf>
EXC_HD void fused_row_held_from(Ctx& ctx, const contract::RmsNormTree& tree, FoldOf fold_of, size_t row_begin,
                                const T* residual, const Pack<T> (&w)[kHeld], float eps, T* residual_out, T* out,
                                T* copy_residual_out) {
  constexpr int P = Storage<T>::kPack;
  const int t = ctx.thread(), nt = ctx.num_threads();
  Pack<T> ro[kHeld] = {};  // every read pack is written first; initialized for g++ -O3's maybe-uninitialized
  EXC_FUSED_UNROLL
  for (int k = 0; k < kHeld; ++k) {
    const int p = t + k * nt;
    if (p < tree.num_packs) {
      const size_t j = static_cast<size_t>(p) * P;
      const Pack<T> res = ctx.load(reinterpret_cast<const Pack<T>*>(residual + j));
      const Pack<T> sum = fold_of(row_begin + j);
      for (int e = 0; e < P; ++e) ro[k].v[e] = contract::residual_add<T>(sum.v[e], res.v[e]);
    }
  }
  EXC_FUSED_UNROLL
  for (int k = 0; k < kHeld; ++k) {
    const int p = t + k * nt;
    if (p < tree.num_packs) {
      const size_t j = static_cast<size_t>(p) * P;
      ctx.store(reinterpret_cast<Pack<T>*>(residual_out + j), ro[k]);
      if (copy_residual_out != nullptr) ctx.store(reinterpret_cast<Pack<T>*>(copy_residual_out + j), ro[k]);
    }
  }
  normalize_held_row<T, kHeld>(ctx, tree, ro, w, eps, out);
}

// fused_row_held_from with s = fold over ranks of x_of(r) (core's x_of; all loads issued before the
// first store).
template <class T, int kRanks, int kHeld, class Ctx, class XOf>
EXC_HD void fused_row_held(Ctx& ctx, const contract::RmsNormTree& tree, XOf x_of, size_t row_begin, const T* residual,
                           const Pack<T> (&w)[kHeld], float eps, T* residual_out, T* out, T* copy_residual_out) {
  fused_row_held_from<T, kRanks, kHeld>(
      ctx, tree, [&](size_t i) { return fold_pack_of<T, kRanks>(ctx, i, x_of); }, row_begin, residual, w, eps,
      residual_out, out, copy_residual_out);
}

// When the register path serves this block (the Ctx has sum_lane_partials, and
// register_path_fits<2>: threads == lanes, at most 2 packs a thread), calls
// held_fn(std::integral_constant<int, kHeld>{}) with the packs a thread holds (register_packs: 1
// or 2) and returns true; otherwise returns false and the caller takes core's path.
template <class Ctx, class HeldFn>
EXC_HD bool run_register_path(Ctx& ctx, const contract::RmsNormTree& tree, HeldFn held_fn) {
  if constexpr (requires(Ctx & c, const contract::RmsNormTree& tr) { c.sum_lane_partials(tr, 0.0f); }) {
    if (register_path_fits<2>(ctx, tree)) {
      if (register_packs(tree) == 1) {
        held_fn(std::integral_constant<int, 1>{});
      } else {
        held_fn(std::integral_constant<int, 2>{});
      }
      return true;
    }
  } else {
    (void)ctx, (void)tree, (void)held_fn;
  }
  return false;
}

// one_stage_reg with kHeld packs a thread. Steps: 1. this thread's weight packs; 2. barrier;
// 3. for each of this block's rows (contiguous chunks of all rows): fused_row_held; 4. barrier (end).
template <class T, int kRanks, int kHeld, class Protocol, class Ctx>
EXC_HD void one_stage_held(Ctx& ctx, const FusedRmsNormArgs<T>& args, const contract::RmsNormTree& tree) {
  const size_t H = static_cast<size_t>(args.hidden);
  Pack<T> w[kHeld];
  load_weight_packs<T, kHeld>(ctx, tree, args.weight, w);
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  const RowRange mine = fused_block_rows(RowRange{0, args.rows}, ctx.block(), ctx.num_blocks());
  trace_folded_rows(ctx, "fused_rows", mine, H, false);
  for (int row = mine.begin; row < mine.end; ++row) {
    const size_t base = static_cast<size_t>(row) * H;
    fused_row_held<T, kRanks, kHeld>(ctx, tree, inputs_in_place(ctx), base, args.residual + base, w, args.eps,
                                     args.residual_out + base, args.out + base, static_cast<T*>(nullptr));
  }
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// one_stage with the rows in registers (same preconditions and bits as core's
// fused_rmsnorm_one_stage, which it runs when the register path does not fit the grid).
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void fused_rmsnorm_one_stage_reg(Ctx& ctx, const FusedRmsNormArgs<T>& args) {
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  const bool held = run_register_path(
      ctx, tree, [&](auto packs) { one_stage_held<T, kRanks, decltype(packs)::value, Protocol>(ctx, args, tree); });
  if (!held) fused_rmsnorm_one_stage<T, kRanks, Protocol>(ctx, args);
}

// push_one_stage on the register path with kHeld packs a thread: core's push_one_stage_rows (push,
// one barrier, the call counter, no end barrier) with fused_row_held as the row step. This
// thread's weight packs are loaded between its pushes and the barrier: their latency hides in the
// barrier's, and the pushes' packs are no longer live (loading the weight first, or the first
// row's residual there too, spills registers under the 64-register cap of 1024-thread blocks).
template <class T, int kRanks, int kHeld, class Protocol, class Halves, class Ctx>
EXC_HD void push_one_stage_held(Ctx& ctx, const FusedRmsNormArgs<T>& args, const contract::RmsNormTree& tree) {
  const size_t H = static_cast<size_t>(args.hidden);
  Pack<T> w[kHeld];
  push_one_stage_rows<T, kRanks, Protocol, Halves>(
      ctx, args, [&] { load_weight_packs<T, kHeld>(ctx, tree, args.weight, w); },
      [&](int row, auto x_of) {
        const size_t base = static_cast<size_t>(row) * H;
        fused_row_held<T, kRanks, kHeld>(ctx, tree, x_of, base, args.residual + base, w, args.eps,
                                         args.residual_out + base, args.out + base, static_cast<T*>(nullptr));
      });
}

// push_one_stage with the rows in registers (same preconditions and bits as core's
// fused_rmsnorm_push_one_stage, which it runs when the register path does not fit the grid; the
// two share the call counter and the receive halves, so either may follow the other).
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Halves = AlternatingHalves, class Ctx>
EXC_HD void fused_rmsnorm_push_one_stage_reg(Ctx& ctx, const FusedRmsNormArgs<T>& args) {
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  const bool held = run_register_path(ctx, tree, [&](auto packs) {
    push_one_stage_held<T, kRanks, decltype(packs)::value, Protocol, Halves>(ctx, args, tree);
  });
  if (!held) fused_rmsnorm_push_one_stage<T, kRanks, Protocol, Halves>(ctx, args);
}

// Whether lamport_one_stage_reg's register path serves a block of `threads` threads: threads ==
// the tree's lanes and the row has at most `lanes` packs (one pack, one lane a thread); else core's
// path. The GPU's host asks it per launch through lamport_register_blocks (below), where a
// thread-block cluster of C blocks of lanes / C threads counts as one block of `lanes` threads.
EXC_HD inline bool lamport_register_path(int threads, const contract::RmsNormTree& tree) {
  return threads == tree.lanes && tree.num_packs <= tree.lanes;
}

// How many blocks of `threads` threads, taken together as one block (a thread-block cluster on the
// GPU: cuda_backend/fused's ClusterRowCtx), make lamport_register_path's block for this tree: b in
// 1..max_blocks with lamport_register_path(b x threads, tree) and threads a multiple of the warp
// (so that each warp's group of lanes lies in one block); 0 where there is none (core's path).
// Example: 1 024 lanes and packs (H 8192 bf16): threads 1024 -> 1, 512 -> 2, 128 -> 8, 64 -> 0
// with max_blocks 8, 384 -> 0.
EXC_HD inline int lamport_register_blocks(int threads, const contract::RmsNormTree& tree, int max_blocks) {
  if (threads <= 0 || threads % contract::kWarp != 0 || tree.lanes % threads != 0) return 0;
  const int blocks = tree.lanes / threads;
  return blocks <= max_blocks && lamport_register_path(blocks * threads, tree) ? blocks : 0;
}

// lamport_one_stage or lamport_two_stage (kKind) on the register path, one lane (and pack) a
// thread: core's lamport_one_stage_rows or lamport_two_stage_rows (push, clear, the sync before the
// polls, the polled fold, no barrier) with fused_row_held_from as the row step. This thread's
// weight pack is loaded after its pushes and clears, so its latency hides in the peers' (the polls
// that follow wait for NVLink). Core's path (fused_row_from) stores the row's residual_out, syncs
// the block, reads it back element by element for the lane partials and again for the scale: two
// more round trips to memory and two more block syncs a row.
template <class T, int kRanks, class Protocol, LamportFused kKind, class Ctx>
EXC_HD void lamport_held(Ctx& ctx, const FusedRmsNormArgs<T>& args, const contract::RmsNormTree& tree) {
  const size_t H = static_cast<size_t>(args.hidden);
  Pack<T> w[1];
  lamport_fused_rows<T, kRanks, Protocol, kKind>(
      ctx, args, [&] { load_weight_packs<T, 1>(ctx, tree, args.weight, w); },
      [&](int row, auto fold_of) {
        const size_t base = static_cast<size_t>(row) * H;
        fused_row_held_from<T, kRanks, 1>(ctx, tree, fold_of, base, args.residual + base, w, args.eps,
                                          args.residual_out + base, args.out + base, static_cast<T*>(nullptr));
      });
}

// lamport_one_stage or lamport_two_stage with the rows in registers (the GPU's Lamport fused
// kernels: the host picks the register path's kernel or core's; same preconditions and bits as
// core's fused_rmsnorm_lamport, which it runs when lamport_register_path is false or the Ctx has no
// sum_lane_partials; the two share every Lamport buffer and counter, so either may follow the
// other, and so may every other Lamport call).
template <class T, int kRanks = 0, class Protocol = LamportProtocol, LamportFused kKind = LamportFused::kOneStage,
          class Ctx>
EXC_HD void fused_rmsnorm_lamport_reg(Ctx& ctx, const FusedRmsNormArgs<T>& args) {
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  if constexpr (requires(Ctx & c, const contract::RmsNormTree& tr) { c.sum_lane_partials(tr, 0.0f); }) {
    if (lamport_register_path(ctx.num_threads(), tree))
      return lamport_held<T, kRanks, Protocol, kKind>(ctx, args, tree);
  }
  fused_rmsnorm_lamport<T, kRanks, Protocol, kKind>(ctx, args);
}

// Records gather_norm's gather for this block, one step a peer (rank+1, rank+2, ...): the rows of
// the peer's slice that its block b wrote, read from its scratch, written to this rank's outputs.
template <class Ctx>
EXC_HD void trace_gather_norm(Ctx& ctx, int rows, size_t H) {
  if constexpr (Ctx::kTraceSteps) {
    const int n = ctx.world_size(), me = ctx.rank();
    for (int k = 1; k < n; ++k) {
      const int peer = (me + k) % n;
      const RowRange theirs = fused_block_rows(fused_rank_rows(rows, peer, n), ctx.block(), ctx.num_blocks());
      const size_t begin = static_cast<size_t>(theirs.begin) * H, end = static_cast<size_t>(theirs.end) * H;
      ctx.trace_step_begin("gather_norm_rows");
      trace_rows(ctx, begin, end, false, peer, Buffer::kScratch, Access::kRead);
      trace_rows(ctx, begin, end, false, me, Buffer::kOutput, Access::kWrite);
      ctx.trace_step_end();
    }
  } else {
    (void)ctx, (void)rows, (void)H;
  }
}

// The gather of gather_norm on the register path: the rows that the peers' block b wrote (peers
// rank+1, rank+2, ...), one sequence across peers; each row's packs are loaded before the previous
// row is normalized, so peer reads overlap the norms. Per row: store residual_out, normalize.
template <class T, int kHeld, class Ctx>
EXC_HD void gather_held_rows(Ctx& ctx, const contract::RmsNormTree& tree, const FusedRmsNormArgs<T>& args,
                             const Pack<T> (&w)[kHeld]) {
  constexpr int P = Storage<T>::kPack;
  const size_t H = static_cast<size_t>(args.hidden);
  const int n = ctx.world_size(), me = ctx.rank();
  const int t = ctx.thread(), nt = ctx.num_threads();
  // The sequence: (k, row) for k = 1..n-1 and row in peer (me + k)'s block-b rows.
  int k = 1;
  RowRange range =
      n > 1 ? fused_block_rows(fused_rank_rows(args.rows, (me + 1) % n, n), ctx.block(), ctx.num_blocks()) : RowRange{};
  int row = range.begin;
  auto settle = [&] {  // moves (k, row) to the next existing row, or k = n at the end
    while (k < n && row >= range.end) {
      if (++k < n) {
        range = fused_block_rows(fused_rank_rows(args.rows, (me + k) % n, n), ctx.block(), ctx.num_blocks());
        row = range.begin;
      }
    }
  };
  Pack<T> next[kHeld];
#if !defined(__CUDA_ARCH__)
  // Host only: a thread copies all kHeld entries into cur below, also those of packs it does not
  // own (p >= num_packs), which fetch never loads and nothing stores; g++ -Werror rejects copying
  // them uninitialized (maybe-uninitialized, in the simulator's instantiation). Not on the device,
  // whose machine code stays as it was (zeroing there changes gather_norm's register allocation).
  for (int i = 0; i < kHeld; ++i) next[i] = Pack<T>{};
#endif
  auto fetch = [&] {
    const T* src = ctx.scratch((me + k) % n) + static_cast<size_t>(row) * H;
    EXC_FUSED_UNROLL
    for (int i = 0; i < kHeld; ++i) {
      const int p = t + i * nt;
      if (p < tree.num_packs) next[i] = ctx.load(reinterpret_cast<const Pack<T>*>(src + static_cast<size_t>(p) * P));
    }
  };
  settle();
  if (k < n) fetch();
  while (k < n) {
    Pack<T> cur[kHeld];
    EXC_FUSED_UNROLL
    for (int i = 0; i < kHeld; ++i) cur[i] = next[i];
    const size_t base = static_cast<size_t>(row) * H;
    ++row;
    settle();
    if (k < n) fetch();
    EXC_FUSED_UNROLL
    for (int i = 0; i < kHeld; ++i) {
      const int p = t + i * nt;
      if (p < tree.num_packs)
        ctx.store(reinterpret_cast<Pack<T>*>(args.residual_out + base + static_cast<size_t>(p) * P), cur[i]);
    }
    normalize_held_row<T, kHeld>(ctx, tree, cur, w, args.eps, args.out + base);
  }
}

// gather_norm on the register path (the steps of fused_rmsnorm_gather_norm below).
template <class T, int kRanks, int kHeld, class Protocol, class Ctx>
EXC_HD void gather_norm_held(Ctx& ctx, const FusedRmsNormArgs<T>& args, const contract::RmsNormTree& tree) {
  const size_t H = static_cast<size_t>(args.hidden);
  Pack<T> w[kHeld];
  load_weight_packs<T, kHeld>(ctx, tree, args.weight, w);
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  {
    const RowRange mine =
        fused_block_rows(fused_rank_rows(args.rows, ctx.rank(), ctx.world_size()), ctx.block(), ctx.num_blocks());
    T* scratch = ctx.scratch(ctx.rank());
    trace_folded_rows(ctx, "fused_slice", mine, H, true);
    for (int row = mine.begin; row < mine.end; ++row) {
      const size_t base = static_cast<size_t>(row) * H;
      fused_row_held<T, kRanks, kHeld>(ctx, tree, inputs_in_place(ctx), base, args.residual + base, w, args.eps,
                                       args.residual_out + base, args.out + base, scratch + base);
    }
  }
  // Every thread's scratch stores happen-before the barrier's release (its first sync_block).
  block_barrier<Protocol>(ctx, &barriers);
  trace_gather_norm(ctx, args.rows, H);
  gather_held_rows<T, kHeld>(ctx, tree, args, w);
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// gather_norm (one kernel launch's work for one block of one rank). Preconditions: as
// core/fused_rmsnorm.h's algorithms (fused_rmsnorm_args_error(args) == nullptr, the same rows, H,
// eps and grid on every rank, world_size <= kMaxRanks, every x in place in ctx.input(rank)), and
// ctx.scratch(r) holds gather_norm_scratch_elements(rows, H) elements on every rank. Steps:
//   1. barrier: every peer's x is in place;
//   2. for each of this block's rows of this rank's slice (fused_rank_rows, fused_block_rows):
//      core's fused_row: s = fold over ranks, residual_out = residual_add(s, residual) into
//      args.residual_out and into this rank's scratch at the row's position, out = RMSNorm into
//      args.out;
//   3. barrier: every slice's residual_out is published;
//   4. for each peer (rank+1, rank+2, ...): the rows that the peer's block b wrote in step 2 (the
//      only ones block b's pairwise barrier vouches for): copy residual_out from the peer's
//      scratch (a bit copy) and normalize it here (gather_rows);
//   5. barrier (end): no peer overwrites its scratch or x while this rank may still read them.
// When the Ctx has sum_lane_partials and the block has exactly the tree's lanes, steps 2 and 4 run
// on the register path (fused_row_held, gather_held_rows; the weight is loaded before step 1).
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void fused_rmsnorm_gather_norm(Ctx& ctx, const FusedRmsNormArgs<T>& args) {
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  const bool held = run_register_path(
      ctx, tree, [&](auto packs) { gather_norm_held<T, kRanks, decltype(packs)::value, Protocol>(ctx, args, tree); });
  if (held) return;
  const size_t H = static_cast<size_t>(args.hidden);
  const int n = ctx.world_size();
  const int me = ctx.rank();
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  {
    const RowRange mine = fused_block_rows(fused_rank_rows(args.rows, me, n), ctx.block(), ctx.num_blocks());
    T* scratch = ctx.scratch(me);
    trace_folded_rows(ctx, "fused_slice", mine, H, true);
    for (int row = mine.begin; row < mine.end; ++row) {
      const size_t base = static_cast<size_t>(row) * H;
      fused_row<T, kRanks>(ctx, tree, inputs_in_place(ctx), base, args.residual + base, args.weight, args.eps,
                           args.residual_out + base, args.out + base, scratch + base, static_cast<T*>(nullptr));
    }
  }
  block_barrier<Protocol>(ctx, &barriers);
  trace_gather_norm(ctx, args.rows, H);
  for (int k = 1; k < n; ++k) {
    const int peer = (me + k) % n;
    const RowRange theirs = fused_block_rows(fused_rank_rows(args.rows, peer, n), ctx.block(), ctx.num_blocks());
    gather_rows<T>(ctx, tree, theirs, ctx.scratch(peer), args.residual_out, args.weight, args.eps, args.out);
  }
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// residual_rmsnorm_rows on the register path, kHeld packs a thread (threads == lanes): this
// thread's weight packs once per block; for each of the block's rows (b, b + num_blocks, ...),
// residual_out = residual_add(s, residual) for this thread's packs, held in registers and stored,
// then normalize_held_row (the lane partial from the registers, one block sync). The next row's s
// and residual are loaded before this row is normalized, so their latency hides behind the
// reduction. One pass over memory: s, residual and weight read once, residual_out and out written
// once. s may be out: a thread reads its packs of a row before it writes them.
// This thread's packs (t + k * nt, k < kHeld) of one row of src into held: the loads of the
// register path, issued together.
template <class T, int kHeld, class Ctx>
EXC_HD void load_row_packs(Ctx& ctx, const contract::RmsNormTree& tree, const T* src_row, Pack<T> (&held)[kHeld]) {
  constexpr int P = Storage<T>::kPack;
  EXC_FUSED_UNROLL
  for (int k = 0; k < kHeld; ++k) {
    const int p = ctx.thread() + k * ctx.num_threads();
    if (p < tree.num_packs) held[k] = ctx.load(reinterpret_cast<const Pack<T>*>(src_row + static_cast<size_t>(p) * P));
  }
}

template <class T, int kHeld, class Ctx>
EXC_HD void residual_rmsnorm_held(Ctx& ctx, const contract::RmsNormTree& tree, const T* s, const T* residual,
                                  const T* weight, T* residual_out, T* out, int rows, float eps) {
  constexpr int P = Storage<T>::kPack;
  const size_t H = static_cast<size_t>(tree.hidden);
  const int t = ctx.thread(), nt = ctx.num_threads();
  Pack<T> w[kHeld];
  load_weight_packs<T, kHeld>(ctx, tree, weight, w);
  Pack<T> next_s[kHeld] = {}, next_r[kHeld] = {};  // loaded for the packs this thread owns
  int row = ctx.block();
  if (row < rows) {
    load_row_packs<T, kHeld>(ctx, tree, s + static_cast<size_t>(row) * H, next_s);
    load_row_packs<T, kHeld>(ctx, tree, residual + static_cast<size_t>(row) * H, next_r);
  }
  for (; row < rows; row += ctx.num_blocks()) {
    const size_t base = static_cast<size_t>(row) * H;
    Pack<T> ro[kHeld];
    EXC_FUSED_UNROLL
    for (int k = 0; k < kHeld; ++k) {
      if (t + k * nt < tree.num_packs) {
        for (int e = 0; e < P; ++e) ro[k].v[e] = contract::residual_add<T>(next_s[k].v[e], next_r[k].v[e]);
      }
    }
    const int following = row + ctx.num_blocks();
    if (following < rows) {
      load_row_packs<T, kHeld>(ctx, tree, s + static_cast<size_t>(following) * H, next_s);
      load_row_packs<T, kHeld>(ctx, tree, residual + static_cast<size_t>(following) * H, next_r);
    }
    EXC_FUSED_UNROLL
    for (int k = 0; k < kHeld; ++k) {
      const int p = t + k * nt;
      if (p < tree.num_packs) {
        ctx.store(reinterpret_cast<Pack<T>*>(residual_out + base + static_cast<size_t>(p) * P), ro[k]);
      }
    }
    normalize_held_row<T, kHeld>(ctx, tree, ro, w, eps, out + base);
  }
}

// residual_rmsnorm_rows's memory path: per row, 1. residual_out, threads striding over packs;
// 2. sync_block; 3. normalize_row (which reads residual_out back).
template <class T, class Ctx>
EXC_HD void residual_rmsnorm_memory(Ctx& ctx, const contract::RmsNormTree& tree, const T* s, const T* residual,
                                    const T* weight, T* residual_out, T* out, int rows, float eps) {
  constexpr int P = Storage<T>::kPack;
  const size_t H = static_cast<size_t>(tree.hidden);
  for (int row = ctx.block(); row < rows; row += ctx.num_blocks()) {
    const size_t base = static_cast<size_t>(row) * H;
    for (int p = ctx.thread(); p < tree.num_packs; p += ctx.num_threads()) {
      const size_t j = base + static_cast<size_t>(p) * P;
      const Pack<T> a = ctx.load(reinterpret_cast<const Pack<T>*>(s + j));
      const Pack<T> b = ctx.load(reinterpret_cast<const Pack<T>*>(residual + j));
      Pack<T> y;
      for (int e = 0; e < P; ++e) y.v[e] = contract::residual_add<T>(a.v[e], b.v[e]);
      ctx.store(reinterpret_cast<Pack<T>*>(residual_out + j), y);
    }
    ctx.sync_block();
    normalize_row<T>(ctx, tree, residual_out + base, weight, eps, out + base);
  }
}

// The split path's second kernel (and exactcoll_add_rmsnorm): for each of this block's rows
// (rows b, b + num_blocks, ...) residual_out = residual_add(s, residual) and out = the canonical
// RMSNorm of residual_out. On the register path (the Ctx has sum_lane_partials, threads == lanes,
// at most 2 packs a thread) residual_rmsnorm_held; otherwise residual_rmsnorm_memory. s is the
// all-reduce's output [rows, H]; it
// may be the same buffer as out (each row of s is read before the same block writes that row of
// out). All pointers 16-byte aligned, H a positive multiple of the pack. No peers, no barrier:
// any grid gives the same bits.
template <class T, class Ctx>
EXC_HD void residual_rmsnorm_rows(Ctx& ctx, const T* s, const T* residual, const T* weight, T* residual_out, T* out,
                                  int rows, int hidden, float eps) {
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(hidden, &tree);
  const bool held = run_register_path(ctx, tree, [&](auto packs) {
    residual_rmsnorm_held<T, decltype(packs)::value>(ctx, tree, s, residual, weight, residual_out, out, rows, eps);
  });
  if (!held) residual_rmsnorm_memory<T>(ctx, tree, s, residual, weight, residual_out, out, rows, eps);
}

// Packs a thread holds on residual_rmsnorm_rows's register path for this grid and tree (1 or 2),
// or 0 when the memory path serves it. The kernels instantiate one path each, chosen on the host
// (this, and the working set's size), so that each is compiled with only its own registers.
EXC_HD inline int residual_rmsnorm_held_packs(int threads, const contract::RmsNormTree& tree) {
  if (threads != tree.lanes || tree.num_packs > 2 * tree.lanes) return 0;
  return register_packs(tree);
}

// Which fused kernel a launch runs (the staging below depends on which rows each block reads).
enum class FusedKernelKind : int {
  kOneStage = 0,         // core fused_rmsnorm_one_stage
  kTwoStage = 1,         // core fused_rmsnorm_two_stage
  kGatherNorm = 2,       // fused_rmsnorm_gather_norm
  kResidualRmsNorm = 3,  // residual_rmsnorm_rows (local; the split path)
  kOneStageReg = 4,      // fused_rmsnorm_one_stage_reg
  kPushOneStage = 5,     // fused_rmsnorm_push_one_stage_reg (reads only its own x: never staged)
  kLamportOneStage = 6,  // fused_rmsnorm_lamport_reg (reads only its own x: never staged)
  kLamportTwoStage = 7   // fused_rmsnorm_lamport_reg, LamportFused::kTwoStage (likewise)
};

// The Lamport protocol of a Lamport fused kernel kind (kLamportOneStage or kLamportTwoStage).
EXC_HD constexpr LamportFused lamport_fused_of(FusedKernelKind kind) {
  return kind == FusedKernelKind::kLamportTwoStage ? LamportFused::kTwoStage : LamportFused::kOneStage;
}

// Copies from src (this rank's x, [rows, H]) into dst (its staging buffer) the rows that block
// ctx.block() of any rank reads from this rank in `kind`: one_stage (and one_stage_reg) reads the
// block's chunk of all rows; two_stage and gather_norm read, for each rank p, the block's chunk of
// p's slice. Bits are copied unchanged. Not for kPushOneStage (peers never read its x; the kernel
// reads x where the caller keeps it).
template <class T, class Ctx>
EXC_HD void stage_fused_input(Ctx& ctx, FusedKernelKind kind, const T* src, T* dst, int rows, int hidden) {
  constexpr int P = Storage<T>::kPack;
  const size_t H = static_cast<size_t>(hidden);
  auto copy_rows = [&](RowRange r) {
    const BlockShare share = block_share(static_cast<size_t>(r.begin) * H, static_cast<size_t>(r.end) * H, P, 0, 1);
    trace_share(ctx, share, Access::kWrite, ctx.rank(), Buffer::kInput);
    copy_range<T>(ctx, share, src, dst, 0);
  };
  if constexpr (Ctx::kTraceSteps) ctx.trace_step_begin("stage_input");
  if (kind == FusedKernelKind::kOneStage || kind == FusedKernelKind::kOneStageReg) {
    copy_rows(fused_block_rows(RowRange{0, rows}, ctx.block(), ctx.num_blocks()));
  } else {
    const int n = ctx.world_size();
    for (int p = 0; p < n; ++p) copy_rows(fused_block_rows(fused_rank_rows(rows, p, n), ctx.block(), ctx.num_blocks()));
  }
  if constexpr (Ctx::kTraceSteps) ctx.trace_step_end();
}

}  // namespace exactcoll
