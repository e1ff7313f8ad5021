// The C API's GPU functions (exactcoll.h, "GPU communicators"), over cuda::Communicator and
// cuda::fused::FusedRmsNorm. Compiled only with a CUDA toolkit; capi/gpu_api_stub.cc stands in
// without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capi/api_support.h"
#include "capi/enum_names.h"
#include "capi/gpu_internal.h"
#include "capi/store_api.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "cuda_backend/multinode/multinode_communicator.h"
#include "cuda_backend/multinode/node_env.h"
#include "cuda_backend/nccl_api.h"
#include "exactcoll/exactcoll.h"

using namespace exactcoll;
using namespace exactcoll::capi;

namespace {

// A communicator behind a C handle: the store it was formed over (kept alive), the
// communicator, the fused op bound to it, and its registered buffers. A job of several nodes has
// the multi-node communicator instead (comm and fused stay null, nothing is registered).
struct CommState {
  std::shared_ptr<Store> store;
  std::unique_ptr<cuda::Communicator> comm;
  std::unique_ptr<cuda::fused::FusedRmsNorm> fused;
  std::unique_ptr<cuda::MultiNodeCommunicator> multinode;
  std::vector<cuda::RegisteredBuffer> registered;
  int device = -1;
};

// The sizes of the first versions of the growing structs (struct_size may be any size from these).
constexpr size_t kFirstCommOptionsSize = offsetof(exactcoll_comm_options, node);
// The struct sizes from which a field is the caller's: each added field sits in the tail padding of
// the struct before it (node after `device`, contract after `local_world_size`), so a field counts
// only when struct_size reaches past the next one (an older caller's padding is not a value).
constexpr size_t kCommOptionsWithNodeSize = offsetof(exactcoll_comm_options, local_world_size) + sizeof(int);
constexpr size_t kCommOptionsWithContractSize = offsetof(exactcoll_comm_options, reserved) + sizeof(int);
constexpr size_t kCommOptionsWithGraphInPlaceSize = offsetof(exactcoll_comm_options, reserved2) + sizeof(int);
constexpr size_t kCommOptionsWithEagerInPlaceSize = offsetof(exactcoll_comm_options, reserved3) + sizeof(int);
constexpr size_t kFirstCommPropertiesSize = offsetof(exactcoll_comm_properties, nodes);

HandleTable<CommState>& comms() {
  static HandleTable<CommState>* table = new HandleTable<CommState>();  // never destroyed: usable at exit
  return *table;
}

using cuda::DeviceScope;  // cuda_backend/cuda_check.h

// Runs body, turning the CUDA backend's exceptions into statuses: a CUDA runtime failure is CUDA,
// NCCL missing is UNAVAILABLE, a CollectiveError from a communicator that refuses IPC calls after
// an earlier timeout is UNUSABLE, and any other CollectiveError is `collective_status` (what it
// means at that call site: a timed-out wait for check, the IPC path missing for the ops).
template <class Body>
void translating(const cuda::Communicator* comm, exactcoll_status collective_status, Body&& body) {
  try {
    body();
  } catch (const cuda::CudaError& e) {
    fail(EXACTCOLL_ERROR_CUDA, e.what());
  } catch (const cuda::NcclError& e) {
    fail(EXACTCOLL_ERROR_UNAVAILABLE, e.what());
  } catch (const cuda::CollectiveError& e) {
    const bool refused = comm != nullptr && !comm->usable() && collective_status != EXACTCOLL_ERROR_TIMEOUT;
    fail(refused ? EXACTCOLL_ERROR_UNUSABLE : collective_status, e.what());
  }
}

std::shared_ptr<CommState> comm_of(exactcoll_comm comm) { return comms().get(comm.id, "communicator"); }

// The registry's algorithm of C value `algo` (the same number, core/registry.h), which the GPU must
// run; INVALID_ARGUMENT otherwise.
cuda::Algorithm gpu_algorithm(int algo) {
  const char* name = checked_name(kAlgoNames, algo, "algo");  // no allocation: this runs on every call
  const auto a = static_cast<cuda::Algorithm>(algo);
  if ((info(a).runs_on & kOnGpu) == 0) {
    bad_argument(std::string("algo ") + name + " runs in the simulator only (GPU: " + algorithm_names(kOnGpu) + ")");
  }
  return a;
}

int c_algorithm(cuda::Algorithm a) { return static_cast<int>(a); }

const cuda::RegisteredBuffer* registered_buffer(const CommState& state, int registered_id) {
  if (registered_id == -1) return nullptr;
  if (state.multinode) {
    bad_argument("registered_id " + std::to_string(registered_id) +
                 ": a multi-node communicator has no registered buffers (its inputs are staged; pass -1)");
  }
  if (registered_id < 0 || registered_id >= static_cast<int>(state.registered.size())) {
    bad_argument("registered_id " + std::to_string(registered_id) +
                 " is not a buffer registered on this communicator (" + std::to_string(state.registered.size()) +
                 " are; -1 for none)");
  }
  return &state.registered[static_cast<size_t>(registered_id)];
}

void fill_info(exactcoll_call_info* info, int algo, int allreduce_algo, bool exact, bool staged, int launches,
               const cuda::LaunchConfig& grid, const std::string& note) {
  if (info == nullptr) return;
  exactcoll_call_info_init(info);
  info->algo = algo;
  info->allreduce_algo = allreduce_algo;
  info->exact = exact ? 1 : 0;
  info->staged = staged ? 1 : 0;
  info->launches = launches;
  info->blocks = grid.blocks;
  info->threads = grid.threads;
  copy_text(info->note, note);
}

// What a multi-node call ran: algo -1 unless NCCL ran (the carry chain and the direct exchange
// have no exactcoll_algo); the note names the algorithm, and any fallback's reason.
void fill_multinode_info(exactcoll_call_info* info, int fused_algo, const cuda::MultiNodeCallInfo& ran) {
  const bool nccl = ran.algorithm == "nccl";
  const int algo = nccl ? static_cast<int>(Algorithm::kNccl) : -1;
  fill_info(info, fused_algo >= 0 ? fused_algo : algo, fused_algo >= 0 ? algo : -1, ran.exact, true, ran.launches, {},
            ran.note.empty() ? ran.algorithm : ran.algorithm + ": " + ran.note);
}

// A multi-node communicator's CollectiveError: UNUSABLE once a lost transfer poisoned it, else
// UNAVAILABLE (NCCL missing for the cross-node transport).
exactcoll_status multinode_status(const CommState& state) {
  return state.multinode->usable() ? EXACTCOLL_ERROR_UNAVAILABLE : EXACTCOLL_ERROR_UNUSABLE;
}

using CollectiveCall = cuda::CallInfo (cuda::Communicator::*)(const void*, void*, size_t, DType, cuda::Algorithm,
                                                              cudaStream_t, const cuda::RegisteredBuffer*,
                                                              std::optional<cuda::LaunchConfig>);
using MultiNodeCall = cuda::MultiNodeCallInfo (cuda::MultiNodeCommunicator::*)(const void*, void*, size_t, DType,
                                                                               cuda::Algorithm, cudaStream_t);

int run_collective(const char* function, CollectiveCall call, MultiNodeCall multinode_call, exactcoll_comm comm,
                   const void* input, void* output, size_t count, int dtype, int algo, void* stream, int registered_id,
                   exactcoll_call_info* info) {
  return guarded(function, [&] {
    if (info != nullptr) require_struct_size(info->struct_size, sizeof(exactcoll_call_info), "exactcoll_call_info");
    const std::shared_ptr<CommState> state = comm_of(comm);
    const DType type = to_dtype(dtype);
    const cuda::Algorithm a = gpu_algorithm(algo);
    if (count > 0) {
      require(input, "input");
      require(output, "output");
    }
    const cuda::RegisteredBuffer* registered = registered_buffer(*state, registered_id);
    if (state->multinode) {
      translating(nullptr, multinode_status(*state), [&] {
        DeviceScope device(state->device);
        fill_multinode_info(
            info, -1,
            ((*state->multinode).*multinode_call)(input, output, count, type, a, static_cast<cudaStream_t>(stream)));
      });
      return;
    }
    translating(state->comm.get(), EXACTCOLL_ERROR_UNAVAILABLE, [&] {
      DeviceScope device(state->device);
      const cuda::CallInfo ran =
          ((*state->comm).*call)(input, output, count, type, a, static_cast<cudaStream_t>(stream), registered, {});
      fill_info(info, c_algorithm(ran.algo), -1, ran.exact, ran.staged, ran.launches, ran.grid, ran.note);
    });
  });
}

}  // namespace

