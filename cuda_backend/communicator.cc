#include "cuda_backend/communicator.h"

#include <cuda.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "core/collectives.h"
#include "core/lamport.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/ipc_exchange.h"
#include "cuda_backend/kernels.h"
#include "cuda_backend/nccl_api.h"
#include "cuda_backend/nccl_bootstrap.h"

namespace exactcoll::cuda {
namespace {

constexpr size_t kAlign = 4096;
constexpr uint64_t kIpcTestTimeoutMs = 3000;
// Ranks sharing a GPU run by time slicing: a barrier round trip takes milliseconds (about 4.5 ms
// for two processes on an H100, ../shared/facts/environment.md), and a slice can hold a kernel
// for much longer under load, so their in-kernel waits get at least this bound.
constexpr uint64_t kSharedGpuMinFlagTimeoutMs = 60000;
constexpr std::chrono::milliseconds kCloseTimeout{30000};
// After a flag timeout a peer is dead: this barrier can never complete, so its whole bound is
// spent on every close. It only gives live peers a moment to leave kernels that still read this
// rank's buffers (they timed out at about the same time); it is part of the "kernel bound + 1 s"
// within which a dead peer's survivors exit (docs/reliability.md).
constexpr std::chrono::milliseconds kClosePoisonedTimeout{200};

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

using MemGetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

// cuMemGetAddressRange (cuda_check.h's driver_entry: no libcuda link dependency).
MemGetAddressRangeFn mem_get_address_range() {
  static const MemGetAddressRangeFn fn = driver_entry<MemGetAddressRangeFn>("cuMemGetAddressRange");
  return fn;
}

using PointerGetAttributesFn = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);

// cuPointerGetAttributes, as above.
PointerGetAttributesFn pointer_get_attributes() {
  static const PointerGetAttributesFn fn = driver_entry<PointerGetAttributesFn>("cuPointerGetAttributes");
  return fn;
}

// The allocation holding ptr: its base and size, and the id the driver gives each allocation for
// the process's life (so a freed-and-reused address range is a new allocation). nullopt: not
// device memory.
std::optional<EagerAllocation> find_allocation(const void* ptr) {
  const PointerGetAttributesFn get = pointer_get_attributes();
  if (get == nullptr) return std::nullopt;
  CUdeviceptr base = 0;
  size_t bytes = 0;
  unsigned long long id = 0;
  CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                      CU_POINTER_ATTRIBUTE_BUFFER_ID};
  void* data[] = {&base, &bytes, &id};
  if (get(3, attributes, data, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS || base == 0 || bytes == 0) {
    return std::nullopt;
  }
  return EagerAllocation{static_cast<uint64_t>(base), static_cast<uint64_t>(bytes), static_cast<uint64_t>(id)};
}

// The calling thread's stream-capture mode set to relaxed for a scope (cudaThreadExchangeStreamCaptureMode).
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureScope() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kBF16: return ncclBfloat16;
    case DType::kFP16: return ncclFloat16;
    case DType::kFP32: return ncclFloat32;
  }
  return ncclFloat32;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether the stream is capturing into a CUDA graph (a legal query during a capture). A query that
// fails (the legacy stream while another thread captures globally) is no capture, its error cleared.
bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status == cudaStreamCaptureStatusActive;
}

}  // namespace

// ---- construction ------------------------------------------------------------------------------

Communicator::Communicator(Store& store, int rank, int world_size, CommunicatorOptions options)
    : store_(store),
      rank_(rank),
      world_size_(world_size),
      options_(std::move(options)),
      table_(options_.table ? *options_.table : DispatchTable::from_environment()) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("Communicator: rank " + std::to_string(rank) + " outside world of " +
                                std::to_string(world_size));
  }
  const std::string bus_id = this_gpu();  // 1
  allocate_region();                      // 2
  cudaIpcMemHandle_t handle{};
  ipc_reason_ = first_problem("ipc/checked", check_peer_access(bus_id, &handle));  // 3
  link_regions(handle);                                                            // 4
  agree_on_eager();                                                                // 4b
  create_nccl();                                                                   // 5
}

std::string Communicator::this_gpu() {
  // 1. This GPU.
  EXC_CUDA_CHECK(cudaGetDevice(&device_));
  cudaDeviceProp prop{};
  EXC_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  arch_ = "sm" + std::to_string(prop.major * 10 + prop.minor);
  char bus_id[64] = {};
  EXC_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device_));
  return bus_id;
}

void Communicator::allocate_region() {
  // 2. The symmetric region [signals | staging | scratch | lamport], signals zeroed and the
  //    Lamport region filled with sentinels (0xFF bytes: all-ones in every type) before anyone can
  //    see it.
  staging_offset_ = round_up(sizeof(SignalBuffer), kAlign);
  scratch_offset_ = staging_offset_ + round_up(options_.buffer_bytes, kAlign);
  lamport_offset_ = scratch_offset_ + round_up(options_.buffer_bytes, kAlign);
  lamport_bytes_ = exactcoll::lamport_region_bytes(options_.lamport_message_bytes, 1, world_size_);
  region_bytes_ = lamport_offset_ + round_up(lamport_bytes_, kAlign);
  EXC_CUDA_CHECK(cudaMalloc(&region_, region_bytes_));
  EXC_CUDA_CHECK(cudaMemset(region_, 0, staging_offset_));
  EXC_CUDA_CHECK(cudaMemset(static_cast<char*>(region_) + lamport_offset_, 0xFF, lamport_bytes_));
  EXC_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&error_), sizeof(DeviceError)));
  EXC_CUDA_CHECK(cudaMemset(error_, 0, sizeof(DeviceError)));
  // The graph input table, allocated now (no allocation may happen inside a capture), all null.
  if (options_.graph_in_place && options_.graph_input_slots > 0) {
    graph_slots_ = options_.graph_input_slots;
    const size_t table_bytes = graph_slots_ * static_cast<size_t>(world_size_) * sizeof(void*);
    EXC_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&graph_table_), table_bytes));
    EXC_CUDA_CHECK(cudaMemset(graph_table_, 0, table_bytes));
  }
  EXC_CUDA_CHECK(cudaDeviceSynchronize());
  peers_.assign(static_cast<size_t>(world_size_), PeerRegion{});
  peers_[static_cast<size_t>(rank_)].base = region_;
}

