// The collective algorithms, written once as templates over an execution context (Ctx). The
// simulator (sim/) instantiates them with CPU threads as ranks; the CUDA backend (cuda_backend/)
// with a device context. Nothing here knows about threads, streams or IPC. Two all-reduce families
// have headers of their own over the same context: the push algorithms (core/push.h) and the
// flag-in-data one (core/lamport.h).
//
// ---- The execution-context concept ------------------------------------------------------------------
// A Ctx for storage type T (Ctx::value_type) supplies, all cheap and non-virtual:
//   int rank(), world_size()                     this rank and n
//   int block(), num_blocks(), thread(), num_threads()
//   const T* input(int peer)                     peer's symmetric input buffer (16-byte aligned)
//   T* scratch(int peer)                         peer's symmetric scratch buffer (16-byte aligned)
//   size_t scratch_elements()                    elements of T in every rank's scratch (the same on
//                                                every rank and in every launch that may run
//                                                concurrently with a peer's; only the push
//                                                algorithms of core/push.h need it)
//   T* output()                                  this rank's output (16-byte aligned)
//   SignalBuffer* signals(int peer)              peer's signal buffer (core/signal.h)
//   void signal(uint32_t* flag, uint32_t value, int peer, int set)      store with release
//   void wait(const uint32_t* flag, uint32_t value, int peer, int set)  acquire-load until equal;
//                                                bounded: a peer that never arrives is an error
//   void sync_block()                            all threads of this block
//   Pack<T> load(const Pack<T>*), void store(Pack<T>*, const Pack<T>&)   16-byte accesses
//   static constexpr int kPacksInFlight (optional, default 1): packs whose loads a thread issues
//     before its first fold or store in fold_range / copy_range (the GPU sets 8; see packs_in_flight)
//   static constexpr Contract kContract (optional, default Contract::kCanonical): the library
//     contract every fold follows, canonical or tree (core/contract.h; see fold_contract). Under
//     tree a traced element records trace_tree_node per internal node, then trace_round.
//   static constexpr bool kTraceSteps, kTraceElements, and when they are true:
//     trace_step_begin(const char* name), trace_access(Access, int peer, Buffer, size_t begin,
//     size_t end), trace_step_end(), bool trace_element(size_t index),
//     trace_fold(size_t index, int rank, float acc_before, float x, float acc_after),
//     trace_round(size_t index, float acc, uint32_t stored_bits),
//     trace_tree_node(size_t index, int left_rank, int right_rank, float left, float right,
//                     float sum, uint32_t stored_bits),
//     and optionally TreeTraceScope tree_trace_scope() (below; default: the whole tree, ranks as
//     they are)
// The device context sets both trace constants false, so tracing compiles away on the GPU.
//
// ---- Work split -------------------------------------------------------------------------------------
// A range of elements [begin, end) is split into 16-byte packs; block b takes a contiguous chunk of
// packs and its threads stride through it (coalesced on the GPU, one contiguous range per block in
// traces). Elements before the first aligned pack or after the last full one are done one at a time
// by the last block. The split never changes a bit: each element's fold is the same.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/contract.h"
#include "core/platform.h"
#include "core/registry.h"
#include "core/signal.h"
#include "core/storage.h"