namespace exactcoll::capi {

namespace {
// The one-node state behind a handle (the CLI's tuning and testing objects have no multi-node form).
std::shared_ptr<CommState> one_node_state(exactcoll_comm comm) {
  std::shared_ptr<CommState> state = comm_of(comm);
  if (state->multinode) bad_argument("a multi-node communicator has no one-node backend objects");
  return state;
}
}  // namespace

cuda::Communicator& backend_communicator(exactcoll_comm comm) { return *one_node_state(comm)->comm; }
cuda::fused::FusedRmsNorm& backend_fused(exactcoll_comm comm) { return *one_node_state(comm)->fused; }
cuda::RegisteredBuffer backend_registered(exactcoll_comm comm, int registered_id) {
  if (registered_id == -1) bad_argument("registered_id -1 names no buffer");
  return *registered_buffer(*comm_of(comm), registered_id);
}

}  // namespace exactcoll::capi

extern "C" {

int exactcoll_has_cuda(void) { return 1; }

int exactcoll_comm_create(exactcoll_store store, int rank, int world_size, const exactcoll_comm_options* options,
                          exactcoll_comm* comm) {
  return guarded("exactcoll_comm_create", [&] {
    require(comm, "the result pointer");
    exactcoll_comm_options o;
    exactcoll_comm_options_init(&o);
    if (options != nullptr) {
      require_struct_size(options->struct_size, kFirstCommOptionsSize, "exactcoll_comm_options");
      // An older caller's struct ends sooner: its missing fields keep their defaults.
      std::memcpy(static_cast<void*>(&o), options, std::min(options->struct_size, sizeof o));
      exactcoll_comm_options defaults;
      exactcoll_comm_options_init(&defaults);
      if (options->struct_size < kCommOptionsWithNodeSize) {
        o.node = defaults.node;
        o.local_world_size = defaults.local_world_size;
      }
      if (options->struct_size < kCommOptionsWithContractSize) o.contract = defaults.contract;
      if (options->struct_size < kCommOptionsWithGraphInPlaceSize) o.graph_in_place = defaults.graph_in_place;
      if (options->struct_size < kCommOptionsWithEagerInPlaceSize) o.eager_in_place = defaults.eager_in_place;
      o.struct_size = sizeof o;
    }
    if (world_size < 1) bad_argument("world_size must be >= 1, got " + std::to_string(world_size));
    if (rank < 0 || rank >= world_size) {
      bad_argument("rank " + std::to_string(rank) + " is outside 0.." + std::to_string(world_size - 1));
    }
    if (o.buffer_bytes < 4096)
      bad_argument("buffer_bytes must be at least 4096, got " + std::to_string(o.buffer_bytes));
    if (o.flag_timeout_ms < 1) bad_argument("flag_timeout_ms must be >= 1");
    if (o.store_timeout_ms < 1) bad_argument("store_timeout_ms must be >= 1");
    if (o.name != nullptr && *o.name == '\0') bad_argument("name is empty (NULL gives \"exactcoll\")");
    if (o.node < -1) bad_argument("node must be -1 (from the environment) or >= 0, got " + std::to_string(o.node));
    if (o.local_world_size < 0) {
      bad_argument("local_world_size must be 0 (from the environment) or >= 1, got " +
                   std::to_string(o.local_world_size));
    }
    checked_name(kContractNames, o.contract, "contract");
    const auto contract = static_cast<Contract>(o.contract);  // the registry's values are the C values
    if (!exactcoll::info(contract).library_contract || (exactcoll::info(contract).runs_on & kOnGpu) == 0) {
      bad_argument(std::string("a communicator folds under the library's contracts on GPUs (") +
                   library_contract_names(kOnGpu) + "), not " + contract_name(contract));
    }
    if (o.graph_in_place != 0 && o.graph_in_place != 1) {
      bad_argument("graph_in_place must be 0 or 1, got " + std::to_string(o.graph_in_place));
    }
    if (o.eager_in_place != 0 && o.eager_in_place != 1) {
      bad_argument("eager_in_place must be 0 or 1, got " + std::to_string(o.eager_in_place));
    }
    multinode::RankPlace place;
    try {
      place = cuda::node_place(process_environment(), rank, world_size, o.node, o.local_world_size);
    } catch (const BootstrapError& e) {
      bad_argument(e.what());
    }
    auto state = std::make_shared<CommState>();
    state->store = store_of(store);
    cuda::CommunicatorOptions co;
    if (o.name != nullptr) co.name = o.name;
    co.buffer_bytes = o.buffer_bytes;
    co.flag_timeout_ms = o.flag_timeout_ms;
    co.store_timeout = std::chrono::milliseconds(o.store_timeout_ms);
    co.use_nccl = o.use_nccl != 0;
    co.programmatic_launch = o.programmatic_launch != 0;
    co.contract = contract;
    co.graph_in_place = o.graph_in_place != 0;
    co.eager_in_place = o.eager_in_place != 0;
    if (place.local_world_size != world_size && (exactcoll::info(contract).runs_on & kOnMultiNode) == 0) {
      // A contract the registry does not mark kOnMultiNode (canonical and tree both run across nodes).
      bad_argument(std::string("the ") + contract_name(contract) + " contract runs on one node; this job spans " +
                   std::to_string(world_size / place.local_world_size) + " nodes");
    }
    translating(nullptr, EXACTCOLL_ERROR_UNAVAILABLE, [&] {
      int devices = 0;
      EXC_CUDA_CHECK(cudaGetDeviceCount(&devices));
      if (o.device < -1 || o.device >= devices) {
        bad_argument("device " + std::to_string(o.device) + " is outside -1.." + std::to_string(devices - 1) + " (" +
                     std::to_string(devices) + " visible)");
      }
      if (o.device == -1) {
        EXC_CUDA_CHECK(cudaGetDevice(&state->device));
      } else {
        state->device = o.device;
      }
      DeviceScope device(state->device);
      if (place.local_world_size == world_size) {
        state->comm = std::make_unique<cuda::Communicator>(*state->store, rank, world_size, co);
        state->fused = std::make_unique<cuda::fused::FusedRmsNorm>(*state->comm);
        return;
      }
      // Several nodes: every rank's place is checked together (the same verdict everywhere).
      cuda::MultiNodeOptions mo;
      mo.name = co.name;
      mo.node = co;
      mo.store_timeout = co.store_timeout;
      try {
        state->multinode = std::make_unique<cuda::MultiNodeCommunicator>(*state->store, rank, world_size, place, mo);
      } catch (const BootstrapError& e) {
        bad_argument(e.what());
      }
      if (!state->multinode->nccl_ready()) {
        fail(EXACTCOLL_ERROR_UNAVAILABLE, "a job of " + std::to_string(world_size / place.local_world_size) +
                                              " nodes needs NCCL between them, and NCCL could not be created");
      }
    });
    comm->id = comms().add(std::move(state));
  });
}

int exactcoll_comm_destroy(exactcoll_comm comm) {
  return guarded("exactcoll_comm_destroy", [&] {
    std::shared_ptr<CommState> state = comms().remove(comm.id, "communicator");
    translating(nullptr, EXACTCOLL_ERROR_CUDA, [&] {
      DeviceScope device(state->device);
      state.reset();  // the communicator's destructor passes the closing barrier and frees its buffers
    });
  });
}

int exactcoll_comm_properties_get(exactcoll_comm comm, exactcoll_comm_properties* properties) {
  return guarded("exactcoll_comm_properties_get", [&] {
    require(properties, "properties");
    require_struct_size(properties->struct_size, kFirstCommPropertiesSize, "exactcoll_comm_properties");
    const std::shared_ptr<CommState> state = comm_of(comm);
    const cuda::Communicator& c = state->multinode ? state->multinode->node() : *state->comm;
    exactcoll_comm_properties p{};
    p.struct_size = std::min(properties->struct_size, sizeof p);
    p.rank = state->multinode ? state->multinode->rank() : c.rank();
    p.world_size = state->multinode ? state->multinode->world_size() : c.world_size();
    p.nodes = state->multinode ? state->multinode->layout().nodes : 1;
    p.local_world_size = c.world_size();
    p.contract = static_cast<int>(c.contract());
    p.device = c.device();
    p.ipc_ready = c.ipc_ready() ? 1 : 0;
    p.nccl_ready = c.nccl_ready() ? 1 : 0;
    p.shared_gpu = c.shared_gpu() ? 1 : 0;
    p.buffer_bytes = c.buffer_bytes();
    p.flag_timeout_ms = c.flag_timeout_ms();
    copy_text(p.arch, c.arch());
    copy_text(p.ipc_unavailable_reason, c.ipc_unavailable_reason());
    copy_text(p.nccl_unavailable_reason, c.nccl_unavailable_reason());
    copy_text(p.eager_unavailable_reason, c.eager_unavailable_reason());
    if (state->multinode) p.nccl_ready = state->multinode->nccl_ready() ? 1 : 0;  // the cross-node NCCL
    std::memcpy(static_cast<void*>(properties), &p, p.struct_size);  // as much as the caller's struct holds
  });
}

int exactcoll_comm_register_buffer(exactcoll_comm comm, const void* buffer, size_t bytes, int* id) {
  return guarded("exactcoll_comm_register_buffer", [&] {
    require(buffer, "buffer");
    require(id, "the result pointer");
    if (bytes == 0) bad_argument("bytes must be > 0");
    const std::shared_ptr<CommState> state = comm_of(comm);
    if (state->multinode) {
      bad_argument(
          "a multi-node communicator registers no buffers (its inputs are staged through the node's "
          "buffers); call the ops with registered_id -1");
    }
    translating(state->comm.get(), EXACTCOLL_ERROR_INVALID_ARGUMENT, [&] {
      DeviceScope device(state->device);
      state->registered.push_back(state->comm->register_buffer(buffer, bytes));
    });
    *id = static_cast<int>(state->registered.size()) - 1;
  });
}

int exactcoll_comm_register_graph_buffers(exactcoll_comm comm, size_t* registered) {
  return guarded("exactcoll_comm_register_graph_buffers", [&] {
    const std::shared_ptr<CommState> state = comm_of(comm);
    size_t count = 0;
    if (!state->multinode) {  // the multi-node communicator stages every input
      translating(state->comm.get(), EXACTCOLL_ERROR_INVALID_ARGUMENT, [&] {
        DeviceScope device(state->device);
        count = state->comm->register_graph_buffers();
      });
    }
    if (registered != nullptr) *registered = count;
  });
}

int exactcoll_allreduce(exactcoll_comm comm, const void* input, void* output, size_t count, int dtype, int algo,
                        void* stream, int registered_id, exactcoll_call_info* info) {
  return run_collective("exactcoll_allreduce", &cuda::Communicator::allreduce, &cuda::MultiNodeCommunicator::allreduce,
                        comm, input, output, count, dtype, algo, stream, registered_id, info);
}

int exactcoll_reduce_scatter(exactcoll_comm comm, const void* input, void* output, size_t count, int dtype, int algo,
                             void* stream, int registered_id, exactcoll_call_info* info) {
  return run_collective("exactcoll_reduce_scatter", &cuda::Communicator::reduce_scatter,
                        &cuda::MultiNodeCommunicator::reduce_scatter, comm, input, output, count, dtype, algo, stream,
                        registered_id, info);
}

int exactcoll_allgather(exactcoll_comm comm, const void* input, void* output, size_t count, int dtype, int algo,
                        void* stream, int registered_id, exactcoll_call_info* info) {
  return run_collective("exactcoll_allgather", &cuda::Communicator::allgather, &cuda::MultiNodeCommunicator::allgather,
                        comm, input, output, count, dtype, algo, stream, registered_id, info);
}

}  // extern "C"

