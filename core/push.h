// The push all-reduces, push_one_shot and push_two_shot: every rank stores its operands into its
// peers' scratch before a barrier instead of reading them across the link after it, so that
// neither needs an end barrier. Here too: their receive halves (AlternatingHalves), the scratch
// they need (push_scratch_elements) and its slots, the push call counter (PushCall,
// advance_push_calls), and the push and fold steps that core/fused_rmsnorm.h's push_one_stage
// shares. Templates over core/collectives.h's execution context, like its algorithms (the
// simulator and the CUDA backend instantiate the same code): the context's scratch_elements() is
// needed only here, and the preconditions common to those algorithms (core/collectives.h, "The
// algorithms") apply. core/collectives.h includes this header at its end, so its includers see the
// push family too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/collectives.h"
#include "core/platform.h"
#include "core/signal.h"
#include "core/storage.h"

namespace exactcoll {

// ---- push_one_shot: inputs pushed into peers' scratch, one barrier per call -------------------------

// The receive halves of the push algorithms (push_one_shot, push_two_shot). Which half a call uses
// comes from this rank's push call number (SignalBuffer::push_calls, the same in every block of
// the launch) and the block's barrier count before the call; where half 1 begins comes from the
// scratch size. The production choice alternates per call and puts half 1 at the middle of the
// scratch, whatever the call's count. tests/sim/protocol_exploration_test.cc has broken choices
// (one half; the block's barrier-count parity; half 1 placed after the call's own slots) that the
// seeded scheduler catches.
struct AlternatingHalves {
  EXC_HD static EXC_INLINE int half(uint32_t push_calls, uint32_t /*barriers*/) {
    return static_cast<int>(push_calls & 1u);
  }
  // Returns the elements from the start of half 0 to the start of half 1. Why not the call's own
  // n x slot-stride: consecutive calls with different counts would then place their halves at
  // different offsets, and a larger call k+1 writing half 0 could reach into the half 1 that a
  // slow peer is still folding from call k. With half 1 at scratch_elements / 2 for every call,
  // half 0 of any call lies in [0, half) and half 1 in [half, 2 half).
  EXC_HD static EXC_INLINE size_t half_elements(size_t /*count*/, int pack, int /*n*/, size_t scratch_elements) {
    const size_t p = static_cast<size_t>(pack);
    return scratch_elements / 2 / p * p;
  }
};

// Elements between two receive slots: count rounded up to whole packs, so that every slot starts
// 16-byte aligned and element i of a slot has the alignment of element i of an input.
EXC_HD inline size_t push_slot_stride(size_t count, int pack) {
  const size_t p = static_cast<size_t>(pack);
  return (count + p - 1) / p * p;
}

// Returns the scratch elements the push algorithms need per rank for a call of `count` elements:
// 2 halves, each of at least n slots (AlternatingHalves puts half 1 at the middle of the scratch,
// so a scratch of this size or more serves the call).
EXC_HD inline size_t push_scratch_elements(size_t count, int pack, int n) {
  return 2 * static_cast<size_t>(n) * push_slot_stride(count, pack);
}

// Returns where, in a rank's scratch, half `half`'s slot for sender `from` begins (elements);
// half_elements is Halves::half_elements(...), at least n x push_slot_stride(count, pack).
EXC_HD inline size_t push_slot_offset(size_t count, int pack, int half, int from, size_t half_elements) {
  return static_cast<size_t>(half) * half_elements + static_cast<size_t>(from) * push_slot_stride(count, pack);
}

// Stores calls + 1 (the next push call number) into the push_calls slots this block owns in this
// launch: b, b + G, b + 2G, ... (G = blocks of the launch), so every slot is advanced by exactly one
// block whatever the grid. Preconditions: called after the block's barrier, by every thread of the
// block, with the value every block read from its own slot before the barrier.
template <class Ctx>
EXC_HD EXC_INLINE void advance_push_calls(Ctx& ctx, uint32_t calls) {
  const int g = ctx.num_blocks();
  SignalBuffer* mine = ctx.signals(ctx.rank());
  for (int s = ctx.block() + g * ctx.thread(); s < kMaxBlocks; s += g * ctx.num_threads())
    mine->push_calls[s] = calls + 1;
}

// Stores pack x (element i, aligned) into every peer p's scratch at ctx.scratch(p) + offset(p) + i,
// peers in order rank+1, rank+2, ... (kRanks > 0: the compile-time world size).
template <class T, int kRanks, class Ctx, class Offset>
EXC_HD EXC_INLINE void store_pack_to_peers(Ctx& ctx, size_t i, const Pack<T>& x, Offset offset) {
  const int n = ctx.world_size();
  const int peers = kRanks > 0 ? kRanks : n;
  for (int k = 1; k < peers; ++k) {
    const int peer = (ctx.rank() + k) % n;
    ctx.store(reinterpret_cast<Pack<T>*>(ctx.scratch(peer) + offset(peer) + i), x);
  }
}

// The same for one unaligned element.
template <class T, int kRanks, class Ctx, class Offset>
EXC_HD EXC_INLINE void store_element_to_peers(Ctx& ctx, size_t i, T x, Offset offset) {
  const int n = ctx.world_size();
  const int peers = kRanks > 0 ? kRanks : n;
  for (int k = 1; k < peers; ++k) {
    const int peer = (ctx.rank() + k) % n;
    ctx.scratch(peer)[offset(peer) + i] = x;
  }
}

// Stores this block's share of src (element i) into every peer's scratch at
// ctx.scratch(peer) + offset(peer) + i, peers in order rank+1, rank+2, ...; 16-byte loads and
// stores for the aligned packs. Preconditions: offset(peer) is a multiple of the pack.
template <class T, int kRanks, class Ctx, class Offset>
EXC_HD void push_share(Ctx& ctx, const BlockShare& share, const T* src, Offset offset) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  const int peers = kRanks > 0 ? kRanks : n;
  constexpr int kGroup = packs_in_flight<Ctx>();
  for_share_grouped<kGroup>(
      ctx, share, P,
      [&](size_t i, size_t stride) {
        Pack<T> in[kGroup];
        for (int u = 0; u < kGroup; ++u) in[u] = ctx.load(reinterpret_cast<const Pack<T>*>(src + i + u * stride));
        for (int k = 1; k < peers; ++k) {
          const int peer = (me + k) % n;
          T* dst = ctx.scratch(peer) + offset(peer);
          for (int u = 0; u < kGroup; ++u) ctx.store(reinterpret_cast<Pack<T>*>(dst + i + u * stride), in[u]);
        }
      },
      [&](size_t i) {
        store_pack_to_peers<T, kRanks>(ctx, i, ctx.load(reinterpret_cast<const Pack<T>*>(src + i)), offset);
      },
      [&](size_t i) { store_element_to_peers<T, kRanks>(ctx, i, src[i], offset); });
}

