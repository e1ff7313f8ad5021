// A communicator of the CUDA backend: one process per GPU, every rank's symmetric buffers linked by
// CUDA IPC, collectives from core/collectives.h's templates (kernels.cuh), NCCL wrapped beside
// them as baseline and fallback.
//
// Per communicator, each rank allocates one symmetric region: [SignalBuffer | staging | scratch]
// (staging and scratch of `buffer_bytes` each), exports it with cudaIpcGetMemHandle, and opens
// every peer's region (cudaIpcOpenMemHandle, lazy peer access) after one exchange through the
// store. Inputs reach the kernels either
//   - staged: the kernel copies this rank's input into its staging buffer before the first barrier
//     (no extra launch or copy node), or
//   - registered: register_buffer() exchanged the user buffer's handle once; peers read it in
//     place. CUDA-graph-captured calls then need no staging at all;
//   - read where the caller keeps it: the algorithms whose peers never read this rank's input
//     (the registry's input_private: push_one_shot, push_two_shot, lamport_one_shot, which `auto`
//     picks at every size) read it in place, eager or captured, with no registration, also when
//     the call is in place (output == input: each block overwrites only what it read itself);
//   - eager in place (options.eager_in_place): an uncaptured, unregistered call whose peers read its
//     input, once every peer has mapped the input's allocation (core/eager_directory.h: per-rank
//     mailboxes in shared host memory, no store round trip), publishes the input's address in each
//     peer's space through the peers' signal buffers before its first barrier
//     (KernelArgs::input_views); a rank whose allocation is not mapped yet stages, publishing null,
//     and exports the allocation for the calls that follow;
//   - captured in place (options.graph_in_place): an out-of-place call captured into a CUDA graph
//     whose peers read its input (one_shot, two_shot, direct; two_shot in place too) leaves the
//     input where it is and reads the peers' addresses from a device table
//     (KernelArgs::input_table); register_graph_buffers(), collective, after the capture,
//     exchanges the handles of those inputs' allocations once and fills the table, so replays
//     read the peers' tensors in place (vLLM's custom all-reduce registers graph buffers so).
// Outputs are written in place (no peer ever reads another rank's output).
//
// Every wait on a flag inside a kernel is bounded (options.flag_timeout_ms). After a launch that
// saw a timeout, check() throws CollectiveError("rank R block B: peer P never arrived at barrier
// (set S, value V)") and the communicator refuses further IPC calls (its barrier counts no longer
// agree across ranks).
//
// Same-decision rule: every choice that changes what peers read (IPC vs NCCL, staged vs registered,
// algorithm, grid, chunking) depends only on arguments that are equal on every rank (count, dtype,
// algorithm, the table, whether a RegisteredBuffer is passed) and on decisions agreed through the
// store at construction (ipc_ready, eager in place on or off). Ranks never decide from local state
// alone. Three choices are rank-local and safe: reading an input_private algorithm's input in place
// or staged (peers never see which, and its chunks do not depend on it: a push message that fits
// the scratch fits the staging buffer); capturing in place, which every rank does for the same
// calls because every rank captures the same calls into its graph (a precondition of replaying
// collectives at all); and an eager call's input in place or staged, which its peers learn in the
// launch itself (every rank of an eager-mode launch publishes its entry, null when it staged; the
// mode depends only on the op, algorithm, size against buffer_bytes and rank 0's threshold, and
// whether the call is registered or captured).
//
// Not thread-safe; one stream at a time per communicator (two streams racing on one communicator's
// flags would deadlock, the failure seen in other projects).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/eager_directory.h"
#include "core/fnv1a.h"
#include "core/handle_exchange.h"
#include "core/storage.h"
#include "core/store.h"
#include "cuda_backend/communicator_options.h"
#include "cuda_backend/dispatch_table.h"
#include "cuda_backend/ipc_exchange.h"
#include "cuda_backend/kernel_args.h"

