// The overlap schedules (core/overlap_plan.h) on GPUs: the same plan the simulator runs, each
// operation enqueued on a CUDA stream.
//
// Per pipeline, every rank allocates one symmetric region [OverlapFlags | shard], exports it with
// cudaIpcGetMemHandle and opens every peer's through the handle-exchange protocol
// (core/handle_exchange.h) over the job's store. Operations map to:
//   signal_ready / signal_consumed   cuStreamWriteValue32 of the call's epoch into the peer's flag
//                                    (a memory fence precedes the write; no SM is used)
//   wait_ready / wait_consumed       cuStreamWaitValue32 (EQ) on this rank's OWN flag: the state is
//                                    mirrored, so the wait polls local memory (no SM is used)
//   pull_shard / copy_own_shard      cudaMemcpyAsync from the peer's IPC-mapped shard (copy engine)
//   record_arrival / wait_arrival    cudaEventRecord / cudaStreamWaitEvent
//   matmul                           one cuBLASLt product (LtMatmul) on the compute stream; kAgMatmul:
//                                    one LtMatmul per distinct row count of the grouping's products
// The compute stream is the caller's stream; the comm streams fork from it at the call's start and
// join it at the end, so a call is ordered like one operation on the caller's stream.
//
// Bounded waits: a stream memory wait cannot time out by itself, so finish() is the bound: it
// waits for the call with a deadline, and past it reads every flag that a still-pending wait polls
// and throws OverlapError naming the rank, stream, step, peer, the flag and the epoch it never
// reached (e.g. "rank 1 comm0 step 1: peer 2 never marked its shard ready for call 7 (ready[2]
// holds 6) after 10000 ms"); it then writes the awaited values into the local flags so the stuck
// streams drain, and the pipeline refuses further calls.
//
// Every rank must call run() with the same shape, the same number of times, in the same order.
// Not thread-safe; one caller stream at a time.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/handle_exchange.h"
#include "core/storage.h"
#include "core/store.h"
#include "cuda_backend/ipc_exchange.h"
#include "cuda_backend/overlap/lt_matmul.h"
#include "core/overlap_plan.h"

namespace exactcoll::cuda {

struct OverlapError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OverlapPipelineOptions {
  std::string name = "overlap";  // store key prefix; unique per pipeline in a job
  overlap::Pattern pattern = overlap::Pattern::kAgMatmul;
  overlap::ProductGrouping products = overlap::ProductGrouping::kPerShard;  // kAgMatmul's row blocks
  DType dtype = DType::kBF16;
  // kAgMatmul: C [m, n] = allgather(A) [m, k] @ B [k, n], A's rows split evenly over the ranks.
  // kPrefetch: C [m, n] = X [m, k] @ W [k, n], unrelated to the all-gather of gather_count elements.
  size_t m = 0, k = 0, n = 0;
  size_t gather_count = 0;
  int comm_streams = 2;
  uint64_t wait_timeout_ms = 20000;  // finish()'s bound
  std::chrono::milliseconds store_timeout{120000};
  // The cuBLASLt algorithm of the products by their row count: kAgMatmul a product of s shards has
  // s * m / ranks rows, kPrefetch's X @ W has m. A row count not in the map: the heuristic's first
  // choice for that shape.
  std::map<size_t, cublasLtMatmulAlgo_t> product_algos;
};

class OverlapPipeline {
 public:
  // Collective over the ranks (store exchanges). The caller has made its GPU current. `handle`
  // and the workspace (workspace_bytes) serve the products. Throws OverlapError, CudaError,
  // CublasError or StoreError.
  OverlapPipeline(Store& store, int rank, int world_size, OverlapPipelineOptions options, cublasLtHandle_t handle,
                  void* workspace, size_t workspace_bytes);
  // Passes a store barrier first: no peer may still read this rank's shard when it is freed.
  ~OverlapPipeline();
  OverlapPipeline(const OverlapPipeline&) = delete;
  OverlapPipeline& operator=(const OverlapPipeline&) = delete;

  // This rank's shard in symmetric memory (shard_elements() elements): write the shard here
  // (stream-ordered before run()).
  void* shard() const { return shard_; }
  size_t shard_elements() const { return shard_elements_; }
  size_t shard_bytes() const { return shard_elements_ * static_cast<size_t>(dtype_size(options_.dtype)); }

  // Enqueues one call on `stream`. gathered: world_size * shard_elements() elements (output);
  // lhs: X for kPrefetch (ignored for kAgMatmul); rhs: B / W; product: C [m, n]. products=false
  // skips the matmul operations (the all-gather alone, for timing).
  void run(void* gathered, const void* lhs, const void* rhs, void* product, cudaStream_t stream, bool products = true);

  // Waits for everything enqueued so far on `stream`, bounded as described above.
  void finish(cudaStream_t stream);

  // The product configuration for `rows` rows of C: kAgMatmul a row count of product_ranges()
  // times m / ranks, kPrefetch m. Throws std::out_of_range for a row count the plan has no product of.
  const LtMatmul& gemm(size_t rows) const { return *gemms_.at(rows); }
  const overlap::RankPlan& plan() const { return plan_; }
  // kAgMatmul: this rank's products' row blocks in compute order (overlap::product_ranges).
  std::vector<overlap::ShardRange> product_ranges() const { return overlap::product_ranges(plan_); }
  size_t shard_rows() const { return options_.m / static_cast<size_t>(world_size_); }
  // "stream memory operations" or why signals fell back to a one-thread kernel.
  const std::string& signal_mechanism() const { return signal_mechanism_; }

 private:
  struct PendingWait {
    cudaEvent_t done;      // recorded right after the wait
    const uint32_t* flag;  // the local flag it polls
    uint32_t expected;
    std::string what;  // "rank 1 comm0 step 1: peer 2 never marked its shard ready for call 7"
  };
  void wait_value(cudaStream_t s, const uint32_t* flag, uint32_t value, std::string what, size_t wait_index);
  void write_value(cudaStream_t s, uint32_t* flag, uint32_t value);
  overlap::OverlapFlags* flags(int rank) const;
  const char* shard_of(int rank) const;

  Store& store_;
  int rank_, world_size_;
  OverlapPipelineOptions options_;
  overlap::RankPlan plan_;
  size_t shard_elements_ = 0;
  void* region_ = nullptr;
  void* shard_ = nullptr;
  std::vector<char*> peer_regions_;
  IpcOpens mappings_;  // peers' buffers mapped through IPC (unmapped when the pipeline goes)
  std::unique_ptr<HandleExchange> exchange_;
  std::map<size_t, std::unique_ptr<LtMatmul>> gemms_;  // by row count
  std::vector<cudaStream_t> comm_;
  cudaStream_t helper_ = nullptr;  // flag reads and releases after a timeout
  cudaEvent_t fork_ = nullptr, done_ = nullptr;
  std::vector<cudaEvent_t> arrival_, comm_end_, wait_done_;
  std::vector<PendingWait> pending_;
  uint32_t epoch_ = 0;
  bool kernel_signals_ = false;
  std::string signal_mechanism_;
  bool poisoned_ = false;
  std::string poison_;
};

}  // namespace exactcoll::cuda