// Step 2 of push_one_shot and push_one_stage: traces step `name` (the read of this block's share of
// src, the writes into slot `my_slot` of every peer's scratch) and runs push_share into that slot.
template <class T, int kRanks, class Ctx>
EXC_HD void push_share_into_slot(Ctx& ctx, const char* name, const BlockShare& share, const T* src, size_t my_slot) {
  if constexpr (Ctx::kTraceSteps) {
    const int n = ctx.world_size();
    ctx.trace_step_begin(name);
    trace_share(ctx, share, Access::kRead, ctx.rank(), Buffer::kInput);
    for (int k = 1; k < n; ++k)
      trace_share(ctx, share, Access::kWrite, (ctx.rank() + k) % n, Buffer::kScratch, my_slot);
    ctx.trace_step_end();
  }
  push_share<T, kRanks>(ctx, share, src, [my_slot](int) { return my_slot; });
}

// One push call's receive half, as every block of the launch computes it before the call's
// barrier (step 1 of the push algorithms): the call number from this block's push_calls slot,
// the half Halves picks from it, and where the halves meet.
struct PushCall {
  uint32_t calls = 0;        // this rank's push call number (SignalBuffer::push_calls)
  int half = 0;              // the receive half of this call
  size_t half_elements = 0;  // Halves::half_elements: where half 1 begins
};