namespace exactcoll {

template <class T>
struct alignas(16) Pack {
  T v[Storage<T>::kPack];
};

enum class Buffer : uint8_t { kInput, kScratch, kOutput, kLamport };
enum class Access : uint8_t { kRead, kWrite };

inline const char* buffer_name(Buffer b) {
  return b == Buffer::kInput     ? "input"
         : b == Buffer::kScratch ? "scratch"
         : b == Buffer::kOutput  ? "output"
                                 : "lamport";
}

// Compile-time world size for the hot loops (0 = read n at run time).
template <int N>
struct WorldSize {
  static constexpr int value = N;
};

// Calls f(WorldSize<n>{}) for n in 1..8, f(WorldSize<0>{}) beyond: the GPU issues all n loads
// before folding only when n is a compile-time constant.
template <class F>
EXC_HD void dispatch_world_size(int n, F&& f) {
  switch (n) {
    case 1: f(WorldSize<1>{}); break;
    case 2: f(WorldSize<2>{}); break;
    case 3: f(WorldSize<3>{}); break;
    case 4: f(WorldSize<4>{}); break;
    case 5: f(WorldSize<5>{}); break;
    case 6: f(WorldSize<6>{}); break;
    case 7: f(WorldSize<7>{}); break;
    case 8: f(WorldSize<8>{}); break;
    default: f(WorldSize<0>{}); break;
  }
}

// The fused op's kernels (core/fused_rmsnorm.h, fused_rmsnorm_kernels.h) have fewer compile-time
// world sizes, each a copy of every fused kernel: calls f(WorldSize<n>{}) for n in {2, 3, 4, 8} (the
// machines' shapes), f(WorldSize<0>{}) for every other n (the same bits; the loads issued rank by
// rank). The GPU's fused launch and the simulator's both dispatch through it, so that the simulator
// runs the instantiations the GPU runs.
template <class F>
EXC_HD void dispatch_fused_world_size(int n, F&& f) {
  switch (n) {
    case 2: f(WorldSize<2>{}); break;
    case 3: f(WorldSize<3>{}); break;
    case 4: f(WorldSize<4>{}); break;
    case 8: f(WorldSize<8>{}); break;
    default: f(WorldSize<0>{}); break;
  }
}

// One block's share of an element range.
struct BlockShare {
  size_t pack_begin = 0, pack_end = 0;  // elements, multiples of the pack
  size_t head_begin = 0, head_end = 0;  // unaligned elements before the packs (last block only)
  size_t tail_begin = 0, tail_end = 0;  // elements after the last full pack (last block only)
};

// Returns block `block`'s share of [begin, end) for packs of `pack` elements.
EXC_HD inline BlockShare block_share(size_t begin, size_t end, int pack, int block, int num_blocks) {
  BlockShare s;
  const size_t p = static_cast<size_t>(pack);
  size_t aligned_begin = (begin + p - 1) / p * p;
  if (aligned_begin > end) aligned_begin = end;
  size_t aligned_end = end / p * p;
  if (aligned_end < aligned_begin) aligned_end = aligned_begin;
  const size_t packs = (aligned_end - aligned_begin) / p;
  const size_t chunk = (packs + num_blocks - 1) / num_blocks;
  size_t first = chunk * static_cast<size_t>(block);
  size_t last = first + chunk;
  if (first > packs) first = packs;
  if (last > packs) last = packs;
  s.pack_begin = aligned_begin + first * p;
  s.pack_end = aligned_begin + last * p;
  if (block == num_blocks - 1) {
    s.head_begin = begin;
    s.head_end = aligned_begin;
    s.tail_begin = aligned_end;
    s.tail_end = end;
  }
  return s;
}

// Records one access per non-empty sub-range of the share (offset shifts the element indices,
// e.g. into an all-gather output).
template <class Ctx>
EXC_HD void trace_share(Ctx& ctx, const BlockShare& s, Access access, int peer, Buffer buffer, size_t offset = 0) {
  if constexpr (Ctx::kTraceSteps) {
    if (s.head_end > s.head_begin) ctx.trace_access(access, peer, buffer, s.head_begin + offset, s.head_end + offset);
    if (s.pack_end > s.pack_begin) ctx.trace_access(access, peer, buffer, s.pack_begin + offset, s.pack_end + offset);
    if (s.tail_end > s.tail_begin) ctx.trace_access(access, peer, buffer, s.tail_begin + offset, s.tail_end + offset);
  } else {
    (void)ctx, (void)s, (void)access, (void)peer, (void)buffer, (void)offset;
  }
}

// Calls pack_fn(i) for each aligned pack start i and scalar_fn(i) for each unaligned element of
// this block's share, threads striding.
template <class Ctx, class PackFn, class ScalarFn>
EXC_HD EXC_INLINE void for_share(Ctx& ctx, const BlockShare& s, int pack, PackFn pack_fn, ScalarFn scalar_fn) {
  const size_t stride = static_cast<size_t>(ctx.num_threads()) * static_cast<size_t>(pack);
  for (size_t i = s.pack_begin + static_cast<size_t>(ctx.thread()) * pack; i < s.pack_end; i += stride) pack_fn(i);
  const size_t t = static_cast<size_t>(ctx.thread());
  const size_t nt = static_cast<size_t>(ctx.num_threads());
  for (size_t i = s.head_begin + t; i < s.head_end; i += nt) scalar_fn(i);
  for (size_t i = s.tail_begin + t; i < s.tail_end; i += nt) scalar_fn(i);
}

// ---- The fold, per element and per pack --------------------------------------------------------------

// The library contract Ctx folds under: Ctx::kContract when it declares one, else canonical.
template <class Ctx>
EXC_HD constexpr Contract fold_contract() {
  if constexpr (requires { Ctx::kContract; }) {
    static_assert(Ctx::kContract == Contract::kCanonical || Ctx::kContract == Contract::kTree,
                  "the algorithms fold under the library contracts only (canonical, tree)");
    return Ctx::kContract;
  } else {
    return Contract::kCanonical;
  }
}

// Where a context's world sits in a traced element's tree (element traces under tree only).
// first_rank: the rank number that traces give the world's rank 0 (its rank r is first_rank + r).
// whole_tree: whether the world's tree is the element's whole tree, whose root is the result and
// gets the trace_round, or a subtree of a larger one: a node of a multi-node job (core/multinode.h),
// whose cross-node levels record the nodes above it and the round (node_tree_combine).
// Example: node 1 of 2 nodes x 4 ranks traces as {4, false}; a one-node world as {0, true}.
struct TreeTraceScope {
  int first_rank = 0;
  bool whole_tree = true;
};

// Returns Ctx's scope (ctx.tree_trace_scope() when it has one), else the whole tree.
template <class Ctx>
TreeTraceScope tree_trace_scope(const Ctx& ctx) {
  if constexpr (requires { ctx.tree_trace_scope(); }) {
    return ctx.tree_trace_scope();
  } else {
    (void)ctx;
    return {};
  }
}

// The tree of element i over ranks 0..n-1 (value(r): rank r's), each internal node traced
// (trace_tree_node, its subtrees' first ranks offset by the scope's first_rank), then, when the
// scope is the whole tree, the result (trace_round with the root's fp32 sum, or the one value).
// For traced elements of a simulated world (n <= kMaxRanks); the untraced paths compute the same
// tree.
template <class T, class Ctx, class Value>
T traced_tree_element(Ctx& ctx, size_t i, int n, Value value) {
  const TreeTraceScope scope = tree_trace_scope(ctx);
  T v[kMaxRanks] = {};  // n <= kMaxRanks are set; initialized for g++ -O3's maybe-uninitialized
  for (int r = 0; r < n; ++r) v[r] = value(r);
  float root_sum = to_float(v[0]);
  contract::tree_in_place_reporting(v, n, [&](int left, int right, T left_value, T right_value, float sum, T node) {
    ctx.trace_tree_node(i, scope.first_rank + left, scope.first_rank + right, to_float(left_value),
                        to_float(right_value), sum, Storage<T>::bits(node));
    root_sum = sum;
  });
  if (scope.whole_tree) ctx.trace_round(i, root_sum, Storage<T>::bits(v[0]));
  return v[0];
}

// Returns the contract's fold of element i over ranks 0..n-1, rank r's element being src(r)[i]
// (src(r) returns a const T*). Under tree with kRanks > 0 (n at compile time) the tree runs in
// registers (tree_in_place); otherwise in contract::tree_fold's bounded stack (local memory on a
// GPU: the world sizes past dispatch_world_size's). A traced element takes traced_tree_element.

template <class T, int kRanks = 0, class Ctx, class Src>
EXC_HD EXC_INLINE T fold_element_from(Ctx& ctx, size_t i, Src src) {
  const int n = ctx.world_size();
  if constexpr (fold_contract<Ctx>() == Contract::kTree) {
    if constexpr (Ctx::kTraceElements) {
      if (ctx.trace_element(i)) return traced_tree_element<T>(ctx, i, n, [&](int r) { return src(r)[i]; });
    }
    if constexpr (kRanks > 0) {
      T v[kRanks];
      for (int r = 0; r < kRanks; ++r) v[r] = src(r)[i];
      contract::tree_in_place(v);
      return v[0];
    } else {
      return contract::tree_fold<T>(n, [&](int r) { return src(r)[i]; });
    }
  }
  const T x0 = src(0)[i];
  float acc = contract::fold_begin<T>(x0);
  bool traced = false;
  if constexpr (Ctx::kTraceElements) {
    traced = ctx.trace_element(i);
    if (traced) ctx.trace_fold(i, 0, 0.0f, to_float(x0), acc);
  }
  for (int r = 1; r < n; ++r) {
    const T x = src(r)[i];
    const float before = acc;
    acc = contract::fold_step<T>(acc, x);
    if constexpr (Ctx::kTraceElements) {
      if (traced) ctx.trace_fold(i, r, before, to_float(x), acc);
    }
  }
  (void)traced;
  const T out = contract::fold_end<T>(acc);
  if constexpr (Ctx::kTraceElements) {
    if (traced) ctx.trace_round(i, acc, Storage<T>::bits(out));
  }
  return out;
}

// Returns the contract's fold of element i over ranks 0..n-1 of ctx.input(r).
template <class T, class Ctx>
EXC_HD EXC_INLINE T fold_element(Ctx& ctx, size_t i) {
  return fold_element_from<T>(ctx, i, [&](int r) { return ctx.input(r); });
}

// The tree contract's fold of one pack, rank r's pack being source(r): with kRanks > 0 every pack
// is loaded first and the tree runs level by level in registers (contract::tree_in_place); a
// run-time world size pushes rank by rank (contract::TreeFold). Both give contract::tree_fold.
template <class T, int kRanks, class Ctx, class Source>
EXC_HD EXC_INLINE Pack<T> tree_pack_from(Ctx& ctx, size_t i, Source source) {
  constexpr int P = Storage<T>::kPack;
  Pack<T> out;
  if constexpr (Ctx::kTraceElements) {  // a traced simulated world: every rank's pack kept
    const int n = ctx.world_size();
    Pack<T> in[kMaxRanks];
    for (int r = 0; r < n; ++r) in[r] = source(r);
    for (int e = 0; e < P; ++e) {
      auto value = [&](int r) { return in[r].v[e]; };
      out.v[e] =
          ctx.trace_element(i + e) ? traced_tree_element<T>(ctx, i + e, n, value) : contract::tree_fold<T>(n, value);
    }
    return out;
  } else if constexpr (kRanks > 0) {
    Pack<T> in[kRanks];
    for (int r = 0; r < kRanks; ++r) in[r] = source(r);
    for (int e = 0; e < P; ++e) {
      T lane[kRanks];
      for (int r = 0; r < kRanks; ++r) lane[r] = in[r].v[e];
      contract::tree_in_place(lane);
      out.v[e] = lane[0];
    }
  } else {
    contract::TreeFold<T> tree[P];
    const int n = ctx.world_size();
    for (int r = 0; r < n; ++r) {
      const Pack<T> x = source(r);
      for (int e = 0; e < P; ++e) tree[e].push(x.v[e]);
    }
    for (int e = 0; e < P; ++e) out.v[e] = tree[e].result();
  }
  return out;
}

// Returns the fold of the pack starting at element i (aligned), rank r's pack being source(r).
// With kRanks > 0 every source(r) is taken before the first add (latency hiding on the GPU); the
// adds run in rank order either way.
template <class T, int kRanks, class Ctx, class Source>
EXC_HD EXC_INLINE Pack<T> fold_pack_from(Ctx& ctx, size_t i, Source source) {
  constexpr int P = Storage<T>::kPack;
  if constexpr (fold_contract<Ctx>() == Contract::kTree) {
    return tree_pack_from<T, kRanks>(ctx, i, source);
  }
  float acc[P] = {};  // set by rank 0's step; initialized so g++ -O3 sees no maybe-uninitialized read (kRanks = 0)
  bool traced[P] = {};
  if constexpr (Ctx::kTraceElements) {
    for (int e = 0; e < P; ++e) traced[e] = ctx.trace_element(i + e);
  }
  // Rank 0 begins every element's fold and ranks 1.. step it, in two element loops without a
  // per-element rank test (control flow that keeps the host compiler from vectorizing them).
  auto step = [&](int r, const Pack<T>& x) {
    float before[P] = {};
    if constexpr (Ctx::kTraceElements) {
      for (int e = 0; e < P; ++e) before[e] = acc[e];
    }
    if (r == 0) {
      EXC_HOST_VECTOR_LOOP
      for (int e = 0; e < P; ++e) acc[e] = contract::fold_begin<T>(x.v[e]);
    } else {
      EXC_HOST_VECTOR_LOOP
      for (int e = 0; e < P; ++e) acc[e] = contract::fold_step<T>(acc[e], x.v[e]);
    }
    if constexpr (Ctx::kTraceElements) {
      for (int e = 0; e < P; ++e) {
        if (traced[e]) ctx.trace_fold(i + e, r, r == 0 ? 0.0f : before[e], to_float(x.v[e]), acc[e]);
      }
    }
  };
  if constexpr (kRanks > 0) {
    Pack<T> in[kRanks];
    for (int r = 0; r < kRanks; ++r) in[r] = source(r);
    for (int r = 0; r < kRanks; ++r) step(r, in[r]);
  } else {
    const int n = ctx.world_size();
    for (int r = 0; r < n; ++r) step(r, source(r));
  }
  Pack<T> out;
  for (int e = 0; e < P; ++e) {
    out.v[e] = contract::fold_end<T>(acc[e]);
    if constexpr (Ctx::kTraceElements) {
      if (traced[e]) ctx.trace_round(i + e, acc[e], Storage<T>::bits(out.v[e]));
    }
  }
  return out;
}

// Returns the fold of the pack starting at element i (aligned), loading every rank's pack.
template <class T, int kRanks, class Ctx>
EXC_HD EXC_INLINE Pack<T> fold_pack(Ctx& ctx, size_t i) {
  return fold_pack_from<T, kRanks>(ctx, i,
                                   [&](int r) { return ctx.load(reinterpret_cast<const Pack<T>*>(ctx.input(r) + i)); });
}

// How many packs a thread handles per loop iteration in fold_range / copy_range, with every load of
// the group issued before the first fold or store: Ctx::kPacksInFlight when the context defines it
// (the GPU: more bytes in flight per thread, since one iteration's loads cannot pass the previous
// iteration's stores), else 1. A fold takes kRanks loads per pack, so it groups
// kPacksInFlight / kRanks packs. Grouping changes only the order in which a thread issues its
// packs: every element is folded and stored exactly as without it, so the bits are the same.
template <class Ctx>
EXC_HD constexpr int packs_in_flight() {
  if constexpr (requires { Ctx::kPacksInFlight; }) {
    return Ctx::kPacksInFlight;
  } else {
    return 1;
  }
}

// for_share with the packs of each thread taken kGroup at a time: group_fn(i, stride) handles packs
// i, i + stride, ..., i + (kGroup - 1) * stride; pack_fn(i) the thread's remaining packs one by one;
// scalar_fn(i) the unaligned elements. The same elements go to the same threads as in for_share.
template <int kGroup, class Ctx, class GroupFn, class PackFn, class ScalarFn>
EXC_HD EXC_INLINE void for_share_grouped(Ctx& ctx, const BlockShare& s, int pack, GroupFn group_fn, PackFn pack_fn,
                                         ScalarFn scalar_fn) {
  const size_t stride = static_cast<size_t>(ctx.num_threads()) * static_cast<size_t>(pack);
  size_t i = s.pack_begin + static_cast<size_t>(ctx.thread()) * pack;
  if constexpr (kGroup > 1) {
    for (; i + (kGroup - 1) * stride < s.pack_end; i += kGroup * stride) group_fn(i, stride);
  } else {
    (void)group_fn;
  }
  for (; i < s.pack_end; i += stride) pack_fn(i);
  const size_t t = static_cast<size_t>(ctx.thread());
  const size_t nt = static_cast<size_t>(ctx.num_threads());
  for (size_t j = s.head_begin + t; j < s.head_end; j += nt) scalar_fn(j);
  for (size_t j = s.tail_begin + t; j < s.tail_end; j += nt) scalar_fn(j);
}

// Stores a pack at dst, with one 16-byte store when dst is 16-byte aligned, element by element
// otherwise (a reduce-scatter slice or an all-gather block may start mid-pack).
template <class T, class Ctx>
EXC_HD EXC_INLINE void put_pack(Ctx& ctx, T* dst, const Pack<T>& x) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    ctx.store(reinterpret_cast<Pack<T>*>(dst), x);
  } else {
    for (int e = 0; e < Storage<T>::kPack; ++e) dst[e] = x.v[e];
  }
}

