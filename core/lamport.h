// The flag-in-data (Lamport) all-reduces with an exact sentinel, one-shot and two-shot: no barrier,
// no flag. In the one-shot every rank stores its (NaN-canonicalized) input into its slot of every
// peer's receive buffer, which holds a sentinel beforehand; a reader polls its own buffer until no
// sentinel remains, then folds in rank order with the fold helpers of core/collectives.h (the
// contract's bits, -0.0 kept). The two-shot does that for the slices' owners, which push their
// folded slices back the same way.
// docs/design.md (§3, §4) has the rotation, docs/numerics.md ("The Lamport sentinel") why the
// sentinel can never be pushed data.
//
// ---- What a context adds for it (besides core/collectives.h's concept) --------------------------------
//   unsigned char* lamport(int peer)          peer's symmetric Lamport region (16-byte aligned; every
//                                             byte 0xFF, i.e. sentinels, when the region is created)
//   size_t lamport_bytes()                    bytes of every rank's region (the same on every rank)
//   void lamport_store(Pack<T>* dst, const Pack<T>& x, int peer)
//                                             a store into peer's region (peer == rank: a clear of
//                                             this rank's own region) that a concurrent poll may see
//                                             element by element (GPU: a relaxed 16-byte store)
//   Pack<T> lamport_poll(const Pack<T>* src, int peer, const LamportPoll& where)
//                                             loads the pack from this rank's own region (relaxed:
//                                             never cached) until no element is the sentinel
//                                             (lamport_arrived); bounded: a peer that never writes
//                                             is an error naming it (and `where`)
//   Pack<T> lamport_peek(const Pack<T>* src)  one such load, whatever it finds (sentinels too), so
//                                             that the first loads of every peer's pack are in
//                                             flight at once (lamport_fold_pack)
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/collectives.h"
#include "core/platform.h"
#include "core/registry.h"
#include "core/signal.h"
#include "core/storage.h"