std::string Communicator::check_peer_access(const std::string& bus_id, cudaIpcMemHandle_t* handle) {
  // 3. Can every pair share memory? Each rank publishes its GPU (or why it cannot export), reads
  //    every rank's, checks peer access to every other GPU, and all ranks agree before anyone opens
  //    anything. Ranks on the same GPU share memory through IPC too (across processes), but they
  //    run by time slicing: every rank sees the same list, so all agree on shared_gpu_.
  std::string problem;
  if (world_size_ > kMaxRanks) {
    problem = "world size " + std::to_string(world_size_) + " exceeds the IPC kernels' " + std::to_string(kMaxRanks);
  } else if (cudaIpcGetMemHandle(handle, region_) != cudaSuccess) {
    problem = "rank " + std::to_string(rank_) + ": cudaIpcGetMemHandle: " + cudaGetErrorString(cudaGetLastError());
  }
  store_.set(key("ipc/gpu/" + std::to_string(rank_)), bus_id);
  std::vector<std::string> buses(static_cast<size_t>(world_size_));
  for (int p = 0; p < world_size_; ++p) {
    buses[static_cast<size_t>(p)] =
        p == rank_ ? bus_id : store_.get(key("ipc/gpu/" + std::to_string(p)), options_.store_timeout);
  }
  for (int p = 0; p < world_size_ && shared_gpu_note_.empty(); ++p) {
    for (int q = p + 1; q < world_size_ && shared_gpu_note_.empty(); ++q) {
      if (buses[static_cast<size_t>(p)] == buses[static_cast<size_t>(q)]) {
        shared_gpu_note_ =
            "ranks " + std::to_string(p) + " and " + std::to_string(q) + " share GPU " + buses[static_cast<size_t>(p)];
      }
    }
  }
  if (!shared_gpu_note_.empty()) {
    options_.flag_timeout_ms = std::max(options_.flag_timeout_ms, kSharedGpuMinFlagTimeoutMs);
  }
  for (int p = 0; p < world_size_ && problem.empty(); ++p) {
    if (p == rank_) continue;
    const std::string& peer_bus = buses[static_cast<size_t>(p)];
    int peer_device = -1;
    if (cudaDeviceGetByPCIBusId(&peer_device, peer_bus.c_str()) == cudaSuccess && peer_device != device_) {
      int can = 0;
      EXC_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_, peer_device));
      if (!can) {
        problem = "GPU " + bus_id + " (rank " + std::to_string(rank_) + ") cannot access GPU " + peer_bus + " (rank " +
                  std::to_string(p) + ") as a peer";
      }
    }
    (void)cudaGetLastError();  // a peer GPU outside CUDA_VISIBLE_DEVICES is not an error here
  }
  return problem;
}

void Communicator::link_regions(const cudaIpcMemHandle_t& handle) {
  // 4. Exchange the regions through the handle-exchange protocol (core/handle_exchange.h), then
  //    prove the links with a real barrier kernel (drivers that claim peer access but do not
  //    deliver exist), and agree again.
  HandleExchangeOptions hx_options;
  hx_options.key_prefix = key("handles");
  hx_options.timeout = options_.store_timeout;
  exchange_ = make_ipc_exchange<CollectiveError>(store_, rank_, world_size_, &mappings_, hx_options);
  if (ipc_reason_.empty()) {
    std::string problem;
    const auto peers = exchange_->exchange({exported_ipc_region(handle, region_, region_bytes_)});
    for (int p = 0; p < world_size_; ++p) peers_[static_cast<size_t>(p)].base = peers[0][static_cast<size_t>(p)];
    ipc_ready_ = true;  // device_barrier needs it
    const uint64_t saved = options_.flag_timeout_ms;
    options_.flag_timeout_ms = shared_gpu() ? saved : kIpcTestTimeoutMs;
    try {
      device_barrier(nullptr);
      check(nullptr);
    } catch (const CollectiveError& e) {
      problem = std::string("IPC barrier test failed: ") + e.what();
      EXC_CUDA_CHECK(cudaMemset(error_, 0, sizeof(DeviceError)));
      EXC_CUDA_CHECK(cudaDeviceSynchronize());
    }
    options_.flag_timeout_ms = saved;
    ipc_reason_ = first_problem("ipc/tested", problem);
    ipc_ready_ = ipc_reason_.empty();
    poisoned_ = false;
  }
}

void Communicator::agree_on_eager() {
  // 4b. Eager in place: on for every rank (its option agreed first) with every rank's mailbox
  //     mapped by every rank, or off on all of them.
  if (!ipc_ready_) {
    eager_reason_ = "the IPC path is unavailable";
  } else {
    const std::string off =
        options_.eager_in_place ? "" : "rank " + std::to_string(rank_) + " was created with eager_in_place = false";
    eager_reason_ = first_problem("eager/wanted", off);
    if (eager_reason_.empty()) set_up_eager();
  }
}

void Communicator::create_nccl() {
  // 5. NCCL: every rank must have the library before any calls ncclCommInitRank (which waits for
  //    all ranks without a bound). NCCL refuses two ranks on one GPU ("invalid usage"), so ranks
  //    sharing a GPU go on without it (every rank knows, from the same list of GPUs).
  if (!options_.use_nccl) {
    nccl_reason_ = "created without NCCL (use_nccl = false)";
  } else if (shared_gpu()) {
    nccl_reason_ = "left out because " + shared_gpu_note_ + " (NCCL refuses two ranks on one GPU)";
  } else {
    nccl_comm_ = create_nccl_comm(store_, key("nccl"), rank_, world_size_, options_.store_timeout, &nccl_reason_);
  }
}

Communicator::~Communicator() {
  // Peers may still read this rank's buffers until they pass this barrier. After a flag timeout
  // (poisoned) a peer is dead or stuck: its live peers timed out too and come at once, so the
  // barrier waits only briefly, and a dead rank costs its peers one timeout, not one more close.
  try {
    store_.barrier(key("close"), rank_, world_size_, poisoned_ ? kClosePoisonedTimeout : kCloseTimeout);
  } catch (const std::exception& e) {
    std::cerr << "exactcoll: rank " << rank_ << ": closing communicator " << options_.name << ": " << e.what() << "\n";
  }
  if (nccl_comm_ != nullptr) {
    try {
      if (poisoned_) {
        // A peer is dead: NCCL is aborted (a destroy could wait for it), on a thread of its own,
        // since the abort takes about a second (4 x H100, 2026-11-27) and a dead peer's survivors
        // are to leave within the kernel bound + 1 s (docs/reliability.md). A process that goes on
        // gets NCCL's resources back when the abort ends; one that exits ends it there.
        // The function pointer is read here: the detached thread touches no static (it may outlive
        // main and static destruction).
        auto abort = NcclApi::get().CommAbort;
        std::thread([abort, comm = nccl_comm_] { abort(comm); }).detach();
      } else {
        NcclApi::get().CommDestroy(nccl_comm_);
      }
    } catch (...) {
    }
  }
  // This rank's own kernels may still read peers' memory through the eager mappings (and the
  // regions'): let them finish (every wait in them is bounded) before anything is unmapped.
  (void)cudaDeviceSynchronize();
  eager_.reset();  // closes the eager mappings (peers are past the close barrier: none reads them)
  exchange_.reset();
  if (region_ != nullptr) (void)cudaFree(region_);
  if (error_ != nullptr) (void)cudaFree(error_);
  if (graph_table_ != nullptr) (void)cudaFree(graph_table_);
}

