// The node-level kernels of the multi-node algorithms (core/multinode.h), as templates over the
// execution context of core/collectives.h. Inside a kernel the context's world is ONE node: rank()
// is the local rank, world_size() the node's L ranks, input(q) and scratch(q) local rank q's
// symmetric buffers (CUDA IPC on GPUs). Nothing here crosses a node; the transport does that
// between kernels.
//
// The carry. A node's fold does not start from its own first rank: it continues the left fold of
// every earlier node's ranks (docs/numerics.md section 4), handed over as the unrounded fp32
// accumulator `carry_in` (node 0 has none and begins with float(x_0)). Node k's kernel adds its
// ranks kL, kL+1, ..., kL+L-1 in order, then either hands the accumulator on unrounded
// (`carry_out`) or, on the last node, rounds once (contract::fold_end). Every element meets exactly
// the operations of the one-node fold, in the same order, so the bits are the contract's.
//
// Under the tree contract (a context whose kContract is Contract::kTree) there is no carry:
// node_fold computes each element's tree over the node's L ranks (core/collectives.h's tree fold,
// contract::tree_*), rounded, and node_tree_combine joins two such subtrees of neighbouring node
// groups with one contract::tree_node. core/multinode.h's tree_allreduce and tree_reduce_scatter
// say why that is the tree over all ranks. A traced element (the simulator's) records each node
// where it is computed: node_fold its node's subtree (core/collectives.h's traced_tree_element,
// the context's TreeTraceScope naming global ranks), node_tree_combine the level it joins
// (CombineTrace), and the combine of the root its round.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/collectives.h"
#include "core/contract.h"
#include "core/platform.h"
#include "core/signal.h"
#include "core/storage.h"