namespace exactcoll {

// ---- The sentinel and the canonicalization on push ---------------------------------------------------

// The sentinel of storage type T: all bits set (bf16, fp16: 0xFFFF; fp32: 0xFFFFFFFF), a NaN that
// is not the canonical one (0x7FFF / 0x7FFFFFFF, docs/numerics.md §2). A region filled with 0xFF
// bytes is all sentinels whatever the type.
template <class T>
EXC_HD constexpr uint32_t lamport_sentinel_bits() {
  return sizeof(T) == 2 ? 0xFFFFu : 0xFFFFFFFFu;
}

// Is x a NaN of storage type T (any sign, any payload)?
template <class T>
EXC_HD EXC_INLINE bool storage_is_nan(T x) {
  const uint32_t u = Storage<T>::bits(x);
  if constexpr (sizeof(T) == 4) {
    return (u & 0x7FFFFFFFu) > 0x7F800000u;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return (u & 0x7FFFu) > 0x7F80u;  // exponent all ones (0x7F80), mantissa not zero
  } else {
    return (u & 0x7FFFu) > 0x7C00u;  // fp16: exponent all ones (0x7C00), mantissa not zero
  }
}

// The contract's canonical NaN of T (what every NaN result is stored as).
template <class T>
EXC_HD EXC_INLINE T storage_canonical_nan() {
  if constexpr (sizeof(T) == 4) {
    return bits_to_float(kCanonicalNaN32);
  } else {
    return T{kStorageNaN16};
  }
}

template <class T>
EXC_HD EXC_INLINE bool lamport_is_sentinel(T x) {
  return Storage<T>::bits(x) == lamport_sentinel_bits<T>();
}

// Is every element of x pushed data (none the sentinel)?
template <class T>
EXC_HD EXC_INLINE bool lamport_arrived(const Pack<T>& x) {
  bool ok = true;
  for (int e = 0; e < Storage<T>::kPack; ++e) ok = ok && !lamport_is_sentinel(x.v[e]);
  return ok;
}

// x with every NaN replaced by the canonical NaN: never the sentinel, and the same fold result
// (a NaN operand makes the fold NaN, stored canonical, whatever its payload: numerics.md).
template <class T>
EXC_HD EXC_INLINE Pack<T> lamport_canonicalize(Pack<T> x) {
  for (int e = 0; e < Storage<T>::kPack; ++e) {
    if (storage_is_nan(x.v[e])) x.v[e] = storage_canonical_nan<T>();
  }
  return x;
}

// ---- The layout of a rank's Lamport region --------------------------------------------------------------
// kLamportBuffers buffers of n receive slots each: buffer j at j x buffer_bytes, sender p's slot
// at p x slot_bytes in it, element i of a message at byte i x sizeof(T) of the slot. The layout
// depends only on the region's size and n (the same on every rank and for every call), never on
// the call's count, so calls of different sizes (and types) can follow each other.

inline constexpr int kLamportBuffers = 3;

struct LamportLayout {
  size_t buffer_bytes = 0;  // multiple of 16
  size_t slot_bytes = 0;    // multiple of 16
};

EXC_HD inline LamportLayout lamport_layout(size_t region_bytes, int n) {
  LamportLayout l;
  l.buffer_bytes = region_bytes / kLamportBuffers / 16 * 16;
  l.slot_bytes = l.buffer_bytes / static_cast<size_t>(n) / 16 * 16;
  return l;
}

// Bytes of a slot that a message of `count` elements of `element_bytes` occupies (whole packs).
EXC_HD inline size_t lamport_message_bytes(size_t count, size_t element_bytes) {
  return (count * element_bytes + 15) / 16 * 16;
}

// lamport_two_shot's slot layout (allreduce_lamport_two_shot). The message is padded to whole
// packs and cut into two_shot_slice(padded, P, p, n) for p = 0..n-1 (the last slice is the
// longest). In rank p's region, slot (buffer, s) holds rank s's piece of slice p at elements
// [0, len_p) and owner s's folded slice s at [stride, stride + len_s), stride being the longest
// slice. Returns that stride in elements.
// Example: 4 ranks, 100 bf16 (13 packs, padded 104): slices of 3, 3, 3 and 4 packs, stride 32.
EXC_HD inline size_t lamport_two_shot_stride(size_t count, int pack, int n) {
  const size_t padded = (count + static_cast<size_t>(pack) - 1) / static_cast<size_t>(pack) * static_cast<size_t>(pack);
  const Slice last = two_shot_slice(padded, pack, n - 1, n);
  return last.end - last.begin;
}

// Bytes of every sender's slot that a Lamport all-reduce `algorithm` of `count` elements of
// `element_bytes` occupies on n ranks: the message for lamport_one_shot, two strides for
// lamport_two_shot.
EXC_HD inline size_t lamport_slot_bytes_needed(Algorithm algorithm, size_t count, size_t element_bytes, int n) {
  if (algorithm == Algorithm::kLamportTwoShot) {
    return 2 * lamport_two_shot_stride(count, static_cast<int>(16 / element_bytes), n) * element_bytes;
  }
  return lamport_message_bytes(count, element_bytes);
}

// Does a call of `algorithm` fit a region of region_bytes on n ranks (in one launch)?
EXC_HD inline bool lamport_fits(Algorithm algorithm, size_t count, size_t element_bytes, int n, size_t region_bytes) {
  return lamport_slot_bytes_needed(algorithm, count, element_bytes, n) <= lamport_layout(region_bytes, n).slot_bytes;
}

// The region bytes per rank that a call of `algorithm` needs on n ranks.
EXC_HD inline size_t lamport_region_bytes(Algorithm algorithm, size_t count, size_t element_bytes, int n) {
  return static_cast<size_t>(kLamportBuffers) * static_cast<size_t>(n) *
         lamport_slot_bytes_needed(algorithm, count, element_bytes, n);
}

// The same for lamport_one_shot's layout (one message a slot), which lamport_one_stage shares: the
// region bytes a call of `count` elements needs on n ranks, and whether it fits region_bytes.
EXC_HD inline size_t lamport_region_bytes(size_t count, size_t element_bytes, int n) {
  return lamport_region_bytes(Algorithm::kLamportOneShot, count, element_bytes, n);
}
EXC_HD inline bool lamport_fits(size_t count, size_t element_bytes, int n, size_t region_bytes) {
  return lamport_fits(Algorithm::kLamportOneShot, count, element_bytes, n, region_bytes);
}

// The longest lamport_two_shot stride, in packs, of any count of at most k packs on n ranks: a
// count of k' packs has slices of floor(k'/n) packs and the last one takes the k' mod n more, so
// with q = floor(k/n) the counts from q n to k reach q + min(n - 1, k - q n), and a count below q n
// (q' <= q - 1) at most q - 1 + n - 1.
// Example: n = 4, k = 9: q = 2; counts of 8..9 packs reach 2 + 1 = 3, a count of 7 reaches
// 1 + 3 = 4: returns 4.
EXC_HD inline size_t lamport_two_shot_longest_stride_packs(size_t k, int n) {
  const size_t ranks = static_cast<size_t>(n);
  const size_t q = k / ranks;
  const size_t here = q + (k - q * ranks < ranks - 1 ? k - q * ranks : ranks - 1);
  const size_t below = q >= 1 ? q - 1 + ranks - 1 : 0;
  return here > below ? here : below;
}

// The chunk a launch of `algorithm` takes of a message that does not fit one slot (lamport_fits),
// on n ranks whose region has slots of slot_bytes: the most elements, a multiple of 64 (so that
// every chunk starts 16-byte aligned), such that every count up to it fits a slot (the last chunk
// is shorter). Returns 0 where not even 64 elements fit.
// lamport_two_shot: scanned down from the count whose slices fill half a slot each; the longest
// stride of the shorter counts exceeds that by at most (n - 2) packs, so the scan takes at most
// about (n - 2) x n x P / 64 steps.
EXC_HD inline size_t lamport_chunk_elements(Algorithm algorithm, size_t slot_bytes, size_t element_bytes, int n) {
  const size_t slot_elements = slot_bytes / element_bytes;
  if (algorithm != Algorithm::kLamportTwoShot) return slot_elements / 64 * 64;
  const size_t pack = 16 / element_bytes;
  const size_t half_packs = slot_elements / 2 / pack;
  size_t chunk = half_packs * pack * static_cast<size_t>(n) / 64 * 64;
  while (chunk >= 64 && lamport_two_shot_longest_stride_packs(chunk / pack, n) > half_packs) chunk -= 64;
  return chunk >= 64 ? chunk : 0;
}

// Elements per launch of a Lamport all-reduce `algorithm` of `count` elements on n ranks whose
// region is region_bytes: the whole message where it fits one slot (lamport_fits: what tune
// measures and auto prices as one launch), else lamport_chunk_elements (0: not even 64 elements
// fit). Example: lamport_two_shot, 4 ranks, 1 MiB slots, bf16: 2 MiB (1 Mi elements, strides of
// 256 Ki) runs whole, although the chunk for longer messages is 1 048 512 elements (a count a
// few packs shorter has a longer last slice).
EXC_HD inline size_t lamport_launch_elements(Algorithm algorithm, size_t count, size_t element_bytes, int n,
                                             size_t region_bytes) {
  if (lamport_fits(algorithm, count, element_bytes, n, region_bytes)) return count;
  return lamport_chunk_elements(algorithm, lamport_layout(region_bytes, n).slot_bytes, element_bytes, n);
}

// What a poll reports when its peer never writes.
struct LamportPoll {
  uint32_t call = 0;   // this rank's Lamport call number
  int buffer = 0;      // which of the buffers
  size_t element = 0;  // the first element of the polled pack
};

// ---- Protocol variants (the production one, and broken ones that exist for the tests) -----------------
// kBuffers: buffers in the rotation (production 3; tests: 2). kClear: clear the previous call's
// buffer (production true). kCanonicalize: replace NaNs by the canonical NaN before the push
// (production true; without it an input equal to the sentinel is never seen as arrived).
struct LamportProtocol {
  static constexpr int kBuffers = kLamportBuffers;
  static constexpr bool kClear = true;
  static constexpr bool kCanonicalize = true;
  // lamport_two_shot's push and gather: a thread's packs of every peer's slice loaded (peeked) at
  // once, then stored (polled), instead of peer after peer (for_peer_slices_at_once). Same bits
  // either way. Off: on 4 x H200, within collective_kernel's 64 registers, the push at once was
  // slower at every size and the gather at once 0.8 us faster at 512 KB but 1.1 us slower at 1 MiB
  // (docs/benchmarks.md, "lamport_two_shot step by step"); tools/gpu/probes/lamport_step_probe.cu
  // times both. The simulator runs one thread a block, so only the GPU exercises their thread strides.
  static constexpr bool kPushPeersAtOnce = false;
  static constexpr bool kGatherPeersAtOnce = false;
};

// This rank's input pack starting at element i (aligned) of a count-element message (mine 16-byte
// aligned, as every input is: the communicator refuses others); elements at or past count (the
// last pack of a count that is not a multiple of the pack) are +0.0, never the sentinel, and never
// stored to output. Element by element (nvcc 13.0 emits eight 2-byte loads per bf16 pack): one
// 16-byte load was part of the prologue that cost 4 GPUs more than it gave 2 (begin_lamport_call).
template <class T, class Ctx>
EXC_HD EXC_INLINE Pack<T> lamport_input_pack(Ctx& ctx, const T* mine, size_t i, size_t count) {
  constexpr int P = Storage<T>::kPack;
  Pack<T> x;
  if (i + P <= count) {
    (void)ctx;
    for (int e = 0; e < P; ++e) x.v[e] = mine[i + e];
  } else {
    for (int e = 0; e < P; ++e) {
      if (i + e < count) {
        x.v[e] = mine[i + e];
      } else if constexpr (sizeof(T) == 4) {
        x.v[e] = 0.0f;
      } else {
        x.v[e] = T{0};
      }
    }
  }
  return x;
}

// All-reduce, Lamport one shot (flag in data): no barrier and no flag; every rank stores its input
// into its slot of every peer's receive buffer, and polls the data itself. Same bits as one_shot:
// every element is folded in rank order 0..n-1 by fold_pack_from, from operands whose only change
// is a NaN made canonical (which changes no fold result).
// Preconditions (besides the common ones): lamport_fits(count, sizeof(T), n, ctx.lamport_bytes());
// the region was filled with 0xFF once, before any call, and is used by Lamport calls only.
// Example: 2 ranks, 8 bf16 (one pack), call k (buffer b = k mod 3): rank 0 stores its pack into
// slot 0 of rank 1's buffer b, rank 1 into slot 1 of rank 0's; rank 0 polls its own slot 1 until
// no element is 0xFFFF and folds input_0 + slot 1; rank 1 folds slot 0 + input_1.
// Steps (per block, on its share of the message's packs):
//   1. k = lamport_calls[block] (this rank's Lamport call number); b = k mod 3 is this call's
//      buffer, c = (k - 1) mod 3 the previous call's (begin_lamport_call);
//   2. push: each pack of this block's share of the input, NaNs made canonical, into slot (b, rank)
//      of every peer's region (peers in order rank+1, rank+2, ...);
//   3. clear: this block's share of the extent that the previous call wrote (lamport_extent[c])
//      of every peer's slot of this rank's own buffer c, back to the sentinel; it overlaps with
//      the peers' latency instead of following the fold;
//   4. poll and fold: for each pack, this rank's own input and the peers' slots (b, p) of its own
//      region, each polled until no sentinel remains, folded in rank order 0..n-1 into output;
//   5. (after the block's sync) record this call's extent in lamport_extent[b] and advance the
//      call number (slots b, b + G, ... as advance_push_calls does).
// Why three buffers, and why the clear is safe. Rank r reads only its own region, and peer p
// writes buffer j of r's region only in calls k with k mod 3 = j.
//   (a) The clear in call k of buffer (k-1) mod 3: r finished reading it in call k-1 (stream
//       order), so every peer write of call k-1 into it had landed; the next write into it comes
//       in call k+2 (= k-1 mod 3), which p starts only after finishing call k+1, which needs r's
//       call k+1 push, issued after r's call k kernel (the clear included) finished. Meanwhile p
//       is at most in call k+1 and writes buffer (k+1) mod 3: not the one being cleared.
//   (b) With two buffers, buffer (k-1) mod 2 = (k+1) mod 2: p, done with call k as soon as r's
//       call k push arrived, may already have written its call k+1 data there, and r's clear
//       erases it (r then polls call k+1 forever). Clearing at the end of call k-1 instead would
//       make two buffers enough but puts the clear's stores after the fold, on every call's
//       critical path; the third buffer moves it off.
//   (c) Without the clear, call k+3 finds call k's data in buffer k mod 3 and folds it.
//   (d) The poll is an exact test because pushed data is never the sentinel (canonical NaNs).
// tests/sim/lamport_exploration_test.cc catches (b), (c) and an uncanonicalized push, and runs
// the production protocol over thousands of seeds.
// ---- The steps every Lamport algorithm shares (allreduce_lamport_one_shot below,
// lamport_one_stage_rows and lamport_two_stage_rows in core/fused_rmsnorm.h); they share the call counter and the
// extents too, so Lamport calls of any kind (these two, lamport_two_shot) may follow each other in any order
// ------------------

// One Lamport call as a block sees it: the call number, this call's buffer and the previous
// call's, and the layout in elements of T.
template <class T>
struct LamportCall {
  uint32_t calls = 0;  // this rank's Lamport call number (SignalBuffer::lamport_calls)
  int buffer = 0;      // calls mod kBuffers: where this call's data goes
  int previous = 0;    // (calls - 1) mod kBuffers: what this call clears
  size_t buffer_elements = 0, slot_elements = 0;
};

// Step 1: reads the call number from this block's slot (every block of the launch reads the same),
// then the block's sync: a Lamport kernel has no barrier before its polls, and the GPU's polls read
// block-shared state the launch has just reset (the aborted flag; kernels.cuh). The read comes
// before the sync, so the sync orders every thread's read before the block's write of the next call
// number (end_lamport_call), whatever that sync orders: cuda_backend/fused's cluster context, whose
// block is a thread-block cluster, makes only this first sync a release and acquire of the whole
// cluster. The clear reads its extent itself (lamport_clear_previous).
// Why no more than this before the push: the twelfth and thirteenth sessions' prologue (every
// extent read here, the first input pack loaded here for lamport_two_shot and lamport_one_stage,
// whole-pack input loads, a missed poll's immediate reload, L2 prefetches before the wait) made
// 2 x H200 0.06-0.25 us faster but 4 x H200 slower: lamport_one_shot 3.85 us instead of 3.50 at
// 16 KB and lamport_one_stage 6.0 instead of 4.45 at 1 row of H 8192, with no one of those pieces
// to blame alone (docs/benchmarks.md, "The Lamport prologue on 4 GPUs"). The kernels run this
// prologue again (lamport_one_shot's on 4 ranks and the fused kernels' PTX is a1ddde8's;
// lamport_two_shot's and 2-rank lamport_one_shot's kernels also leave out collective_kernel's
// input-table and views code, cuda_backend/kernels.cuh); tools/gpu/probes/lamport_step_probe.cu
// keeps the prefetches as a variant.
template <class T, class Protocol, class Ctx>
EXC_HD EXC_INLINE LamportCall<T> begin_lamport_call(Ctx& ctx) {
  constexpr int B = Protocol::kBuffers;
  LamportCall<T> c;
  const SignalBuffer* own = ctx.signals(ctx.rank());
  c.calls = own->lamport_calls[ctx.block()];
  ctx.sync_block();
  c.buffer = static_cast<int>(c.calls % B);
  c.previous = static_cast<int>((c.calls + B - 1) % B);
  const LamportLayout layout = lamport_layout(ctx.lamport_bytes(), ctx.world_size());
  c.buffer_elements = layout.buffer_bytes / sizeof(T);
  c.slot_elements = layout.slot_bytes / sizeof(T);
  return c;
}

// Element offset of sender `from`'s slot of `buffer` in a region, and the slot's address in
// `owner`'s region.
template <class T>
EXC_HD EXC_INLINE size_t lamport_slot_offset(const LamportCall<T>& c, int buffer, int from) {
  return static_cast<size_t>(buffer) * c.buffer_elements + static_cast<size_t>(from) * c.slot_elements;
}
template <class T, class Ctx>
EXC_HD EXC_INLINE T* lamport_slot(Ctx& ctx, const LamportCall<T>& c, int owner, int buffer, int from) {
  return reinterpret_cast<T*>(ctx.lamport(owner)) + lamport_slot_offset(c, buffer, from);
}

// Stores the folded pack x of element i (aligned) into out, a count-element output: whole where the
// pack lies inside the output, else only its elements below count (the last pack's padding is
// never stored).
template <class T, class Ctx>
EXC_HD EXC_INLINE void lamport_output_pack(Ctx& ctx, T* out, size_t i, size_t count, const Pack<T>& x) {
  constexpr int P = Storage<T>::kPack;
  if (i + P <= count) {
    put_pack(ctx, out + i, x);
  } else {
    for (int e = 0; i + e < count; ++e) out[i + e] = x.v[e];
  }
}

// share with its packs cut at `count` (traces: what is read from an input or written to an output
// of count elements; the padding of the last pack is neither).
EXC_HD inline BlockShare lamport_clip(BlockShare share, size_t count) {
  if (share.pack_end > count) share.pack_end = count > share.pack_begin ? count : share.pack_begin;
  return share;
}

// Step 2: each pack of `share` (pack-aligned at both ends, within [0, padded count)) of this
// rank's input `mine` (count elements), NaNs made canonical (Protocol::kCanonicalize), into slot
// (buffer, rank) of every peer's region, peers in order rank+1, rank+2, ...; traced as `name`.
template <class T, int kRanks, class Protocol, class Ctx>
EXC_HD void lamport_push(Ctx& ctx, const char* name, const LamportCall<T>& c, const BlockShare& share, const T* mine,
                         size_t count) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  const int peers = kRanks > 0 ? kRanks : n;
  if constexpr (Ctx::kTraceSteps) {
    ctx.trace_step_begin(name);
    trace_share(ctx, lamport_clip(share, count), Access::kRead, me, Buffer::kInput);
    for (int k = 1; k < n; ++k) {
      trace_share(ctx, share, Access::kWrite, (me + k) % n, Buffer::kLamport, lamport_slot_offset(c, c.buffer, me));
    }
    ctx.trace_step_end();
  } else {
    (void)name;
  }
  for_share(
      ctx, share, P,
      [&](size_t i) {
        Pack<T> x = lamport_input_pack(ctx, mine, i, count);
        if constexpr (Protocol::kCanonicalize) x = lamport_canonicalize(x);
        for (int k = 1; k < peers; ++k) {
          const int peer = (me + k) % n;
          ctx.lamport_store(reinterpret_cast<Pack<T>*>(lamport_slot(ctx, c, peer, c.buffer, me) + i), x, peer);
        }
      },
      [](size_t) {});
}

