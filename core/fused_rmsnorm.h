// Fused all-reduce + residual add + RMSNorm, as templates over the execution context of
// core/collectives.h (the simulator and the CUDA backend instantiate the same code).
//
// The op, per rank (docs/numerics.md, "Fused all-reduce + residual + RMSNorm"):
//   x [rows, H]        this rank's partial sums: ctx.input(r) is rank r's x
//   residual [rows, H] the same on every rank (each rank passes its own copy)
//   weight [H], eps
//   s            = contract::fold over ranks 0..n-1 of x, rounded to storage (the all-reduce)
//   residual_out = contract::residual_add(s, residual)            = round(float(s) + float(residual))
//   out          = the canonical RMSNorm of residual_out           (contract::sum_squares tree,
//                  contract::rmsnorm_inverse, contract::rmsnorm_scale)
// Every algorithm below gives these bits, for every rows, H (a multiple of the pack), world size,
// block count and thread count: the fold order, the rounding points and the sum-of-squares tree
// depend on nothing else.
//
// ---- Addition to the execution-context concept (core/collectives.h) ------------------------------------
//   template <class Row> float row_sum_squares(const contract::RmsNormTree& tree, Row row)
//       Called by every thread of the block with the same tree and the same row; returns to every
//       thread ss = contract::sum_squares(tree, row). row(j) returns float(v_j) for j < tree.hidden
//       and may be called from any thread of the block (the values are in memory that the block
//       wrote before a sync_block). The simulator calls contract::sum_squares; the device context
//       computes lane l's partial (contract::lane_sum_squares) on the thread(s) owning lane l and
//       the two 32-lane butterflies with warp shuffles and a shared-memory step: the same tree, so
//       the same bits, without one thread walking the whole row.
//
// ---- Extra buffers ----------------------------------------------------------------------------------
// The residual, the weight and the two outputs come in FusedRmsNormArgs (no new context virtuals).
// All four pointers must be 16-byte aligned (packs are loaded and stored whole). two_stage also
// needs ctx.scratch(r) to hold fused_two_stage_scratch_elements(rows, H) elements on every rank;
// push_one_stage needs ctx.scratch_elements() >= push_scratch_elements(rows * H, pack, n)
// (core/push.h: the push algorithms' two receive halves of n slots).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/lamport.h"
#include "core/platform.h"
#include "core/push.h"
#include "core/registry.h"
#include "core/signal.h"
#include "core/storage.h"

