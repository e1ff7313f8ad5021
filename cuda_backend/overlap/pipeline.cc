#include "cuda_backend/overlap/pipeline.h"

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

#include "cuda_backend/cuda_check.h"
#include "cuda_backend/ipc_exchange.h"
#include "cuda_backend/overlap/flag_kernel.h"

namespace exactcoll::cuda {
namespace {

using overlap::OpKind;
using overlap::OverlapFlags;
using overlap::Pattern;

constexpr size_t kFlagsBytes = 4096;  // the flag block, padded so the shard starts page-aligned

using StreamWaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using StreamWriteValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// The driver's stream memory operations (cuda_check.h's driver_entry), or OverlapError.
template <class Fn>
Fn required_driver_entry(const char* name) {
  const Fn f = driver_entry<Fn>(name);
  if (f == nullptr) throw OverlapError(std::string("the CUDA driver does not provide ") + name);
  return f;
}

StreamWaitValue32Fn stream_wait_value32() {
  static const StreamWaitValue32Fn fn = required_driver_entry<StreamWaitValue32Fn>("cuStreamWaitValue32");
  return fn;
}

StreamWriteValue32Fn stream_write_value32() {
  static const StreamWriteValue32Fn fn = required_driver_entry<StreamWriteValue32Fn>("cuStreamWriteValue32");
  return fn;
}

void check_driver(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    throw OverlapError(std::string(what) + " failed with CUresult " + std::to_string(static_cast<int>(r)));
}

}  // namespace

OverlapPipeline::OverlapPipeline(Store& store, int rank, int world_size, OverlapPipelineOptions options,
                                 cublasLtHandle_t handle, void* workspace, size_t workspace_bytes)
    : store_(store), rank_(rank), world_size_(world_size), options_(std::move(options)) {
  // 1. Arguments and the plan.
  const auto& o = options_;
  if (world_size < 1 || world_size > overlap::kMaxOverlapRanks || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("OverlapPipeline: rank " + std::to_string(rank) + " of " + std::to_string(world_size) +
                                " (1.." + std::to_string(overlap::kMaxOverlapRanks) + " ranks)");
  }
  if (o.dtype == DType::kFP32) throw std::invalid_argument("OverlapPipeline: products are bf16 or fp16");
  if (o.m < 1 || o.k < 1 || o.n < 1) throw std::invalid_argument("OverlapPipeline: m, k and n must be at least 1");
  if (o.pattern == Pattern::kAgMatmul && o.m % static_cast<size_t>(world_size) != 0) {
    throw std::invalid_argument("OverlapPipeline: m = " + std::to_string(o.m) + " is not a multiple of the " +
                                std::to_string(world_size) + " ranks");
  }
  if (o.pattern == Pattern::kPrefetch && o.gather_count < 1) {
    throw std::invalid_argument("OverlapPipeline: prefetch needs gather_count >= 1");
  }
  plan_ = overlap::make_plan(o.pattern, rank, world_size, o.comm_streams, o.products);
  shard_elements_ = o.pattern == Pattern::kAgMatmul ? o.m / static_cast<size_t>(world_size) * o.k : o.gather_count;

  // 2. The symmetric region [flags | shard], flags zeroed before anyone can see them.
  const size_t region_bytes = kFlagsBytes + shard_bytes();
  EXC_CUDA_CHECK(cudaMalloc(&region_, region_bytes));
  EXC_CUDA_CHECK(cudaMemset(region_, 0, kFlagsBytes));
  EXC_CUDA_CHECK(cudaDeviceSynchronize());
  shard_ = static_cast<char*>(region_) + kFlagsBytes;

  // 3. Streams (comm streams at the highest priority, so the rare kernel on them is scheduled
  //    first) and events.
  int least = 0, greatest = 0;
  EXC_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  comm_.assign(static_cast<size_t>(o.comm_streams), nullptr);
  for (auto& s : comm_) EXC_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  EXC_CUDA_CHECK(cudaStreamCreateWithFlags(&helper_, cudaStreamNonBlocking));
  auto event = [] {
    cudaEvent_t e = nullptr;
    EXC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  };
  fork_ = event();
  done_ = event();
  for (int j = 0; j < world_size; ++j) arrival_.push_back(event());
  for (int s = 0; s < o.comm_streams; ++s) comm_end_.push_back(event());
  for (const auto& stream : plan_.streams) {
    for (const auto& op : stream.ops) {
      if (op.kind == OpKind::kWaitReady || op.kind == OpKind::kWaitConsumed) wait_done_.push_back(event());
    }
  }

  // 4. Exchange the regions (same-decision handle exchange over the store).
  cudaIpcMemHandle_t ipc{};
  EXC_CUDA_CHECK(cudaIpcGetMemHandle(&ipc, region_));
  HandleExchangeOptions hx;
  hx.key_prefix = o.name + "/handles";
  hx.timeout = o.store_timeout;
  exchange_ = make_ipc_exchange<OverlapError>(store_, rank_, world_size_, &mappings_, hx);
  const auto peers = exchange_->exchange({exported_ipc_region(ipc, region_, region_bytes)});
  for (int p = 0; p < world_size_; ++p) peer_regions_.push_back(static_cast<char*>(peers[0][static_cast<size_t>(p)]));

  // 5. Signals: stream memory writes into a peer's IPC-mapped flags where the driver accepts them
  //    (a test write of 0, the value every flag holds now), else a one-thread kernel.
  signal_mechanism_ = "stream memory operations (cuStreamWriteValue32 / cuStreamWaitValue32)";
  try {
    for (int p = 0; p < world_size_; ++p) {
      if (p == rank_) continue;
      check_driver(stream_write_value32()(reinterpret_cast<CUstream>(helper_),
                                          reinterpret_cast<CUdeviceptr>(&flags(p)->ready[rank_]), 0, 0),
                   "cuStreamWriteValue32 to a peer's flag");
    }
    EXC_CUDA_CHECK(cudaStreamSynchronize(helper_));
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    kernel_signals_ = true;
    signal_mechanism_ = std::string("one-thread release-store kernels (") + e.what() + ")";
  }

  // 6. The products (one configuration per row count), then a barrier: every rank's region is
  //    open and tested before any call.
  std::vector<size_t> product_rows;
  if (o.pattern == Pattern::kAgMatmul) {
    for (const overlap::ShardRange& r : product_ranges())
      product_rows.push_back(shard_rows() * static_cast<size_t>(r.count));
  } else {
    product_rows.push_back(o.m);
  }
  for (size_t rows : product_rows) {
    if (gemms_.count(rows) != 0) continue;
    const auto algo = o.product_algos.find(rows);
    gemms_[rows] = std::make_unique<LtMatmul>(
        handle, o.dtype, rows, o.k, o.n, workspace, workspace_bytes,
        algo == o.product_algos.end() ? std::nullopt : std::optional<cublasLtMatmulAlgo_t>(algo->second));
  }
  store_.barrier(o.name + "/ready", rank_, world_size_, o.store_timeout);
}

OverlapPipeline::~OverlapPipeline() {
  // Every call has completed on this rank once its streams are idle (a call ends after every
  // peer consumed this rank's shard); the barrier makes sure every peer is past its last call too.
  if (!poisoned_) {
    for (cudaStream_t s : comm_) (void)cudaStreamSynchronize(s);
  }
  try {
    store_.barrier(options_.name + "/close", rank_, world_size_, options_.store_timeout);
  } catch (const std::exception& e) {
    std::cerr << "exactcoll: rank " << rank_ << ": closing overlap pipeline " << options_.name << ": " << e.what()
              << "\n";
  }
  gemms_.clear();
  exchange_.reset();
  for (cudaEvent_t e : arrival_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : comm_end_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : wait_done_) (void)cudaEventDestroy(e);
  if (fork_) (void)cudaEventDestroy(fork_);
  if (done_) (void)cudaEventDestroy(done_);
  for (cudaStream_t s : comm_) (void)cudaStreamDestroy(s);
  if (helper_) (void)cudaStreamDestroy(helper_);
  if (region_) (void)cudaFree(region_);
}

OverlapFlags* OverlapPipeline::flags(int rank) const {
  return reinterpret_cast<OverlapFlags*>(rank == rank_ ? static_cast<char*>(region_)
                                                       : peer_regions_[static_cast<size_t>(rank)]);
}

const char* OverlapPipeline::shard_of(int rank) const {
  return rank == rank_ ? static_cast<const char*>(shard_) : peer_regions_[static_cast<size_t>(rank)] + kFlagsBytes;
}

void OverlapPipeline::write_value(cudaStream_t s, uint32_t* flag, uint32_t value) {
  if (kernel_signals_) {
    EXC_CUDA_CHECK(launch_write_flag(flag, value, s));
  } else {
    check_driver(stream_write_value32()(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), value, 0),
                 "cuStreamWriteValue32");
  }
}