namespace exactcoll::multinode {

// One node_fold launch of one rank: `pieces` ranges of `length` input elements each, piece p
// beginning at input element first + p * stride.
template <class T>
struct NodeFoldArgs {
  size_t first = 0;
  size_t stride = 0;
  size_t length = 0;
  int pieces = 1;
  int first_rank = 0;               // global rank of this node's local rank 0 (traces name global ranks)
  const float* carry_in = nullptr;  // [pieces * length], this rank's own memory; null: this is node 0
  float* carry_out = nullptr;       // [pieces * length], this rank's own memory; null: round instead
  T* rounded = nullptr;             // when rounding: piece p element e -> rounded[p * length + e] ...
  T* rounded_alt = nullptr;         // ... except piece alt_piece -> rounded_alt[e]
  int alt_piece = -1;
  // Tree contract only: nonzero places piece p at rounded[reverse_bits(p, piece_bits) * length + e]
  // (pieces == 2^piece_bits), so that the recursive halving of tree_reduce_scatter sends halves
  // that are contiguous.
  int piece_bits = 0;
  bool barrier_before = false;  // pass a barrier first: every local peer's input is in place
  bool barrier_after = false;   // pass a barrier last: no local peer reuses its input too early
};

// Returns the fold of element i over this node's ranks in rank order, begun from *carry (the
// earlier nodes' fold) or, when carry is null, from float(x_{local 0}); unrounded. Traced elements
// record every add under the global rank first_rank + q.
template <class T, class Ctx>
EXC_HD EXC_INLINE float node_fold_element(Ctx& ctx, size_t i, const float* carry, int first_rank) {
  const int n = ctx.world_size();
  bool traced = false;
  if constexpr (Ctx::kTraceElements) traced = ctx.trace_element(i);
  float acc = 0.0f;
  for (int q = 0; q < n; ++q) {
    const T x = ctx.input(q)[i];
    const float before = q == 0 && carry != nullptr ? *carry : acc;
    acc = q == 0 && carry == nullptr ? contract::fold_begin<T>(x) : contract::fold_step<T>(before, x);
    if constexpr (Ctx::kTraceElements) {
      if (traced) ctx.trace_fold(i, first_rank + q, q == 0 && carry == nullptr ? 0.0f : before, to_float(x), acc);
    }
  }
  (void)traced;
  return acc;
}

// Stores the fold of element i (piece p, element e of the piece): unrounded into carry_out, or
// rounded once into its destination.
template <class T, class Ctx>
EXC_HD EXC_INLINE void node_fold_store(Ctx& ctx, const NodeFoldArgs<T>& a, int p, size_t e, size_t i, float acc) {
  if (a.carry_out != nullptr) {
    a.carry_out[static_cast<size_t>(p) * a.length + e] = acc;
    return;
  }
  const T out = contract::fold_end<T>(acc);
  if constexpr (Ctx::kTraceElements) {
    if (ctx.trace_element(i)) ctx.trace_round(i, acc, Storage<T>::bits(out));
  }
  (void)ctx, (void)i;
  T* dst = p == a.alt_piece ? a.rounded_alt : a.rounded + static_cast<size_t>(p) * a.length;
  dst[e] = out;
}

// Returns v with its low `bits` bits in reverse order (bits 0..30).
// Example: reverse_bits(1, 3) == 4; reverse_bits(6, 3) == 3.
EXC_HD EXC_INLINE int reverse_bits(int v, int bits) {
  int r = 0;
  for (int b = 0; b < bits; ++b) r |= ((v >> b) & 1) << (bits - 1 - b);
  return r;
}

// node_fold under the tree contract (Ctx::kContract == Contract::kTree): every element's tree over
// the node's L ranks in local rank order (the fold of core/collectives.h, contract::tree_in_place
// or TreeFold: one copy of the tree), rounded to storage into the piece's destination. Steps:
//   1. barrier when barrier_before: every local peer's input is in place;
//   2. for each piece, this block's share of its elements (block_share): the tree of the L local
//      inputs, with the compile-time world size for L <= 8 (every rank's pack loaded before the
//      first add), stored at rounded[slot * length + e] (slot = p, or reverse_bits(p, piece_bits))
//      or at rounded_alt[e] for alt_piece;
//   3. barrier when barrier_after.
// Preconditions: as node_fold; carry_in and carry_out null (the tree has no carry).
template <class T, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void node_tree_fold(Ctx& ctx, const NodeFoldArgs<T>& a) {
  constexpr int P = Storage<T>::kPack;
  uint32_t barriers = load_barrier_count(ctx);
  if (a.barrier_before) block_barrier<Protocol>(ctx, &barriers);
  for (int p = 0; p < a.pieces; ++p) {
    const size_t begin = a.first + static_cast<size_t>(p) * a.stride;
    const BlockShare share = block_share(begin, begin + a.length, P, ctx.block(), ctx.num_blocks());
    const int slot = a.piece_bits > 0 ? reverse_bits(p, a.piece_bits) : p;
    T* dst = p == a.alt_piece ? a.rounded_alt : a.rounded + static_cast<size_t>(slot) * a.length;
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("node_fold_tree");
      for (int q = 0; q < ctx.world_size(); ++q) trace_share(ctx, share, Access::kRead, q, Buffer::kInput);
      ctx.trace_step_end();
    }
    dispatch_world_size(ctx.world_size(), [&](auto ranks) {
      constexpr int kRanks = decltype(ranks)::value;
      fold_range_with<T, kRanks>(
          ctx, share, [&](int q) { return ctx.input(q); },
          [&](size_t i, const Pack<T>& out) { put_pack(ctx, dst + (i - begin), out); },
          [&](size_t i, T out) { dst[i - begin] = out; });
    });
  }
  if (a.barrier_after) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// The node's share of the carried fold (one kernel launch, one block of one local rank). Steps:
//   1. barrier when barrier_before: every local peer's input is in place;
//   2. for each piece, this block's share of its elements (block_share; the pack split changes no
//      bit): fold over the node's ranks in order, continuing carry_in (node_fold_element), and
//      store unrounded into carry_out or rounded into the piece's destination;
//   3. barrier when barrier_after (the launch after which this node reads no input of the call).
// Preconditions: every local rank of the node launches node_fold with the same grid and the same
// barrier flags (its pieces may differ); first + p * stride + length <= the inputs' elements.
template <class T, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void node_fold(Ctx& ctx, const NodeFoldArgs<T>& a) {
  if constexpr (fold_contract<Ctx>() == Contract::kTree) {
    node_tree_fold<T, Protocol>(ctx, a);
    return;
  }
  constexpr int P = Storage<T>::kPack;
  uint32_t barriers = load_barrier_count(ctx);
  if (a.barrier_before) block_barrier<Protocol>(ctx, &barriers);
  for (int p = 0; p < a.pieces; ++p) {
    const size_t begin = a.first + static_cast<size_t>(p) * a.stride;
    const BlockShare share = block_share(begin, begin + a.length, P, ctx.block(), ctx.num_blocks());
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin(a.carry_out != nullptr ? "node_fold_carry" : "node_fold_round");
      for (int q = 0; q < ctx.world_size(); ++q) trace_share(ctx, share, Access::kRead, q, Buffer::kInput);
      ctx.trace_step_end();
    }
    const float* carry = a.carry_in != nullptr ? a.carry_in + static_cast<size_t>(p) * a.length : nullptr;
    auto element = [&](size_t i) {
      const size_t e = i - begin;
      node_fold_store(ctx, a, p, e, i,
                      node_fold_element<T>(ctx, i, carry != nullptr ? carry + e : nullptr, a.first_rank));
    };
    for_share(
        ctx, share, P,
        [&](size_t i) {
          for (int u = 0; u < P; ++u) element(i + static_cast<size_t>(u));
        },
        element);
  }
  if (a.barrier_after) block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// What a node_tree_combine range holds, for element traces (the simulator's; a context that traces
// no element never reads it): which message element each range element is, and which node of the
// element's tree the combine computes.
// Range element e is message element first + q * stride + e % piece_length, q being the owner
// node reverse_bits(first_slot + e / piece_length, slot_bits): for the all-reduce one piece (the
// chunk slice: first its first element, piece_length its length, slot_bits 0); for the
// reduce-scatter the owners' pieces in bit-reversed order, as node_fold placed them (first, stride
// and piece_bits of its NodeFoldArgs).
struct CombineTrace {
  size_t first = 0;
  size_t stride = 0;
  size_t piece_length = 0;  // 0: the whole range is one piece
  int first_slot = 0;
  int slot_bits = 0;
  int left_rank = 0;   // the first global rank of the left subtree (the lower node group's)
  int right_rank = 0;  // the first global rank of the right subtree
  bool root = false;   // the node is the element's root: its round is traced after it
};

// Returns the message element that range element e holds (CombineTrace above).
// Example: {first 100, piece_length 8}: e = 3 is element 103; {first 5, stride 40, piece_length
// 10, first_slot 2, slot_bits 2}: e = 13 is slot 3, owner node reverse_bits(3, 2) = 3, element
// 5 + 3 * 40 + 3 = 128.
EXC_HD inline size_t combine_trace_index(const CombineTrace& t, size_t e) {
  if (t.piece_length == 0) return t.first + e;
  const int slot = t.first_slot + static_cast<int>(e / t.piece_length);
  return t.first + static_cast<size_t>(reverse_bits(slot, t.slot_bits)) * t.stride + e % t.piece_length;
}

// One node_tree_combine launch of one rank: `length` elements, all in this rank's own memory
// (offsets in elements of T).
struct NodeCombineArgs {
  size_t left = 0;         // the lower node group's subtree values, at scratch + left
  size_t right = 0;        // the higher node group's, at scratch + right
  size_t dst = 0;          // the combined values, at scratch + dst, or output + dst ...
  bool to_output = false;  // ... when to_output
  size_t length = 0;
  CombineTrace trace;  // element traces only
};

// Returns contract::tree_node(l, r) for range element e of a combine; a traced element records the
// node (trace_tree_node: the subtrees' first global ranks, both values, the fp32 sum, the node)
// and, at the root, its round.
template <class T, class Ctx>
EXC_HD EXC_INLINE T combine_element(Ctx& ctx, const CombineTrace& t, size_t e, T l, T r) {
  if constexpr (Ctx::kTraceElements) {
    const size_t i = combine_trace_index(t, e);
    if (ctx.trace_element(i)) {
      const float sum = contract::tree_sum(l, r);
      const T node = round_to<T>(sum);  // contract::tree_node(l, r)
      ctx.trace_tree_node(i, t.left_rank, t.right_rank, to_float(l), to_float(r), sum, Storage<T>::bits(node));
      if (t.root) ctx.trace_round(i, sum, Storage<T>::bits(node));
      return node;
    }
  } else {
    (void)ctx, (void)t, (void)e;
  }
  return contract::tree_node(l, r);
}

// The tree's combine of two node groups' subtrees (tree contract): dst[e] =
// contract::tree_node(left[e], right[e]) for e in [0, length), this block's share. No peer is
// read and no barrier passed: each rank combines what it holds and what its rail peer sent.
// dst may be left or right (in place). Pack loads and stores where all three ranges begin
// 16-byte aligned; element by element otherwise (a reduce-scatter piece may begin mid-pack).
template <class T, class Ctx>
EXC_HD void node_tree_combine(Ctx& ctx, const NodeCombineArgs& a) {
  constexpr int P = Storage<T>::kPack;
  const int me = ctx.rank();
  const T* left = ctx.scratch(me) + a.left;
  const T* right = ctx.scratch(me) + a.right;
  T* dst = (a.to_output ? ctx.output() : ctx.scratch(me)) + a.dst;
  const BlockShare share = block_share(0, a.length, P, ctx.block(), ctx.num_blocks());
  if constexpr (Ctx::kTraceSteps) {
    ctx.trace_step_begin("node_tree_combine");
    trace_share(ctx, share, Access::kRead, me, Buffer::kScratch, a.left);
    trace_share(ctx, share, Access::kRead, me, Buffer::kScratch, a.right);
    trace_share(ctx, share, Access::kWrite, me, a.to_output ? Buffer::kOutput : Buffer::kScratch, a.dst);
    ctx.trace_step_end();
  }
  auto element = [&](size_t e) { dst[e] = combine_element(ctx, a.trace, e, left[e], right[e]); };
  const uintptr_t addresses =
      reinterpret_cast<uintptr_t>(left) | reinterpret_cast<uintptr_t>(right) | reinterpret_cast<uintptr_t>(dst);
  const bool aligned = addresses % 16 == 0;
  for_share(
      ctx, share, P,
      [&](size_t e) {
        if (aligned) {
          const Pack<T> l = ctx.load(reinterpret_cast<const Pack<T>*>(left + e));
          const Pack<T> r = ctx.load(reinterpret_cast<const Pack<T>*>(right + e));
          Pack<T> out;
          for (int u = 0; u < P; ++u)
            out.v[u] = combine_element(ctx, a.trace, e + static_cast<size_t>(u), l.v[u], r.v[u]);
          ctx.store(reinterpret_cast<Pack<T>*>(dst + e), out);
        } else {
          for (int u = 0; u < P; ++u) element(e + static_cast<size_t>(u));
        }
      },
      element);
}

// One node_gather launch: the result of one all-reduce chunk, [chunk_begin, chunk_begin +
// chunk_length) of the message, whose local rank q's slice (two_shot_slice(chunk_length, pack, q,
// L)) lies in q's scratch at slot_offset + its position in the chunk.
struct NodeGatherArgs {
  size_t chunk_begin = 0;
  size_t chunk_length = 0;
  size_t slot_offset = 0;
};

// The all-reduce's intra-node gather of one chunk. Steps:
//   1. barrier: every local peer's slice of the chunk is in its slot (folded there on the last
//      node, received there on the others);
//   2. copy every local rank's slice (this rank's first, then rank+1, ...) from its slot into
//      output[chunk_begin + position] (a bit copy);
//   3. barrier (end): no local peer overwrites its slot (the chunk two later) or its input (the next
//      call) while this rank may still read it.
template <class T, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void node_gather(Ctx& ctx, const NodeGatherArgs& a) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  for (int k = 0; k < n; ++k) {
    const int q = (me + k) % n;
    const Slice s = two_shot_slice(a.chunk_length, P, q, n);
    const BlockShare share = block_share(s.begin, s.end, P, ctx.block(), ctx.num_blocks());
    if constexpr (Ctx::kTraceSteps) {
      ctx.trace_step_begin("node_gather");
      trace_share(ctx, share, Access::kRead, q, Buffer::kScratch, a.slot_offset);
      trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput, a.chunk_begin);
      ctx.trace_step_end();
    }
    copy_range<T>(ctx, share, ctx.scratch(q) + a.slot_offset, ctx.output() + a.chunk_begin, 0);
  }
  block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