// Step 3: this block's share of the extent the previous call wrote (lamport_extent[previous]) of
// every peer's slot of this rank's own buffer `previous`, back to the sentinel (Protocol::kClear).
template <class T, int kRanks, class Protocol, class Ctx>
EXC_HD void lamport_clear_previous(Ctx& ctx, const LamportCall<T>& c) {
  if constexpr (Protocol::kClear) {
    constexpr int P = Storage<T>::kPack;
    const int n = ctx.world_size();
    const int me = ctx.rank();
    const int peers = kRanks > 0 ? kRanks : n;
    const size_t extent = static_cast<size_t>(ctx.signals(me)->lamport_extent[c.previous]) / sizeof(T);
    const BlockShare clear = block_share(0, extent, P, ctx.block(), ctx.num_blocks());
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("clear");
      for (int k = 1; k < n; ++k) {
        trace_share(ctx, clear, Access::kWrite, me, Buffer::kLamport, lamport_slot_offset(c, c.previous, (me + k) % n));
      }
      ctx.trace_step_end();
    }
    Pack<T> sentinel;
    for (int e = 0; e < P; ++e) {
      if constexpr (sizeof(T) == 4) {
        sentinel.v[e] = bits_to_float(lamport_sentinel_bits<T>());
      } else {
        sentinel.v[e] = T{static_cast<uint16_t>(lamport_sentinel_bits<T>())};
      }
    }
    for_share(
        ctx, clear, P,
        [&](size_t i) {
          for (int k = 1; k < peers; ++k) {
            const int p = (me + k) % n;
            ctx.lamport_store(reinterpret_cast<Pack<T>*>(lamport_slot(ctx, c, me, c.previous, p) + i), sentinel, me);
          }
        },
        [](size_t) {});
  } else {
    (void)ctx, (void)c;
  }
}

