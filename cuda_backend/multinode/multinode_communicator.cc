#include "cuda_backend/multinode/multinode_communicator.h"

#include <algorithm>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bootstrap/worker_env.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "cuda_backend/multinode/node_kernels.h"
#include "cuda_backend/nccl_api.h"
#include "cuda_backend/nccl_bootstrap.h"

namespace exactcoll::cuda {

// The transport concept of core/multinode.h on a GPU: node kernels on the node's IPC world, NCCL
// point-to-point across nodes, all on the caller's stream (so every step is ordered after the one
// before it, and a group's transfers complete before the kernel that reads them starts).
template <class T>
class CudaPrims {
 public:
  CudaPrims(MultiNodeCommunicator& comm, void* output, cudaStream_t stream, MultiNodeCallInfo* info)
      : comm_(comm), ipc_(comm.node().ipc_kernel_args()), stream_(stream), info_(info) {
    ipc_.output = output;
    ipc_.stage_from = nullptr;
    ipc_.count = 0;
  }

  multinode::NodeLayout layout() const { return comm_.layout_; }
  int node() const { return comm_.layout_.node_of(comm_.rank_); }
  int local() const { return comm_.layout_.local_of(comm_.rank_); }
  T* output() const { return static_cast<T*>(ipc_.output); }
  const T* input() const { return static_cast<const T*>(ipc_.inputs[local()]); }
  T* scratch() const { return static_cast<T*>(ipc_.scratch[local()]); }
  float* carry_in() const { return comm_.carry_; }
  float* carry_out() const { return comm_.carry_ + comm_.carry_floats_; }
  // The node kernels' contract: the node communicator's (ipc_.contract picks the kernel).
  Contract contract() const { return static_cast<Contract>(ipc_.contract); }

