// The eager directory: how an eager (uncaptured, unregistered) call lets its peers read its input
// where the caller keeps it, with no store round trip and no agreement per call. Host-only; the
// CUDA backend runs it over CUDA IPC handles and shared host memory (cuda_backend/communicator.cc),
// the tests over heap memory and fake handles (tests/core/eager_directory_test.cc).
//
// Every rank owns one EagerMailbox in memory every rank of the node maps (POSIX shared memory on
// GPUs). Each field has one writer:
//   - exports: the allocations this rank has exported, in slot order. The owner fills entry s,
//     then publishes it by storing exported = s + 1 (release).
//   - mapped[r][s]: where THIS rank has opened rank r's slot s (its own address), kMappingFailed
//     when the open failed or the slot was retired and closed, 0 until it tried. The owner stores
//     it (release) after the open returned.
//   - retired[s]: the owner no longer publishes slot s (a new allocation now overlaps its range:
//     the old one was freed); peers close their mapping of it, or never open it. A slot is
//     retired only so, and is not reused: a rank exports at most kEagerSlots allocations over the
//     communicator's life, and its calls with later new allocations stage (CallInfo::note says so).
//
// A call (views): this rank finds the allocation that holds its input. When that allocation is a
// slot that every peer has mapped, the call returns, for each peer p, the input's address in p's
// process (mapped + offset): the kernel publishes those through the peers' signal buffers
// (KernelArgs::input_views), and each peer reads the input in place. Otherwise the call stages its
// input as before, and a new allocation is exported for the calls that follow. So the choice is
// rank-local and needs no agreement: peers learn it per launch, from the published address (null:
// read the staging buffer). service() opens what peers exported since the last call; every call
// runs it, so a peer's new slot is mapped by the time this rank makes its next call.
//
// Why a published address is safe to use in the same launch: a peer stores mapped[..] only after
// its open returned, so its process can already reach the memory when this rank reads the address.
// Why retiring is safe: a slot is retired when this rank sees a new allocation in its address
// range, i.e. after the old one was freed; cudaFree (torch's caching allocator frees that way) waits
// for this rank's GPU work, whose last launch reading the slot ended with a barrier every peer had
// reached after its reads. So no peer kernel still reads a retired slot, and a peer closes it at
// its next service(). (An allocation freed with no new one over its range stays mapped by the peers
// until the communicator closes.)
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/signal.h"

namespace exactcoll {

inline constexpr int kEagerSlots = 64;           // exported allocations per rank, at most
inline constexpr size_t kEagerHandleBytes = 64;  // a cudaIpcMemHandle_t
inline constexpr uint64_t kMappingFailed = 1;    // mapped[..]: the open failed (never 1 otherwise)
using EagerHandle = std::array<char, kEagerHandleBytes>;

// One rank's mailbox. Zero-filled at creation (every atomic 0). Lives in memory every rank maps.
struct EagerMailbox {
  struct Export {
    EagerHandle handle;
    uint64_t base;   // allocation base in the owner's process
    uint64_t bytes;  // allocation size
    uint64_t id;     // the allocation's unique id in the owner's process (CU_POINTER_ATTRIBUTE_BUFFER_ID)
  };
  std::atomic<uint32_t> exported;
  std::atomic<uint32_t> retirements;  // how many slots the owner has retired (peers skip the scan while it holds)
  std::atomic<uint32_t> retired[kEagerSlots];
  Export exports[kEagerSlots];
  std::atomic<uint64_t> mapped[kMaxRanks][kEagerSlots];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "mailbox atomics are shared between processes");

// The allocation that holds an address: base, size and the allocation's unique id.
struct EagerAllocation {
  uint64_t base = 0;
  uint64_t bytes = 0;
  uint64_t id = 0;
};

struct EagerDirectoryFns {
  // The allocation holding ptr, or nullopt (not device memory this process can export).
  std::function<std::optional<EagerAllocation>(const void* ptr)> find;
  // Exports an allocation: its handle, or nullopt when it cannot be exported (e.g. a virtual
  // memory allocation from cuMemCreate without an IPC handle type).
  std::function<std::optional<EagerHandle>(const EagerAllocation&)> export_handle;
  // Opens peer's exported allocation: this process's address of its base, or nullptr on failure.
  std::function<void*(int peer, const EagerHandle&)> open;
  // Closes an address open returned.
  std::function<void(int peer, void* address)> close;
};

struct EagerDirectoryStats {
  uint64_t in_place = 0;  // views calls that returned addresses
  uint64_t staged = 0;    // views calls that did not
  uint64_t exports = 0;   // allocations exported
  uint64_t opens = 0;     // peer allocations opened (failures included)
  uint64_t closes = 0;    // peer allocations closed (retired)
  uint64_t retires = 0;   // own slots retired
};

class EagerDirectory {
 public:
  // mailboxes[r]: rank r's mailbox as this process maps it. Preconditions: 1 <= world_size <=
  // kMaxRanks, 0 <= rank < world_size; every mailbox outlives the directory.
  EagerDirectory(int rank, int world_size, std::vector<EagerMailbox*> mailboxes, EagerDirectoryFns fns);
  // Closes every peer allocation this directory opened.
  ~EagerDirectory();
  EagerDirectory(const EagerDirectory&) = delete;
  EagerDirectory& operator=(const EagerDirectory&) = delete;

  // Opens the slots peers exported since the last service and closes the ones they retired.
  void service();

  // Returns true and fills views[p] (p < world_size) with the address of [input, input + bytes)
  // in rank p's process (views[rank] = input) when every peer has mapped the allocation that holds
  // it. Returns false otherwise, with *why saying why (when why is not null); the input's
  // allocation is then exported (once), so that a later call can return true.
  // Example: the first call with a new torch block returns false ("exported just now"), and the
  // calls after every peer's next service() return true.
  bool views(const void* input, size_t bytes, const void* views[kMaxRanks], std::string* why = nullptr);

  const EagerDirectoryStats& stats() const { return stats_; }

 private:
  struct OwnSlot {
    EagerAllocation allocation;
    bool retired = false;
  };
  int rank_;
  int world_size_;
  std::vector<EagerMailbox*> mailboxes_;
  EagerDirectoryFns fns_;
  std::vector<OwnSlot> own_;              // this rank's slots, in slot order
  std::vector<uint64_t> unexportable_;    // allocation ids export_handle refused
  std::vector<uint32_t> seen_;            // per peer: slots opened (or failed) so far
  std::vector<uint32_t> retirements_;     // per peer: its retirements count at the last scan
  std::vector<std::vector<void*>> open_;  // per peer, per slot: what open returned (null: none)
  EagerDirectoryStats stats_;
};

}  // namespace exactcoll