namespace {

// The checks every norm entry point makes: rows, hidden and eps in range, the pointers present.
void check_norm_arguments(int64_t rows, int64_t hidden, float eps, std::initializer_list<const void*> pointers) {
  if (rows < 0 || rows > (int64_t{1} << 30)) bad_argument("rows must be 0..2^30, got " + std::to_string(rows));
  if (hidden < 1 || hidden > (int64_t{1} << 24))
    bad_argument("hidden must be 1..16777216, got " + std::to_string(hidden));
  if (!std::isfinite(eps) || eps < 0.0f) bad_argument("eps must be finite and >= 0, got " + std::to_string(eps));
  if (rows == 0) return;
  const char* names[] = {"x", "residual", "weight", "residual_out", "out"};
  int i = 0;
  for (const void* p : pointers) require(p, names[i++]);
}

}  // namespace

extern "C" {

int exactcoll_add_rmsnorm(const void* x, const void* residual, const void* weight, void* residual_out, void* out,
                          int64_t rows, int64_t hidden, float eps, int dtype, int device, void* stream) {
  return guarded("exactcoll_add_rmsnorm", [&] {
    const DType type = to_dtype(dtype);
    check_norm_arguments(rows, hidden, eps, {x, residual, weight, residual_out, out});
    if (device < -1)
      bad_argument("device must be -1 (the current one) or a device index, got " + std::to_string(device));
    translating(nullptr, EXACTCOLL_ERROR_CUDA, [&] {
      // Not from the stream (cudaStreamGetDevice is refused while the stream is being captured).
      if (device == -1) EXC_CUDA_CHECK(cudaGetDevice(&device));
      DeviceScope scope(device);
      cuda::fused::launch_residual_rmsnorm(
          x, residual, weight, residual_out, out,
          cuda::fused::FusedRmsNormShape{static_cast<int>(rows), static_cast<int>(hidden), eps, type},
          static_cast<cudaStream_t>(stream), /*programmatic=*/true);
    });
  });
}

int exactcoll_fused_add_rmsnorm(exactcoll_comm comm, const void* x, const void* residual, const void* weight,
                                void* residual_out, void* out, int64_t rows, int64_t hidden, float eps, int dtype,
                                int algo, void* stream, int registered_id, exactcoll_call_info* info) {
  return guarded("exactcoll_fused_add_rmsnorm", [&] {
    if (info != nullptr) require_struct_size(info->struct_size, sizeof(exactcoll_call_info), "exactcoll_call_info");
    const std::shared_ptr<CommState> state = comm_of(comm);
    const DType type = to_dtype(dtype);
    const char* name = checked_name(kFusedAlgoNames, algo, "fused algo");
    const auto a = static_cast<cuda::fused::FusedAlgorithm>(algo);
    if ((exactcoll::info(a).runs_on & kOnGpu) == 0) {
      bad_argument(std::string("fused algo ") + name +
                   " runs in the simulator only (GPU: " + fused_algorithm_names(kOnGpu) + ")");
    }
    check_norm_arguments(rows, hidden, eps, {x, residual, weight, residual_out, out});
    const cuda::RegisteredBuffer* registered = registered_buffer(*state, registered_id);
    // x is read by peers (or staged) while the outputs are written: they must be separate memory.
    const size_t bytes =
        static_cast<size_t>(rows) * static_cast<size_t>(hidden) * static_cast<size_t>(dtype_size(type));
    auto overlap = [bytes](const void* a, const void* b) {
      const auto x0 = reinterpret_cast<uintptr_t>(a), y0 = reinterpret_cast<uintptr_t>(b);
      return x0 < y0 + bytes && y0 < x0 + bytes;
    };
    if (rows > 0 && (overlap(x, out) || overlap(x, residual_out) || overlap(out, residual_out))) {
      bad_argument("x, out and residual_out must not overlap");
    }
    if (state->multinode) {
      if ((exactcoll::info(a).runs_on & kOnMultiNode) == 0) {
        bad_argument(std::string("across nodes the fused op is the carry-chain all-reduce, then the norm on each GPU "
                                 "(algo auto), or nccl_split; not ") +
                     name);
      }
      translating(nullptr, multinode_status(*state), [&] {
        DeviceScope device(state->device);
        const cuda::MultiNodeCallInfo ran = state->multinode->fused_add_rmsnorm(
            x, residual, weight, residual_out, out, static_cast<int>(rows), static_cast<int>(hidden), eps, type,
            a == FusedAlgorithm::kAuto ? cuda::Algorithm::kAuto : cuda::Algorithm::kNccl,
            static_cast<cudaStream_t>(stream));
        fill_multinode_info(
            info, static_cast<int>(a == FusedAlgorithm::kAuto ? FusedAlgorithm::kUnfused : FusedAlgorithm::kNcclSplit),
            ran);
      });
      return;
    }
    cuda::fused::FusedRmsNormBuffers buffers{x, residual, weight, residual_out, out};
    cuda::fused::FusedRmsNormShape shape{static_cast<int>(rows), static_cast<int>(hidden), eps, type};
    translating(state->comm.get(), EXACTCOLL_ERROR_UNAVAILABLE, [&] {
      DeviceScope device(state->device);
      const cuda::fused::FusedCallInfo ran =
          state->fused->run(buffers, shape, a, static_cast<cudaStream_t>(stream), registered);
      int allreduce_algo = -1;
      if (!ran.allreduce.empty()) allreduce_algo = value_of(kAlgoNames, ran.allreduce);
      fill_info(info, static_cast<int>(ran.algo), allreduce_algo, ran.exact, ran.staged, ran.launches, ran.grid, "");
    });
  });
}

int exactcoll_comm_set_max_blocks(exactcoll_comm comm, int max_blocks, int* previous) {
  return guarded("exactcoll_comm_set_max_blocks", [&] {
    if (max_blocks < 0) bad_argument("max_blocks must be >= 0 (0: the tuned grid), got " + std::to_string(max_blocks));
    const std::shared_ptr<CommState> state = comm_of(comm);
    cuda::Communicator& launcher = state->multinode ? state->multinode->node() : *state->comm;
    if (previous != nullptr) *previous = launcher.max_blocks();
    launcher.set_max_blocks(max_blocks);
  });
}

int exactcoll_comm_check(exactcoll_comm comm, void* stream) {
  return guarded("exactcoll_comm_check", [&] {
    const std::shared_ptr<CommState> state = comm_of(comm);
    translating(state->comm.get(), EXACTCOLL_ERROR_TIMEOUT, [&] {
      DeviceScope device(state->device);
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      EXC_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture));
      if (capture != cudaStreamCaptureStatusNone) {
        bad_argument("the stream is being captured into a CUDA graph: check after the graph is replayed");
      }
      if (state->multinode) {
        state->multinode->check(static_cast<cudaStream_t>(stream));
      } else {
        state->comm->check(static_cast<cudaStream_t>(stream));
      }
    });
  });
}

}  // extern "C"