// GEQ (cyclic) rather than EQ: in a correct run the flag never passes the epoch before the wait is
// satisfied (core/overlap_plan.h), so both are the same; GEQ lets finish() release a stuck wait of
// an earlier call by writing a later epoch.
void OverlapPipeline::wait_value(cudaStream_t s, const uint32_t* flag, uint32_t value, std::string what,
                                 size_t wait_index) {
  check_driver(stream_wait_value32()(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), value,
                                     CU_STREAM_WAIT_VALUE_GEQ),
               "cuStreamWaitValue32");
  cudaEvent_t done = wait_done_.at(wait_index);
  EXC_CUDA_CHECK(cudaEventRecord(done, s));
  pending_.push_back({done, flag, value, std::move(what)});
}

void OverlapPipeline::run(void* gathered, const void* lhs, const void* rhs, void* product, cudaStream_t stream,
                          bool products) {
  if (poisoned_)
    throw OverlapError("overlap pipeline " + options_.name + " is unusable after an earlier error: " + poison_);
  const uint32_t epoch = ++epoch_;
  const size_t esize = static_cast<size_t>(dtype_size(options_.dtype));
  char* out = static_cast<char*>(gathered);
  pending_.clear();

  // 1. Fork: the comm streams start after everything already on the caller's stream.
  EXC_CUDA_CHECK(cudaEventRecord(fork_, stream));
  for (cudaStream_t s : comm_) EXC_CUDA_CHECK(cudaStreamWaitEvent(s, fork_, 0));

  // 2. The plan, stream by stream in index order: every record_arrival (comm) is enqueued before
  //    the wait_arrival (compute) that needs it.
  size_t wait_index = 0;
  const std::string me = "rank " + std::to_string(rank_) + " ";
  for (size_t si = 0; si < plan_.streams.size(); ++si) {
    const bool is_compute = si + 1 == plan_.streams.size();
    cudaStream_t s = is_compute ? stream : comm_[si];
    const std::string where = me + plan_.streams[si].name;
    for (const overlap::PlanOp& op : plan_.streams[si].ops) {
      switch (op.kind) {
        case OpKind::kSignalReady: write_value(s, &flags(op.peer)->ready[rank_], epoch); break;
        case OpKind::kWaitReady:
          wait_value(s, &flags(rank_)->ready[op.peer], epoch,
                     where + " step " + std::to_string(op.step) + ": peer " + std::to_string(op.peer) +
                         " never marked its shard ready for call " + std::to_string(epoch) + " (ready[" +
                         std::to_string(op.peer) + "]",
                     wait_index++);
          break;
        case OpKind::kPullShard:
          EXC_CUDA_CHECK(cudaMemcpyAsync(out + static_cast<size_t>(op.peer) * shard_bytes(), shard_of(op.peer),
                                         shard_bytes(), cudaMemcpyDeviceToDevice, s));
          break;
        case OpKind::kCopyOwnShard:
          EXC_CUDA_CHECK(cudaMemcpyAsync(out + static_cast<size_t>(rank_) * shard_bytes(), shard_, shard_bytes(),
                                         cudaMemcpyDeviceToDevice, s));
          break;
        case OpKind::kSignalConsumed: write_value(s, &flags(op.peer)->consumed[rank_], epoch); break;
        case OpKind::kRecordArrival: EXC_CUDA_CHECK(cudaEventRecord(arrival_[static_cast<size_t>(op.step)], s)); break;
        case OpKind::kWaitArrival:
          EXC_CUDA_CHECK(cudaStreamWaitEvent(s, arrival_[static_cast<size_t>(op.step)], 0));
          break;
        case OpKind::kMatmul:
          if (!products) break;
          if (options_.pattern == Pattern::kAgMatmul) {
            // Rows of shards [peer, peer + shards): step 0 reads the own shard in place, the
            // others the gathered rows (contiguous, like C's).
            const size_t first_row = shard_rows() * static_cast<size_t>(op.peer);
            const void* a = op.step == 0 ? static_cast<const void*>(shard_)
                                         : static_cast<const void*>(out + static_cast<size_t>(op.peer) * shard_bytes());
            gemm(shard_rows() * static_cast<size_t>(op.shards))
                .run(a, rhs, static_cast<char*>(product) + first_row * options_.n * esize, s);
          } else {
            gemm(options_.m).run(lhs, rhs, product, s);
          }
          break;
        case OpKind::kWaitConsumed:
          wait_value(s, &flags(rank_)->consumed[op.peer], epoch,
                     where + ": peer " + std::to_string(op.peer) + " never reported its copy of this rank's shard " +
                         "consumed for call " + std::to_string(epoch) + " (consumed[" + std::to_string(op.peer) + "]",
                     wait_index++);
          break;
      }
    }
  }

  // 3. Join: the call ends on the caller's stream once every comm stream is done.
  for (size_t si = 0; si < comm_.size(); ++si) {
    EXC_CUDA_CHECK(cudaEventRecord(comm_end_[si], comm_[si]));
    EXC_CUDA_CHECK(cudaStreamWaitEvent(stream, comm_end_[si], 0));
  }
  EXC_CUDA_CHECK(cudaEventRecord(done_, stream));
}

