// The multi-node collectives: written once, as numbered steps against a primitives object (the
// transport concept below), for a world of M nodes x L local ranks numbered node-major
// (core/multinode_layout.h). Inside a node they launch the node kernels of core/multinode_kernels.h
// (IPC on GPUs); between nodes they move bytes through the transport (NCCL point-to-point on GPUs,
// cuda_backend/multinode; a simulated network in sim/multinode). Host-only.
//
// ---- Why these algorithms keep the contract's bits (docs/numerics.md, "Past one node") ---------------
// The contract's all-reduce is acc = float(x_0), acc = acc + float(x_r) for r = 1..n-1, one
// rounding. With node-major ranks the ranks of node k are kL..kL+L-1, so that left fold is node 0's
// fold continued by node 1's ranks, then node 2's, ...: the CARRY CHAIN. Each node adds its ranks to
// the unrounded fp32 accumulator it received from the node before and hands it on; the last node
// rounds. No addition is regrouped, so no bit changes. What does change bits, and is not done here:
// reducing each node first and then adding the node sums ((x0+x1)+(x2+x3) is not ((x0+x1)+x2)+x3 in
// fp32), or rounding the accumulator to storage between nodes.
//
// ---- Under the tree contract (tree_allreduce, tree_reduce_scatter below) ---------------------------
// tree(x_0 .. x_{n-1}) (core/contract.h) splits a power-of-two n in halves, so with node-major
// ranks and M, L powers of two it is the balanced tree over the M node subtrees, each the tree over
// its node's L ranks. Inside a node each local rank folds its slice into the node subtree (rounded);
// across nodes RECURSIVE DOUBLING over the rails: at step k = 0..log2(M)-1 node q and node q xor 2^k
// swap what they hold and both compute tree_node(lower node's value, higher node's value), which
// is the tree's node one level up (the aligned group of 2^(k+1) nodes), so both hold the same bits.
// log2(M) exchanges of the rounded slice (b bytes per element) where the chain takes M steps.
//
// ---- Bytes per element of the message, across one node boundary (bf16; docs/design.md has the diagram)
//   carry chain (this file):  an fp32 carry (4 bytes) forward + the rounded result (2 bytes) back
//                             around the ring, per element, shared by the node's L NICs (rail l
//                             carries local rank l's slice: 1/L of the message).
//   direct reduce-scatter:    every rank's raw input (2 bytes) to the slice owner, then the result:
//                             L x 2 bytes forward per element across a boundary instead of 4.
//   The chain saves cross-node bytes whenever L >= 3 (L = 2: equal; L = 1: direct is smaller).
//
// ---- The transport concept: a Prims for storage type T is one rank's handle, and supplies ------------
//   NodeLayout layout(); int node(); int local();            where this rank is
//   T* output();                                             this rank's output (local memory)
//   const T* input();                                        this rank's input as its peers read it
//   T* scratch();                                            this rank's symmetric scratch (local
//                                                            peers read it in node kernels)
//   float* carry_in(); float* carry_out();                   this rank's fp32 carry buffers
//   Contract contract();                                     the contract fold() folds under:
//                                                            canonical (the chain) or tree
//   void group(const Transfer* transfers, int count)         one group of sends and receives that
//        progress together and are all complete before anything after the call on this rank
//        (NCCL: ncclGroupStart, ncclSend/ncclRecv..., ncclGroupEnd on the rank's stream). Between
//        two ranks, the k-th send from a to b is the k-th receive on b from a (NCCL's rule); the
//        tags must match too (the simulator checks them).
//   void fold(const NodeFoldArgs<T>&)                       node kernels: every local rank of the
//   void gather(const NodeGatherArgs&)                      node launches the same sequence, as a
//   void gather_inputs(const NodeGatherInputsArgs&)         kernel on each GPU's stream
//   void combine(const NodeCombineArgs&)                     node_tree_combine: a kernel on this
//                                                            rank's own memory (tree contract)
//   void copy(T* dst, const T* src, size_t elements)         a local copy (no peer involved)
// The functions below are the only code that decides what crosses a node boundary.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/collectives.h"
#include "core/multinode_kernels.h"
#include "core/multinode_layout.h"
#include "core/op.h"
#include "core/storage.h"

