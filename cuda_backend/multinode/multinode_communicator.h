// A communicator for jobs past one machine: M nodes x L GPUs, ranks numbered node-major. Inside a
// node it is the IPC communicator (cuda_backend/communicator.h) over the node's L ranks; across
// nodes, NCCL point-to-point (ncclSend/ncclRecv inside group calls) carries the bytes of the
// multi-node algorithms of core/multinode.h, whose arithmetic is the contract's: every call that
// takes the carry chain (or the direct all-gather) reports exact = true and gives the
// simulator's bits (sim/multinode runs the same source).
//
// Construction (collective over all ranks):
//   1. every rank publishes its place (node, local rank, ranks per node; node_env.h reads them
//      from the launcher) and reads everyone's; multinode::layout_from_places checks them together,
//      so a bad layout is the same clear error on every rank;
//   2. the node's IPC communicator over the node's ranks (store keys <name>/node<k>/...; no NCCL
//      of its own);
//   3. one NCCL communicator over all ranks (create_nccl_comm), the cross-node transport, and the
//      fp32 carry buffers.
// auto: one node -> the IPC communicator's own choice (its algorithms, its table); several nodes
// -> the carry chain (all-reduce, reduce-scatter, fused) and the direct exchange (all-gather).
// nccl: NCCL's own collective (its sums follow no contract: exact = false).
// Under the tree contract (options.node.contract): the node subtrees, then recursive doubling
// (all-reduce, fused: "tree_doubling") or halving (reduce-scatter: "tree_halving") across nodes;
// M and L must be powers of two (construction throws BootstrapError otherwise, on every rank).
//
// Messages beyond the node communicator's buffers: the all-reduce runs in pieces that fit (the
// bits are per element, so pieces change none); a reduce-scatter that does not fit falls back to
// NCCL (exact = false, note says so); an all-gather that does not fit takes NCCL's all-gather (a
// bit copy: exact).
//
// Not thread-safe; one stream at a time (as the IPC communicator).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/multinode.h"
#include "core/multinode_layout.h"
#include "core/storage.h"
#include "core/store.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/communicator_options.h"

namespace exactcoll::cuda {

struct MultiNodeOptions {
  std::string name = "exactcoll_multinode";                  // store key prefix; unique per communicator in a job
  CommunicatorOptions node;                                  // the node's IPC communicator (name and use_nccl set here)
  size_t chunk_elements = multinode::kDefaultChunkElements;  // pipeline chunk (a multiple of 64)
  LaunchConfig node_grid{16, 512, false};                    // every node kernel's grid
  std::chrono::milliseconds store_timeout{120000};
  // check(): how long the stream may take before the cross-node transfers are declared lost (NCCL's
  // receives have no bound of their own).
  uint64_t transfer_timeout_ms = 120000;
};

// What one call ran.
struct MultiNodeCallInfo {
  std::string algorithm;  // "carry_chain", "tree_doubling", "tree_halving", "direct_exchange", "nccl", or the
                          // IPC algorithm (one node)
  bool exact = true;      // false: NCCL's sums
  int launches = 0;       // node kernels
  int groups = 0;         // NCCL group calls
  size_t sent_bytes = 0;  // this rank's bytes sent across nodes
  std::string note;       // why a fallback happened
};

class MultiNodeCommunicator {
 public:
  // Collective: every rank of the job, each on its GPU (cudaSetDevice before). Throws
  // BootstrapError for a bad layout (every problem named), StoreError, CudaError, NcclError.
  MultiNodeCommunicator(Store& store, int rank, int world_size, multinode::RankPlace place,
                        MultiNodeOptions options = {});
  ~MultiNodeCommunicator();
  MultiNodeCommunicator(const MultiNodeCommunicator&) = delete;
  MultiNodeCommunicator& operator=(const MultiNodeCommunicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return layout_.world_size(); }
  const multinode::NodeLayout& layout() const { return layout_; }
  Communicator& node() { return *node_; }
  bool nccl_ready() const { return nccl_comm_ != nullptr; }

  // output[i] = the contract's fold over ranks 0..n-1 of input_r[i] (canonical or tree: the
  // node communicator's options.contract). algo: auto or nccl (one
  // node: any algorithm of the IPC communicator). input, output: 16-byte aligned device memory.
  MultiNodeCallInfo allreduce(const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                              cudaStream_t stream);
  // output[j] = fold over ranks of input_r[rank * count / n + j] (count a multiple of n).
  MultiNodeCallInfo reduce_scatter(const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                                   cudaStream_t stream);
  // output[q * count + i] = input_q[i].
  MultiNodeCallInfo allgather(const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                              cudaStream_t stream);
  // The fused all-reduce + residual add + RMSNorm (docs/numerics.md): the all-reduce of x into out
  // (as s, under the communicator's contract), then the canonical residual add and RMSNorm of every
  // row on this GPU.
  MultiNodeCallInfo fused_add_rmsnorm(const void* x, const void* residual, const void* weight, void* residual_out,
                                      void* out, int rows, int hidden, float eps, DType dtype, Algorithm algo,
                                      cudaStream_t stream);

  // Waits for stream, bounded by options.transfer_timeout_ms, then throws CollectiveError if a node
  // kernel timed out (naming the local rank, block and peer, as the IPC communicator does). When
  // the stream does not finish in time, the first NCCL group of the recent calls that never
  // completed names what never arrived ("rank 5 (node 1, local rank 1): ... receive carry chunk 3
  // (512 bytes) from rank 1 (node 0, local rank 1) ..."), NCCL is aborted and every later call
  // throws.
  void check(cudaStream_t stream);
  bool usable() const { return !poisoned_; }

 private:
  MultiNodeCallInfo run(Op kind, const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                        cudaStream_t stream);
  template <class T>
  MultiNodeCallInfo run_typed(Op kind, const void* input, void* output, size_t count, cudaStream_t stream);
  MultiNodeCallInfo run_nccl(Op kind, const void* input, void* output, size_t count, DType dtype, cudaStream_t stream,
                             const std::string& note);
  // Records an event after an NCCL group on stream, with what the group moves (a ring of the
  // latest kGroupMarks groups), for check()'s message.
  void mark_group(cudaStream_t stream, std::string what);
  template <class T>
  friend class CudaPrims;
  struct GroupMark {
    cudaEvent_t event = nullptr;
    std::string what;
  };
  static constexpr size_t kGroupMarks = 64;

  Store& store_;
  int rank_;
  multinode::NodeLayout layout_;
  MultiNodeOptions options_;
  std::unique_ptr<Communicator> node_;
  ncclComm_t nccl_comm_ = nullptr;
  std::string nccl_reason_;
  float* carry_ = nullptr;  // [2 * carry_floats_]: carry_in, then carry_out
  size_t carry_floats_ = 0;
  std::vector<GroupMark> marks_;
  size_t marked_ = 0;  // groups marked so far
  bool poisoned_ = false;
  std::string poison_;
};

}  // namespace exactcoll::cuda