  // 1. ncclGroupStart; 2. every send and receive, as bytes; 3. ncclGroupEnd: NCCL progresses them
  // together on the stream.
  void group(const multinode::Transfer* transfers, int count) {
    const NcclApi& nccl = NcclApi::get();
    nccl.check(nccl.GroupStart(), "ncclGroupStart");
    std::string what;
    for (int i = 0; i < count; ++i) {
      const multinode::Transfer& t = transfers[i];
      what += (i ? "; " : "") + std::string(t.send ? "send " : "receive ") + multinode::transfer_text(comm_.layout_, t);
      if (t.send) {
        nccl.check(nccl.Send(t.data, t.bytes, ncclUint8, t.peer, comm_.nccl_comm_, stream_), "ncclSend");
        info_->sent_bytes += t.bytes;
      } else {
        nccl.check(nccl.Recv(t.data, t.bytes, ncclUint8, t.peer, comm_.nccl_comm_, stream_), "ncclRecv");
      }
    }
    nccl.check(nccl.GroupEnd(), "ncclGroupEnd");
    comm_.mark_group(stream_, std::move(what));
    ++info_->groups;
  }
  void fold(const multinode::NodeFoldArgs<T>& a) {
    NodeKernelArgs<T> k{ipc_, NodeKernel::kFold, a, {}, {}, {}};
    launch(k);
  }
  void gather(const multinode::NodeGatherArgs& a) {
    NodeKernelArgs<T> k{ipc_, NodeKernel::kGather, {}, a, {}, {}};
    launch(k);
  }
  void gather_inputs(const multinode::NodeGatherInputsArgs& a) {
    NodeKernelArgs<T> k{ipc_, NodeKernel::kGatherInputs, {}, {}, a, {}};
    launch(k);
  }
  void combine(const multinode::NodeCombineArgs& a) {
    NodeKernelArgs<T> k{ipc_, NodeKernel::kCombine, {}, {}, {}, a};
    launch(k);
  }
  void copy(T* dst, const T* src, size_t elements) {
    EXC_CUDA_CHECK(cudaMemcpyAsync(dst, src, elements * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
  }

 private:
  void launch(const NodeKernelArgs<T>& k) {
    LaunchConfig grid = comm_.options_.node_grid;
    grid.programmatic = false;  // NCCL's kernels sit between ours on the stream
    EXC_CUDA_CHECK(launch_node_kernel<T>(k, grid, stream_));
    ++info_->launches;
  }
  MultiNodeCommunicator& comm_;
  KernelArgs ipc_;
  cudaStream_t stream_;
  MultiNodeCallInfo* info_;
};

namespace {

constexpr size_t kCarrySlackFloats = 1024;  // a local slice may exceed chunk / L by up to L packs (<= 128)

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

ncclDataType_t nccl_type(DType d) {
  return d == DType::kBF16 ? ncclBfloat16 : d == DType::kFP16 ? ncclFloat16 : ncclFloat32;
}

}  // namespace

MultiNodeCommunicator::MultiNodeCommunicator(Store& store, int rank, int world_size, multinode::RankPlace place,
                                             MultiNodeOptions options)
    : store_(store), rank_(rank), options_(std::move(options)) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("MultiNodeCommunicator: rank " + std::to_string(rank) + " outside world of " +
                                std::to_string(world_size));
  }
  if (options_.chunk_elements == 0 || options_.chunk_elements % 64 != 0) {
    throw std::invalid_argument("MultiNodeCommunicator: chunk_elements must be a positive multiple of 64");
  }
  // 1. Every rank's place, checked together (the same verdict on every rank).
  const std::string key = options_.name + "/place/";
  store_.set(key + std::to_string(rank), std::to_string(place.node) + " " + std::to_string(place.local_rank) + " " +
                                             std::to_string(place.local_world_size));
  std::vector<multinode::RankPlace> places(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::string text = store_.get(key + std::to_string(r), options_.store_timeout);
    multinode::RankPlace& p = places[static_cast<size_t>(r)];
    if (std::sscanf(text.c_str(), "%d %d %d", &p.node, &p.local_rank, &p.local_world_size) != 3) {
      throw BootstrapError("node layout: rank " + std::to_string(r) + " published a malformed place '" + text + "'");
    }
  }
  if (const std::string problem = multinode::layout_from_places(places, &layout_); !problem.empty()) {
    throw BootstrapError("node layout:\n  " + problem);
  }
  if (layout_.local_ranks > kMaxRanks) {
    throw BootstrapError("node layout: " + std::to_string(layout_.local_ranks) +
                         " ranks per node; the IPC kernels take 1.." + std::to_string(kMaxRanks));
  }
  if (options_.node.contract == Contract::kTree) {
    if (const std::string problem = multinode::check_tree_layout(layout_); !problem.empty()) {
      throw BootstrapError("node layout: " + problem);
    }
  }
  // 2. The node's IPC communicator.
  CommunicatorOptions node_options = options_.node;
  node_options.name = options_.name + "/node" + std::to_string(place.node);
  node_options.use_nccl = false;
  node_options.graph_in_place = false;  // the multi-node calls stage every input (no graph input table)
  node_options.store_timeout = options_.store_timeout;
  node_ = std::make_unique<Communicator>(store_, place.local_rank, layout_.local_ranks, node_options);
  // 3. NCCL over every rank (the cross-node transport) and the carry buffers.
  if (layout_.nodes > 1 || options_.node.use_nccl) {
    nccl_comm_ =
        create_nccl_comm(store_, options_.name + "/nccl", rank_, world_size, options_.store_timeout, &nccl_reason_);
  }
  // The longest carry: an all-reduce slice (chunk / L + L packs) or a reduce-scatter chunk of M
  // pieces of at least 64 elements.
  carry_floats_ = std::max(options_.chunk_elements, 64 * static_cast<size_t>(layout_.nodes)) + kCarrySlackFloats;
  EXC_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&carry_), 2 * carry_floats_ * sizeof(float)));
}

MultiNodeCommunicator::~MultiNodeCommunicator() {
  node_.reset();  // its close barrier first: peers may still read this rank's buffers
  if (nccl_comm_ != nullptr) {
    try {
      NcclApi::get().CommDestroy(nccl_comm_);
    } catch (...) {
    }
  }
  if (carry_ != nullptr) (void)cudaFree(carry_);
  for (const GroupMark& m : marks_) (void)cudaEventDestroy(m.event);
}

void MultiNodeCommunicator::mark_group(cudaStream_t stream, std::string what) {
  if (marks_.size() < kGroupMarks) {
    GroupMark m;
    EXC_CUDA_CHECK(cudaEventCreateWithFlags(&m.event, cudaEventDisableTiming));
    marks_.push_back(m);
  }
  GroupMark& m = marks_[marked_ % kGroupMarks];
  EXC_CUDA_CHECK(cudaEventRecord(m.event, stream));
  m.what = std::move(what);
  ++marked_;
}