// Folds this block's share of every rank's data, rank r's element i being src(r)[i] (src(r)
// returns a const T* with the same 16-byte alignment as element 0 of an input), and hands every
// result to the caller: put(i, pack) for the aligned pack starting at element i, put_element(i, x)
// for an unaligned element. The fold of each element is the contract's whatever the callbacks do
// with it (where results go never changes a bit).
template <class T, int kRanks, class Ctx, class Src, class Put, class PutElement>
EXC_HD void fold_range_with(Ctx& ctx, const BlockShare& share, Src src, Put put, PutElement put_element) {
  constexpr int P = Storage<T>::kPack;
  constexpr int kGroup = packs_in_flight<Ctx>() / (kRanks > 0 ? kRanks : packs_in_flight<Ctx>()) > 1
                             ? packs_in_flight<Ctx>() / (kRanks > 0 ? kRanks : 1)
                             : 1;  // the run-time-n fold (kRanks = 0) is not grouped
  for_share_grouped<kGroup>(
      ctx, share, P,
      [&](size_t i, size_t stride) {
        Pack<T> in[kGroup][kRanks > 0 ? kRanks : 1];
        for (int u = 0; u < kGroup; ++u) {
          for (int r = 0; r < kRanks; ++r) {
            in[u][r] = ctx.load(reinterpret_cast<const Pack<T>*>(src(r) + i + u * stride));
          }
        }
        for (int u = 0; u < kGroup; ++u) {
          put(i + u * stride, fold_pack_from<T, kRanks>(ctx, i + u * stride, [&](int r) { return in[u][r]; }));
        }
      },
      [&](size_t i) {
        put(i, fold_pack_from<T, kRanks>(
                   ctx, i, [&](int r) { return ctx.load(reinterpret_cast<const Pack<T>*>(src(r) + i)); }));
      },
      [&](size_t i) { put_element(i, fold_element_from<T, kRanks>(ctx, i, src)); });
}

