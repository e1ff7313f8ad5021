// What one launch of a collective kernel needs, as plain data: filled by the host (communicator.cc,
// compiled by g++), passed by value as a __grid_constant__ kernel parameter (kernels.cuh, nvcc).
// No CUDA headers, so host code and tests include it freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/op.h"
#include "core/signal.h"

namespace exactcoll::cuda {

// The collectives the IPC kernels implement (core/op.h) and the algorithms (core/registry.h).
using exactcoll::Algorithm;
using exactcoll::Op;
using exactcoll::op_name;
using exactcoll::output_count;

// Which core template a kernel runs (the all-reduce algorithms, reduce_scatter, allgather),
// or kBarrier: one barrier of the signal protocol and nothing else (copy-engine steps, line-ups).
enum class KernelKind : int {
  kOneShot = 0,
  kTwoShot = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBarrier = 4,
  kPushOneShot = 5,     // allreduce_push_one_shot: scratch of push_scratch_elements(count, pack, n)
  kPushTwoShot = 6,     // allreduce_push_two_shot: the same scratch as push_one_shot
  kLamportOneShot = 7,  // allreduce_lamport_one_shot: the Lamport region, no staging (core/lamport.h)
  kLamportTwoShot = 8,  // allreduce_lamport_two_shot: the same region
};

// The SM kernel of (op, algorithm) on the IPC path, or nullopt where there is none (auto, nccl,
// copy_engine, and algorithms the op does not have). Exhaustive over the registry's algorithms, so
// a new one fails to compile (-Wswitch) until it is placed here.
constexpr std::optional<KernelKind> sm_kernel_kind(Op op, Algorithm algo) {
  switch (algo) {
    case Algorithm::kOneShot: return op == Op::kAllReduce ? std::optional(KernelKind::kOneShot) : std::nullopt;
    case Algorithm::kTwoShot: return op == Op::kAllReduce ? std::optional(KernelKind::kTwoShot) : std::nullopt;
    case Algorithm::kPushOneShot: return op == Op::kAllReduce ? std::optional(KernelKind::kPushOneShot) : std::nullopt;
    case Algorithm::kPushTwoShot: return op == Op::kAllReduce ? std::optional(KernelKind::kPushTwoShot) : std::nullopt;
    case Algorithm::kLamportOneShot:
      return op == Op::kAllReduce ? std::optional(KernelKind::kLamportOneShot) : std::nullopt;
    case Algorithm::kLamportTwoShot:
      return op == Op::kAllReduce ? std::optional(KernelKind::kLamportTwoShot) : std::nullopt;
    case Algorithm::kDirect:
      switch (op) {
        case Op::kAllReduce: return std::nullopt;
        case Op::kReduceScatter: return KernelKind::kReduceScatter;
        case Op::kAllGather: return KernelKind::kAllGather;
      }
      return std::nullopt;
    case Algorithm::kCopyEngine:
    case Algorithm::kAuto:
    case Algorithm::kNccl: return std::nullopt;
  }
  return std::nullopt;
}

// Returns "" when input (in_bytes) and output (out_bytes) are disjoint or overlap in the one
// in-place form each op's kernels are safe with, since every block then overwrites only what it
// has staged or read itself: all-reduce output == input; reduce-scatter output == input + rank x
// out_bytes (this rank's block); all-gather input == output + rank x in_bytes. Otherwise what is
// wrong: with a partial overlap one block can write output over input another block has not read.
// Example: overlap_problem(Op::kAllReduce, p, 64, p + 16, 64, 0) names the overlap; (.., p, 64, 0) is "".
// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

inline std::string overlap_problem(Op op, const void* input, size_t in_bytes, const void* output, size_t out_bytes,
                                   int rank) {
  if (!ranges_overlap(input, in_bytes, output, out_bytes)) return "";
  const auto in = reinterpret_cast<uintptr_t>(input), out = reinterpret_cast<uintptr_t>(output);
  const auto r = static_cast<uintptr_t>(rank);
  switch (op) {
    case Op::kAllReduce:
      if (in == out) return "";
      return "input and output overlap without being the same buffer (pass out = input for in place)";
    case Op::kReduceScatter:
      if (out == in + r * out_bytes) return "";
      return "input and output overlap, and output is not this rank's block of the input (input + rank x output "
             "bytes, the in-place form)";
    case Op::kAllGather:
      if (in == out + r * in_bytes) return "";
      return "input and output overlap, and input is not this rank's block of the output (output + rank x input "
             "bytes, the in-place form)";
  }
  return "";
}

// A timeout seen by a wait on a flag, recorded by the first thread that saw one (per communicator)
// and read by the host after the launch: "rank R block B: peer P never arrived at barrier (set S,
// value V)".
struct DeviceError {
  uint32_t claimed;    // 0 until some thread records an error (atomicCAS 0 -> 1)
  uint32_t kind;       // 1 = a flag wait timed out
  int32_t rank;        // the waiting rank
  int32_t block;       // the waiting block
  int32_t peer;        // whose signal never came
  int32_t set;         // flag set of the barrier
  uint32_t expected;   // the barrier value waited for
  uint32_t observed;   // the flag's value when the wait gave up
  uint64_t waited_ns;  // how long it waited
};

inline constexpr uint32_t kErrorFlagTimeout = 1;
// A Lamport poll timed out: peer = the rank that never wrote, set = the Lamport buffer, expected =
// the call number, observed = the element still holding the sentinel.
inline constexpr uint32_t kErrorLamportTimeout = 2;
// A block of a thread-block cluster never got the partial sums of the cluster's other blocks
// (cuda_backend/fused, lamport_one_stage on a cluster): peer = this rank, set = the block's rank
// in its cluster, expected = the cluster's exchange number in this launch.
inline constexpr uint32_t kErrorClusterTimeout = 3;

// One launch. Pointers are device addresses valid in this process (peers' buffers opened through
// CUDA IPC). inputs[r] is what the algorithm reads as rank r's input: peers' staging buffers or
// registered user buffers. When stage_from is not null the kernel first copies this rank's input
// from stage_from into inputs[rank] (the staging buffer), exactly the elements each peer's block
// of the same index will read (kernels.cuh, stage_own_input).
struct KernelArgs {
  const void* inputs[kMaxRanks];
  void* scratch[kMaxRanks];
  SignalBuffer* signals[kMaxRanks];
  void* output;
  const void* stage_from;
  DeviceError* error;
  uint64_t count;          // elements: per-rank input count (all ops)
  uint64_t scratch_bytes;  // of every rank's scratch buffer (the push algorithms' halves)
  // Not null: a call captured into a CUDA graph with its input in place, whose row of the
  // communicator's graph input table register_graph_buffers fills after the capture. A filled row
  // (this rank's entry not null): the kernel reads rank r's input from input_table[r] and stages
  // nothing. A row still null (not registered yet, on every rank alike: registration is collective
  // and all-or-nothing): the kernel stages from stage_from as an uncaptured call does.
  const void* const* input_table;
  // Eager in place (publish_views 1 only for a launch whose peers read its input, uncaptured and
  // unregistered, communicator.h): input_views[p] is this rank's input as rank p addresses it, or
  // null when this rank staged it. Block b stores input_views[p] into input_rows[b][rank] of rank
  // p's SignalBuffer before its first barrier and, once past it, reads every peer's entry from its
  // own (null: that peer's staging buffer, inputs[peer]).
  uint32_t publish_views;
  const void* input_views[kMaxRanks];
  void* lamport[kMaxRanks];  // every rank's Lamport region (core/lamport.h), 0xFF-filled at creation
  uint64_t lamport_bytes;    // of every rank's Lamport region
  uint64_t timeout_ns;       // bound on every flag wait
  int32_t rank;
  int32_t world_size;
  int32_t contract;  // the library contract the folds follow: Contract::kCanonical or kTree (C value)
};

// Grid of one launch. Preconditions: 1 <= blocks <= kMaxBlocks; threads a multiple of 32 in
// [64, 1024] (>= world_size, so that thread t < n can signal peer t).
struct LaunchConfig {
  int blocks = 0;
  int threads = 0;
  // Launch attribute, not part of the dispatch table: programmatic dependent launch (the kernel
  // may be scheduled before the previous kernel of the stream finishes; it waits for that kernel's
  // completion in griddepcontrol.wait before touching memory).
  bool programmatic = false;
  // Blocks per thread-block cluster (sm90), 1: none. Only lamport_one_stage's cluster kernel
  // (cuda_backend/fused) launches with more: its C blocks of a cluster act as one block of C x
  // threads (the cluster's threads hold the row's lanes). Preconditions: blocks a multiple of it.
  int cluster = 1;
};

}  // namespace exactcoll::cuda