template <class Halves, class Ctx>
EXC_HD EXC_INLINE PushCall begin_push_call(Ctx& ctx, size_t count, int pack, uint32_t barriers) {
  PushCall c;
  c.calls = ctx.signals(ctx.rank())->push_calls[ctx.block()];
  c.half = Halves::half(c.calls, barriers);
  c.half_elements = Halves::half_elements(count, pack, ctx.world_size(), ctx.scratch_elements());
  return c;
}

// Returns where, after a push call's barrier, rank r's operand of the fold lies: `mine` (this
// rank's own input) for r == rank, else this rank's own receive slot (half, r).
template <class T, class Ctx>
EXC_HD EXC_INLINE auto push_fold_sources(Ctx& ctx, const T* mine, size_t count, const PushCall& call) {
  const T* recv = ctx.scratch(ctx.rank());
  const int me = ctx.rank();
  const int half = call.half;
  const size_t half_elements = call.half_elements;
  return [=](int r) -> const T* {
    return r == me ? mine : recv + push_slot_offset(count, Storage<T>::kPack, half, r, half_elements);
  };
}

// Traces a push algorithm's fold step `name` over `share`: the reads of this rank's input and of
// its slots (half, r), the write of output and, when result_to_peers, the writes of the result into
// every peer p's slot (half, p) (push_two_shot's step 5).
template <class T, class Ctx>
EXC_HD void trace_push_fold(Ctx& ctx, const char* name, const BlockShare& share, size_t count, const PushCall& call,
                            bool result_to_peers = false) {
  if constexpr (Ctx::kTraceSteps) {
    const int me = ctx.rank();
    ctx.trace_step_begin(name);
    for (int r = 0; r < ctx.world_size(); ++r) {
      if (r == me) {
        trace_share(ctx, share, Access::kRead, me, Buffer::kInput);
      } else {
        trace_share(ctx, share, Access::kRead, me, Buffer::kScratch,
                    push_slot_offset(count, Storage<T>::kPack, call.half, r, call.half_elements));
      }
    }
    trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput);
    for (int k = 1; result_to_peers && k < ctx.world_size(); ++k) {
      const int peer = (me + k) % ctx.world_size();
      trace_share(ctx, share, Access::kWrite, peer, Buffer::kScratch,
                  push_slot_offset(count, Storage<T>::kPack, call.half, peer, call.half_elements));
    }
    ctx.trace_step_end();
  } else {
    (void)ctx, (void)name, (void)share, (void)count, (void)call, (void)result_to_peers;
  }
}