// One node_gather_inputs launch of the all-gather: chunk [chunk_begin, chunk_begin + chunk_length)
// of every rank's input. Rank (node k', local q)'s chunk is local rank q's own input when k' is
// this node, else it lies in local rank q's scratch at slot_offset + k' * slot_stride (received
// from node k' over the network).
struct NodeGatherInputsArgs {
  size_t count = 0;  // elements per rank's input
  size_t chunk_begin = 0;
  size_t chunk_length = 0;
  int nodes = 1;
  int node = 0;
  size_t slot_offset = 0;
  size_t slot_stride = 0;
};

// The all-gather's intra-node step for one chunk. Steps:
//   1. barrier: every local peer has its inputs of this chunk from every node;
//   2. for every node k' and local rank q: copy rank (k', q)'s chunk into output[(k' L + q) count +
//      chunk_begin ...] (a bit copy);
//   3. barrier (end): no local peer overwrites its slots or its input while this rank reads them.
template <class T, class Protocol = TwoSetProtocol, class Ctx>
EXC_HD void node_gather_inputs(Ctx& ctx, const NodeGatherInputsArgs& a) {
  constexpr int P = Storage<T>::kPack;
  const int n = ctx.world_size();
  const int me = ctx.rank();
  uint32_t barriers = load_barrier_count(ctx);
  block_barrier<Protocol>(ctx, &barriers);
  const BlockShare share = block_share(0, a.chunk_length, P, ctx.block(), ctx.num_blocks());
  for (int node = 0; node < a.nodes; ++node) {
    for (int k = 0; k < n; ++k) {
      const int q = (me + k) % n;
      const bool own_node = node == a.node;
      const T* src = own_node ? ctx.input(q) + a.chunk_begin
                              : ctx.scratch(q) + a.slot_offset + static_cast<size_t>(node) * a.slot_stride;
      const size_t dst = static_cast<size_t>(node * n + q) * a.count + a.chunk_begin;
      if constexpr (Ctx::kTraceSteps) {
        ctx.trace_step_begin("node_gather_inputs");
        trace_share(ctx, share, Access::kRead, q, own_node ? Buffer::kInput : Buffer::kScratch,
                    own_node ? a.chunk_begin : a.slot_offset + static_cast<size_t>(node) * a.slot_stride);
        trace_share(ctx, share, Access::kWrite, me, Buffer::kOutput, dst);
        ctx.trace_step_end();
      }
      copy_range<T>(ctx, share, src, ctx.output() + dst, 0);
    }
  }
  block_barrier<Protocol>(ctx, &barriers);
  store_barrier_count(ctx, barriers);
}

}  // namespace exactcoll::multinode