// fold_range_with, element i going to dst0[i - shift] (and dst1[i - shift] if dst1 is not null).
template <class T, int kRanks, class Ctx, class Src>
EXC_HD void fold_range_from(Ctx& ctx, const BlockShare& share, Src src, T* dst0, T* dst1, size_t shift = 0) {
  fold_range_with<T, kRanks>(
      ctx, share, src,
      [&](size_t i, const Pack<T>& out) {
        put_pack(ctx, dst0 + (i - shift), out);
        if (dst1 != nullptr) put_pack(ctx, dst1 + (i - shift), out);
      },
      [&](size_t i, T out) {
        dst0[i - shift] = out;
        if (dst1 != nullptr) dst1[i - shift] = out;
      });
}

// Folds this block's share of every rank's input; element i goes to dst0[i - shift] (and
// dst1[i - shift] if dst1 is not null).
template <class T, int kRanks, class Ctx>
EXC_HD void fold_range(Ctx& ctx, const BlockShare& share, T* dst0, T* dst1, size_t shift = 0) {
  fold_range_from<T, kRanks>(
      ctx, share, [&](int r) { return ctx.input(r); }, dst0, dst1, shift);
}

// Copies this block's share of src into dst: element i goes to dst[i + offset] (bits unchanged).
template <class T, class Ctx>
EXC_HD void copy_range(Ctx& ctx, const BlockShare& share, const T* src, T* dst, size_t offset) {
  constexpr int P = Storage<T>::kPack;
  constexpr int kGroup = packs_in_flight<Ctx>() / 2 > 1 ? packs_in_flight<Ctx>() / 2 : 1;
  for_share_grouped<kGroup>(
      ctx, share, P,
      [&](size_t i, size_t stride) {
        Pack<T> in[kGroup];
        for (int u = 0; u < kGroup; ++u) in[u] = ctx.load(reinterpret_cast<const Pack<T>*>(src + i + u * stride));
        for (int u = 0; u < kGroup; ++u) put_pack(ctx, dst + offset + i + u * stride, in[u]);
      },
      [&](size_t i) { put_pack(ctx, dst + offset + i, ctx.load(reinterpret_cast<const Pack<T>*>(src + i))); },
      [&](size_t i) { dst[offset + i] = src[i]; });
}