std::string Communicator::first_problem(const std::string& round, const std::string& problem) {
  store_.set(key(round + "/" + std::to_string(rank_)), problem);
  store_.barrier(key(round), rank_, world_size_, options_.store_timeout);
  std::string first;
  for (int p = 0; p < world_size_ && first.empty(); ++p) {
    first = store_.get(key(round + "/" + std::to_string(p)), options_.store_timeout);
  }
  return first;
}

// ---- eager in place ------------------------------------------------------------------------------

struct Communicator::Eager {
  std::vector<boost::interprocess::mapped_region> regions;  // every rank's mailbox, mapped here
  std::unique_ptr<EagerDirectory> directory;
};

// Each rank creates its mailbox as a POSIX shared-memory object named from rank 0's random token
// (unique to this communicator on the host), every rank maps every one, all agree, and each rank
// removes its name: the mappings stay, and nothing is left in /dev/shm even if a process dies.
void Communicator::set_up_eager() {
  namespace bip = boost::interprocess;
  // Rank 0's threshold holds for every rank (whether a launch publishes its input must not differ
  // between ranks): options.eager_in_place_min_bytes, or EXACTCOLL_EAGER_MIN_BYTES where set.
  if (rank_ == 0) {
    std::random_device random;
    const uint64_t token = (uint64_t{random()} << 32) ^ random();
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(token));
    store_.set(key("eager/token"), text);
    std::optional<size_t> min_bytes = options_.eager_in_place_min_bytes;
    if (const char* env = std::getenv("EXACTCOLL_EAGER_MIN_BYTES"); env != nullptr && *env != '\0') {
      char* end = nullptr;
      errno = 0;
      const unsigned long long v = std::strtoull(env, &end, 10);
      if (errno != 0 || *end != '\0' || *env == '-') {
        std::cerr << "exactcoll: EXACTCOLL_EAGER_MIN_BYTES=" << env << " is not a byte count; using "
                  << (min_bytes ? std::to_string(*min_bytes) : std::string("the per-algorithm defaults")) << "\n";
      } else {
        min_bytes = static_cast<size_t>(v);
      }
    }
    store_.set(key("eager/min_bytes"), min_bytes ? std::to_string(*min_bytes) : std::string("default"));
  }
  const std::string token = store_.get(key("eager/token"), options_.store_timeout);
  if (const std::string agreed = store_.get(key("eager/min_bytes"), options_.store_timeout); agreed == "default") {
    options_.eager_in_place_min_bytes.reset();
  } else {
    options_.eager_in_place_min_bytes = std::stoull(agreed);
  }
  auto name_of = [&](int r) { return "exactcoll." + token + "." + std::to_string(r); };
  auto eager = std::make_unique<Eager>();
  eager->regions.resize(static_cast<size_t>(world_size_));
  std::string problem;
  bool created = false;
  try {
    bip::shared_memory_object shm(bip::create_only, name_of(rank_).c_str(), bip::read_write);
    created = true;
    shm.truncate(static_cast<bip::offset_t>(sizeof(EagerMailbox)));
    eager->regions[static_cast<size_t>(rank_)] = bip::mapped_region(shm, bip::read_write);
    new (eager->regions[static_cast<size_t>(rank_)].get_address()) EagerMailbox();
  } catch (const std::exception& e) {
    problem = "rank " + std::to_string(rank_) + ": shared memory " + name_of(rank_) + ": " + e.what();
  }
  std::string first;
  try {
    if (first_problem("eager/created", problem).empty()) {
      for (int p = 0; p < world_size_ && problem.empty(); ++p) {
        if (p == rank_) continue;
        try {
          bip::shared_memory_object shm(bip::open_only, name_of(p).c_str(), bip::read_write);
          eager->regions[static_cast<size_t>(p)] = bip::mapped_region(shm, bip::read_write);
        } catch (const std::exception& e) {
          problem = "rank " + std::to_string(rank_) + ": shared memory of rank " + std::to_string(p) + ": " + e.what();
        }
      }
    }
    first = first_problem("eager/mapped", problem);
  } catch (...) {  // a store round that timed out: the name goes too
    if (created) bip::shared_memory_object::remove(name_of(rank_).c_str());
    throw;
  }
  if (created) bip::shared_memory_object::remove(name_of(rank_).c_str());
  if (!first.empty()) {
    eager_reason_ = first;
    return;
  }
  std::vector<EagerMailbox*> mailboxes;
  for (auto& region : eager->regions) mailboxes.push_back(static_cast<EagerMailbox*>(region.get_address()));
  EagerDirectoryFns fns;
  fns.find = find_allocation;
  fns.export_handle = [](const EagerAllocation& a) -> std::optional<EagerHandle> {
    cudaIpcMemHandle_t handle{};
    if (cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(a.base)) != cudaSuccess) {
      (void)cudaGetLastError();  // e.g. a cuMemCreate allocation: this call stages, not an error
      return std::nullopt;
    }
    EagerHandle out{};
    static_assert(sizeof handle == sizeof out);
    std::memcpy(out.data(), &handle, sizeof handle);
    return out;
  };
  // Opens and closes run in relaxed capture mode: another stream of this process may be capturing
  // (torch captures in global mode), where a map or unmap would otherwise invalidate that capture.
  fns.open = [this](int /*peer*/, const EagerHandle& h) -> void* {
    cudaIpcMemHandle_t handle{};
    std::memcpy(&handle, h.data(), sizeof handle);
    RelaxedCaptureScope relaxed;
    try {
      return mappings_.open(handle);
    } catch (const std::exception&) {
      (void)cudaGetLastError();  // the peer stages that allocation's calls (mapped = failed)
      return nullptr;
    }
  };
  fns.close = [this](int /*peer*/, void* address) {
    RelaxedCaptureScope relaxed;
    mappings_.close(address);
  };
  eager->directory = std::make_unique<EagerDirectory>(rank_, world_size_, std::move(mailboxes), std::move(fns));
  eager_ = std::move(eager);
}

EagerDirectoryStats Communicator::eager_stats() const {
  return eager_ ? eager_->directory->stats() : EagerDirectoryStats{};
}

// ---- registration --------------------------------------------------------------------------------

void Communicator::agree_or_throw(const std::string& what, const std::string& prefix, const std::string& value,
                                  const std::string& problem,
                                  const std::function<std::string(int, const std::string&)>& mismatch) {
  store_.set(key(prefix + std::to_string(rank_)), value + " " + problem);
  for (int p = 0; p < world_size_; ++p) {
    const std::string theirs = store_.get(key(prefix + std::to_string(p)), options_.store_timeout);
    const size_t space = theirs.find(' ');
    const std::string their_value = theirs.substr(0, space);
    const std::string their_problem = space == std::string::npos ? "" : theirs.substr(space + 1);
    if (!their_problem.empty()) throw CollectiveError(what + ": rank " + std::to_string(p) + ": " + their_problem);
    if (their_value != value) throw CollectiveError(what + ": " + mismatch(p, their_value));
  }
}

