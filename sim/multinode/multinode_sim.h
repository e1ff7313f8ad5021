// The multi-node collectives of core/multinode.h on the simulator: M nodes x L local ranks, every
// node an IPC world of its own (symmetric heaps, the signal protocol, sim::SimCtx), the nodes joined
// by the simulated network of sim/multinode/network.h. The same algorithm source the CUDA backend
// runs over NCCL (cuda_backend/multinode).
//
// Example:
//   NetworkOptions net{.layout = {2, 4}, .schedule = sim::Schedule::kSeeded, .seed = 7};
//   MultiNodeSpec spec{.op = Op::kAllReduce, .dtype = DType::kBF16, .count = 4096};
//   run_multinode(net, spec, inputs, outputs);   // inputs[r], outputs[r] for r = 0..7
#pragma once

#include <string>
#include <vector>

#include "core/fused_rmsnorm.h"
#include "core/multinode.h"
#include "core/storage.h"
#include "sim/multinode/network.h"

namespace exactcoll::multinode {

struct MultiNodeSpec {
  Op op = Op::kAllReduce;
  DType dtype = DType::kBF16;
  size_t count = 0;                               // elements per rank's input
  int blocks = 1;                                 // blocks of every node kernel (the work split; same bits)
  size_t chunk_elements = kDefaultChunkElements;  // pipeline chunk (core/multinode.h)
  int result_slots = 2;                           // all-reduce only: 1 is a broken variant for the exploration tests
  // canonical (the carry chain) or tree (node subtrees, then recursive doubling / halving across
  // nodes: core/multinode.h's tree_allreduce and tree_reduce_scatter; all-gather is a copy under both).
  Contract contract = Contract::kCanonical;
  bool tree_steps_top_down = false;  // tree all-reduce only: a broken variant for the tests (another tree)
};

// Returns "" or what is wrong with spec on layout: count 0, reduce_scatter's count not a multiple
// of the ranks, blocks outside 1..kMaxBlocks, chunk_elements not a positive multiple of 64, more
// local ranks than kMaxRanks, a contract that does not run across nodes (the registry's
// kOnMultiNode), or tree on a layout it does not run on (check_tree_layout: several nodes need M
// and L powers of two).
std::string check_multinode_spec(const MultiNodeSpec& spec, const NodeLayout& layout);

using exactcoll::output_count;  // core/op.h

// What a run leaves behind for traces: the JSON lines of every message and of every node kernel
// (when net.trace), merged by time.
struct MultiNodeTrace {
  std::string json_lines;
  size_t messages = 0;          // messages posted
  size_t cross_node_bytes = 0;  // bytes of all messages (every message crosses a node boundary)
};

// Runs spec on the simulated job; inputs[r] (count elements) and outputs[r]
// (output_count elements) are rank r's, any alignment. trace_elements: input element indices
// whose folds are traced (with net.trace): under canonical each rank's fold events along the chain
// and the last node's round; under tree the tree_node events of the node subtree (global ranks)
// on every rank that folds it, then one per cross-node level that rank combines (the subtrees of
// the two node groups it joins), and the round on each rank that computes the root. Throws
// std::invalid_argument for a bad spec or pointer counts, sim::SimError when the run fails
// (deadlock, timeout, a mismatched message).
void run_multinode(const NetworkOptions& net, const MultiNodeSpec& spec, const std::vector<const void*>& inputs,
                   const std::vector<void*>& outputs, MultiNodeTrace* trace = nullptr,
                   const std::vector<uint64_t>& trace_elements = {});

// The fused all-reduce + residual + RMSNorm across nodes: the all-reduce above of x into
// residual_out (under spec.contract), then on every rank residual_out = residual_add(s, residual)
// and out = the canonical RMSNorm (core/fused_rmsnorm.h's unfused steps, local): the bits of every
// one-node fused algorithm under the same contract. Per rank: x, residual, residual_out, out
// [rows, H]; weight [H].
struct MultiNodeFusedSpec {
  DType dtype = DType::kBF16;
  int rows = 1;
  int hidden = 0;
  float eps = 1e-6f;
  int blocks = 1;
  size_t chunk_elements = kDefaultChunkElements;
  Contract contract = Contract::kCanonical;  // the all-reduce's: canonical or tree
};
struct MultiNodeFusedIo {
  std::vector<const void*> x, residual, weight;
  std::vector<void*> residual_out, out;
};
// Returns "" or what is wrong (rows < 1, H not a positive multiple of the pack, blocks, chunk).
std::string check_multinode_fused_spec(const MultiNodeFusedSpec& spec, const NodeLayout& layout);
void run_multinode_fused(const NetworkOptions& net, const MultiNodeFusedSpec& spec, const MultiNodeFusedIo& io,
                         MultiNodeTrace* trace = nullptr);

}  // namespace exactcoll::multinode