// Step 4's fold of the pack at element i (aligned): over every rank r in rank order
// (fold_pack_from), rank r's pack being `own` for this rank (its input pack), else peer r's pack at
// slot_of(r) in this rank's own region, polled until no element is the sentinel.
// Why not poll rank after rank: a poll cannot move on until its load returned and showed the data
// there, so n - 1 polls in a row cost n - 1 round trips even where every peer's data has arrived.
// One load of every peer's pack (lamport_peek) goes out first, none waiting for another; a peer
// whose data had not arrived is then polled alone. Data that arrived never changes within the call
// (its one writer pushed it once, and the next clear of its buffer comes a call later), so the early
// load is what a poll would return. The loops are unrolled so that the operands stay in registers
// (indexed at run time they went to local memory: a 256-byte stack frame on 4 ranks, and
// lamport_one_shot took 5.6 us instead of 3.6 at 1 KB on 4 x H100). Up to kLamportPeekRanks
// ranks: beyond, the kernels' 64 registers (1 024 threads a block) spilled more with the early
// loads (ptxas: 256 bytes of spill loads against 92 on 8 ranks), so those poll rank after rank.
inline constexpr int kLamportPeekRanks = 4;

// *all_arrived (when not null) tells whether every operand arrived: false only where a poll gave
// up (the GPU's bounded wait returns the pack it last saw after recording the error), so a caller
// that forwards the result (lamport_two_shot) does not hand a sentinel's fold to its peers as data.
template <class T, int kRanks, class Ctx, class SlotOf>
EXC_HD EXC_INLINE Pack<T> lamport_fold_pack(Ctx& ctx, const LamportCall<T>& c, size_t i, const Pack<T>& own,
                                            SlotOf slot_of, bool* all_arrived = nullptr) {
  const int me = ctx.rank();
  bool arrived = true;
  auto poll = [&](int r) {
    const Pack<T> x = ctx.lamport_poll(slot_of(r), r, LamportPoll{c.calls, c.buffer, i});
    arrived = arrived && lamport_arrived(x);
    return x;
  };
  Pack<T> result;
  if constexpr (kRanks > 0 && kRanks <= kLamportPeekRanks) {
    Pack<T> in[kRanks];
    EXC_UNROLL
    for (int r = 0; r < kRanks; ++r) in[r] = r == me ? own : ctx.lamport_peek(slot_of(r));
    EXC_UNROLL
    for (int r = 0; r < kRanks; ++r) {
      if (r != me && !lamport_arrived(in[r])) in[r] = poll(r);
    }
    result = fold_pack_from<T, kRanks>(ctx, i, [&](int r) { return in[r]; });
  } else {
    result = fold_pack_from<T, kRanks>(ctx, i, [&](int r) { return r == me ? own : poll(r); });
  }
  if (all_arrived != nullptr) *all_arrived = arrived;
  return result;
}