RegisteredBuffer Communicator::register_buffer(const void* ptr, size_t bytes) {
  const int id = static_cast<int>(registrations_.size());
  Registration reg;
  reg.bytes = bytes;
  reg.peers.assign(static_cast<size_t>(world_size_), nullptr);
  reg.peers[static_cast<size_t>(rank_)] = static_cast<const char*>(ptr);
  if (ipc_ready_) {
    // 1. The allocation containing ptr, and ptr's offset in it (or why it cannot be shared).
    std::string problem;
    CUdeviceptr base = 0;
    size_t size = 0;
    cudaIpcMemHandle_t handle{};
    const MemGetAddressRangeFn range = mem_get_address_range();
    if (!aligned16(ptr)) {
      problem = "buffer is not 16-byte aligned";
    } else if (range == nullptr) {
      problem = "cuMemGetAddressRange is unavailable";
    } else if (range(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) {
      problem = "pointer is not device memory of this GPU";
    } else if (reinterpret_cast<CUdeviceptr>(ptr) + bytes > base + size) {
      problem = "buffer extends past its allocation";
    } else if (cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)) != cudaSuccess) {
      problem = std::string("cudaIpcGetMemHandle: ") + cudaGetErrorString(cudaGetLastError()) +
                " (memory from cudaMallocAsync pools or VMM cannot be exported this way)";
    }
    // 2. Every rank reads every rank's verdict and size, so all fail together or none does.
    // Keyed by the attempt, not the id: a failed attempt does not use up its id, and a retry must
    // not read a peer's verdict from it.
    agree_or_throw("register_buffer #" + std::to_string(id), "reg/" + std::to_string(register_rounds_++) + "/",
                   std::to_string(bytes), problem, [&](int p, const std::string& theirs) {
                     return "rank " + std::to_string(p) + " registered " + theirs + " bytes, rank " +
                            std::to_string(rank_) + " " + std::to_string(bytes);
                   });
    // 3. The handle exchange (opens only what is new, same decision on every rank, barrier).
    const ExportedBuffer mine{std::string(reinterpret_cast<const char*>(&handle), sizeof handle), base, size,
                              reinterpret_cast<CUdeviceptr>(ptr) - base};
    const auto peers = exchange_->exchange({mine});
    for (int p = 0; p < world_size_; ++p) {
      reg.peers[static_cast<size_t>(p)] = static_cast<const char*>(peers[0][static_cast<size_t>(p)]);
    }
  }
  registrations_.push_back(std::move(reg));
  return RegisteredBuffer{id, ptr, bytes};
}

size_t Communicator::register_graph_buffers() {
  require_usable();
  if (!ipc_ready_) return 0;  // agreed by every rank at creation
  const uint64_t round = graph_rounds_++;
  // What this round registers, consumed whatever happens below: after a failure these rows stay
  // null, so their launches stage on every rank alike, and the next registration starts afresh.
  std::vector<const void*> pending;
  pending.swap(graph_pending_);
  const uint64_t pending_digest = graph_pending_digest_;
  graph_pending_digest_ = kFnv1aOffset;
  const size_t first_row = graph_registered_;
  graph_registered_ += pending.size();
  const size_t count = pending.size();
  // 1. No replay of this rank may run while its rows change (a replay half before and half after
  //    would stage on this rank while its peers read in place); then the allocation behind every
  //    input captured in place, exported once per allocation (or why one cannot be).
  std::string problem;
  if (const cudaError_t synced = cudaDeviceSynchronize(); synced != cudaSuccess) {
    (void)cudaGetLastError();
    problem = std::string("cudaDeviceSynchronize: ") + cudaGetErrorString(synced) +
              (synced == cudaErrorStreamCaptureUnsupported || synced == cudaErrorStreamCaptureInvalidated
                   ? " (called during a CUDA-graph capture: call it after the capture ends)"
                   : "");
  }
  std::vector<ExportedBuffer> mine;
  std::map<CUdeviceptr, std::string> handles;
  const MemGetAddressRangeFn range = mem_get_address_range();
  for (size_t i = 0; i < count && problem.empty(); ++i) {
    CUdeviceptr base = 0;
    size_t size = 0;
    if (range == nullptr) {
      problem = "cuMemGetAddressRange is unavailable";
    } else if (range(&base, &size, reinterpret_cast<CUdeviceptr>(pending[i])) != CUDA_SUCCESS) {
      problem = "a captured input is not device memory of this GPU (was its graph's memory freed?)";
    } else if (handles.count(base) == 0) {
      cudaIpcMemHandle_t handle{};
      if (cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)) != cudaSuccess) {
        problem = std::string("cudaIpcGetMemHandle: ") + cudaGetErrorString(cudaGetLastError()) +
                  " (memory from cudaMallocAsync pools or expandable segments cannot be exported this way: "
                  "capture with graph_in_place off)";
      } else {
        handles[base] = std::string(reinterpret_cast<const char*>(&handle), sizeof handle);
      }
    }
    if (problem.empty()) {
      mine.push_back(ExportedBuffer{handles[base], base, size, reinterpret_cast<CUdeviceptr>(pending[i]) - base});
    }
  }
  // 2. Every rank reads every rank's verdict and its captured sequence (how many launches, and a
  //    digest of each one's op, count, type and algorithm in capture order), so all fail together
  //    or none does, and row i is the same call on every rank.
  char digest[17];
  std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(pending_digest));
  const std::string sequence = std::to_string(count) + ":" + digest;
  try {
    agree_or_throw("register_graph_buffers", "graph/" + std::to_string(round) + "/", sequence, problem,
                   [&](int p, const std::string& theirs) {
                     return "rank " + std::to_string(p) + " captured " + theirs.substr(0, theirs.find(':')) +
                            " launches in place since the last registration, rank " + std::to_string(rank_) + " " +
                            std::to_string(count) +
                            (theirs.substr(0, theirs.find(':')) == std::to_string(count)
                                 ? " but of other calls (op, count, type or algorithm differ)"
                                 : "") +
                            " (every rank must capture the same collectives, with graph_in_place alike)";
                   });
  } catch (const StoreError&) {
    // A peer never came: the ranks' rounds may no longer line up.
    poisoned_ = true;
    poison_message_ = "register_graph_buffers: a peer never published its verdict";
    throw;
  }
  if (count == 0) return 0;
  // 3. One exchange (opens only allocations not opened before), then the rows, on every rank;
  // 4. whether every rank filled its rows. If one could not, every rank clears its rows again, so
  //    all stage. Past step 2 the ranks agreed on what to register, so a failure here is a peer
  //    that never came (a store timeout) or a CUDA error: this rank clears its rows and, since its
  //    rounds may no longer match its peers' (a registration, or the exchange, it left half way),
  //    refuses further calls.
  const size_t row_offset = first_row * static_cast<size_t>(world_size_);
  const size_t row_bytes = count * static_cast<size_t>(world_size_) * sizeof(void*);
  try {
    const auto peers = exchange_->exchange(mine);
    std::vector<const void*> rows(count * static_cast<size_t>(world_size_));
    for (size_t i = 0; i < count; ++i) {
      for (int p = 0; p < world_size_; ++p) {
        rows[i * static_cast<size_t>(world_size_) + static_cast<size_t>(p)] = peers[i][static_cast<size_t>(p)];
      }
    }
    cudaError_t filled = cudaMemcpy(graph_table_ + row_offset, rows.data(), row_bytes, cudaMemcpyHostToDevice);
    if (filled == cudaSuccess) filled = cudaDeviceSynchronize();  // a pageable copy may return before it lands
    const std::string fill_problem = filled == cudaSuccess ? "" : std::string("filling: ") + cudaGetErrorString(filled);
    agree_or_throw("register_graph_buffers", "graph/" + std::to_string(round) + "/filled/", "1", fill_problem,
                   [](int, const std::string&) { return std::string("every rank publishes 1"); });
  } catch (...) {
    const bool cleared =
        cudaMemset(graph_table_ + row_offset, 0, row_bytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
    poisoned_ = true;
    poison_message_ = std::string("register_graph_buffers failed after the ranks agreed on what to register") +
                      (cleared ? "" : ", and this rank could not clear its rows") +
                      ": this communicator's registrations may no longer line up with its peers'";
    throw;
  }
  return count;
}