// All-reduce, push one shot: every rank stores its input into every peer's scratch before a single
// barrier, then folds from local memory; no end barrier. Same bits as one_shot (the fold runs over
// ranks 0..n-1 in rank order; only where the operands are read from changes).
// Preconditions (besides the common ones): ctx.scratch_elements() >= push_scratch_elements(count,
// kPack, n), the same on every rank; the scratch is not used by another algorithm without an end
// barrier in between (one_shot, two_shot, reduce_scatter and allgather have theirs).
// Example: 2 ranks, count 8 bf16 (one pack): rank 0 stores its pack into rank 1's scratch slot
// (half h, from 0), rank 1 into rank 0's slot (h, 1); after the barrier rank 0 folds
// input_0 + scratch_0[h, 1], rank 1 folds scratch_1[h, 0] + input_1.
// Steps:
//   1. h = push_calls & 1 (this rank's push call number; every block reads the same value); half h
//      begins at h x half_elements (AlternatingHalves: the middle of the scratch);
//   2. push: this block's share of [0, count) of this rank's input, read locally with 16-byte
//      loads, stored with 16-byte stores into slot (h, rank) of every peer's scratch;
//   3. barrier: the release after the stores, the acquire before the reads; every peer's share of
//      this block is now in this rank's slots (h, p);
//   4. advance the push call number: block b writes push_calls + 1 into slots b, b + G, b + 2G, ...
//      (G = blocks of this launch), so every slot is advanced by exactly one block (slot b is read
//      in step 1 by block b only, and before the barrier's sync);
//   5. fold this block's share in rank order 0..n-1 from local memory (own input for this rank,
//      own scratch slot (h, p) for peer p) into output.
// Why no end barrier. Two hazards an end barrier would cover:
//   (a) a peer overwrites the slot this rank is still folding. Peer p writes half h of this rank's
//       scratch in call k and again, in the same half, at the earliest in call k+2 (the halves
//       alternate per call, and every rank counts the same calls). Before its call k+2 stores, p
//       has completed call k+1 (stream order), so some block of p has passed call k+1's barrier,
//       which needs this rank's signal for call k+1 from the block of the same index, sent only
//       after this rank's call k+1 kernel started, i.e. after its call k kernel had finished
//       every fold (stream order). So a slot is rewritten only after its reader is done with it.
//       In call k+1, p writes the other half, which this rank does not read in call k, whatever
//       the two calls' counts (the halves do not move with the count). Another collective
//       between two push calls passes a barrier too, which makes the argument hold with any call
//       in place of call k+1.
//   (b) a fast rank's next launch stages new input over the buffer a peer is still reading: peers
//       never read this rank's input (only this rank does, in its own launch).
// The half must not be the block's barrier-count parity: blocks' counts differ after launches
// with different grids, and then block b of call k+1 can use the half that block b' of call k is
// still folding (tests/sim/protocol_exploration_test.cc catches that variant, and one half).
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Halves = AlternatingHalves, class Ctx>
EXC_HD void allreduce_push_one_shot(Ctx& ctx, size_t count) {
  constexpr int P = Storage<T>::kPack;
  const int me = ctx.rank();
  uint32_t barriers = load_barrier_count(ctx);
  // 1. The receive half of this call.
  const PushCall call = begin_push_call<Halves>(ctx, count, P, barriers);
  const BlockShare share = block_share(0, count, P, ctx.block(), ctx.num_blocks());
  const T* mine = ctx.input(me);
  const size_t my_slot = push_slot_offset(count, P, call.half, me, call.half_elements);
  // 2. Push this block's share into every peer's slot (half, me); peers in order me+1, me+2, ...
  push_share_into_slot<T, kRanks>(ctx, "push", share, mine, my_slot);
  // 3. One barrier: every peer's share of this block is in this rank's slots.
  block_barrier<Protocol>(ctx, &barriers);
  // 4. Advance the push call number in the slots this block owns in this launch.
  advance_push_calls(ctx, call.calls);
  // 5. Fold in rank order from local memory.
  trace_push_fold<T>(ctx, "fold", share, count, call);
  fold_range_from<T, kRanks>(ctx, share, push_fold_sources(ctx, mine, count, call), ctx.output(),
                             static_cast<T*>(nullptr));
  store_barrier_count(ctx, barriers);
}