// lamport_fold_pack for the one-shot layout: peer r's pack at element i of its slot (buffer, r),
// this rank's own from `mine` (count elements; +0.0 past the end).
template <class T, int kRanks, class Ctx>
EXC_HD EXC_INLINE Pack<T> lamport_fold_message_pack(Ctx& ctx, const LamportCall<T>& c, const T* mine, size_t count,
                                                    size_t i) {
  return lamport_fold_pack<T, kRanks>(ctx, c, i, lamport_input_pack(ctx, mine, i, count), [&](int r) {
    return reinterpret_cast<const Pack<T>*>(lamport_slot(ctx, c, ctx.rank(), c.buffer, r) + i);
  });
}

// Step 5: after the block's sync, records what this call had its peers write into buffer `buffer`
// (the next call that uses buffer `buffer`'s successor clears it) and advances the call number in
// the slots this block owns in this launch (b, b + G, ...; as advance_push_calls). Every block
// writes the same extent.
template <class T, class Ctx>
EXC_HD EXC_INLINE void end_lamport_call(Ctx& ctx, const LamportCall<T>& c, size_t extent_bytes) {
  SignalBuffer* own = ctx.signals(ctx.rank());
  ctx.sync_block();
  if (ctx.thread() == 0) own->lamport_extent[c.buffer] = extent_bytes;
  const int g = ctx.num_blocks();
  for (int s = ctx.block() + g * ctx.thread(); s < kMaxBlocks; s += g * ctx.num_threads()) {
    own->lamport_calls[s] = c.calls + 1;
  }
}