const void* Communicator::peer_address(const RegisteredBuffer& buffer, int peer) const {
  if (buffer.id < 0 || buffer.id >= static_cast<int>(registrations_.size()) || peer < 0 || peer >= world_size_) {
    throw std::invalid_argument("peer_address: unknown buffer or peer");
  }
  return registrations_[static_cast<size_t>(buffer.id)].peers[static_cast<size_t>(peer)];
}

// ---- launches ------------------------------------------------------------------------------------

KernelArgs Communicator::base_args() const {
  KernelArgs a{};
  for (int r = 0; r < world_size_ && r < kMaxRanks; ++r) {
    char* base = static_cast<char*>(peers_[static_cast<size_t>(r)].base);
    a.signals[r] = reinterpret_cast<SignalBuffer*>(base);
    a.inputs[r] = base + staging_offset_;
    a.scratch[r] = base + scratch_offset_;
    a.lamport[r] = base + lamport_offset_;
  }
  a.scratch_bytes = options_.buffer_bytes;  // every rank's: the options must match across ranks
  a.lamport_bytes = lamport_bytes_;
  a.error = error_;
  // Saturated: a bound of more than 584 years is "forever", not a product that wraps to a short one.
  constexpr uint64_t kNsPerMs = 1000000ull;
  a.timeout_ns = options_.flag_timeout_ms > UINT64_MAX / kNsPerMs ? UINT64_MAX : options_.flag_timeout_ms * kNsPerMs;
  a.rank = rank_;
  a.world_size = world_size_;
  a.contract = static_cast<int32_t>(options_.contract);
  return a;
}

void Communicator::launch(DType dtype, KernelKind kind, const KernelArgs& args, LaunchConfig grid,
                          cudaStream_t stream) {
  // Lamport kernels read inputs[rank] alone: some are built without the input table, the views and
  // the staging (cuda_backend/kernels.cuh, collective_kernel), so a launch that carried any of them
  // would read the wrong input without a word.
  if ((kind == KernelKind::kLamportOneShot || kind == KernelKind::kLamportTwoShot) &&
      (args.input_table != nullptr || args.publish_views != 0 || args.stage_from != nullptr)) {
    throw std::logic_error(
        "a Lamport launch carries an input table, views or a staging source; its kernel reads "
        "inputs[rank] alone");
  }
  grid.programmatic = options_.programmatic_launch;
  grid.cluster = 1;  // no collective kernel runs on clusters (a grid copied from a fused call may say one)
  EXC_CUDA_CHECK(launch_collective(dtype, kind, args, grid, stream));
}

void Communicator::require_usable() const {
  if (poisoned_)
    throw CollectiveError("communicator " + options_.name + " is unusable after an earlier error: " + poison_message_);
}

void Communicator::device_barrier(cudaStream_t stream) {
  require_usable();
  if (!ipc_ready_) throw CollectiveError("device_barrier needs the IPC path: " + ipc_reason_);
  KernelArgs a = base_args();
  a.count = 0;
  launch(DType::kBF16, KernelKind::kBarrier, a, LaunchConfig{1, 32 * ((world_size_ + 31) / 32)}, stream);
}

void Communicator::check(cudaStream_t stream) {
  EXC_CUDA_CHECK(cudaStreamSynchronize(stream));
  DeviceError e{};
  EXC_CUDA_CHECK(cudaMemcpy(&e, error_, sizeof e, cudaMemcpyDeviceToHost));
  if (e.claimed == 0) return;
  char message[256];
  if (e.kind == kErrorLamportTimeout) {
    std::snprintf(message, sizeof message,
                  "rank %d block %d: rank %d never wrote its data (lamport_one_shot call %u, Lamport buffer %d: "
                  "element %u still held the sentinel after %.1f ms)",
                  e.rank, e.block, e.peer, e.expected, e.set, e.observed, static_cast<double>(e.waited_ns) / 1e6);
  } else if (e.kind == kErrorClusterTimeout) {
    std::snprintf(
        message, sizeof message,
        "rank %d block %d (block %d of its thread-block cluster): the cluster's other blocks never sent "
        "their partial sums (lamport_one_stage / lamport_two_stage, exchange %u of the launch, after %.1f ms)",
        e.rank, e.block, e.set, e.expected, static_cast<double>(e.waited_ns) / 1e6);
  } else {
    std::snprintf(
        message, sizeof message,
        "rank %d block %d: peer %d never arrived at barrier (set %d, value %u; the flag held %u after %.1f ms)", e.rank,
        e.block, e.peer, e.set, e.expected, e.observed, static_cast<double>(e.waited_ns) / 1e6);
  }
  poisoned_ = true;
  poison_message_ = message;
  throw CollectiveError(message);
}

Choice Communicator::choose(Op op, size_t count, DType dtype, Algorithm algo) const {
  return table_.choose(arch_, world_size_, op, static_cast<uint64_t>(count) * dtype_size(dtype), algo);
}

KernelArgs Communicator::ipc_kernel_args() const {
  if (!ipc_ready_) throw CollectiveError("the IPC path is unavailable: " + ipc_reason_);
  require_usable();
  return base_args();
}