// Copies several ranges at once: for each source q, this block's share[q] of src[q] into dst
// (element i of src[q] to dst[i + offset[q]]), kGroup packs of every source loaded before the
// first store of an iteration. The GPU's gather steps use it (packs_in_flight > 1) so that the
// peers' read latencies overlap instead of adding up, peer after peer; the elements, the threads
// that copy them and the bits are those of copy_range called once per source.
template <class T, int kSources, int kGroup, class Ctx>
EXC_HD void copy_ranges(Ctx& ctx, const BlockShare (&share)[kSources], const T* const (&src)[kSources], T* dst,
                        const size_t (&offset)[kSources]) {
  constexpr int P = Storage<T>::kPack;
  const size_t t = static_cast<size_t>(ctx.thread());
  const size_t nt = static_cast<size_t>(ctx.num_threads());
  const size_t stride = nt * P;
  for (size_t j = t * P;; j += kGroup * stride) {
    Pack<T> v[kGroup][kSources] = {};  // initialized: g++ cannot see that only loaded packs are stored
    bool any = false;
    for (int u = 0; u < kGroup; ++u) {
      for (int q = 0; q < kSources; ++q) {
        const size_t i = share[q].pack_begin + j + u * stride;
        if (i < share[q].pack_end) {
          v[u][q] = ctx.load(reinterpret_cast<const Pack<T>*>(src[q] + i));
          any = true;
        }
      }
    }
    if (!any) break;
    for (int u = 0; u < kGroup; ++u) {
      for (int q = 0; q < kSources; ++q) {
        const size_t i = share[q].pack_begin + j + u * stride;
        if (i < share[q].pack_end) put_pack(ctx, dst + offset[q] + i, v[u][q]);
      }
    }
  }
  for (int q = 0; q < kSources; ++q) {
    for (size_t i = share[q].head_begin + t; i < share[q].head_end; i += nt) dst[offset[q] + i] = src[q][i];
    for (size_t i = share[q].tail_begin + t; i < share[q].tail_end; i += nt) dst[offset[q] + i] = src[q][i];
  }
}