template <class T, int kRanks = 0, class Protocol = LamportProtocol, class Ctx>
EXC_HD void allreduce_lamport_one_shot(Ctx& ctx, size_t count) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  // 1. The call number and the buffers. (No input pack loaded ahead of it: with one, lamport_one_shot took
  //    0.1 us less at 16 KB on 2 x H200 but 0.1 more at 32 KB and 0.1-0.2 more at 1 MiB; docs/
  //    benchmarks.md, "A Lamport launch's first loads".)
  const LamportCall<T> c = begin_lamport_call<T, Protocol>(ctx);
  const size_t padded = (count + P - 1) / P * P;
  const BlockShare share = block_share(0, padded, P, ctx.block(), ctx.num_blocks());
  const T* mine = ctx.input(me);
  (void)n;
  // 2. Push.
  lamport_push<T, kRanks, Protocol>(ctx, "push", c, share, mine, count);
  // 3. Clear the previous call's buffer of this rank's own region.
  lamport_clear_previous<T, kRanks, Protocol>(ctx, c);
  // 4. Poll and fold, in rank order, into output.
  if constexpr (Ctx::kTraceSteps) {
    ctx.trace_step_begin("poll_fold");
    for (int r = 0; r < n; ++r) {
      if (r == me) {
        trace_share(ctx, lamport_clip(share, count), Access::kRead, me, Buffer::kInput);
      } else {
        trace_share(ctx, share, Access::kRead, me, Buffer::kLamport, lamport_slot_offset(c, c.buffer, r));
      }
    }
    trace_share(ctx, lamport_clip(share, count), Access::kWrite, me, Buffer::kOutput);
    ctx.trace_step_end();
  }
  T* const out = ctx.output();
  for_share(
      ctx, share, P,
      [&](size_t i) {
        lamport_output_pack(ctx, out, i, count, lamport_fold_message_pack<T, kRanks>(ctx, c, mine, count, i));
      },
      [](size_t) {});
  // 5. Record the extent and advance the call number.
  end_lamport_call(ctx, c, lamport_message_bytes(count, sizeof(T)));
}

// All-reduce, Lamport two shot: the reduce-scatter and the all-gather of two_shot, each a Lamport
// push (no barrier, no flag). Every rank pushes 2 (n - 1) / n of the message instead of
// lamport_one_shot's n - 1 messages, for one more NVLink latency. Same bits as one_shot: each
// element is folded once, by its slice's owner, in rank order 0..n-1 by fold_pack_from, and the
// others copy that result.
// Preconditions (besides the common ones): lamport_fits(Algorithm::kLamportTwoShot, count,
// sizeof(T), n, ctx.lamport_bytes()); the region as for lamport_one_shot.
// Example: 2 ranks, 16 bf16 (two packs; slice 0 = pack 0, slice 1 = pack 1, stride 8), call k
// (buffer b): rank 0 stores its pack 1 into slot (b, 0) of rank 1's region at [0, 8), rank 1 its
// pack 0 into slot (b, 1) of rank 0's; rank 0 folds input_0 + polled pack 0 into output[0, 8) and
// stores that into slot (b, 0) of rank 1's region at [8, 16); rank 1 does the same for pack 1;
// each then polls the other's folded slice from its own region into output.
// Steps (per block; slice p = two_shot_slice(padded count, P, p, n), stride its longest length,
// lamport_two_shot_stride):
//   1. the call number and the buffers (begin_lamport_call);
//   2. reduce-scatter push: this block's share of each peer p's slice of the input, NaNs made
//      canonical, into slot (b, rank) of p's region at the slice's offset (peers rank+1, ...);
//   3. clear the previous call's buffer (lamport_clear_previous: the extents are bytes per slot,
//      whichever algorithm wrote them);
//   4. fold this block's share of this rank's slice from its own input and the polled pieces, in
//      rank order, into output, and push each result into slot (b, rank) of every peer's region at
//      stride + the slice's offset (the fold's NaNs are the canonical one, never the sentinel);
//   5. all-gather: poll this block's share of every peer p's folded slice from slot (b, p) of this
//      rank's own region at stride, into output;
//   6. record the extent (two strides) and advance the call number (end_lamport_call).
// Why the three buffers and the clear stay safe: as lamport_one_shot's (a)-(d), with "p's call
// k+1 needs r's call k+1 push" holding through the last slice, which is never empty (the padded
// count has a pack): its owner L folds it from every rank's piece, r's among them, and every other
// rank polls L's folded slice. So p's call k+1 waits for r's push directly (p = L) or for L's
// push, whose values L computed from r's (a data dependence: L cannot store them before its load
// of r's piece returned). Either way p writes into r's region in call k+2 only after r's call k+1
// push, which r issued after its call k kernel, the clear included, had finished. Where every
// call has the same count, p's call k+1 also polls r directly whenever it writes to r in call
// k+2; with counts that change between calls the order may pass through L alone (the simulator's
// exploration alternates such counts; the GPU relies on the dependence above).
// One slice of lamport_two_shot and this block's share of it.
struct LamportSliceShare {
  Slice slice;
  BlockShare share;
};