namespace exactcoll::multinode {

using exactcoll::Op;  // core/op.h
using exactcoll::op_name;

// What a message carries (traces, and the simulator's matching check).
// kPartial: a rounded subtree of the tree contract (recursive doubling and halving).
enum class Payload : uint8_t { kCarry, kResult, kInput, kPartial };

inline const char* payload_name(Payload p) {
  return p == Payload::kCarry ? "carry" : p == Payload::kResult ? "result" : p == Payload::kInput ? "input" : "partial";
}

struct Transfer {
  bool send = true;  // false: receive
  int peer = 0;      // global rank
  void* data = nullptr;
  size_t bytes = 0;
  Payload payload = Payload::kCarry;
  uint32_t chunk = 0;
};

// "carry chunk 3 (512 bytes) from rank 1 (node 0, local rank 1)": a transfer as waits and errors
// name it.
inline std::string transfer_text(const NodeLayout& layout, const Transfer& t) {
  return std::string(payload_name(t.payload)) + " chunk " + std::to_string(t.chunk) + " (" + std::to_string(t.bytes) +
         " bytes)" + (t.send ? " to " : " from ") + rank_text(layout, t.peer);
}

// Elements of the message handled per pipeline step. A multiple of 64 (so every chunk begins
// 16-byte aligned); smaller chunks fill the chain sooner, larger ones send fewer messages.
inline constexpr size_t kDefaultChunkElements = size_t{1} << 20;

// Per-rank buffer sizes a call needs (the backends allocate them; the same on every rank).
struct BufferNeeds {
  size_t carry_floats = 0;      // each of carry_in and carry_out
  size_t scratch_elements = 0;  // of T, symmetric
};

// Returns the chunk length of op's pipeline for `chunk_elements` requested: the all-reduce cuts the
// message itself; reduce-scatter cuts each owner's piece and all-gather each rank's input into
// chunk_elements / M (so a step still moves about chunk_elements per rank); at least 64, a multiple
// of 64.
inline size_t piece_chunk(Op op, const NodeLayout& layout, size_t chunk_elements) {
  const size_t c = op == Op::kAllReduce ? chunk_elements : chunk_elements / static_cast<size_t>(layout.nodes);
  return std::max<size_t>(64, c / 64 * 64);
}

// Returns the elements of one pipeline slot for a message of `total` elements cut into `chunk`s:
// the chunk, or the whole message rounded up to a multiple of 64 when it is shorter. buffer_needs
// sizes the slots by it, and an algorithm that keeps several slots side by side must place them by
// it too (all-gather placed them `chunk` apart once, past the end of a short message's scratch).
// Why a multiple of 64: slot k begins at k * slot_elements, and the node kernels read a slot in
// 16-byte packs. An unrounded slot of 4099 bf16 put node 1's slot at byte 8198, and the GPU
// faulted (cudaErrorMisalignedAddress); `chunk` is already a multiple of 64.
// Example: slot_elements(1 << 20, 4099) == 4160; slot_elements(1 << 20, 1 << 21) == 1 << 20.
inline size_t slot_elements(size_t chunk, size_t total) {
  return std::min(chunk, (std::max<size_t>(total, 1) + 63) / 64 * 64);
}

// Returns the buffers op needs for `count` elements per rank (all-reduce, all-gather: the input;
// reduce-scatter: the input, count / n per owner) under `contract` (canonical: the chain; tree:
// tree_allreduce and tree_reduce_scatter, no carry).
template <class T>
BufferNeeds buffer_needs(Op op, const NodeLayout& layout, size_t count, size_t chunk_elements,
                         Contract contract = Contract::kCanonical) {
  constexpr size_t P = Storage<T>::kPack;
  const size_t M = static_cast<size_t>(layout.nodes), L = static_cast<size_t>(layout.local_ranks);
  const size_t c = piece_chunk(op, layout, chunk_elements);
  BufferNeeds b;
  if (contract == Contract::kTree && op == Op::kAllReduce) {
    b.scratch_elements = 2 * slot_elements(c, count);  // the node subtree's slot, the partner's slot
  } else if (contract == Contract::kTree && op == Op::kReduceScatter) {
    // The M pieces of a chunk, and the M / 2 the first halving step receives.
    b.scratch_elements = (M + M / 2) * slot_elements(c, count / (M * L));
  } else if (op == Op::kAllReduce) {
    const size_t chunk = slot_elements(c, count);
    // The carry holds one local slice of a chunk; the last local rank's is the longest (it takes
    // the remainder packs and the tail). A short last chunk can give it more than a full one does:
    // 48 elements over 4 local ranks are slices of 1, 1, 1 and 3 packs, a full 64 slices of 2.
    auto last_slice = [&](size_t length) { return length / P / L * P + length % P + (length / P % L) * P; };
    b.carry_floats = std::max(last_slice(chunk), last_slice(count % chunk));
    b.scratch_elements = 2 * chunk;  // two result slots
  } else if (op == Op::kReduceScatter) {
    const size_t per = count / (M * L);
    const size_t piece = slot_elements(c, per);
    b.carry_floats = M * piece;
    b.scratch_elements = 2 * (M > 1 ? M - 1 : 1) * piece;  // results in flight, two slots
  } else {
    const size_t piece = slot_elements(c, count);
    b.carry_floats = 0;
    b.scratch_elements = M * piece;  // one slot per node
  }
  return b;
}

namespace detail {

struct ChunkRange {
  size_t begin = 0, length = 0;
};

inline size_t chunk_count(size_t total, size_t chunk) { return total == 0 ? 0 : (total + chunk - 1) / chunk; }

inline ChunkRange chunk_range(size_t total, size_t chunk, long j) {
  const size_t begin = static_cast<size_t>(j) * chunk;
  return {begin, std::min(chunk, total - begin)};
}

// Adds a transfer to a group under construction.
struct GroupBuilder {
  Transfer items[8];
  int size = 0;
  void add(bool send, int peer, const void* data, size_t bytes, Payload payload, long chunk) {
    if (bytes == 0) return;
    if (size == 8) throw std::logic_error("multinode: more than 8 transfers in one group");
    items[size++] = Transfer{send, peer, const_cast<void*>(data), bytes, payload, static_cast<uint32_t>(chunk)};
  }
};

}  // namespace detail

// All-reduce across nodes: every rank's output[i] = the contract's fold over ranks 0..n-1 of
// input_r[i], the bits of the one-node all-reduce (docs/numerics.md section 4).
// Preconditions: every rank calls with the same count and chunk_elements (a multiple of 64); the
// Prims' buffers hold buffer_needs<T>(kAllReduce, ...); inputs in place before the call.
// Example: 2 nodes x 2 ranks, count 16, one chunk: local rank 0 owns elements 0..7, local rank 1
// 8..15. Step 0: node 0 folds x_0 + x_1 into its carry. Step 1: the carry goes 0 -> 1 (fp32);
// node 1 adds x_2, x_3 and rounds. Step 2: the rounded slice goes 1 -> 0. Every node gathers its
// two slices (IPC).
// Steps, on rank (node k, local l), for the chunks j of the message (a ring over the nodes of rail
// l: prev = (k-1, l), next = (k+1, l), both mod M; this rank's slice of chunk j is
// two_shot_slice(chunk length, pack, l, L)):
//   for t = 0 .. J - 1 + 2(M - 1):
//     1. one group with the ring neighbours (receives and sends progress together, so no rank
//        waits on a neighbour that waits on it):
//          receive from prev  the carry of chunk t - k           (k >= 1)
//          receive from prev  the result of chunk t - M - k      (k <= M - 2)
//          send to next       the carry of chunk t - 1 - k       (k <= M - 2), folded last step
//          send to next       the result of chunk t - M          (k = M - 1), rounded last step
//                             or of chunk t - 1 - M - k          (k <= M - 3), received last step;
//     2. fold chunk t - k: this node's ranks continue the carry (node 0 begins the fold); node
//        M - 1 rounds into result slot (t - k) % 2 of its scratch, the others keep an fp32 carry;
//     3. gather the chunk whose result arrived here (node M - 1: the one it just rounded) from the
//        node's slots into output (node_gather: barrier, copy, barrier).
// Chunk j is folded on node k at step j + k, rounded at step j + M - 1 and reaches node k <= M - 2
// at step j + M + k, so every receive meets the send its neighbour posts in the same step. Two
// result slots: a step forwards chunk j from one slot while receiving chunk j + 1 into the other;
// the gather's end barrier keeps a slot until every local peer has copied it. (result_slots = 1 is
// the broken variant tests/sim/multinode/multinode_sim_test.cc shows the seeded network catching: a
// forwarding node's receive of chunk j + 1 can land before its send of chunk j has left.)
template <class T, class Prims>
void allreduce(Prims& p, size_t count, size_t chunk_elements = kDefaultChunkElements, int result_slots = 2) {
  constexpr int P = Storage<T>::kPack;
  const NodeLayout layout = p.layout();
  const int M = layout.nodes, L = layout.local_ranks, k = p.node(), l = p.local();
  const size_t chunk = piece_chunk(Op::kAllReduce, layout, chunk_elements);
  const long J = static_cast<long>(detail::chunk_count(count, chunk));
  const int prev = layout.rank_of((k + M - 1) % M, l), next = layout.rank_of((k + 1) % M, l);
  auto valid = [&](long j) { return j >= 0 && j < J; };
  auto range = [&](long j) { return detail::chunk_range(count, chunk, j); };
  auto slice = [&](long j) { return two_shot_slice(range(j).length, P, l, L); };
  auto slot_offset = [&](long j) { return static_cast<size_t>(j % result_slots) * chunk; };
  auto slot = [&](long j) { return p.scratch() + slot_offset(j); };
  const size_t ef = sizeof(float), et = sizeof(T);
  for (long t = 0; t < J + 2 * (M - 1); ++t) {
    // 1. The ring exchange of this step.
    detail::GroupBuilder g;
    const long fold_chunk = t - k, result_in = t - M - k;
    if (k >= 1 && valid(fold_chunk)) {
      g.add(false, prev, p.carry_in(), (slice(fold_chunk).end - slice(fold_chunk).begin) * ef, Payload::kCarry,
            fold_chunk);
    }
    if (k <= M - 2 && valid(result_in)) {
      const Slice s = slice(result_in);
      g.add(false, prev, slot(result_in) + s.begin, (s.end - s.begin) * et, Payload::kResult, result_in);
    }
    if (k <= M - 2 && valid(t - 1 - k)) {
      g.add(true, next, p.carry_out(), (slice(t - 1 - k).end - slice(t - 1 - k).begin) * ef, Payload::kCarry,
            t - 1 - k);
    }
    const long result_out = k == M - 1 ? t - M : k <= M - 3 ? t - 1 - M - k : -1;
    if (M >= 2 && valid(result_out)) {
      const Slice s = slice(result_out);
      g.add(true, next, slot(result_out) + s.begin, (s.end - s.begin) * et, Payload::kResult, result_out);
    }
    if (g.size > 0) p.group(g.items, g.size);
    // 2. This node's ranks continue the fold of chunk t - k.
    if (valid(fold_chunk)) {
      const Slice s = slice(fold_chunk);
      NodeFoldArgs<T> a;
      a.first = range(fold_chunk).begin + s.begin;
      a.length = s.end - s.begin;
      a.first_rank = layout.rank_of(k, 0);
      a.carry_in = k >= 1 ? p.carry_in() : nullptr;
      a.carry_out = k <= M - 2 ? p.carry_out() : nullptr;
      a.rounded = slot(fold_chunk) + s.begin;
      a.barrier_before = fold_chunk == 0;
      p.fold(a);
    }
    // 3. Gather the chunk whose result is now in this node's slots.
    const long gathered = k == M - 1 ? fold_chunk : result_in;
    if (valid(gathered)) {
      p.gather(NodeGatherArgs{range(gathered).begin, range(gathered).length, slot_offset(gathered)});
    }
  }
}

// Reduce-scatter across nodes: rank r's output[e] = the contract's fold over ranks 0..n-1 of
// input[r * per + e], per = count / n (the bits of the one-node reduce_scatter).
// Preconditions: count % n == 0; as allreduce.
// Rail l carries the pieces of the owners (k', l), k' = 0..M-1. Steps, on rank (node k, local l),
// for the chunks j of a piece (elements [jC, jC + c) of every owner's piece):
//   for t = 0 .. J - 1 + 2(M - 1):
//     1. one group with the ring neighbours:
//          receive from prev  the carry of chunk t - k, all M pieces        (k >= 1)
//          receive from prev  the results of chunk t - M - k for owners k..M-2  (k <= M - 2)
//          send to next       the carry of chunk t - 1 - k                  (k <= M - 2)
//          send to next       the results of chunk t - M for owners 0..M-2   (k = M - 1)
//                             or of chunk t - 1 - M - k for owners k+1..M-2   (k <= M - 3);
//     2. fold chunk t - k of the M pieces (node 0 begins, node M - 1 rounds: its own piece into
//        output, the others' into result slot (t - k) % 2);
//     3. node k <= M - 2: copy its own piece of the results that arrived (chunk t - M - k) from the
//        slot into output.
// The last fold of a node passes a barrier after it (no local peer restages its input while one
// still folds it).
template <class T, class Prims>
void reduce_scatter(Prims& p, size_t count, size_t chunk_elements = kDefaultChunkElements) {
  const NodeLayout layout = p.layout();
  const int M = layout.nodes, L = layout.local_ranks, k = p.node(), l = p.local();
  const size_t n = static_cast<size_t>(M) * static_cast<size_t>(L);
  if (count % n != 0) {
    throw std::invalid_argument("reduce_scatter: count " + std::to_string(count) + " is not a multiple of the " +
                                std::to_string(n) + " ranks");
  }
  const size_t per = count / n;
  const size_t chunk = piece_chunk(Op::kReduceScatter, layout, chunk_elements);
  const long J = static_cast<long>(detail::chunk_count(per, chunk));
  const int prev = layout.rank_of((k + M - 1) % M, l), next = layout.rank_of((k + 1) % M, l);
  auto valid = [&](long j) { return j >= 0 && j < J; };
  auto len = [&](long j) { return detail::chunk_range(per, chunk, j).length; };
  // Slot s holds results of owners (first_owner .. M-2) of one chunk, contiguous, owner order.
  const size_t slot_span = static_cast<size_t>(M > 1 ? M - 1 : 1) * chunk;
  auto slot = [&](long j) { return p.scratch() + static_cast<size_t>(j % 2) * slot_span; };
  const size_t ef = sizeof(float), et = sizeof(T);
  for (long t = 0; t < J + 2 * (M - 1); ++t) {
    // 1. The ring exchange of this step. A node receives the results for owners k..M-2 at the
    //    start of its slot and forwards those of owners k+1..M-2 (after its own).
    detail::GroupBuilder g;
    const long fold_chunk = t - k, result_in = t - M - k;
    if (k >= 1 && valid(fold_chunk)) {
      g.add(false, prev, p.carry_in(), static_cast<size_t>(M) * len(fold_chunk) * ef, Payload::kCarry, fold_chunk);
    }
    if (k <= M - 2 && valid(result_in)) {
      g.add(false, prev, slot(result_in), static_cast<size_t>(M - 1 - k) * len(result_in) * et, Payload::kResult,
            result_in);
    }
    if (k <= M - 2 && valid(t - 1 - k)) {
      g.add(true, next, p.carry_out(), static_cast<size_t>(M) * len(t - 1 - k) * ef, Payload::kCarry, t - 1 - k);
    }
    if (M >= 2 && k == M - 1 && valid(t - M)) {
      g.add(true, next, slot(t - M), static_cast<size_t>(M - 1) * len(t - M) * et, Payload::kResult, t - M);
    } else if (k <= M - 3 && valid(t - 1 - M - k)) {
      const long j = t - 1 - M - k;
      g.add(true, next, slot(j) + len(j), static_cast<size_t>(M - 2 - k) * len(j) * et, Payload::kResult, j);
    }
    if (g.size > 0) p.group(g.items, g.size);
    // 2. Fold this chunk of the M pieces of rail l.
    if (valid(fold_chunk)) {
      NodeFoldArgs<T> a;
      a.first = static_cast<size_t>(l) * per + static_cast<size_t>(fold_chunk) * chunk;
      a.stride = static_cast<size_t>(L) * per;
      a.length = len(fold_chunk);
      a.pieces = M;
      a.first_rank = layout.rank_of(k, 0);
      a.carry_in = k >= 1 ? p.carry_in() : nullptr;
      a.carry_out = k <= M - 2 ? p.carry_out() : nullptr;
      a.rounded = slot(fold_chunk);
      a.rounded_alt = p.output() + static_cast<size_t>(fold_chunk) * chunk;
      a.alt_piece = M - 1;
      a.barrier_before = fold_chunk == 0;
      a.barrier_after = fold_chunk == J - 1;
      p.fold(a);
    }
    // 3. Keep this rank's own piece of the results that arrived.
    if (k <= M - 2 && valid(result_in)) {
      p.copy(p.output() + static_cast<size_t>(result_in) * chunk, slot(result_in), len(result_in));
    }
  }
}

// All-gather across nodes: rank r's output[q * count + i] = input_q[i] for every rank q (a bit
// copy). Steps, on rank (node k, local l), for the chunks j of the input:
//   1. one group: send this rank's chunk j to rank (k', l) of every other node k', and receive
//      theirs into slot k' of this rank's scratch (direct: each NIC sends its input M - 1 times,
//      which is what a ring would forward too, in one hop);
//   2. node_gather_inputs: every local rank's chunks, of every node, into output.
template <class T, class Prims>
void allgather(Prims& p, size_t count, size_t chunk_elements = kDefaultChunkElements) {
  const NodeLayout layout = p.layout();
  const int M = layout.nodes, k = p.node(), l = p.local();
  const size_t chunk = piece_chunk(Op::kAllGather, layout, chunk_elements);
  const long J = static_cast<long>(detail::chunk_count(count, chunk));
  const size_t slot = slot_elements(chunk, count);  // node k' 's chunk lands at scratch + k' * slot
  const size_t et = sizeof(T);
  for (long j = 0; j < J; ++j) {
    const detail::ChunkRange r = detail::chunk_range(count, chunk, j);
    // 1. Exchange with the same local rank of every other node (at most 4 peers per group).
    for (int first = 1; first < M; first += 4) {
      detail::GroupBuilder g;
      for (int h = first; h < M && h < first + 4; ++h) {
        const int to = (k + h) % M, from = (k + M - h) % M;
        g.add(true, layout.rank_of(to, l), p.input() + r.begin, r.length * et, Payload::kInput, j);
        g.add(false, layout.rank_of(from, l), p.scratch() + static_cast<size_t>(from) * slot, r.length * et,
              Payload::kInput, j);
      }
      p.group(g.items, g.size);
    }
    // 2. The node's gather.
    NodeGatherInputsArgs a;
    a.count = count;
    a.chunk_begin = r.begin;
    a.chunk_length = r.length;
    a.nodes = M;
    a.node = k;
    a.slot_offset = 0;
    a.slot_stride = slot;
    p.gather_inputs(a);
  }
}

// ---- The tree contract across nodes ---------------------------------------------------------------

inline bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

// Returns "" when the tree contract runs on layout, else why not: one node (any L: the node's own
// tree), or M and L both powers of two. Why: tree(x_0 .. x_{n-1}) puts the largest power of two
// below n on the left (core/contract.h), so it is the tree over node subtrees exactly when every
// node's ranks form a subtree (L a power of two) and the nodes' own tree is balanced (M a power of
// two, which recursive doubling needs; the tree rule over M node values for other M would need an
// exchange of another shape, not built).
// Example: check_tree_layout({4, 2}) == ""; check_tree_layout({3, 2}) names 3 nodes.
inline std::string check_tree_layout(const NodeLayout& layout) {
  if (layout.nodes == 1 || (is_power_of_two(layout.nodes) && is_power_of_two(layout.local_ranks))) return "";
  return "the tree contract across nodes needs a power-of-two number of nodes and of ranks per node (the tree "
         "over all ranks is then the tree over the nodes' subtrees, combined by recursive doubling); this job has " +
         std::to_string(layout.nodes) + " nodes of " + std::to_string(layout.local_ranks) + " ranks";
}

namespace detail {

inline int log2_exact(int v) {
  int k = 0;
  while ((1 << k) < v) ++k;
  return k;
}

// The node of the tree that a recursive doubling or halving step computes, for element traces:
// it joins node k's group and its partner's (the nodes that agree with each on every node bit not
// combined yet), the lower group being the left subtree; the last step's node is the root.
// Example: 4 nodes x 2, node 3, partner 1 (bit 1), combined 0b01: groups {2, 3} and {0, 1}, so
// left rank 0, right rank 4.
inline CombineTrace combined_subtrees(const NodeLayout& layout, int k, int partner, int combined, bool root) {
  const int mine = k & ~combined, theirs = partner & ~combined;
  CombineTrace t;
  t.left_rank = layout.rank_of(std::min(mine, theirs), 0);
  t.right_rank = layout.rank_of(std::max(mine, theirs), 0);
  t.root = root;
  return t;
}

// Throws unless p folds under the tree contract on a layout the tree runs on.
template <class Prims>
void require_tree(const Prims& p, const char* what) {
  if (p.contract() != Contract::kTree) {
    throw std::logic_error(std::string(what) + ": the transport's node folds are not under the tree contract");
  }
  if (const std::string problem = check_tree_layout(p.layout()); !problem.empty()) {
    throw std::invalid_argument(std::string(what) + ": " + problem);
  }
}

}  // namespace detail

// All-reduce under the tree contract: every rank's output[i] = contract::tree_fold over ranks
// 0..n-1 of input_r[i], the bits of the one-node tree all-reduce of n ranks.
// Preconditions: check_tree_layout(layout) == "" (else std::invalid_argument); p.contract() is
// tree; every rank calls with the same count and chunk_elements; buffers as buffer_needs<T>(
// kAllReduce, ..., Contract::kTree) (scratch: two slots of a chunk); inputs in place.
// Why the bits are the tree's: with node-major ranks, M = 2^m and L = 2^l, the tree over n = 2^(m+l)
// ranks is, level by level, the tree over each node's L ranks (levels 1..l), then over aligned
// groups of 2, 4, ..., M nodes (levels l+1..l+m). Step 1 computes the node levels (node_fold under
// tree); step 2's k-th exchange computes level l+k+1: node q's value is the subtree of its aligned
// group of 2^k nodes, its partner q xor 2^k holds the neighbouring group's, and the lower group is
// the left child. tree_node rounds one fp32 add of the two, and fp32 addition is commutative, so the
// two partners compute the same bits (both pass the lower group's value as left, as the tree
// reads).
// Example: 2 nodes x 2 ranks, x = a, b | c, d: node 0 folds tree_node(a, b), node 1 tree_node(c, d)
// (each local rank its slice); rail l swaps them; both compute tree_node(tree_node(a, b),
// tree_node(c, d)) = contract::tree_fold over a, b, c, d.
// Steps, on rank (node k, local l), for each chunk j of the message (its slice: two_shot_slice of
// the chunk, as the chain's):
//   1. node_fold (tree): the tree over the node's L inputs of this slice, rounded, into slot 0 of
//      this rank's scratch (at the slice's place in the chunk);
//   2. for s = 0 .. log2(M) - 1: one group with rank (k xor 2^s, l): send slot 0's slice, receive
//      the partner's into slot 1; then node_tree_combine: slot 0 = tree_node(lower node's, higher
//      node's);
//   3. node_gather of the chunk (barrier, copy every local rank's slot-0 slice, barrier), as the
//      chain's last step.
// steps_top_down: a broken variant for the tests only (pairs nodes at distance M / 2 first, a
// different tree: caught for M >= 4).
template <class T, class Prims>
void tree_allreduce(Prims& p, size_t count, size_t chunk_elements = kDefaultChunkElements,
                    bool steps_top_down = false) {
  constexpr int P = Storage<T>::kPack;
  detail::require_tree(p, "tree_allreduce");
  const NodeLayout layout = p.layout();
  const int M = layout.nodes, L = layout.local_ranks, k = p.node(), l = p.local();
  const int steps = detail::log2_exact(M);
  const size_t chunk = piece_chunk(Op::kAllReduce, layout, chunk_elements);
  const size_t slot = slot_elements(chunk, count);  // slot 1 (the partner's values) begins here
  const long J = static_cast<long>(detail::chunk_count(count, chunk));
  const size_t et = sizeof(T);
  for (long j = 0; j < J; ++j) {
    const detail::ChunkRange r = detail::chunk_range(count, chunk, j);
    const Slice s = two_shot_slice(r.length, P, l, L);
    const size_t length = s.end - s.begin;
    // 1. The node's subtree of this rank's slice.
    NodeFoldArgs<T> a;
    a.first = r.begin + s.begin;
    a.length = length;
    a.first_rank = layout.rank_of(k, 0);
    a.rounded = p.scratch() + s.begin;
    a.barrier_before = j == 0;
    p.fold(a);
    // 2. Recursive doubling over rail l.
    int combined = 0;  // the node bits that the steps so far joined
    for (int step = 0; step < steps; ++step) {
      const int bit = 1 << (steps_top_down ? steps - 1 - step : step);
      const int partner = k ^ bit;
      detail::GroupBuilder g;
      g.add(true, layout.rank_of(partner, l), p.scratch() + s.begin, length * et, Payload::kPartial, j);
      g.add(false, layout.rank_of(partner, l), p.scratch() + slot + s.begin, length * et, Payload::kPartial, j);
      if (g.size > 0) p.group(g.items, g.size);
      NodeCombineArgs c;
      c.left = k < partner ? s.begin : slot + s.begin;
      c.right = k < partner ? slot + s.begin : s.begin;
      c.dst = s.begin;
      c.length = length;
      c.trace = detail::combined_subtrees(layout, k, partner, combined, step == steps - 1);
      c.trace.first = r.begin + s.begin;  // the slice, one piece
      c.trace.piece_length = length;
      p.combine(c);
      combined |= bit;
    }
    // 3. Every local rank's slice of the chunk into output.
    p.gather(NodeGatherArgs{r.begin, r.length, 0});
  }
}

// Reduce-scatter under the tree contract: rank r's output[e] = contract::tree_fold over ranks
// 0..n-1 of input[r * per + e], per = count / n (the bits of the one-node tree reduce-scatter).
// Preconditions: count % n == 0; as tree_allreduce (buffers: buffer_needs<T>(kReduceScatter, ...,
// Contract::kTree)).
// Rail l carries the pieces of the owners (k', l), k' = 0..M-1, by RECURSIVE HALVING in the tree's
// order (nodes at distance 1 first): after step s a node holds, for the owners whose node agrees
// with its own on bits 0..s, the subtree of its aligned group of 2^(s+1) nodes; the last step
// leaves it its own piece, the tree over all nodes. The pieces sit in bit-reversed owner order
// (node_fold's piece_bits), so that each step's kept and sent halves are contiguous. A node's NIC
// sends M/2 + M/4 + ... + 1 = M - 1 pieces per chunk. Steps, on rank (node k, local l), for each
// chunk j of a piece (elements [jC, jC + c) of every owner's piece):
//   1. node_fold (tree) of the M pieces of rail l into scratch, owner k' at bit-reversed position
//      (M = 1: this rank's piece straight into output);
//   2. for s = 0 .. log2(M) - 1, holding M / 2^s pieces (from position `first`): one group with
//      rank (k xor 2^s, l): send the half whose owners differ from k in bit s, receive the
//      partner's values of the kept half; node_tree_combine of the kept half (the lower node's
//      values left), in place, or into output at the last step.
// The last fold passes a barrier after it (no local peer restages its input while one still
// folds it).
// Example: 4 nodes, rail l; positions hold owners 0, 2, 1, 3 (bit-reversed). Node 1 (bits 01):
// step 0 with node 0 keeps positions 2..3 (owners 1, 3: bit 0 set) and sends 0..1; step 1 with
// node 3 keeps position 2 (owner 1) and sends position 3, combining into output.
template <class T, class Prims>
void tree_reduce_scatter(Prims& p, size_t count, size_t chunk_elements = kDefaultChunkElements) {
  detail::require_tree(p, "tree_reduce_scatter");
  const NodeLayout layout = p.layout();
  const int M = layout.nodes, L = layout.local_ranks, k = p.node(), l = p.local();
  const size_t n = static_cast<size_t>(M) * static_cast<size_t>(L);
  if (count % n != 0) {
    throw std::invalid_argument("reduce_scatter: count " + std::to_string(count) + " is not a multiple of the " +
                                std::to_string(n) + " ranks");
  }
  const int steps = detail::log2_exact(M);
  const size_t per = count / n;
  const size_t chunk = piece_chunk(Op::kReduceScatter, layout, chunk_elements);
  const long J = static_cast<long>(detail::chunk_count(per, chunk));
  const size_t et = sizeof(T);
  for (long j = 0; j < J; ++j) {
    const size_t len = detail::chunk_range(per, chunk, j).length;
    const size_t received = static_cast<size_t>(M) * len;  // where a step's incoming half lands
    // 1. The node subtrees of the M pieces of rail l.
    NodeFoldArgs<T> a;
    a.first = static_cast<size_t>(l) * per + static_cast<size_t>(j) * chunk;
    a.stride = static_cast<size_t>(L) * per;
    a.length = len;
    a.pieces = M;
    a.first_rank = layout.rank_of(k, 0);
    a.rounded = p.scratch();
    a.piece_bits = steps;
    if (M == 1) {
      a.rounded_alt = p.output() + static_cast<size_t>(j) * chunk;
      a.alt_piece = 0;
    }
    a.barrier_before = j == 0;
    a.barrier_after = j == J - 1;
    p.fold(a);
    // 2. Recursive halving over rail l: positions [first, first + held) are held.
    size_t first = 0, held = static_cast<size_t>(M);
    for (int s = 0; s < steps; ++s) {
      const int partner = k ^ (1 << s);
      const size_t half = held / 2;
      const bool upper = ((k >> s) & 1) != 0;  // this node keeps the owners with bit s set
      const size_t kept = first + (upper ? half : 0), sent = first + (upper ? 0 : half);
      detail::GroupBuilder g;
      g.add(true, layout.rank_of(partner, l), p.scratch() + sent * len, half * len * et, Payload::kPartial, j);
      g.add(false, layout.rank_of(partner, l), p.scratch() + received, half * len * et, Payload::kPartial, j);
      if (g.size > 0) p.group(g.items, g.size);
      NodeCombineArgs c;
      c.left = k < partner ? kept * len : received;
      c.right = k < partner ? received : kept * len;
      c.to_output = s == steps - 1;
      c.dst = c.to_output ? static_cast<size_t>(j) * chunk : kept * len;
      c.length = half * len;
      c.trace = detail::combined_subtrees(layout, k, partner, (1 << s) - 1, c.to_output);
      c.trace.first = a.first;  // the kept owners' pieces, where node_fold placed them
      c.trace.stride = a.stride;
      c.trace.piece_length = len;
      c.trace.first_slot = static_cast<int>(kept);
      c.trace.slot_bits = steps;
      p.combine(c);
      first = kept;
      held = half;
    }
  }
}

}  // namespace exactcoll::multinode