// Packs per source per iteration of copy_ranges: half the context's loads in flight, shared by
// the sources (at least 1).
template <class Ctx, int kSources>
EXC_HD constexpr int copy_ranges_group() {
  return packs_in_flight<Ctx>() / 2 / kSources > 1 ? packs_in_flight<Ctx>() / 2 / kSources : 1;
}

// ---- The algorithms ------------------------------------------------------------------------------------
// Each is one kernel launch's work for one block of one rank. Preconditions common to all: every
// rank calls with the same count and the same grid (num_blocks <= kMaxBlocks), world_size <=
// kMaxRanks, the inputs are in place (staged or registered) before the launch.

// Two-shot slice of rank r: contiguous, pack-aligned; the last rank also takes the remainder.
struct Slice {
  size_t begin = 0, end = 0;
};
EXC_HD inline Slice two_shot_slice(size_t count, int pack, int rank, int n) {
  const size_t packs = count / static_cast<size_t>(pack);
  const size_t per = packs / static_cast<size_t>(n);
  Slice s;
  s.begin = per * pack * static_cast<size_t>(rank);
  s.end = rank == n - 1 ? count : s.begin + per * pack;
  return s;
}

// All-reduce, one shot. Steps:
//   1. barrier: every peer's input is in place;
//   2. fold this block's share of [0, count) from every rank's input, in rank order, into output;
//   3. barrier (end): no peer reuses its input while this rank may still read it.
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void allreduce_one_shot(Ctx& ctx, size_t count) {
  const int n = ctx.world_size();
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  const BlockShare share = block_share(0, count, Storage<T>::kPack, ctx.block(), ctx.num_blocks());
  if constexpr (Ctx::kTraceSteps) {
    ctx.trace_step_begin("fold");
    for (int r = 0; r < n; ++r) trace_share(ctx, share, Access::kRead, r, Buffer::kInput);
    trace_share(ctx, share, Access::kWrite, ctx.rank(), Buffer::kOutput);
    ctx.trace_step_end();
  }
  (void)n;
  fold_range<T, kRanks>(ctx, share, ctx.output(), static_cast<T*>(nullptr));
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// All-reduce, two shot. Steps:
//   1. barrier: every peer's input is in place;
//   2. fold this rank's slice (two_shot_slice) from every rank's input in rank order 0..n-1 (not
//      rotated), into this rank's scratch and output;
//   3. barrier: every slice is published;
//   4. copy each peer's slice from its scratch into output (peers in order rank+1, rank+2, ...);
//   5. barrier (end): no peer overwrites its scratch while this rank may still read it.
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void allreduce_two_shot(Ctx& ctx, size_t count) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  {
    const Slice mine = two_shot_slice(count, P, me, n);
    const BlockShare share = block_share(mine.begin, mine.end, P, ctx.block(), ctx.num_blocks());
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("reduce_slice");
      for (int r = 0; r < n; ++r) trace_share(ctx, share, Access::kRead, r, Buffer::kInput);
      trace_share(ctx, share, Access::kWrite, me, Buffer::kScratch);
      trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput);
      ctx.trace_step_end();
    }
    fold_range<T, kRanks>(ctx, share, ctx.scratch(me), ctx.output());
  }
  block_barrier<Protocol>(ctx, &barriers);
  if constexpr (kRanks > 1 && kRanks <= 4 && packs_in_flight<Ctx>() > 1) {
    // GPU: every peer's slice in one pass (copy_ranges), the same elements as the loop below
    // (up to 4 ranks: beyond, the shares of 7 peers no longer fit the GPU's registers).
    constexpr int S = kRanks - 1;
    BlockShare shares[S];
    const T* sources[S];
    size_t offsets[S];
    for (int k = 1; k < kRanks; ++k) {
      const int peer = (me + k) % n;
      const Slice theirs = two_shot_slice(count, P, peer, n);
      shares[k - 1] = block_share(theirs.begin, theirs.end, P, ctx.block(), ctx.num_blocks());
      sources[k - 1] = ctx.scratch(peer);
      offsets[k - 1] = 0;
      if constexpr (Ctx::kTraceSteps) {
        ctx.trace_step_begin("gather_slice");
        trace_share(ctx, shares[k - 1], Access::kRead, peer, Buffer::kScratch);
        trace_share(ctx, shares[k - 1], Access::kWrite, me, Buffer::kOutput);
        ctx.trace_step_end();
      }
    }
    copy_ranges<T, S, copy_ranges_group<Ctx, S>()>(ctx, shares, sources, ctx.output(), offsets);
  } else {
    for (int k = 1; k < n; ++k) {
      const int peer = (me + k) % n;
      const Slice theirs = two_shot_slice(count, P, peer, n);
      const BlockShare share = block_share(theirs.begin, theirs.end, P, ctx.block(), ctx.num_blocks());
      if constexpr (Ctx::kTraceSteps) {
        ctx.trace_step_begin("gather_slice");
        trace_share(ctx, share, Access::kRead, peer, Buffer::kScratch);
        trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput);
        ctx.trace_step_end();
      }
      copy_range<T>(ctx, share, ctx.scratch(peer), ctx.output(), 0);
    }
  }
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// Reduce-scatter: rank r gets the fold of elements [r*count/n, (r+1)*count/n) in its output[0..).
// Preconditions: count % n == 0. Steps:
//   1. barrier: every peer's input is in place;
//   2. fold this rank's slice from every rank's input, in rank order, into output[0, count/n);
//   3. barrier (end): no peer reuses its input while this rank may still read it.
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void reduce_scatter(Ctx& ctx, size_t count) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  const size_t per = count / static_cast<size_t>(n);
  const size_t begin = per * static_cast<size_t>(me);
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  const BlockShare share = block_share(begin, begin + per, P, ctx.block(), ctx.num_blocks());
  if constexpr (Ctx::kTraceSteps) {
    ctx.trace_step_begin("reduce_slice");
    for (int r = 0; r < n; ++r) trace_share(ctx, share, Access::kRead, r, Buffer::kInput);
    // Output index = element index - begin (unsigned wrap-around makes the offset a subtraction).
    trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput, size_t{0} - begin);
    ctx.trace_step_end();
  }
  fold_range<T, kRanks>(ctx, share, ctx.output(), static_cast<T*>(nullptr), begin);
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// All-gather: output[r*count + i] = input_r[i], a bit copy (NaN payloads and -0 kept).
// Steps: barrier; copy every rank's input (in order rank, rank+1, ...) into output; end barrier.
template <class T, int kRanks = 0, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void allgather(Ctx& ctx, size_t count) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  const BlockShare share = block_share(0, count, P, ctx.block(), ctx.num_blocks());
  if constexpr (kRanks > 0 && packs_in_flight<Ctx>() > 1) {
    // GPU: every rank's input in one pass (copy_ranges), the same elements as the loop below.
    BlockShare shares[kRanks];
    const T* sources[kRanks];
    size_t offsets[kRanks];
    for (int k = 0; k < kRanks; ++k) {
      const int peer = (me + k) % n;
      shares[k] = share;
      sources[k] = ctx.input(peer);
      offsets[k] = count * static_cast<size_t>(peer);
      if constexpr (Ctx::kTraceSteps) {
        ctx.trace_step_begin("gather");
        trace_share(ctx, share, Access::kRead, peer, Buffer::kInput);
        trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput, offsets[k]);
        ctx.trace_step_end();
      }
    }
    copy_ranges<T, kRanks, copy_ranges_group<Ctx, kRanks>()>(ctx, shares, sources, ctx.output(), offsets);
  } else {
    for (int k = 0; k < n; ++k) {
      const int peer = (me + k) % n;
      const size_t offset = count * static_cast<size_t>(peer);
      if constexpr (Ctx::kTraceSteps) {
        ctx.trace_step_begin("gather");
        trace_share(ctx, share, Access::kRead, peer, Buffer::kInput);
        trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput, offset);
        ctx.trace_step_end();
      }
      copy_range<T>(ctx, share, ctx.input(peer), ctx.output(), offset);
    }
  }
  if constexpr (Protocol::kEndBarrier) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

}  // namespace exactcoll