namespace exactcoll::cuda {

// A kernel reported a wait that timed out (message names rank, block, peer, set and value), or
// the communicator was used after such an error.
struct CollectiveError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A user buffer whose peers' addresses this communicator knows (register_buffer).
struct RegisteredBuffer {
  int id = -1;
  const void* local = nullptr;
  size_t bytes = 0;
};

// What one call ran.
struct CallInfo {
  Algorithm algo = Algorithm::kOneShot;  // never kAuto
  LaunchConfig grid;                     // zero for NCCL and copy-engine steps
  int launches = 0;                      // kernels (more than one when a message is chunked)
  bool staged = false;                   // the input went through the staging buffer
  bool exact = true;                     // false: an NCCL fallback whose bits follow no contract
  std::string note;                      // why a fallback happened
};

class Communicator {
 public:
  // Collective: every rank of the job calls it with the same options (and world_size), each in
  // its own process on its GPU (cudaSetDevice before). Ranks may share a GPU (shared_gpu()).
  // Throws StoreError, CudaError or CollectiveError.
  Communicator(Store& store, int rank, int world_size, CommunicatorOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  const std::string& arch() const { return arch_; }  // "sm90"
  bool ipc_ready() const { return ipc_ready_; }      // agreed by every rank
  const std::string& ipc_unavailable_reason() const { return ipc_reason_; }
  bool nccl_ready() const { return nccl_comm_ != nullptr; }
  // False after a kernel timed out (check() threw): IPC calls are refused from then on.
  bool usable() const { return !poisoned_; }
  // Why NCCL was not created ("" when it was).
  const std::string& nccl_unavailable_reason() const { return nccl_reason_; }
  // "" when eager calls can read their inputs in place (options.eager_in_place), else why not.
  const std::string& eager_unavailable_reason() const { return eager_reason_; }
  // The eager directory's counts (zero while eager in place is off).
  EagerDirectoryStats eager_stats() const;
  // Some ranks share a GPU (a correctness mode: kernels interleave by time slicing, NCCL is left
  // out, and flag waits get at least 60 s). Agreed by every rank.
  bool shared_gpu() const { return !shared_gpu_note_.empty(); }
  const std::string& shared_gpu_note() const { return shared_gpu_note_; }  // "ranks 0 and 1 share GPU ..."
  // The bound on in-kernel flag waits in effect (options, raised when ranks share a GPU).
  uint64_t flag_timeout_ms() const { return options_.flag_timeout_ms; }
  // The contract its exact calls fold under (the options').
  Contract contract() const { return options_.contract; }
  size_t buffer_bytes() const { return options_.buffer_bytes; }
  // Bytes of every rank's Lamport region (core/lamport.h: 3 buffers x n slots).
  size_t lamport_region_bytes() const { return lamport_bytes_; }
  // Whether kernels launch with programmatic dependent launch (CommunicatorOptions); the fused
  // kernels on this communicator follow it too.
  bool programmatic_launch() const { return options_.programmatic_launch; }
  const DispatchTable& table() const { return table_; }

  // Collective: every rank passes its own buffer of the same size, in the same order. Returns a
  // handle, equal on every rank, that the collectives accept. Preconditions: ptr is device memory
  // of this GPU (any offset inside a cudaMalloc allocation), 16-byte aligned.
  RegisteredBuffer register_buffer(const void* ptr, size_t bytes);

  // Collective: every rank calls it after capturing the same collectives into its CUDA graph(s),
  // before the first replay. Exports the allocations behind the inputs captured in place since the
  // last call (cuMemGetAddressRange, cudaIpcGetMemHandle), exchanges them once (handle_exchange:
  // only new allocations are opened) and fills their rows of the graph input table, so that
  // replays read every rank's input where it lies. Returns how many captured launches it
  // registered (0 when none was captured in place, or without the IPC path). It first waits for
  // this rank's device work (no replay may run while rows change): call it when no replay of those
  // graphs is in flight. Throws CollectiveError, on every rank, when some rank's input cannot be
  // exported (memory from cudaMallocAsync pools or expandable segments: capture with
  // options.graph_in_place = false), when ranks captured different sequences of in-place launches
  // (count, or op/type/count/algorithm digest), or when called during a capture. The launches it
  // covered are consumed either way: after a failure their rows stay null, and replays stage those
  // inputs, as they do until their rows are registered (same bits, the copy's cost). A failure
  // after the ranks agreed (a peer that never came, a rank that could not fill its rows) clears
  // this rank's rows and makes the communicator refuse further calls (usable() false): the ranks'
  // registrations may no longer line up. The first wait is for all work on the GPU, so call it
  // with no replay in flight and nothing queued that waits on another rank (an NCCL recv).
  // Example: capture g; comm.register_graph_buffers(); g.replay();
  size_t register_graph_buffers();

  // output[i] = the contract's fold over ranks of input_r[i], i < count.
  // Preconditions: input and output 16-byte aligned device memory; registered != nullptr means
  // input lies inside *registered at the same offset on every rank. algo: one_shot, two_shot,
  // push_one_shot, push_two_shot, lamport_one_shot, lamport_two_shot, auto or nccl. grid: forces a launch configuration
  // (tuning); default: the table's. push_one_shot and push_two_shot need 2 x n x count elements of scratch
  // (core/push.h, push_scratch_elements); where that exceeds buffer_bytes they run in
  // chunks that fit (push_chunk_elements), and auto takes them only where the table prices those
  // chunks below the other algorithms (DispatchTable::choose_allreduce_auto); auto takes
  // a Lamport algorithm only where the message runs in one launch (lamport_fits).
  CallInfo allreduce(const void* input, void* output, size_t count, DType dtype, Algorithm algo, cudaStream_t stream,
                     const RegisteredBuffer* registered = nullptr, std::optional<LaunchConfig> grid = {});

  // output[j] = fold over ranks of input_r[rank * count/n + j], j < count/n (count = per-rank input
  // elements, a multiple of n). algo: direct, auto or nccl. A staged input larger than buffer_bytes
  // runs in chunks (same bits); only an input that does not fit at all falls back to NCCL.
  CallInfo reduce_scatter(const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                          cudaStream_t stream, const RegisteredBuffer* registered = nullptr,
                          std::optional<LaunchConfig> grid = {});

  // output[r * count + i] = input_r[i] (count = per-rank input elements), bits unchanged.
  // algo: direct (SM copy), copy_engine, auto or nccl.
  CallInfo allgather(const void* input, void* output, size_t count, DType dtype, Algorithm algo, cudaStream_t stream,
                     const RegisteredBuffer* registered = nullptr, std::optional<LaunchConfig> grid = {});

  // Whether the IPC path has a launcher for (op, algo): every registry entry with kOnGpu and
  // picked_by_auto must, for each op it implements (tests/capi/enum_names_test.cc).
  static bool has_launcher(Op op, Algorithm algo) { return launcher_for(op, algo) != nullptr; }

  // This process's address of rank `peer`'s part of a registered buffer (copy-engine measurements).
  const void* peer_address(const RegisteredBuffer& buffer, int peer) const;

  // A device-side barrier of every rank (one block), e.g. to line ranks up before timing.
  void device_barrier(cudaStream_t stream);

  // Waits for stream, then throws CollectiveError if any kernel of this communicator recorded a
  // timeout since the last check.
  void check(cudaStream_t stream);

  // The choice `auto` (or a named algorithm) makes for a message (no launch).
  Choice choose(Op op, size_t count, DType dtype, Algorithm algo) const;

  // The largest grid the collectives' SM kernels launch with from now on: a launch whose chosen
  // grid (the tuned one) has more blocks runs with max_blocks; 0 (the default) keeps the tuned grid.
  // For a collective that overlaps other kernels (exactcoll.linear's prefill overlap): fewer blocks
  // leave SMs to the other kernel. Never changes bits (no algorithm's fold depends on its grid).
  // Collective state: every rank must set the same value before the same calls (a launch's blocks
  // signal their peers' blocks of the same index). Applies to all-reduce, reduce-scatter and
  // all-gather launches (so to the fused op's unfused all-reduce, not to its fused kernels).
  // Precondition: max_blocks >= 0.
  void set_max_blocks(int max_blocks) { max_blocks_ = max_blocks; }
  int max_blocks() const { return max_blocks_; }

  // For kernels outside this class (cuda_backend/fused): this rank's launch arguments with the
  // symmetric buffers filled in (inputs[r] = rank r's staging buffer; output, stage_from and count
  // zero). Throws CollectiveError when the IPC path is unavailable or the communicator unusable.
  KernelArgs ipc_kernel_args() const;

 private:
  struct PeerRegion {
    void* base = nullptr;  // this process's address of the peer's region
  };
  struct Registration {
    size_t bytes = 0;
    std::vector<const char*> peers;  // per rank: this process's address of rank r's buffer
  };

  // One call once run's steps 1-4 have settled its arguments, inputs and algorithm.
  struct Call {
    Op op = Op::kAllReduce;
    const void* input = nullptr;
    void* output = nullptr;
    size_t count = 0;  // input elements per rank
    DType dtype = DType::kBF16;
    cudaStream_t stream = nullptr;
    Choice choice;                      // never auto or nccl
    const Registration* reg = nullptr;  // peers read the registered input in place (null: staged)
    size_t reg_offset = 0;              // the input's byte offset inside the registration
    bool own_input = false;             // input_private: read where the caller keeps it
    bool captured_in_place = false;     // peers read it through the graph input table
    bool eager_views = false;           // an eager-mode launch: publishes input_views (null: staged)
    bool eager_in_place = false;        // ... and every peer reads this rank's input at views[peer]
    const void* views[kMaxRanks] = {};  // this rank's input as rank p addresses it (eager_in_place)
    std::string eager_note;             // why an eager-mode call staged
    size_t elem_bytes() const { return static_cast<size_t>(dtype_size(dtype)); }
    size_t in_bytes() const { return count * elem_bytes(); }
    bool staged() const { return reg == nullptr && !own_input && !captured_in_place && !eager_in_place; }
  };
  // Step 5 of run: one launcher per (op, algorithm family), NCCL's RunWorkElement<..., Algo,
  // Proto> as the model. launcher_for names it for every (op, algorithm) the GPU runs with IPC
  // (an exhaustive switch over the registry's families), or returns null.
  using Launcher = CallInfo (Communicator::*)(const Call&);
  static Launcher launcher_for(Op op, Algorithm algo);
  // one_shot, two_shot, push_one_shot, push_two_shot (all-reduce) and direct (reduce-scatter,
  // all-gather): one SM kernel per chunk.
  CallInfo launch_sm_kernels(const Call& call);
  // lamport_one_shot: the input read in place, in chunks of one Lamport slot.
  CallInfo launch_lamport(const Call& call);
  // copy_engine all-gather: copies between two barriers.
  CallInfo launch_copy_engine(const Call& call);
  // What a launcher reports before it launches: the choice and where the input came from.
  static CallInfo started(const Call& call);
  // inputs[r] of a launch at `byte_offset` into the message: staging buffers, or the registration.
  void fill_inputs(const Call& call, size_t byte_offset, KernelArgs* args) const;

  // Step 3 of run: the call's input inside `registered` (peers read it there), or staged when the
  // output overlaps it. Throws std::invalid_argument for an unknown buffer or an input outside it.
  void use_registration(Call* call, const RegisteredBuffer& registered, size_t out_bytes) const;
  // Steps 4b-4d of run, once the algorithm is chosen: whether the input is read where it lies
  // (input_private, captured in place, eager in place) or staged.
  void choose_input_path(Call* call, bool registered, size_t out_bytes);
  CallInfo run(Op op, const void* input, void* output, size_t count, DType dtype, Algorithm algo, cudaStream_t stream,
               const RegisteredBuffer* registered, std::optional<LaunchConfig> grid);
  CallInfo run_nccl(Op op, const void* input, void* output, size_t count, DType dtype, cudaStream_t stream);
  // NCCL instead of the IPC path, with the reason in the note.
  CallInfo nccl_fallback(const Call& call, const std::string& why);
  // Reduce-scatter of a staged input larger than the staging buffer, in chunks with the bits of
  // one call (communicator.cc says how).
  CallInfo run_chunked_reduce_scatter(const Call& call);
  // Collective: every rank publishes `value` and its `problem` ("" when none) under the store key
  // prefix and reads every rank's, so that all fail together or none does. Throws CollectiveError
  // "<what>: rank P: <problem>" for the first rank with a problem, or "<what>: <mismatch(P, its
  // value)>" for the first whose value differs from this rank's. Values contain no space.
  void agree_or_throw(const std::string& what, const std::string& prefix, const std::string& value,
                      const std::string& problem, const std::function<std::string(int, const std::string&)>& mismatch);
  // The constructor's steps, in order (communicator.cc says what each does): 1. this GPU (returns
  // its PCI bus id); 2. the symmetric region and the graph input table; 3. whether every pair can
  // share memory (returns this rank's problem, "" when none, before the ranks agree; fills *handle);
  // 4. the regions exchanged and the links proved; 4b. eager in place on or off for all; 5. NCCL.
  std::string this_gpu();
  void allocate_region();
  std::string check_peer_access(const std::string& bus_id, cudaIpcMemHandle_t* handle);
  void link_regions(const cudaIpcMemHandle_t& handle);
  void agree_on_eager();
  void create_nccl();
  // Collective: every rank publishes its `problem` ("" when none) under key prefix `round` and
  // returns the first rank's problem, the same on every rank.
  std::string first_problem(const std::string& round, const std::string& problem);
  // Construction step 4b: the eager mailboxes and directory, or eager_reason_ says why not.
  void set_up_eager();
  KernelArgs base_args() const;
  void launch(DType dtype, KernelKind kind, const KernelArgs& args, LaunchConfig grid, cudaStream_t stream);
  void require_usable() const;
  std::string key(const std::string& suffix) const { return options_.name + "/" + suffix; }

  Store& store_;
  int rank_;
  int world_size_;
  CommunicatorOptions options_;
  DispatchTable table_;
  int device_ = -1;
  std::string arch_;
  bool ipc_ready_ = false;
  std::string ipc_reason_;
  bool poisoned_ = false;
  int max_blocks_ = 0;  // set_max_blocks
  std::string poison_message_;
  std::string shared_gpu_note_;
  std::string nccl_reason_;

  void* region_ = nullptr;  // this rank's [signals | staging | scratch]
  size_t staging_offset_ = 0, scratch_offset_ = 0, region_bytes_ = 0;
  size_t lamport_offset_ = 0, lamport_bytes_ = 0;  // the Lamport region at the end (core/lamport.h)
  std::vector<PeerRegion> peers_;
  DeviceError* error_ = nullptr;
  IpcOpens mappings_;  // peers' allocations this communicator mapped (the exchange's and the eager ones)
  std::unique_ptr<HandleExchange> exchange_;
  struct Eager;                   // the mailboxes' shared memory and the directory (communicator.cc)
  std::unique_ptr<Eager> eager_;  // null: eager in place is off (eager_reason_ says why)
  std::string eager_reason_;
  std::vector<Registration> registrations_;
  // The graph input table: graph_slots_ rows of world_size_ device pointers (rank r's input at
  // column r), zeroed at creation; rows below graph_registered_ are filled, the next
  // graph_pending_.size() rows were handed to captured launches whose own inputs graph_pending_
  // lists, in capture order.
  const void** graph_table_ = nullptr;
  size_t graph_slots_ = 0;
  size_t graph_registered_ = 0;
  std::vector<const void*> graph_pending_;
  uint64_t graph_pending_digest_ = kFnv1aOffset;  // FNV-1a of each pending launch's op, algo, type, count, offset
  uint64_t graph_rounds_ = 0;                     // register_graph_buffers calls (store key rounds)
  uint64_t register_rounds_ = 0;                  // register_buffer attempts (store key rounds)
  ncclComm_t nccl_comm_ = nullptr;
};

}  // namespace exactcoll::cuda