void MultiNodeCommunicator::check(cudaStream_t stream) {
  if (poisoned_) throw CollectiveError(poison_);
  // 1. The stream, bounded: an NCCL receive whose sender never comes waits forever on its own.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.transfer_timeout_ms);
  for (cudaError_t q; (q = cudaStreamQuery(stream)) != cudaSuccess;) {
    if (q != cudaErrorNotReady) EXC_CUDA_CHECK(q);
    if (std::chrono::steady_clock::now() > deadline) {
      // 2. The oldest marked group still pending is what never arrived (or was never received).
      std::string what =
          "the stream's work (no NCCL group pending among the latest " + std::to_string(kGroupMarks) + ")";
      for (size_t i = marked_ > kGroupMarks ? marked_ - kGroupMarks : 0; i < marked_; ++i) {
        if (cudaEventQuery(marks_[i % kGroupMarks].event) == cudaErrorNotReady) {
          what = "its NCCL group " + marks_[i % kGroupMarks].what;
          break;
        }
      }
      (void)cudaGetLastError();
      poisoned_ = true;
      poison_ = multinode::rank_text(layout_, rank_) + ": after " + std::to_string(options_.transfer_timeout_ms) +
                " ms, " + what + " had not completed (a peer never sent or never received); NCCL was aborted and " +
                "the communicator is unusable";
      if (nccl_comm_ != nullptr) {
        NcclApi::get().CommAbort(nccl_comm_);
        nccl_comm_ = nullptr;
      }
      throw CollectiveError(poison_);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  node_->check(stream);
}

MultiNodeCallInfo MultiNodeCommunicator::run_nccl(Op kind, const void* input, void* output, size_t count, DType dtype,
                                                  cudaStream_t stream, const std::string& note) {
  if (nccl_comm_ == nullptr) throw CollectiveError("NCCL is not available: " + nccl_reason_);
  const NcclApi& nccl = NcclApi::get();
  const ncclDataType_t t = nccl_type(dtype);
  const size_t n = static_cast<size_t>(world_size());
  if (kind == Op::kAllReduce)
    nccl.check(nccl.AllReduce(input, output, count, t, ncclSum, nccl_comm_, stream), "ncclAllReduce");
  if (kind == Op::kReduceScatter) {
    nccl.check(nccl.ReduceScatter(input, output, count / n, t, ncclSum, nccl_comm_, stream), "ncclReduceScatter");
  }
  if (kind == Op::kAllGather) nccl.check(nccl.AllGather(input, output, count, t, nccl_comm_, stream), "ncclAllGather");
  MultiNodeCallInfo info;
  info.algorithm = "nccl";
  info.exact = kind == Op::kAllGather;  // a copy; NCCL's sums follow no contract
  info.note = note;
  return info;
}

template <class T>
MultiNodeCallInfo MultiNodeCommunicator::run_typed(Op kind, const void* input, void* output, size_t count,
                                                   cudaStream_t stream) {
  const size_t capacity = node_->buffer_bytes() / sizeof(T) / 64 * 64;  // elements of staging, and of scratch
  const size_t elem = sizeof(T);
  const bool tree = node_->contract() == Contract::kTree;
  MultiNodeCallInfo info;
  info.algorithm = kind == Op::kAllGather   ? "direct_exchange"
                   : !tree                  ? "carry_chain"
                   : kind == Op::kAllReduce ? "tree_doubling"
                                            : "tree_halving";
  // Every size below depends only on the call's arguments and options equal on every rank.
  const size_t chunk = std::min(options_.chunk_elements, std::max<size_t>(64, capacity / 2 / 64 * 64));
  const multinode::BufferNeeds needs = multinode::buffer_needs<T>(kind, layout_, count, chunk, node_->contract());
  if (kind != Op::kAllReduce && (count > capacity || needs.scratch_elements > capacity * 1)) {
    const DType d = sizeof(T) == 4 ? DType::kFP32 : std::is_same_v<T, bf16> ? DType::kBF16 : DType::kFP16;
    return run_nccl(kind, input, output, count, d, stream,
                    "message larger than the node buffers (" + std::to_string(node_->buffer_bytes()) + " bytes)");
  }
  // Pieces that fit the staging buffer (only the all-reduce has more than one).
  const size_t piece = kind == Op::kAllReduce ? std::max<size_t>(64, capacity) : count;
  for (size_t first = 0; first < count; first += piece) {
    const size_t c = std::min(piece, count - first);
    CudaPrims<T> prims(*this, static_cast<char*>(output) + first * elem, stream, &info);
    // 1. This rank's input into its staging buffer (its node peers read it there).
    EXC_CUDA_CHECK(cudaMemcpyAsync(const_cast<T*>(prims.input()), static_cast<const char*>(input) + first * elem,
                                   c * elem, cudaMemcpyDeviceToDevice, stream));
    // 2. The algorithm (core/multinode.h): the carry chain, or under the tree contract the node
    //    subtrees and recursive doubling (all-reduce) or halving (reduce-scatter).
    if (kind == Op::kAllReduce && tree) {
      multinode::tree_allreduce<T>(prims, c, chunk);
    } else if (kind == Op::kAllReduce) {
      multinode::allreduce<T>(prims, c, chunk);
    } else if (kind == Op::kReduceScatter && tree) {
      multinode::tree_reduce_scatter<T>(prims, c, chunk);
    } else if (kind == Op::kReduceScatter) {
      multinode::reduce_scatter<T>(prims, c, chunk);
    } else {
      multinode::allgather<T>(prims, c, chunk);
    }
  }
  return info;
}

MultiNodeCallInfo MultiNodeCommunicator::run(Op kind, const void* input, void* output, size_t count, DType dtype,
                                             Algorithm algo, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(world_size());
  if (kind == Op::kReduceScatter && count % n != 0) {
    throw std::invalid_argument("reduce_scatter: count " + std::to_string(count) + " is not a multiple of the " +
                                std::to_string(n) + " ranks");
  }
  if (!aligned16(input) || !aligned16(output)) throw std::invalid_argument("input and output must be 16-byte aligned");
  {
    const size_t elem = static_cast<size_t>(dtype_size(dtype));
    const std::string problem =
        overlap_problem(kind, input, count * elem, output, output_count(kind, count, world_size()) * elem, rank_);
    if (!problem.empty()) throw std::invalid_argument(std::string(op_name(kind)) + ": " + problem);
  }
  if (poisoned_) throw CollectiveError(poison_);
  if (count == 0) return MultiNodeCallInfo{"none", true, 0, 0, 0, ""};
  if (algo == Algorithm::kNccl) return run_nccl(kind, input, output, count, dtype, stream, "");
  // One node: the IPC communicator, any of its algorithms.
  if (layout_.nodes == 1) {
    const CallInfo c = [&] {
      switch (kind) {
        case Op::kAllReduce: return node_->allreduce(input, output, count, dtype, algo, stream);
        case Op::kReduceScatter: return node_->reduce_scatter(input, output, count, dtype, algo, stream);
        case Op::kAllGather: return node_->allgather(input, output, count, dtype, algo, stream);
      }
      throw std::logic_error("not an Op");
    }();
    return MultiNodeCallInfo{algorithm_name(c.algo), c.exact, c.launches, 0, 0, c.note};
  }
  if (algo != Algorithm::kAuto) {
    throw std::invalid_argument(
        std::string("across nodes the algorithms are auto (the carry chain, or the tree's exchange) and nccl, not ") +
        algorithm_name(algo));
  }
  if (nccl_comm_ == nullptr) throw CollectiveError("the cross-node transport needs NCCL: " + nccl_reason_);
  return with_storage_type(dtype,
                           [&](auto tag) { return run_typed<decltype(tag)>(kind, input, output, count, stream); });
}

MultiNodeCallInfo MultiNodeCommunicator::allreduce(const void* input, void* output, size_t count, DType dtype,
                                                   Algorithm algo, cudaStream_t stream) {
  return run(Op::kAllReduce, input, output, count, dtype, algo, stream);
}

MultiNodeCallInfo MultiNodeCommunicator::reduce_scatter(const void* input, void* output, size_t count, DType dtype,
                                                        Algorithm algo, cudaStream_t stream) {
  return run(Op::kReduceScatter, input, output, count, dtype, algo, stream);
}

MultiNodeCallInfo MultiNodeCommunicator::allgather(const void* input, void* output, size_t count, DType dtype,
                                                   Algorithm algo, cudaStream_t stream) {
  return run(Op::kAllGather, input, output, count, dtype, algo, stream);
}

MultiNodeCallInfo MultiNodeCommunicator::fused_add_rmsnorm(const void* x, const void* residual, const void* weight,
                                                           void* residual_out, void* out, int rows, int hidden,
                                                           float eps, DType dtype, Algorithm algo,
                                                           cudaStream_t stream) {
  // 1. s = the all-reduce of x, into out; 2. residual_out = residual_add(s, residual) and
  // out = RMSNorm(residual_out) on this GPU (the split paths' kernel: the same bits as every fused
  // algorithm, docs/numerics.md).
  fused::FusedRmsNormShape shape;
  shape.rows = rows;
  shape.hidden = hidden;
  shape.eps = eps;
  shape.dtype = dtype;
  MultiNodeCallInfo info =
      allreduce(x, out, static_cast<size_t>(rows) * static_cast<size_t>(hidden), dtype, algo, stream);
  fused::launch_residual_rmsnorm(out, residual, weight, residual_out, out, shape, stream, false);
  ++info.launches;
  return info;
}

}  // namespace exactcoll::cuda