CallInfo Communicator::allreduce(const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                                 cudaStream_t stream, const RegisteredBuffer* registered,
                                 std::optional<LaunchConfig> grid) {
  return run(Op::kAllReduce, input, output, count, dtype, algo, stream, registered, grid);
}

CallInfo Communicator::reduce_scatter(const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                                      cudaStream_t stream, const RegisteredBuffer* registered,
                                      std::optional<LaunchConfig> grid) {
  return run(Op::kReduceScatter, input, output, count, dtype, algo, stream, registered, grid);
}

CallInfo Communicator::allgather(const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                                 cudaStream_t stream, const RegisteredBuffer* registered,
                                 std::optional<LaunchConfig> grid) {
  return run(Op::kAllGather, input, output, count, dtype, algo, stream, registered, grid);
}

CallInfo Communicator::run_nccl(Op op, const void* input, void* output, size_t count, DType dtype,
                                cudaStream_t stream) {
  if (nccl_comm_ == nullptr) {
    throw CollectiveError("NCCL is not available in communicator " + options_.name + ": " + nccl_reason_);
  }
  const NcclApi& nccl = NcclApi::get();
  const ncclDataType_t t = nccl_type(dtype);
  switch (op) {
    case Op::kAllReduce:
      nccl.check(nccl.AllReduce(input, output, count, t, ncclSum, nccl_comm_, stream), "ncclAllReduce");
      break;
    case Op::kReduceScatter:
      nccl.check(
          nccl.ReduceScatter(input, output, count / static_cast<size_t>(world_size_), t, ncclSum, nccl_comm_, stream),
          "ncclReduceScatter");
      break;
    case Op::kAllGather:
      nccl.check(nccl.AllGather(input, output, count, t, nccl_comm_, stream), "ncclAllGather");
      break;
  }
  CallInfo info;
  info.algo = Algorithm::kNccl;
  info.exact = op == Op::kAllGather;  // a copy; NCCL's sums follow no contract
  return info;
}

CallInfo Communicator::nccl_fallback(const Call& call, const std::string& why) {
  // Under tree a reduction's bits are what makes the TP sizes agree: NCCL's sums would break that
  // silently (exact = 0 is easy to miss), so the call fails instead. An all-gather copies bits.
  if (options_.contract == Contract::kTree && call.op != Op::kAllGather) {
    throw CollectiveError(std::string(op_name(call.op)) + " under the tree contract has no NCCL fallback (NCCL's " +
                          "sums are not the tree's) and the exact path cannot run it: " + why);
  }
  CallInfo info = run_nccl(call.op, call.input, call.output, call.count, call.dtype, call.stream);
  info.note = why;
  return info;
}

CallInfo Communicator::started(const Call& call) {
  CallInfo info;
  info.algo = call.choice.algo;
  info.grid = call.choice.grid;
  info.staged = call.staged();
  info.note = call.eager_note;
  return info;
}

void Communicator::fill_inputs(const Call& call, size_t byte_offset, KernelArgs* a) const {
  if (call.reg != nullptr) {
    for (int r = 0; r < world_size_; ++r) {
      a->inputs[r] = call.reg->peers[static_cast<size_t>(r)] + call.reg_offset + byte_offset;
    }
  } else if (call.own_input || call.eager_in_place) {
    // Peers' entries stay their staging buffers: input_private algorithms never read them, and an
    // eager launch reads a peer's staging buffer only where that peer published null.
    a->inputs[rank_] = static_cast<const char*>(call.input) + byte_offset;
  }
  if (call.eager_views) {
    a->publish_views = 1;
    for (int p = 0; p < world_size_; ++p) {
      a->input_views[p] = call.eager_in_place ? static_cast<const char*>(call.views[p]) + byte_offset : nullptr;
    }
  }
  // Captured in place: inputs stay the staging buffers, which the kernel uses until the row of
  // its input table is registered (launch_sm_kernels).
}

Communicator::Launcher Communicator::launcher_for(Op op, Algorithm algo) {
  if (!implements(algo, op) || (info(algo).runs_on & kOnGpu) == 0) return nullptr;
  switch (info(algo).family) {
    case Family::kSmKernels: return &Communicator::launch_sm_kernels;
    case Family::kLamport: return &Communicator::launch_lamport;
    case Family::kCopyEngine: return &Communicator::launch_copy_engine;
    case Family::kChoice:                // auto: resolved by run's step 4
    case Family::kNccl: return nullptr;  // run_nccl, before any IPC step
  }
  return nullptr;
}

// Chunk j covers output elements [j * chunk, j * chunk + c) of every rank: each rank copies, in one
// 2-D copy-engine copy, the pieces [r * per + j * chunk, + c) of its input for r = 0..n-1 into its
// staging buffer, laid out as a reduce_scatter of c * n elements expects (piece r at r * c), and
// one reduce_scatter kernel folds its piece from every rank into output + j * chunk. Every element
// is folded over ranks 0..n-1 in rank order as in one call, so the bits are one call's. Reusing the
// staging buffer is safe: reduce_scatter ends with a barrier, so no peer still reads chunk j when
// this rank's copy for chunk j + 1 (stream order) overwrites it; the copy completes before the
// kernel starts, and the kernel's first barrier tells the peers it is in place (as the copy-engine
// all-gather's staging). Chunks are multiples of 64 elements, so every output chunk stays 16-byte
// aligned.
CallInfo Communicator::run_chunked_reduce_scatter(const Call& call) {
  const size_t elem = call.elem_bytes();
  const size_t n = static_cast<size_t>(world_size_);
  const size_t per = call.count / n;
  const size_t chunk = options_.buffer_bytes / elem / n / 64 * 64;
  if (chunk == 0) return nccl_fallback(call, "staging buffer smaller than 64 elements per rank");
  CallInfo info = started(call);
  for (size_t first = 0; first < per; first += chunk) {
    const size_t c = std::min(chunk, per - first);
    KernelArgs a = base_args();
    EXC_CUDA_CHECK(cudaMemcpy2DAsync(const_cast<void*>(a.inputs[rank_]), c * elem,
                                     static_cast<const char*>(call.input) + first * elem, per * elem, c * elem, n,
                                     cudaMemcpyDeviceToDevice, call.stream));
    a.count = c * n;
    a.output = static_cast<char*>(call.output) + first * elem;
    a.stage_from = nullptr;
    launch(call.dtype, KernelKind::kReduceScatter, a, call.choice.grid, call.stream);
    ++info.launches;
  }
  return info;
}