namespace exactcoll {

template <class T>
struct FusedRmsNormArgs {
  const T* residual = nullptr;  // [rows, H], this rank's copy
  const T* weight = nullptr;    // [H]
  T* residual_out = nullptr;    // [rows, H], this rank's
  T* out = nullptr;             // [rows, H], this rank's (may be ctx.output())
  int rows = 0;
  int hidden = 0;  // H
  float eps = 0.0f;
};

// The fused algorithms (core/registry.h: FusedAlgorithm, names and properties). one_stage,
// two_stage, push_one_stage, lamport_one_stage and the unfused steps are below; gather_norm,
// one_stage_reg and push_one_stage_reg (the GPU's push_one_stage kernel: core's push_one_stage on
// the register path) are in core/fused_rmsnorm_kernels.h. Every one gives the contract's bits.
// The ones the simulator runs (not auto), in the registry's order.
inline constexpr auto kFusedAlgorithmsOnSimulator = fused_algorithms_on<kOnSimulator>();

// Returns nullptr when args satisfy the preconditions common to every algorithm, else what is
// wrong (a static string): H a positive multiple of the pack, rows >= 0, pointers present and
// 16-byte aligned.
template <class T>
EXC_HD inline const char* fused_rmsnorm_args_error(const FusedRmsNormArgs<T>& args) {
  contract::RmsNormTree tree;
  if (!contract::make_rmsnorm_tree<T>(args.hidden, &tree)) return "hidden size must be a positive multiple of the pack";
  if (args.rows < 0) return "rows must be >= 0";
  if (args.residual == nullptr || args.weight == nullptr || args.residual_out == nullptr || args.out == nullptr) {
    return "residual, weight, residual_out and out must all be given";
  }
  const uintptr_t misaligned = reinterpret_cast<uintptr_t>(args.residual) | reinterpret_cast<uintptr_t>(args.weight) |
                               reinterpret_cast<uintptr_t>(args.residual_out) | reinterpret_cast<uintptr_t>(args.out);
  if (misaligned % 16 != 0) return "residual, weight, residual_out and out must be 16-byte aligned";
  return nullptr;
}

// Scratch elements two_stage needs on every rank: its rows' residual_out, then their out.
EXC_HD inline size_t fused_two_stage_scratch_elements(int rows, int hidden) {
  return 2 * static_cast<size_t>(rows) * static_cast<size_t>(hidden);
}

// Rows [begin, end).
struct RowRange {
  int begin = 0, end = 0;
};

// Returns rank `rank`'s rows in two_stage: contiguous, as even as possible (rows * r / n).
EXC_HD inline RowRange fused_rank_rows(int rows, int rank, int n) {
  RowRange r;
  r.begin = static_cast<int>(static_cast<int64_t>(rows) * rank / n);
  r.end = static_cast<int>(static_cast<int64_t>(rows) * (rank + 1) / n);
  return r;
}

// Returns block `block`'s rows of [range.begin, range.end): contiguous chunks of ceil(count / blocks).
EXC_HD inline RowRange fused_block_rows(RowRange range, int block, int num_blocks) {
  const int count = range.end - range.begin;
  const int chunk = (count + num_blocks - 1) / num_blocks;
  RowRange r;
  r.begin = range.begin + (chunk * block < count ? chunk * block : count);
  r.end = range.begin + (chunk * (block + 1) < count ? chunk * (block + 1) : count);
  return r;
}

// Records the accesses of a row range to every rank's input (reads) and the given buffers.
template <class Ctx>
EXC_HD void trace_rows(Ctx& ctx, size_t begin, size_t end, bool reads_inputs, int peer, Buffer buffer, Access access) {
  if constexpr (Ctx::kTraceSteps) {
    if (end <= begin) return;
    if (reads_inputs) {
      for (int r = 0; r < ctx.world_size(); ++r) ctx.trace_access(Access::kRead, r, Buffer::kInput, begin, end);
    }
    ctx.trace_access(access, peer, buffer, begin, end);
  } else {
    (void)ctx, (void)begin, (void)end, (void)reads_inputs, (void)peer, (void)buffer, (void)access;
  }
}

// Records step `name`: this block folds rows `rows` (of H elements) from every rank's input into
// this rank's output, and into its scratch too when to_scratch (the row positions of x).
template <class Ctx>
EXC_HD void trace_folded_rows(Ctx& ctx, const char* name, RowRange rows, size_t H, bool to_scratch) {
  if constexpr (Ctx::kTraceSteps) {
    ctx.trace_step_begin(name);
    const size_t begin = static_cast<size_t>(rows.begin) * H, end = static_cast<size_t>(rows.end) * H;
    if (to_scratch) trace_rows(ctx, begin, end, true, ctx.rank(), Buffer::kScratch, Access::kWrite);
    trace_rows(ctx, begin, end, !to_scratch, ctx.rank(), Buffer::kOutput, Access::kWrite);
    ctx.trace_step_end();
  } else {
    (void)ctx, (void)name, (void)rows, (void)H, (void)to_scratch;
  }
}

// ---- Row steps, shared by the algorithms ---------------------------------------------------------------
// Where a row's fold reads rank r's x: a callable x_of(r) returning a const T* to element 0 of rank
// r's [rows, H] x (element i at x_of(r) + i). one_stage and two_stage read every rank's x in place
// (inputs_in_place); push_one_stage reads its own x and the copies the peers pushed into its scratch.

// Returns x_of for every rank's x read in place from its symmetric input buffer: ctx.input(r).
template <class Ctx>
EXC_HD EXC_INLINE auto inputs_in_place(Ctx& ctx) {
  return [&ctx](int r) { return ctx.input(r); };
}

// Returns the fold of the pack at element i (aligned) over ranks 0..n-1, rank r's pack loaded from
// x_of(r) + i (with kRanks > 0 every load is issued before the first add).
template <class T, int kRanks, class Ctx, class XOf>
EXC_HD EXC_INLINE Pack<T> fold_pack_of(Ctx& ctx, size_t i, XOf x_of) {
  return fold_pack_from<T, kRanks>(ctx, i,
                                   [&](int r) { return ctx.load(reinterpret_cast<const Pack<T>*>(x_of(r) + i)); });
}

// Computes residual_out and out for one row, every thread of the block taking part. Steps:
//   1. threads stride over the row's packs: s = fold over ranks of x_of(r) (fold_pack_of, rank
//      order), residual_out = residual_add(s, residual), stored to residual_out (and
//      copy_residual_out when not null);
//   2. sync_block, so that every thread sees the whole row;
//   3. ss = ctx.row_sum_squares(tree, row of residual_out); inv = rmsnorm_inverse(ss, H, eps);
//   4. threads stride over the packs: out = rmsnorm_scale(residual_out, inv, weight), stored to
//      out (and copy_out when not null);
//   5. sync_block: the next row may reuse what the reduction in step 3 used.
// row_begin is the row's first element in x; residual_out/out/copy_* point at element 0 of the
// row in their buffers.
// fused_row_from takes the fold as fold_of(i), the folded pack at element i of x (lamport_one_stage
// polls its operands: lamport_fold_message_pack); fused_row loads them from x_of(r) + i.
template <class T, int kRanks, class Ctx, class FoldOf>
EXC_HD void fused_row_from(Ctx& ctx, const contract::RmsNormTree& tree, FoldOf fold_of, size_t row_begin,
                           const T* residual, const T* weight, float eps, T* residual_out, T* out, T* copy_residual_out,
                           T* copy_out) {
  constexpr int P = Storage<T>::kPack;
  const int np = tree.num_packs;
  // The weight of this thread's first pack, loaded now so that its latency overlaps the fold and
  // the row's sum of squares instead of following them (the loads below likewise come before the
  // fold's operands, which may be polled). Only where loads come from; no bit changes.
  const int first = ctx.thread();
  Pack<T> first_weight{};
  if (first < np) first_weight = ctx.load(reinterpret_cast<const Pack<T>*>(weight + static_cast<size_t>(first) * P));
  for (int p = ctx.thread(); p < np; p += ctx.num_threads()) {
    const size_t j = static_cast<size_t>(p) * P;
    const size_t i = row_begin + j;
    const Pack<T> res = ctx.load(reinterpret_cast<const Pack<T>*>(residual + j));
    const Pack<T> s = fold_of(i);
    Pack<T> ro;
    for (int e = 0; e < P; ++e) ro.v[e] = contract::residual_add<T>(s.v[e], res.v[e]);
    ctx.store(reinterpret_cast<Pack<T>*>(residual_out + j), ro);
    if (copy_residual_out != nullptr) ctx.store(reinterpret_cast<Pack<T>*>(copy_residual_out + j), ro);
  }
  ctx.sync_block();
  const T* ro_row = residual_out;
  const float ss = ctx.row_sum_squares(tree, [ro_row](int j) { return to_float(ro_row[j]); });
  const float inv = contract::rmsnorm_inverse(ss, tree.hidden, eps);
  for (int p = ctx.thread(); p < np; p += ctx.num_threads()) {
    const size_t j = static_cast<size_t>(p) * P;
    const Pack<T> v = ctx.load(reinterpret_cast<const Pack<T>*>(residual_out + j));
    const Pack<T> w = p == first ? first_weight : ctx.load(reinterpret_cast<const Pack<T>*>(weight + j));
    Pack<T> y;
    for (int e = 0; e < P; ++e) y.v[e] = contract::rmsnorm_scale<T>(to_float(v.v[e]), inv, w.v[e]);
    ctx.store(reinterpret_cast<Pack<T>*>(out + j), y);
    if (copy_out != nullptr) ctx.store(reinterpret_cast<Pack<T>*>(copy_out + j), y);
  }
  ctx.sync_block();
}

template <class T, int kRanks, class Ctx, class XOf>
EXC_HD void fused_row(Ctx& ctx, const contract::RmsNormTree& tree, XOf x_of, size_t row_begin, const T* residual,
                      const T* weight, float eps, T* residual_out, T* out, T* copy_residual_out, T* copy_out) {
  fused_row_from<T, kRanks>(
      ctx, tree, [&](size_t i) { return fold_pack_of<T, kRanks>(ctx, i, x_of); }, row_begin, residual, weight, eps,
      residual_out, out, copy_residual_out, copy_out);
}

// ---- The fused algorithms (one kernel launch's work for one block of one rank) ---------------------------
// Preconditions common to all: fused_rmsnorm_args_error(args) == nullptr; every rank calls with
// the same rows, H, eps and grid (num_blocks <= kMaxBlocks); world_size <= kMaxRanks; every rank's
// x is in place in ctx.input(rank) before the launch.

// one_stage: every rank reduces every row itself. Steps:
//   1. barrier: every peer's x is in place;
//   2. for each of this block's rows (contiguous chunks of all rows): fused_row into
//      args.residual_out and args.out (this rank's memory only);
//   3. barrier (end): no peer reuses its x while this rank may still read it.
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void fused_rmsnorm_one_stage(Ctx& ctx, const FusedRmsNormArgs<T>& args) {
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  const size_t H = static_cast<size_t>(args.hidden);
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  const RowRange mine = fused_block_rows(RowRange{0, args.rows}, ctx.block(), ctx.num_blocks());
  trace_folded_rows(ctx, "fused_rows", mine, H, false);
  for (int row = mine.begin; row < mine.end; ++row) {
    const size_t base = static_cast<size_t>(row) * H;
    fused_row<T, kRanks>(ctx, tree, inputs_in_place(ctx), base, args.residual + base, args.weight, args.eps,
                         args.residual_out + base, args.out + base, static_cast<T*>(nullptr), static_cast<T*>(nullptr));
  }
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// two_stage: ranks reduce disjoint row slices, then every rank gathers all rows. Steps:
//   1. barrier: every peer's x is in place;
//   2. for each of this block's rows of this rank's slice (fused_rank_rows): fused_row into
//      args.residual_out/args.out and into this rank's scratch (residual_out rows at [0, rows*H),
//      out rows at [rows*H, 2*rows*H));
//   3. barrier: every slice is published;
//   4. copy each peer's rows (peers rank+1, rank+2, ...) of both halves from its scratch into
//      args.residual_out and args.out (a bit copy); block b copies the rows the peer's block b
//      wrote in step 2, the only ones its pairwise barrier vouches for;
//   5. barrier (end): no peer overwrites its scratch while this rank may still read it.
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void fused_rmsnorm_two_stage(Ctx& ctx, const FusedRmsNormArgs<T>& args) {
  constexpr int P = Storage<T>::kPack;
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  const size_t H = static_cast<size_t>(args.hidden);
  const size_t total = static_cast<size_t>(args.rows) * H;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  {
    const RowRange slice = fused_rank_rows(args.rows, me, n);
    const RowRange mine = fused_block_rows(slice, ctx.block(), ctx.num_blocks());
    T* scratch = ctx.scratch(me);
    trace_folded_rows(ctx, "fused_slice", mine, H, true);
    for (int row = mine.begin; row < mine.end; ++row) {
      const size_t base = static_cast<size_t>(row) * H;
      fused_row<T, kRanks>(ctx, tree, inputs_in_place(ctx), base, args.residual + base, args.weight, args.eps,
                           args.residual_out + base, args.out + base, scratch + base, scratch + total + base);
    }
  }
  block_barrier<Protocol>(ctx, &barriers);
  for (int k = 1; k < n; ++k) {
    const int peer = (me + k) % n;
    // Block b copies exactly the rows that the peer's block b wrote: the barrier is pairwise per
    // block, so only those rows are known to be published.
    const RowRange theirs = fused_block_rows(fused_rank_rows(args.rows, peer, n), ctx.block(), ctx.num_blocks());
    const BlockShare share = block_share(theirs.begin * H, theirs.end * H, P, 0, 1);
    const T* src = ctx.scratch(peer);
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("gather_rows");
      trace_share(ctx, share, Access::kRead, peer, Buffer::kScratch);
      trace_share(ctx, share, Access::kRead, peer, Buffer::kScratch, total);
      trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput);
      ctx.trace_step_end();
    }
    copy_range<T>(ctx, share, src, args.residual_out, 0);
    copy_range<T>(ctx, share, src + total, args.out, 0);
  }
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// push_one_stage: every rank pushes its x into every peer's scratch before a single barrier, then
// reduces its rows from local memory; no end barrier. The all-reduce part is
// allreduce_push_one_shot's (core/push.h), on rows instead of a flat share, and it SHARES
// that algorithm's call counter (SignalBuffer::push_calls) and receive halves (Halves) with every
// push algorithm on the same signal and scratch buffers. Additional preconditions (those of
// allreduce_push_one_shot): ctx.scratch_elements() >= push_scratch_elements(rows * H, pack, n), the
// same on every rank; the scratch is not used by another algorithm without an end barrier in
// between (one_stage, two_stage and the all-reduces without push have theirs).
// Example: 2 ranks, 1 row, 1 block: rank 0 stores its row of x into slot (h, 0) of rank 1's
// scratch and rank 1 its row into slot (h, 1) of rank 0's; after the barrier rank 0 folds
// x_0 + scratch_0[h, 1], rank 1 scratch_1[h, 0] + x_1, and both finish the row as one_stage does.
// Steps:
//   1. h = Halves::half(push_calls[block], barriers) (the call number's parity; every block of the
//      launch reads the same number); half h begins at h x Halves::half_elements(rows * H, ...)
//      (AlternatingHalves: the middle of the scratch, whatever the call's size);
//   2. push: this block's rows (fused_block_rows of all rows: exactly the rows that block b of
//      every rank folds) of this rank's x, read locally, stored with 16-byte stores (several packs
//      in flight, push_share) into slot (h, rank) of every peer's scratch, at their positions in x;
//      then before_barrier(): work of this block that needs no peer's data (the register path
//      loads the weight there; core passes nothing);
//   3. one barrier: the release after the stores, the acquire before the reads; block b's
//      pairwise barrier vouches for exactly the rows that the peers' block b pushed in step 2;
//   4. advance the push call number as allreduce_push_one_shot's step 4 does (slots b, b + G, ...);
//   5. for each of this block's rows: row_fn(row, x_of) with x_of(r) = this rank's own x for r ==
//      rank, its own scratch slot (h, r) otherwise (local reads only). fused_rmsnorm_push_one_stage
//      passes core's fused_row (fold in rank order, residual_add, canonical RMSNorm);
//      push_one_stage_reg's register path (core/fused_rmsnorm_kernels.h) its row held in registers.
// Why no end barrier: allreduce_push_one_shot's argument (a) and (b) hold unchanged. (a) Peer p
// writes half h of this rank's scratch in this call k, the other half in its next push call
// (push_one_shot, push_two_shot or push_one_stage alike: they advance the same counter), and half
// h again at the earliest in push call k+2, after passing a barrier of call k+1 whose signal from
// this rank is sent only after this rank's call k kernel finished every row (stream order); any
// other collective in between has a barrier of its own that serves as call k+1. The calls' sizes
// may differ (rows * H here, any count in an all-reduce, any rows in the next fused call): half 1
// starts at the same place for every size, so a call writing half h^1 never reaches into half h.
// (b) Peers never read this rank's x, residual, weight or outputs: a fast rank's next launch may
// overwrite them while a peer is still in this call. Hence also: x needs no staging (the CUDA
// backend reads it from the caller's pointer).
template <class T, int kRanks, class Protocol, class Halves, class Ctx, class BeforeBarrier, class RowFn>
EXC_HD void push_one_stage_rows(Ctx& ctx, const FusedRmsNormArgs<T>& args, BeforeBarrier before_barrier, RowFn row_fn) {
  constexpr int P = Storage<T>::kPack;
  const int me = ctx.rank();
  const int b = ctx.block();
  const int num_blocks = ctx.num_blocks();
  const size_t H = static_cast<size_t>(args.hidden);
  const size_t count = static_cast<size_t>(args.rows) * H;
  uint32_t barriers = load_barrier_count(ctx);
  // 1. The receive half of this call.
  const PushCall call = begin_push_call<Halves>(ctx, count, P, barriers);
  const size_t my_slot = push_slot_offset(count, P, call.half, me, call.half_elements);
  const RowRange mine = fused_block_rows(RowRange{0, args.rows}, b, num_blocks);
  const BlockShare share = block_share(mine.begin * H, mine.end * H, P, 0, 1);
  const T* x = ctx.input(me);
  // 2. Push this block's rows into every peer's slot (half, me); peers in order me+1, me+2, ...
  push_share_into_slot<T, kRanks>(ctx, "push_rows", share, x, my_slot);
  before_barrier();
  // 3. One barrier: every peer's rows of this block are in this rank's slots.
  block_barrier<Protocol>(ctx, &barriers);
  // 4. Advance the push call number in the slots this block owns in this launch.
  advance_push_calls(ctx, call.calls);
  // 5. The rows, folded from local memory.
  trace_push_fold<T>(ctx, "fused_rows", share, count, call);
  const auto x_of = push_fold_sources(ctx, x, count, call);
  for (int row = mine.begin; row < mine.end; ++row) row_fn(row, x_of);
  store_barrier_count(ctx, barriers);
}

// push_one_stage with core's row step (the simulator's and the CUDA backend's fallback when its
// register path does not fit the grid). Same bits as one_stage.
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Halves = AlternatingHalves, class Ctx>
EXC_HD void fused_rmsnorm_push_one_stage(Ctx& ctx, const FusedRmsNormArgs<T>& args) {
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  const size_t H = static_cast<size_t>(args.hidden);
  push_one_stage_rows<T, kRanks, Protocol, Halves>(
      ctx, args, [] {},
      [&](int row, auto x_of) {
        const size_t base = static_cast<size_t>(row) * H;
        fused_row<T, kRanks>(ctx, tree, x_of, base, args.residual + base, args.weight, args.eps,
                             args.residual_out + base, args.out + base, static_cast<T*>(nullptr),
                             static_cast<T*>(nullptr));
      });
}

// Returns the rows lamport_one_stage's block folds, given its push share `push` (block_share of
// [0, rows * H) over the grid): the rows whose last pack lies in the share, [pack_begin / H,
// pack_end / H). H is a multiple of the pack, so the row ending in a share is the row r with
// pack_begin < (r + 1) H <= pack_end. The shares cover [0, rows * H) in order, so every row goes to
// exactly one block, and every element of block b's rows lies at or before the end of its own
// share: it was pushed by blocks 0..b of the peers. With one block per row (the grid of rows
// blocks) these are fused_block_rows' rows; with more blocks than rows the last blocks of each
// row's span fold it and the others only push.
EXC_HD inline RowRange lamport_block_rows(const BlockShare& push, size_t hidden) {
  RowRange r;
  r.begin = static_cast<int>(push.pack_begin / hidden);
  r.end = static_cast<int>(push.pack_end / hidden);
  return r;
}

// lamport_one_stage: the fused op over allreduce_lamport_one_shot's protocol (core/lamport.h): no
// barrier, no flag; the call counter, the buffers, the extents and the sentinel are the Lamport
// all-reduce's, so Lamport calls of both kinds may follow each other. Same bits as one_stage: every
// element is folded by fold_pack_from in rank order from operands whose only change is a NaN made
// canonical (numerics.md §9), then fused_row's residual add and canonical RMSNorm.
// Additional preconditions: lamport_fits(rows * H, sizeof(T), n, ctx.lamport_bytes()); the region
// was filled with 0xFF once, before any Lamport call.
// lamport_one_stage_rows is the protocol, with the row step as a parameter (as push_one_stage_rows):
// core's fused_rmsnorm_lamport passes fused_row_from; the register path
// (core/fused_rmsnorm_kernels.h, fused_rmsnorm_lamport_reg, the GPU's kernel) its row
// held in registers. Steps (per block):
//   1. the Lamport call (begin_lamport_call): buffer b = k mod 3, previous = (k - 1) mod 3;
//   2. push this block's share of the whole message (block_share of [0, rows * H) over all blocks
//      of the grid, as allreduce_lamport_one_shot's push), NaNs made canonical, into slot (b, rank)
//      of every peer's region: at 1 row every block of the grid pushes a part of the row, instead
//      of the one block that folds it storing all n - 1 copies from one multiprocessor;
//   3. clear this block's share of the previous call's extent of this rank's own buffer `previous`
//      (lamport_clear_previous: already a share over all blocks); then before_fold(): work of this
//      block that needs no peer's data (the register path loads the weight there; core passes
//      nothing);
//   4. sync_before_polls: every thread of the block has pushed before any thread polls. The GPU
//      needs no such order (its threads run at once); the simulator runs a block's threads in turn
//      (sim/block_threads.h), and without it a thread could poll for a pack that a later thread of
//      the peer's block pushes, while that block waits in its own earlier thread's poll;
//   5. for each of this block's rows (lamport_block_rows: the rows that end in its push share):
//      row_fn(row, fold_of), fold_of(i) the folded pack at element i of x (lamport_fold_message_pack:
//      own x, own slots (b, p) polled until no element is the sentinel);
//   6. record the extent and advance the call number (end_lamport_call).
// Why it needs no barrier and three buffers: allreduce_lamport_one_shot's (a) to (d), unchanged.
// They argue per rank, never per block: this rank reads only its own region and its own x,
// residual and weight (peers read nothing of it); the buffer a call clears was read only by the
// previous call's kernel, which finished (all its blocks) before this one began, whichever block
// polled which part of it; and a peer writes that buffer again only in call k + 2, after its call
// k + 1 polled all of this rank's call k + 1 push (every row of it is polled by some block), which
// this rank issues only after its call k kernel, every block's clear included, finished. The call
// number and the extents are per rank too: every block reads the same call number and writes the
// same extent (end_lamport_call).
// Progress: block b polls only data that blocks 0..b of the peers push (lamport_block_rows), and
// every block pushes before it polls, so a block never waits for a later block of any rank: the
// order the simulator's threads scheduler runs a rank's blocks in, and the same requirement as
// the barrier algorithms' (block b waits for the peers' block b). No new precondition on the grid
// (pushing by fused_block_rows' rows while folding by the shares, or the other way round, would
// make block 0 wait for the peers' later blocks).
// lamport_one_stage's step 4: ctx.sync_block(), or ctx.sync_before_polls() where the context has
// it. A context may provide it when its block's threads run at once and its sync_block costs more
// than the order step 4 needs (none on a GPU): cuda_backend/fused's cluster context, whose
// sync_block is a barrier of every block of a thread-block cluster, makes it a no-op.
template <class Ctx>
EXC_HD EXC_INLINE void sync_before_polls(Ctx& ctx) {
  if constexpr (requires { ctx.sync_before_polls(); }) {
    ctx.sync_before_polls();
  } else {
    ctx.sync_block();
  }
}

template <class T, int kRanks, class Protocol, class Ctx, class BeforeFold, class RowFn>
EXC_HD void lamport_one_stage_rows(Ctx& ctx, const FusedRmsNormArgs<T>& args, BeforeFold before_fold, RowFn row_fn) {
  constexpr int P = Storage<T>::kPack;
  const size_t H = static_cast<size_t>(args.hidden);
  const size_t count = static_cast<size_t>(args.rows) * H;
  const int me = ctx.rank();
  // 1. The call.
  const LamportCall<T> c = begin_lamport_call<T, Protocol>(ctx);
  const BlockShare push = block_share(0, count, P, ctx.block(), ctx.num_blocks());
  const RowRange mine = lamport_block_rows(push, H);
  const BlockShare rows = block_share(mine.begin * H, mine.end * H, P, 0, 1);
  const T* x = ctx.input(me);
  // 2. Push this block's share of the message (every block of the grid, whatever its rows).
  lamport_push<T, kRanks, Protocol>(ctx, "push", c, push, x, count);
  // 3. Clear the previous call's buffer; the work that needs no peer.
  lamport_clear_previous<T, kRanks, Protocol>(ctx, c);
  before_fold();
  // 4. Every thread's pushes before any thread's polls.
  sync_before_polls(ctx);
  // 5. This block's rows, from the polled operands.
  if constexpr (Ctx::kTraceSteps) {
    ctx.trace_step_begin("fused_rows");
    for (int r = 0; r < ctx.world_size(); ++r) {
      if (r == me) {
        trace_share(ctx, rows, Access::kRead, me, Buffer::kInput);
      } else {
        trace_share(ctx, rows, Access::kRead, me, Buffer::kLamport, lamport_slot_offset(c, c.buffer, r));
      }
    }
    trace_share(ctx, rows, Access::kWrite, me, Buffer::kOutput);
    ctx.trace_step_end();
  }
  auto fold_of = [&](size_t i) { return lamport_fold_message_pack<T, kRanks>(ctx, c, x, count, i); };
  for (int row = mine.begin; row < mine.end; ++row) row_fn(row, fold_of);
  // 6. Record the extent and advance the call number.
  end_lamport_call(ctx, c, lamport_message_bytes(count, sizeof(T)));
}

// ---- lamport_two_stage: lamport_one_stage with each row folded once, by its owner -------------------------
// Row r belongs to rank r mod n (lamport_row_owner), at index r / n among that rank's rows: each
// rank folds a 1/n share of the rows, interleaved so that every block's rows are spread over the
// ranks. lamport_two_stage's slot layout: in rank p's region, slot (buffer, s) holds rank s's
// pieces of the rows p owns at [0, stride), row r at (r / n) x H, and owner s's folded rows at
// [stride, 2 stride), row r (owned by s) at stride + (r / n) x H; stride = ceil(rows / n) x H
// elements (lamport_two_stage_stride). Two strides a slot: at n = 4, half of lamport_one_stage's
// message, so twice the rows fit one launch.
// Example: 4 ranks, 6 rows of H 8: rank 1 owns rows 1 and 5, at elements 0 and 8 of its pieces
// half; stride 16.
EXC_HD inline int lamport_row_owner(int row, int n) { return row % n; }
EXC_HD inline size_t lamport_two_stage_stride(int rows, size_t hidden, int n) {
  return (static_cast<size_t>(rows) + static_cast<size_t>(n) - 1) / static_cast<size_t>(n) * hidden;
}
// The element of an owner's half (pieces or folded rows) that element i of x (row i / H) lands at.
EXC_HD inline size_t lamport_owned_offset(size_t i, size_t hidden, int n) {
  const size_t row = i / hidden;
  return row / static_cast<size_t>(n) * hidden + (i - row * hidden);
}
// Bytes of every sender's slot that a lamport_two_stage call of rows x hidden elements of
// element_bytes occupies on n ranks (two strides), and the region bytes per rank it needs.
EXC_HD inline size_t lamport_two_stage_slot_bytes(int rows, size_t hidden, size_t element_bytes, int n) {
  return 2 * lamport_two_stage_stride(rows, hidden, n) * element_bytes;
}
EXC_HD inline size_t lamport_two_stage_region_bytes(int rows, size_t hidden, size_t element_bytes, int n) {
  return static_cast<size_t>(kLamportBuffers) * static_cast<size_t>(n) *
         lamport_two_stage_slot_bytes(rows, hidden, element_bytes, n);
}
// The most rows of `hidden` elements of element_bytes that one lamport_two_stage launch takes on
// slots of slot_bytes: n x floor(slot_bytes / (2 x H x element_bytes)) (0: not even n rows fit).
// Example: 1 MiB slots, 4 ranks, H 4096 bf16 (8 KiB rows): 4 x 64 = 256 rows.
EXC_HD inline size_t lamport_two_stage_max_rows(size_t slot_bytes, size_t hidden, size_t element_bytes, int n) {
  return static_cast<size_t>(n) * (slot_bytes / (2 * hidden * element_bytes));
}

// lamport_two_stage: the fused op as two Lamport pushes, the way lamport_two_shot is the
// all-reduce's: each rank pushes its x of every row to the row's owner; the owner folds the row in
// rank order and pushes the folded row back to every peer; every rank then adds its residual and
// normalizes every row itself. Each rank pushes 2 (n - 1) / n of x instead of lamport_one_stage's
// n - 1 copies, for one more NVLink latency, and folds 1/n of the rows; the split (an all-reduce,
// then the norm kernel) moves as much but launches twice and writes and reads the sum once more.
// Same bits as one_stage: each element is folded once, by its owner, with fold_pack_from in rank
// order from operands whose only change is a NaN made canonical; the others take those bits; then
// every rank runs the same row step (fused_row_from or the register path's) on them.
// Additional preconditions: lamport_two_stage_slot_bytes(rows, H, sizeof(T), n) <= the slot of
// lamport_layout(ctx.lamport_bytes(), n); the region as for lamport_one_stage.
// lamport_two_stage_rows is the protocol with the row step as a parameter (as lamport_one_stage_rows,
// whose push shares, rows per block, clear and call counter it keeps). Steps (per block):
//   1. the Lamport call (begin_lamport_call);
//   2. push: each pack of this block's share of x (block_share of [0, rows * H) over the grid)
//      whose row another rank owns, NaNs made canonical, into slot (b, rank) of the owner's region
//      at lamport_owned_offset;
//   3. clear the previous call's buffer (lamport_clear_previous: extents are bytes per slot,
//      whichever Lamport call wrote them); before_fold();
//   4. sync_before_polls (lamport_one_stage's step 4);
//   5. this block's rows (lamport_block_rows) that this rank owns: row_fn(row, fold_of) with
//      fold_of(i) = the fold of own x and the polled pieces (slots (b, p) at lamport_owned_offset),
//      each folded pack also pushed, canonicalized, into slot (b, rank) of every peer's region at
//      stride + lamport_owned_offset (a poll that gave up pushes nothing, as lamport_two_shot's);
//   6. this block's other rows: row_fn(row, fold_of) with fold_of(i) = the owner's folded pack,
//      polled from slot (b, owner) of this rank's own region at stride + lamport_owned_offset;
//   7. record the extent (two strides) and advance the call number (end_lamport_call).
// Why the three buffers and the clear stay safe: allreduce_lamport_one_shot's (a) to (d), with "p's
// call k + 1 needs r's call k + 1 push" holding as in lamport_two_shot: every row's fold takes r's
// piece, and p either folds a row (polling r's piece) or polls the row's owner's folded row, which
// the owner computed from r's piece (a data dependence). There is at least one row in a call.
// Progress: step 5 polls only the pieces that blocks 0..b of the peers push in their step 2 (as
// lamport_one_stage's polls); step 6 polls what the owner's block b pushes in its step 5, which
// waits only for step-2 pushes. Owned rows come first so that no row waits for a peer's poll of
// another row: folding rows in row order would chain the ranks' rows one NVLink latency each.
template <class T, int kRanks, class Protocol, class Ctx, class BeforeFold, class RowFn>
EXC_HD void lamport_two_stage_rows(Ctx& ctx, const FusedRmsNormArgs<T>& args, BeforeFold before_fold, RowFn row_fn) {
  constexpr int P = Storage<T>::kPack;
  const size_t H = static_cast<size_t>(args.hidden);
  const size_t count = static_cast<size_t>(args.rows) * H;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  const int peers = kRanks > 0 ? kRanks : n;
  const size_t stride = lamport_two_stage_stride(args.rows, H, n);
  // 1. The call.
  const LamportCall<T> c = begin_lamport_call<T, Protocol>(ctx);
  const BlockShare push = block_share(0, count, P, ctx.block(), ctx.num_blocks());
  const RowRange mine = lamport_block_rows(push, H);
  const T* x = ctx.input(me);
  // 2. Push this block's share of x to the rows' owners.
  if constexpr (Ctx::kTraceSteps) {
    ctx.trace_step_begin("push_owned");
    trace_share(ctx, push, Access::kRead, me, Buffer::kInput);
    for (size_t begin = push.pack_begin; begin < push.pack_end;) {
      const size_t row = begin / H, end = push.pack_end < (row + 1) * H ? push.pack_end : (row + 1) * H;
      const int owner = lamport_row_owner(static_cast<int>(row), n);
      if (owner != me) {
        const size_t at = lamport_slot_offset(c, c.buffer, me) + lamport_owned_offset(begin, H, n);
        ctx.trace_access(Access::kWrite, owner, Buffer::kLamport, at, at + (end - begin));
      }
      begin = end;
    }
    ctx.trace_step_end();
  }
  for_share(
      ctx, push, P,
      [&](size_t i) {
        const int owner = lamport_row_owner(static_cast<int>(i / H), n);
        if (owner == me) return;
        Pack<T> v = ctx.load(reinterpret_cast<const Pack<T>*>(x + i));
        if constexpr (Protocol::kCanonicalize) v = lamport_canonicalize(v);
        ctx.lamport_store(
            reinterpret_cast<Pack<T>*>(lamport_slot(ctx, c, owner, c.buffer, me) + lamport_owned_offset(i, H, n)), v,
            owner);
      },
      [](size_t) {});
  // 3. Clear the previous call's buffer; the work that needs no peer.
  lamport_clear_previous<T, kRanks, Protocol>(ctx, c);
  before_fold();
  // 4. Every thread's pushes before any thread's polls.
  sync_before_polls(ctx);
  // 5. The owned rows: fold, push the folded row to every peer, the row step.
  auto trace_row = [&](const char* name, int row, bool owned) {
    if constexpr (Ctx::kTraceSteps) {
      const size_t begin = static_cast<size_t>(row) * H, at = lamport_owned_offset(begin, H, n);
      const int owner = lamport_row_owner(row, n);
      ctx.trace_step_begin(name);
      if (owned) {
        for (int r = 0; r < n; ++r) {
          if (r == me) {
            ctx.trace_access(Access::kRead, me, Buffer::kInput, begin, begin + H);
          } else {
            const size_t from = lamport_slot_offset(c, c.buffer, r) + at;
            ctx.trace_access(Access::kRead, me, Buffer::kLamport, from, from + H);
          }
        }
        for (int k = 1; k < n; ++k) {
          const size_t to = lamport_slot_offset(c, c.buffer, me) + stride + at;
          ctx.trace_access(Access::kWrite, (me + k) % n, Buffer::kLamport, to, to + H);
        }
      } else {
        const size_t from = lamport_slot_offset(c, c.buffer, owner) + stride + at;
        ctx.trace_access(Access::kRead, me, Buffer::kLamport, from, from + H);
      }
      ctx.trace_access(Access::kWrite, me, Buffer::kOutput, begin, begin + H);
      ctx.trace_step_end();
    } else {
      (void)name, (void)row, (void)owned;
    }
  };
  for (int row = mine.begin; row < mine.end; ++row) {
    if (lamport_row_owner(row, n) != me) continue;
    trace_row("fold_owned_row", row, true);
    row_fn(row, [&](size_t i) {
      const size_t at = lamport_owned_offset(i, H, n);
      bool arrived = true;
      const Pack<T> s = lamport_fold_pack<T, kRanks>(
          ctx, c, i, ctx.load(reinterpret_cast<const Pack<T>*>(x + i)),
          [&](int r) { return reinterpret_cast<const Pack<T>*>(lamport_slot(ctx, c, me, c.buffer, r) + at); },
          &arrived);
      if (arrived) {
        const Pack<T> pushed = Protocol::kCanonicalize ? lamport_canonicalize(s) : s;
        for (int k = 1; k < peers; ++k) {
          const int p = (me + k) % n;
          ctx.lamport_store(reinterpret_cast<Pack<T>*>(lamport_slot(ctx, c, p, c.buffer, me) + stride + at), pushed, p);
        }
      }
      return s;
    });
  }
  // 6. The other rows: the owner's folded row, polled, then the row step.
  for (int row = mine.begin; row < mine.end; ++row) {
    const int owner = lamport_row_owner(row, n);
    if (owner == me) continue;
    trace_row("gather_row", row, false);
    row_fn(row, [&](size_t i) {
      const auto* src = reinterpret_cast<const Pack<T>*>(lamport_slot(ctx, c, me, c.buffer, owner) + stride +
                                                         lamport_owned_offset(i, H, n));
      return ctx.lamport_poll(src, owner, LamportPoll{c.calls, c.buffer, i});
    });
  }
  // 7. Record the extent and advance the call number.
  end_lamport_call(ctx, c, 2 * stride * sizeof(T));
}

// The fused Lamport protocols, as a template parameter of the code they share (the row step, the
// register path, the GPU's kernels).
enum class LamportFused { kOneStage, kTwoStage };

template <class T, int kRanks, class Protocol, LamportFused kKind, class Ctx, class BeforeFold, class RowFn>
EXC_HD void lamport_fused_rows(Ctx& ctx, const FusedRmsNormArgs<T>& args, BeforeFold before_fold, RowFn row_fn) {
  if constexpr (kKind == LamportFused::kTwoStage) {
    lamport_two_stage_rows<T, kRanks, Protocol>(ctx, args, before_fold, row_fn);
  } else {
    lamport_one_stage_rows<T, kRanks, Protocol>(ctx, args, before_fold, row_fn);
  }
}

// lamport_one_stage or lamport_two_stage with core's row step (the simulator's default with one
// thread a block, and the GPU's fallback where the register path does not fit the grid).
template <class T, int kRanks = 0, class Protocol = LamportProtocol, LamportFused kKind = LamportFused::kOneStage,
          class Ctx>
EXC_HD void fused_rmsnorm_lamport(Ctx& ctx, const FusedRmsNormArgs<T>& args) {
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(args.hidden, &tree);
  const size_t H = static_cast<size_t>(args.hidden);
  lamport_fused_rows<T, kRanks, Protocol, kKind>(
      ctx, args, [] {},
      [&](int row, auto fold_of) {
        const size_t base = static_cast<size_t>(row) * H;
        fused_row_from<T, kRanks>(ctx, tree, fold_of, base, args.residual + base, args.weight, args.eps,
                                  args.residual_out + base, args.out + base, static_cast<T*>(nullptr),
                                  static_cast<T*>(nullptr));
      });
}

// ---- The unfused steps (local kernels; the caller runs an all-reduce first) -------------------------------
// unfused = allreduce (one_shot or two_shot, into s) + residual_add_step + rmsnorm_step, three
// launches. Neither step talks to peers, so neither has a barrier.

// residual_out[i] = residual_add(s[i], residual[i]) for this block's share of [0, rows*H).
template <class T, class Ctx>
EXC_HD void residual_add_step(Ctx& ctx, const T* s, const T* residual, T* residual_out, size_t count) {
  constexpr int P = Storage<T>::kPack;
  const BlockShare share = block_share(0, count, P, ctx.block(), ctx.num_blocks());
  for_share(
      ctx, share, P,
      [&](size_t i) {
        const Pack<T> a = ctx.load(reinterpret_cast<const Pack<T>*>(s + i));
        const Pack<T> b = ctx.load(reinterpret_cast<const Pack<T>*>(residual + i));
        Pack<T> y;
        for (int e = 0; e < P; ++e) y.v[e] = contract::residual_add<T>(a.v[e], b.v[e]);
        ctx.store(reinterpret_cast<Pack<T>*>(residual_out + i), y);
      },
      [&](size_t i) { residual_out[i] = contract::residual_add<T>(s[i], residual[i]); });
  ctx.sync_block();
}

// out = canonical RMSNorm of v, rows over blocks (contiguous chunks). Preconditions: H a positive
// multiple of the pack; v, weight, out 16-byte aligned.
template <class T, class Ctx>
EXC_HD void rmsnorm_step(Ctx& ctx, const T* v, const T* weight, T* out, int rows, int hidden, float eps) {
  constexpr int P = Storage<T>::kPack;
  contract::RmsNormTree tree;
  contract::make_rmsnorm_tree<T>(hidden, &tree);
  const RowRange mine = fused_block_rows(RowRange{0, rows}, ctx.block(), ctx.num_blocks());
  for (int row = mine.begin; row < mine.end; ++row) {
    const T* vr = v + static_cast<size_t>(row) * hidden;
    T* yr = out + static_cast<size_t>(row) * hidden;
    const float ss = ctx.row_sum_squares(tree, [vr](int j) { return to_float(vr[j]); });
    const float inv = contract::rmsnorm_inverse(ss, hidden, eps);
    for (int p = ctx.thread(); p < tree.num_packs; p += ctx.num_threads()) {
      const size_t j = static_cast<size_t>(p) * P;
      const Pack<T> x = ctx.load(reinterpret_cast<const Pack<T>*>(vr + j));
      const Pack<T> w = ctx.load(reinterpret_cast<const Pack<T>*>(weight + j));
      Pack<T> y;
      for (int e = 0; e < P; ++e) y.v[e] = contract::rmsnorm_scale<T>(to_float(x.v[e]), inv, w.v[e]);
      ctx.store(reinterpret_cast<Pack<T>*>(yr + j), y);
    }
    ctx.sync_block();
  }
}

}  // namespace exactcoll