// All-reduce, push two shot: slices pushed to their owners, each owner folds its slice and pushes
// the result to every peer; two barriers, no end barrier. Same bits as one_shot (each element is
// folded once, by its slice's owner, in rank order 0..n-1). Scratch: the layout of push_one_shot
// (two halves of n slots, half 1 at Halves::half_elements, element i at position i of a slot);
// the preconditions of push_one_shot apply.
// Steps:
//   1. h = push_calls & 1 (the call counter push_one_shot uses; every push call advances it);
//   2. push slices: for every peer o, this block's share of slice o (two_shot_slice) of this
//      rank's input into slot (h, rank) of o's scratch;
//   3. barrier: every peer's part of this rank's slice is in this rank's slots (h, p);
//   4. advance the push call number (as push_one_shot's step 4);
//   5. fold this block's share of this rank's slice in rank order 0..n-1 (own input, own scratch
//      slots (h, p) for the peers) and store each result pack, from registers, into output and
//      into slot (h, p) of every peer p's scratch (p's own slot, which no sender writes). One pass:
//      the fold's local reads overlap the NVLink stores instead of preceding them (at 64 MB on 4
//      GPUs the separate fold took about a tenth of the call), and output is not read back;
//   6. barrier: every owner's result for this block's shares is in this rank's slot (h, rank);
//   7. copy every peer's slice from this rank's own slot (h, rank) into output (local reads).
// Why no end barrier: as push_one_shot's (a) and (b). Half h of this rank's scratch is written
// in call k (steps 2 and 5 of the peers) and again at the earliest in call k+2, after the writer
// passed a barrier of call k+1 that needs this rank's call k+1 signal, sent after its call k
// kernel finished (step 7 included). Within a call, step 2 writes slots (h, sender) and step 5
// slot (h, receiver): different slots, and each is read only after the barrier that follows it.
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Halves = AlternatingHalves, class Ctx>
EXC_HD void allreduce_push_two_shot(Ctx& ctx, size_t count) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  const int b = ctx.block();
  const int num_blocks = ctx.num_blocks();
  uint32_t barriers = load_barrier_count(ctx);
  // 1. The receive half of this call.
  const PushCall call = begin_push_call<Halves>(ctx, count, P, barriers);
  const T* mine = ctx.input(me);
  auto slot = [&](int from) { return push_slot_offset(count, P, call.half, from, call.half_elements); };
  // 2. Push every peer's slice of this rank's input to that peer.
  for (int k = 1; k < n; ++k) {
    const int owner = (me + k) % n;
    const Slice theirs = two_shot_slice(count, P, owner, n);
    const BlockShare share = block_share(theirs.begin, theirs.end, P, b, num_blocks);
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("push_slice");
      trace_share(ctx, share, Access::kRead, me, Buffer::kInput);
      trace_share(ctx, share, Access::kWrite, owner, Buffer::kScratch, slot(me));
      ctx.trace_step_end();
    }
    // One receiver per slice, so a plain store loop (push_share sends to every peer).
    for_share(
        ctx, share, P,
        [&](size_t i) {
          ctx.store(reinterpret_cast<Pack<T>*>(ctx.scratch(owner) + slot(me) + i),
                    ctx.load(reinterpret_cast<const Pack<T>*>(mine + i)));
        },
        [&](size_t i) { ctx.scratch(owner)[slot(me) + i] = mine[i]; });
  }
  // 3. Barrier: this rank's slice has arrived from every peer.
  block_barrier<Protocol>(ctx, &barriers);
  // 4. Advance the push call number in the slots this block owns in this launch.
  advance_push_calls(ctx, call.calls);
  // 5. Fold this rank's slice in rank order from local memory; each result into output and into
  //    every peer's own slot, peers in order me+1, me+2, ...
  const Slice own = two_shot_slice(count, P, me, n);
  const BlockShare own_share = block_share(own.begin, own.end, P, b, num_blocks);
  trace_push_fold<T>(ctx, "reduce_push", own_share, count, call, /*result_to_peers=*/true);
  T* const out = ctx.output();
  fold_range_with<T, kRanks>(
      ctx, own_share, push_fold_sources(ctx, mine, count, call),
      [&](size_t i, const Pack<T>& x) {
        ctx.store(reinterpret_cast<Pack<T>*>(out + i), x);
        store_pack_to_peers<T, kRanks>(ctx, i, x, slot);
      },
      [&](size_t i, T x) {
        out[i] = x;
        store_element_to_peers<T, kRanks>(ctx, i, x, slot);
      });
  // 6. Barrier: every owner's result is in this rank's own slot.
  block_barrier<Protocol>(ctx, &barriers);
  // 7. Copy the peers' slices from local memory into output.
  for (int k = 1; k < n; ++k) {
    const int owner = (me + k) % n;
    const Slice theirs = two_shot_slice(count, P, owner, n);
    const BlockShare share = block_share(theirs.begin, theirs.end, P, b, num_blocks);
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("gather_slice");
      trace_share(ctx, share, Access::kRead, me, Buffer::kScratch, slot(me));
      trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput);
      ctx.trace_step_end();
    }
    copy_range<T>(ctx, share, ctx.scratch(me) + slot(me), ctx.output(), 0);
  }
  store_barrier_count(ctx, barriers);
}

}  // namespace exactcoll