void OverlapPipeline::finish(cudaStream_t stream) {
  if (poisoned_)
    throw OverlapError("overlap pipeline " + options_.name + " is unusable after an earlier error: " + poison_);
  // 1. Wait for the caller's stream (the last call's join is on it), up to the deadline.
  cudaEvent_t marker = nullptr;
  EXC_CUDA_CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
  EXC_CUDA_CHECK(cudaEventRecord(marker, stream));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(options_.wait_timeout_ms);
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaEventQuery(marker)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  (void)cudaEventDestroy(marker);
  if (q == cudaSuccess) return;
  if (q != cudaErrorNotReady) EXC_CUDA_CHECK(q);

  // 2. Timed out: find the first wait still pending whose flag has not reached its epoch.
  uint32_t* host = nullptr;
  EXC_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host), sizeof(uint32_t) * (pending_.size() + 1)));
  std::string message;
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (cudaEventQuery(pending_[i].done) != cudaErrorNotReady) continue;
    EXC_CUDA_CHECK(cudaMemcpyAsync(&host[i], pending_[i].flag, sizeof(uint32_t), cudaMemcpyDeviceToHost, helper_));
    EXC_CUDA_CHECK(cudaStreamSynchronize(helper_));
    if (message.empty() && static_cast<int32_t>(host[i] - pending_[i].expected) < 0) {
      message = pending_[i].what + " holds " + std::to_string(host[i]) + ") after " +
                std::to_string(options_.wait_timeout_ms) + " ms";
    }
  }
  if (message.empty()) {
    message = "rank " + std::to_string(rank_) + ": call " + std::to_string(epoch_) + " did not complete within " +
              std::to_string(options_.wait_timeout_ms) +
              " ms, with every awaited flag set (a copy or product is stuck)";
  }
  // 3. Release the stuck streams (the awaited epochs written into the local flags), so that the
  //    process can exit; the pipeline is unusable from now on.
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (cudaEventQuery(pending_[i].done) != cudaErrorNotReady) continue;
    host[pending_.size()] = pending_[i].expected;
    (void)cudaMemcpyAsync(const_cast<uint32_t*>(pending_[i].flag), &host[pending_.size()], sizeof(uint32_t),
                          cudaMemcpyHostToDevice, helper_);
    (void)cudaStreamSynchronize(helper_);
  }
  (void)cudaFreeHost(host);
  poisoned_ = true;
  poison_ = message;
  throw OverlapError(message);
}

}  // namespace exactcoll::cuda