CallInfo Communicator::launch_copy_engine(const Call& call) {
  const size_t bytes = call.in_bytes();
  if (call.staged() && bytes > options_.buffer_bytes) {
    return nccl_fallback(call, "message larger than the staging buffer");
  }
  KernelArgs a = base_args();
  fill_inputs(call, 0, &a);
  // 1. Staged: this rank's input into its staging buffer, where peers read it.
  char* out = static_cast<char*>(call.output);
  if (call.staged()) {
    EXC_CUDA_CHECK(
        cudaMemcpyAsync(const_cast<void*>(a.inputs[rank_]), call.input, bytes, cudaMemcpyDeviceToDevice, call.stream));
  }
  // 2. Barrier: every input is in place. 3. Copy-engine copies, own input first, then rank+1, ...
  device_barrier(call.stream);
  for (int k = 0; k < world_size_; ++k) {
    const int peer = (rank_ + k) % world_size_;
    const void* src = peer == rank_ ? call.input : a.inputs[peer];
    EXC_CUDA_CHECK(
        cudaMemcpyAsync(out + static_cast<size_t>(peer) * bytes, src, bytes, cudaMemcpyDeviceToDevice, call.stream));
  }
  // 4. Barrier (end): no peer reuses its buffer while this rank's copies may still read it.
  device_barrier(call.stream);
  CallInfo info = started(call);
  info.grid = LaunchConfig{};
  info.launches = 2;
  return info;
}

CallInfo Communicator::launch_lamport(const Call& call) {
  // The input is read in place (peers never read it: no staging, no registration needed); a
  // message runs in one launch where it fits a Lamport slot, else in chunks that do
  // (lamport_launch_elements).
  const size_t elem = call.elem_bytes();
  const size_t chunk = lamport_launch_elements(call.choice.algo, call.count, elem, world_size_, lamport_bytes_);
  if (chunk == 0) return nccl_fallback(call, "Lamport region smaller than one chunk");
  CallInfo info = started(call);
  for (size_t first = 0; first < call.count; first += chunk) {
    KernelArgs a = base_args();
    a.inputs[rank_] = static_cast<const char*>(call.input) + first * elem;
    a.count = std::min(chunk, call.count - first);
    a.output = static_cast<char*>(call.output) + first * elem;
    a.stage_from = nullptr;
    launch(call.dtype, *sm_kernel_kind(call.op, call.choice.algo), a, call.choice.grid, call.stream);
    ++info.launches;
  }
  info.staged = false;
  return info;
}

// All-reduce folds element by element, so a message larger than the buffers runs as chunks with
// the same bits; reduce-scatter chunks its staged input (run_chunked_reduce_scatter); all-gather
// falls back to NCCL beyond the buffers.
CallInfo Communicator::launch_sm_kernels(const Call& call) {
  const Algorithm algo = call.choice.algo;
  const size_t elem = call.elem_bytes();
  const size_t in_bytes = call.in_bytes();
  const size_t capacity = options_.buffer_bytes;
  const int elem_bytes = static_cast<int>(elem);
  const bool needs_scratch = info(algo).needs == Needs::kSliceScratch;
  const bool push = is_push_algorithm(algo);
  const bool fits = (!call.staged() || in_bytes <= capacity) && (!needs_scratch || in_bytes <= capacity) &&
                    (!push || push_fits(call.count, elem_bytes, world_size_, capacity));
  if (!fits && call.op == Op::kReduceScatter && call.staged()) return run_chunked_reduce_scatter(call);
  if (!fits && call.op != Op::kAllReduce) return nccl_fallback(call, "message larger than the staging buffer");
  const std::optional<KernelKind> kind = sm_kernel_kind(call.op, algo);
  if (!kind) throw std::logic_error(std::string("no SM kernel for ") + op_name(call.op) + " " + algorithm_name(algo));
  // Chunks are multiples of 64 elements, so every chunk starts 16-byte aligned (the push
  // algorithms': 2 x n slots of a chunk fit the scratch, push_chunk_elements).
  const size_t chunk = fits   ? call.count
                       : push ? push_chunk_elements(elem_bytes, world_size_, capacity)
                              : std::max<size_t>(64, capacity / elem / 64 * 64);
  // Captured in place: one row of the graph input table per launch; with too few rows left the
  // call stages (every rank captures the same calls, so every rank runs out at the same one).
  const size_t launches = (call.count + chunk - 1) / chunk;
  if (call.captured_in_place && graph_registered_ + graph_pending_.size() + launches > graph_slots_) {
    Call staged = call;
    staged.captured_in_place = false;
    CallInfo info = launch_sm_kernels(staged);
    info.note = "staged: the graph input table is full (" + std::to_string(graph_slots_) + " rows)";
    return info;
  }
  CallInfo info = started(call);
  for (size_t first = 0; first < call.count; first += chunk) {
    const size_t c = std::min(chunk, call.count - first);
    KernelArgs a = base_args();
    fill_inputs(call, first * elem, &a);
    if (call.captured_in_place) {
      a.input_table = graph_table_ + (graph_registered_ + graph_pending_.size()) * static_cast<size_t>(world_size_);
      graph_pending_.push_back(static_cast<const char*>(call.input) + first * elem);
      for (const uint64_t v : {uint64_t{static_cast<uint8_t>(call.op)}, uint64_t{static_cast<uint8_t>(algo)},
                               uint64_t{static_cast<uint8_t>(call.dtype)}, uint64_t{c}, uint64_t{first}}) {
        graph_pending_digest_ = fnv1a_u64(graph_pending_digest_, v);
      }
    }
    a.count = c;
    a.output = static_cast<char*>(call.output) + first * elem;
    a.stage_from =
        call.staged() || call.captured_in_place ? static_cast<const char*>(call.input) + first * elem : nullptr;
    launch(call.dtype, *kind, a, call.choice.grid, call.stream);
    ++info.launches;
  }
  return info;
}

void Communicator::use_registration(Call* call, const RegisteredBuffer& registered, size_t out_bytes) const {
  const size_t in_bytes = call->in_bytes();
  if (registered.id < 0 || registered.id >= static_cast<int>(registrations_.size())) {
    throw std::invalid_argument("unknown RegisteredBuffer #" + std::to_string(registered.id));
  }
  call->reg = &registrations_[static_cast<size_t>(registered.id)];
  const auto in = reinterpret_cast<uintptr_t>(call->input), base = reinterpret_cast<uintptr_t>(registered.local);
  if (in < base || in + in_bytes > base + call->reg->bytes) {
    throw std::invalid_argument(std::string(op_name(call->op)) + ": input is not inside RegisteredBuffer #" +
                                std::to_string(registered.id));
  }
  call->reg_offset = in - base;
  // In place (output overlapping the input that peers read): go through staging instead.
  if (ranges_overlap(call->input, in_bytes, call->output, out_bytes)) call->reg = nullptr;
}