// lamport_two_shot's push and gather with every peer at once (LamportProtocol::kPushPeersAtOnce,
// kGatherPeersAtOnce): for each peer k = 1 .. kRanks - 1 (rank + k) and each pack i of share_of(k)
// (a BlockShare whose packs are the whole share: the slices are pack-aligned), use(k, i, load(k, i)),
// the thread's j-th pack of every peer's share loaded first, those loads in flight together, then
// each used. Peer after peer instead (allreduce_lamport_two_shot's loops), a load waits for the use
// before it (a store, or a poll's spin, which the compiler may not move a load across). Thread t
// takes packs t, t + threads, ... of each share either way, and each use gets what the load of its
// own pack returned, so the results are the same. Only the shares' bounds are kept (two words a
// peer), for the registers.
// Preconditions: 2 <= kRanks <= kLamportPeekRanks.
template <class T, int kRanks, class Ctx, class ShareOf, class Load, class Use>
EXC_HD EXC_INLINE void for_peer_slices_at_once(Ctx& ctx, ShareOf share_of, Load load, Use use) {
  static_assert(kRanks > 1 && kRanks <= kLamportPeekRanks, "every peer's pack in registers at once");
  constexpr int P = Storage<T>::kPack;
  size_t begin[kRanks], end[kRanks];
  EXC_UNROLL
  for (int k = 1; k < kRanks; ++k) {
    const BlockShare share = share_of(k);
    begin[k] = share.pack_begin;
    end[k] = share.pack_end;
  }
  const size_t step = static_cast<size_t>(ctx.num_threads()) * P;
  // Bounded: j grows by step each round, and the loop ends once j is past every share.
  for (size_t j = static_cast<size_t>(ctx.thread()) * P;; j += step) {
    Pack<T> x[kRanks];
    bool any = false;
    EXC_UNROLL
    for (int k = 1; k < kRanks; ++k) {
      if (begin[k] + j < end[k]) {
        x[k] = load(k, begin[k] + j);
        any = true;
      }
    }
    if (!any) return;
    EXC_UNROLL
    for (int k = 1; k < kRanks; ++k) {
      if (begin[k] + j < end[k]) use(k, begin[k] + j, x[k]);
    }
  }
}

