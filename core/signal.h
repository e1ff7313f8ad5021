// The signal protocol shared by every algorithm: a pairwise, per-block barrier over flags that
// carry increasing values, alternating between two flag sets.
//
// Every rank owns a SignalBuffer in symmetric memory. Block b of rank r passes barrier k (k = 1, 2,
// ... counted per block across launches) when, for every peer p, it has stored k into
// flags[set(k)][b][r] of p's buffer (release) and read k from flags[set(k)][b][p] of its own
// buffer (acquire). set(k) = k & 1.
//
// Why two sets cannot confuse two barriers: peer p writes value k+2 into the slot that held k only
// after passing barrier k+1 (the other set), which needs this block's signal k+1, which this block
// sends only after it has read k. So a slot never changes before its reader has seen the value it
// waits for, and the wait is an equality test. With one set, p's signal k+1 can overwrite k before
// it is read, and the reader waits forever (tests/sim/protocol_exploration_test.cc proves the seeded
// scheduler catches that).
#pragma once

#include <cstdint>

#include "core/platform.h"

namespace exactcoll {

inline constexpr int kMaxRanks = 16;
inline constexpr int kMaxBlocks = 128;
inline constexpr int kFlagSets = 2;

// Lives at offset 0 of each rank's symmetric signal allocation. Zero-initialized once.
struct SignalBuffer {
  // flags[set][block][from_rank]: written by peers, read only by the owner.
  uint32_t flags[kFlagSets][kMaxBlocks][kMaxRanks];
  // barrier_count[block]: how many barriers this rank's block has passed (owner-only).
  uint32_t barrier_count[kMaxBlocks];
  // push_calls[slot]: how many allreduce_push_one_shot calls this rank has made (owner-only). All
  // kMaxBlocks slots hold the same value between launches (every launch advances every slot, each
  // slot by exactly one block), so every block of a launch reads the same call number whatever the
  // grid of earlier launches (core/push.h, allreduce_push_one_shot).
  uint32_t push_calls[kMaxBlocks];
  // lamport_calls[slot]: how many Lamport calls (core/lamport.h: lamport_one_shot, lamport_two_shot,
  // the fused lamport_one_stage) this rank has made (owner-only),
  // kept like push_calls (every slot equal between launches). core/lamport.h.
  uint32_t lamport_calls[kMaxBlocks];
  // lamport_extent[j]: bytes of each receive slot of this rank's Lamport buffer j that the last
  // call using buffer j had its peers write (owner-only): what the next call clears. core/lamport.h.
  uint64_t lamport_extent[4];
  // input_rows[block][from_rank]: where rank from_rank's input lies in THIS rank's address space
  // for the launch in flight, or null (read its staging buffer), stored by the peer's block before
  // it signals this block's first barrier (eager in place: KernelArgs::input_views). Read only
  // after that barrier; rewritten by the next such launch only after this block's end barrier.
  const void* input_rows[kMaxBlocks][kMaxRanks];
};

// The production protocol: two flag sets, one barrier before and one after each collective.
struct TwoSetProtocol {
  EXC_HD static EXC_INLINE int flag_set(uint32_t barrier_value) { return static_cast<int>(barrier_value & 1u); }
  static constexpr bool kEndBarrier = true;
};

// Passes barrier number ++*count for the calling block. Every thread of the block calls it with
// the same *count. Threads stride over peers: on the GPU thread t < n handles peer t; in the
// simulator one thread handles all.
template <class Protocol, class Ctx>
EXC_HD void block_barrier(Ctx& ctx, uint32_t* count) {
  ctx.sync_block();  // this block's earlier writes happen-before the release below
  const uint32_t value = ++*count;
  const int set = Protocol::flag_set(value);
  const int n = ctx.world_size();
  const int me = ctx.rank();
  const int b = ctx.block();
  for (int p = ctx.thread(); p < n; p += ctx.num_threads()) {
    ctx.signal(&ctx.signals(p)->flags[set][b][me], value, p, set);
  }
  for (int p = ctx.thread(); p < n; p += ctx.num_threads()) {
    ctx.wait(&ctx.signals(me)->flags[set][b][p], value, p, set);
  }
  ctx.sync_block();  // the acquire above happens-before every thread's reads after the barrier
  // A context may take state its peers published before this barrier (the GPU's eager input rows).
  if constexpr (requires { ctx.barrier_passed(); }) ctx.barrier_passed();
}

// The block's barrier count at launch start (written by the previous launch's end).
template <class Ctx>
EXC_HD EXC_INLINE uint32_t load_barrier_count(Ctx& ctx) {
  return ctx.signals(ctx.rank())->barrier_count[ctx.block()];
}

// Saves the count for the next launch. Every thread has read the old value by now.
template <class Ctx>
EXC_HD EXC_INLINE void store_barrier_count(Ctx& ctx, uint32_t count) {
  ctx.sync_block();
  if (ctx.thread() == 0) ctx.signals(ctx.rank())->barrier_count[ctx.block()] = count;
}

}  // namespace exactcoll