void Communicator::choose_input_path(Call* call, bool registered, size_t out_bytes) {
  const size_t in_bytes = call->in_bytes();
  // Whether the stream captures, asked once and only where a step needs it (a runtime call).
  std::optional<bool> capturing_cache;
  auto capturing = [&] {
    if (!capturing_cache) capturing_cache = stream_capturing(call->stream);
    return *capturing_cache;
  };
  // 4b. An algorithm whose peers never read this rank's input reads it where the caller keeps it
  //     (no staging copy), also in place: its blocks overwrite only what they have read themselves
  //     (core/push.h). The input_private algorithms are all-reduces, whose one allowed overlap
  //     (step 1's overlap_problem) is output == input.
  if (call->reg == nullptr && info(call->choice.algo).input_private) call->own_input = true;

  // 4c. Captured into a CUDA graph, an input that peers read stays where it is too: the kernel
  //     reads every rank's address from a row of the graph input table, which
  //     register_graph_buffers fills after the capture (launch_sm_kernels takes the rows). Until
  //     then replays stage, so the message must fit the staging buffer (one launch). In place
  //     (output == input) only for two_shot, which writes its output after the barrier that
  //     follows every peer's reads (tests/sim/protocol_exploration_test.cc, TwoShotInPlaceIsSafe);
  //     one_shot's peers would read its result.
  const bool disjoint_or_safe_in_place = !ranges_overlap(call->input, in_bytes, call->output, out_bytes) ||
                                         (call->input == call->output && call->choice.algo == Algorithm::kTwoShot);
  const bool peers_read_input =
      info(call->choice.algo).family == Family::kSmKernels && !info(call->choice.algo).input_private;
  if (call->staged() && graph_table_ != nullptr && info(call->choice.algo).family == Family::kSmKernels &&
      in_bytes <= options_.buffer_bytes && disjoint_or_safe_in_place && capturing()) {
    call->captured_in_place = true;
  }

  // 4d. Eager (neither captured nor registered), such an input stays where it is too once every
  //     peer has mapped its allocation: the launch publishes its address in each peer's space
  //     (fill_inputs). Whether a launch publishes at all depends only on what every rank passes
  //     alike (the algorithm, the size, registered or not, captured or not), so every rank of it
  //     writes its entry; in place or staged is this rank's own choice (null: staged). One launch:
  //     the message fits the staging buffer, so a rank that stages needs no chunks either.
  if (eager_ && !registered && peers_read_input && in_bytes <= options_.buffer_bytes &&
      in_bytes >= options_.eager_in_place_min_bytes.value_or(
                      eager_in_place_default_min_bytes(world_size_, call->op, call->choice.algo)) &&
      !capturing()) {
    call->eager_views = true;
    if (!disjoint_or_safe_in_place) {
      call->eager_note = "staged: peers would read this in-place call's output";
    } else if (std::string why; eager_->directory->views(call->input, in_bytes, call->views, &why)) {
      call->eager_in_place = true;
    } else {
      call->eager_note = "staged: " + why;
    }
  }
}

CallInfo Communicator::run(Op op, const void* input, void* output, size_t count, DType dtype, Algorithm algo,
                           cudaStream_t stream, const RegisteredBuffer* registered, std::optional<LaunchConfig> grid) {
  // 1. Arguments.
  if (algo != Algorithm::kAuto && algo != Algorithm::kNccl && launcher_for(op, algo) == nullptr) {
    throw std::invalid_argument(std::string(op_name(op)) + " has no algorithm " + algorithm_name(algo) + " (" +
                                algorithm_names(kOnGpu, op) + ")");
  }
  const size_t n = static_cast<size_t>(world_size_);
  if (op == Op::kReduceScatter && count % n != 0) {
    throw std::invalid_argument("reduce_scatter: count " + std::to_string(count) +
                                " is not a multiple of the world size " + std::to_string(n));
  }
  if (count == 0) return CallInfo{};
  if (grid && (grid->blocks < 1 || grid->blocks > kMaxBlocks || grid->threads < 64 || grid->threads > 1024 ||
               grid->threads % 32 != 0)) {
    throw std::invalid_argument("grid must have 1.." + std::to_string(kMaxBlocks) +
                                " blocks and a multiple of 32 threads in 64..1024");
  }
  Call call;
  call.op = op;
  call.input = input;
  call.output = output;
  call.count = count;
  call.dtype = dtype;
  call.stream = stream;
  const size_t elem = call.elem_bytes();
  const size_t in_bytes = call.in_bytes();
  const size_t out_bytes = output_count(op, count, world_size_) * elem;
  // Before every path (NCCL leaves other overlaps undefined too). A rank-local check, as the
  // alignment's: a rank that alone passes a partial overlap fails here while its peers wait out
  // the flag timeout.
  if (const std::string problem = overlap_problem(op, input, in_bytes, output, out_bytes, rank_); !problem.empty()) {
    throw std::invalid_argument(std::string(op_name(op)) + ": " + problem);
  }
  if (algo == Algorithm::kNccl) return run_nccl(op, input, output, count, dtype, stream);

  // 2. Fallbacks (each decided from arguments and agreed state only).
  if (!ipc_ready_) return nccl_fallback(call, "IPC path unavailable: " + ipc_reason_);
  require_usable();
  if (!aligned16(input) || !aligned16(output)) {
    throw std::invalid_argument(std::string(op_name(op)) + ": input and output must be 16-byte aligned");
  }

  // 2b. Open what peers exported for their eager calls since this rank's last call (in relaxed
  //     capture mode, so also while this or another stream captures).
  if (eager_) eager_->directory->service();

  // 3. Where inputs come from.
  if (registered != nullptr) use_registration(&call, *registered, out_bytes);

  // 4. The algorithm and grid. push_one_shot and push_two_shot need two halves of n receive slots
  //    of the message in every rank's scratch; where those do not fit they run in chunks that do
  //    (launch_sm_kernels). `auto` prices that: a push algorithm that does not fit is chosen only
  //    where its chunks beat the other algorithms (DispatchTable::choose_allreduce_auto).
  const size_t capacity = options_.buffer_bytes;
  //    A Lamport algorithm runs whole where the message fits one slot and in chunks beyond
  //    (lamport_launch_elements); auto takes it only where it runs whole (its table rows are
  //    measured only there) and prices the other algorithms where it does not.
  call.choice =
      op == Op::kAllReduce && algo == Algorithm::kAuto
          ? table_.choose_allreduce_auto(arch_, world_size_, count, static_cast<int>(elem), capacity, lamport_bytes_)
          : choose(op, count, dtype, algo);
  if (grid) {
    call.choice.grid = *grid;
  } else if (max_blocks_ > 0 && call.choice.grid.blocks > max_blocks_) {
    call.choice.grid.blocks = max_blocks_;
  }

  // 4b–4d. Whether the input is read where it lies (choose_input_path).
  choose_input_path(&call, registered != nullptr, out_bytes);

  // 5. The launcher of (op, algorithm).
  const Launcher launcher = launcher_for(op, call.choice.algo);
  if (launcher == nullptr) {
    throw std::logic_error(std::string("the dispatch table chose ") + algorithm_name(call.choice.algo) + " for " +
                           op_name(op) + ", which has no launcher");
  }
  return (this->*launcher)(call);
}

}  // namespace exactcoll::cuda