template <class T, int kRanks = 0, class Protocol = LamportProtocol, class Ctx>
EXC_HD void allreduce_lamport_two_shot(Ctx& ctx, size_t count) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  const int peers = kRanks > 0 ? kRanks : n;
  // 1. The call number and the buffers.
  const LamportCall<T> c = begin_lamport_call<T, Protocol>(ctx);
  const size_t padded = (count + P - 1) / P * P;
  const size_t stride = lamport_two_shot_stride(count, P, n);
  const T* mine = ctx.input(me);
  T* const out = ctx.output();
  auto slice_of = [&](int p) {
    LamportSliceShare s;
    s.slice = two_shot_slice(padded, P, p, n);
    s.share = block_share(s.slice.begin, s.slice.end, P, ctx.block(), ctx.num_blocks());
    return s;
  };
  constexpr bool kPushAtOnce = Protocol::kPushPeersAtOnce && kRanks > 1 && kRanks <= kLamportPeekRanks;
  constexpr bool kGatherAtOnce = Protocol::kGatherPeersAtOnce && kRanks > 1 && kRanks <= kLamportPeekRanks;
  // Slice p's first element (element i of slice p lands at element i - slice_begin(p) of its slot),
  // and this block's share of peer (rank + k)'s slice (for_peer_slices_at_once).
  auto slice_begin = [&](int p) { return two_shot_slice(padded, P, p, n).begin; };
  auto peer_share = [&](int k) { return slice_of((me + k) % n).share; };
  // 2. Reduce-scatter push.
  for (int k = 1; k < peers; ++k) {
    const int p = (me + k) % n;
    const LamportSliceShare s = slice_of(p);
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("push_slice");
      trace_share(ctx, lamport_clip(s.share, count), Access::kRead, me, Buffer::kInput);
      // Element i of the slice lands at element i - begin of the slot (offsets wrap modulo 2^64).
      trace_share(ctx, s.share, Access::kWrite, p, Buffer::kLamport,
                  lamport_slot_offset(c, c.buffer, me) - s.slice.begin);
      ctx.trace_step_end();
    }
    if constexpr (kPushAtOnce) continue;
    T* const slot = lamport_slot(ctx, c, p, c.buffer, me);
    for_share(
        ctx, s.share, P,
        [&](size_t i) {
          Pack<T> x = lamport_input_pack(ctx, mine, i, count);
          if constexpr (Protocol::kCanonicalize) x = lamport_canonicalize(x);
          ctx.lamport_store(reinterpret_cast<Pack<T>*>(slot + (i - s.slice.begin)), x, p);
        },
        [](size_t) {});
  }
  if constexpr (kPushAtOnce) {
    for_peer_slices_at_once<T, kRanks>(
        ctx, peer_share, [&](int, size_t i) { return lamport_input_pack(ctx, mine, i, count); },
        [&](int k, size_t i, Pack<T> x) {
          const int p = (me + k) % n;
          if constexpr (Protocol::kCanonicalize) x = lamport_canonicalize(x);
          T* const slot = lamport_slot(ctx, c, p, c.buffer, me);
          ctx.lamport_store(reinterpret_cast<Pack<T>*>(slot + (i - slice_begin(p))), x, p);
        });
  }
  // 3. Clear the previous call's buffer of this rank's own region.
  lamport_clear_previous<T, kRanks, Protocol>(ctx, c);
  // 4. Fold this rank's slice and push the results.
  {
    const LamportSliceShare s = slice_of(me);
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("fold_slice");
      for (int r = 0; r < n; ++r) {
        if (r == me) {
          trace_share(ctx, lamport_clip(s.share, count), Access::kRead, me, Buffer::kInput);
        } else {
          trace_share(ctx, s.share, Access::kRead, me, Buffer::kLamport,
                      lamport_slot_offset(c, c.buffer, r) - s.slice.begin);
        }
      }
      trace_share(ctx, lamport_clip(s.share, count), Access::kWrite, me, Buffer::kOutput);
      for (int k = 1; k < n; ++k) {
        trace_share(ctx, s.share, Access::kWrite, (me + k) % n, Buffer::kLamport,
                    lamport_slot_offset(c, c.buffer, me) + stride - s.slice.begin);
      }
      ctx.trace_step_end();
    }
    for_share(
        ctx, s.share, P,
        [&](size_t i) {
          bool arrived = true;
          const Pack<T> result = lamport_fold_pack<T, kRanks>(
              ctx, c, i, lamport_input_pack(ctx, mine, i, count),
              [&](int r) {
                return reinterpret_cast<const Pack<T>*>(lamport_slot(ctx, c, me, c.buffer, r) + (i - s.slice.begin));
              },
              &arrived);
          lamport_output_pack(ctx, out, i, count, result);
          // A poll that gave up (its error is recorded): push nothing, so the peers' own bounded
          // polls report this rank instead of copying a fold of sentinels.
          if (!arrived) return;
          const Pack<T> pushed = Protocol::kCanonicalize ? lamport_canonicalize(result) : result;
          for (int k = 1; k < peers; ++k) {
            const int p = (me + k) % n;
            T* const slot = lamport_slot(ctx, c, p, c.buffer, me) + stride;
            ctx.lamport_store(reinterpret_cast<Pack<T>*>(slot + (i - s.slice.begin)), pushed, p);
          }
        },
        [](size_t) {});
  }
  // 5. All-gather: every peer's folded slice, polled from this rank's own region (with the peers at
  //    once, one load of every peer's pack goes out first, and a pack that had not arrived is then
  //    polled alone, as lamport_fold_pack's peeks).
  for (int k = 1; k < peers; ++k) {
    const int p = (me + k) % n;
    const LamportSliceShare s = slice_of(p);
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("gather_slice");
      trace_share(ctx, s.share, Access::kRead, me, Buffer::kLamport,
                  lamport_slot_offset(c, c.buffer, p) + stride - s.slice.begin);
      trace_share(ctx, lamport_clip(s.share, count), Access::kWrite, me, Buffer::kOutput);
      ctx.trace_step_end();
    }
    if constexpr (kGatherAtOnce) continue;
    const T* const slot = lamport_slot(ctx, c, me, c.buffer, p) + stride;
    for_share(
        ctx, s.share, P,
        [&](size_t i) {
          const auto* src = reinterpret_cast<const Pack<T>*>(slot + (i - s.slice.begin));
          lamport_output_pack(ctx, out, i, count, ctx.lamport_poll(src, p, LamportPoll{c.calls, c.buffer, i}));
        },
        [](size_t) {});
  }
  if constexpr (kGatherAtOnce) {
    auto gathered = [&](int k, size_t i) {
      const int p = (me + k) % n;
      return reinterpret_cast<const Pack<T>*>(lamport_slot(ctx, c, me, c.buffer, p) + stride + (i - slice_begin(p)));
    };
    for_peer_slices_at_once<T, kRanks>(
        ctx, peer_share, [&](int k, size_t i) { return ctx.lamport_peek(gathered(k, i)); },
        [&](int k, size_t i, Pack<T> x) {
          if (!lamport_arrived(x))
            x = ctx.lamport_poll(gathered(k, i), (me + k) % n, LamportPoll{c.calls, c.buffer, i});
          lamport_output_pack(ctx, out, i, count, x);
        });
  }
  // 6. Record the extent and advance the call number.
  end_lamport_call(ctx, c, 2 * stride * sizeof(T));
}

}  // namespace exactcoll
