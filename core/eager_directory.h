// The eager directory: how an eager (uncaptured, unregistered) call lets its peers read its input
// where the caller keeps it, with no store round trip and no agreement per call. Host-only; the
// CUDA backend runs it over CUDA IPC handles and shared host memory (cuda_backend/communicator.cc),
// the tests over heap memory and fake handles (tests/core/eager_directory_test.cc).
//
// Every rank owns one EagerMailbox in memory every rank of the node maps (POSIX shared memory on
// GPUs). Each field has one writer:
//   - exports: the allocations this rank exports, one per slot. The owner fills entry s, then
//     publishes a new slot by storing exported = s + 1 (release), or a reused one by storing its
//     generation (below).
//   - generation[s]: how many times the owner has reused slot s (0 at its first export). A slot
//     whose allocation was retired takes a new export once every peer has closed it (below); the
//     owner then rewrites exports[s] and stores generation[s] + 1 (release).
//   - retired[s]: g + 1 when the owner no longer publishes generation g of slot s (a new
//     allocation now overlaps its range: the old one was freed); 0 or an older generation's value
//     while the current one is live. Peers close their mapping of it, or never open it. A slot is
//     retired only so.
//   - changes: how many retirements and reuses the owner has stored (after the slot's fields,
//     release); a peer rescans the slots it has seen only when this moved.
//   - mapped[r][s], mapped_generation[r][s]: where THIS rank has opened generation
//     mapped_generation of rank r's slot s (its own address), kMappingFailed when the open failed
//     or that generation was retired (and closed, or never opened), 0 until it tried. This rank
//     stores mapped after the open (or close) returned, then mapped_generation (release both); a
//     reader loads mapped_generation first, so when it finds a generation there, mapped is that
//     generation's entry (or a later one of it).
//
// Reuse: the owner gives a retired slot (generation g) a new export only when every peer
// publishes mapped_generation = g and mapped = kMappingFailed, i.e. holds no mapping of it and will
// never open it; so a peer never holds two mappings of one slot (it closes before it opens the next
// generation, and one process maps a handle once), and the owner rewrites exports[s] only after
// every peer's last read of it. Until then, with all kEagerSlots slots live or waiting, calls with
// new allocations stage (CallInfo::note says so). A slot is not retired for being idle: a peer may
// still read a live allocation, and nothing here sees when its kernels are done.
//
// A call (views): this rank finds the allocation that holds its input. When that allocation is a
// slot that every peer has mapped in the slot's current generation, the call returns, for each
// peer p, the input's address in p's process (mapped + offset): the kernel publishes those through
// the peers' signal buffers (KernelArgs::input_views), and each peer reads the input in place.
// Otherwise the call stages its input as before, and a new allocation is exported for the calls
// that follow. So the choice is rank-local and needs no agreement: peers learn it per launch, from
// the published address (null: read the staging buffer). service() opens what peers exported (or
// re-exported) since the last call and closes what they retired; every call runs it, so a peer's
// new slot is mapped by the time this rank makes its next call.
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
#include <type_traits>
#include <vector>

#include "core/signal.h"

namespace exactcoll {

inline constexpr int kEagerSlots = 64;           // exported allocations per rank at a time, at most
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
  std::atomic<uint32_t> changes;  // retirements and reuses so far (peers skip the rescan while it holds)
  std::atomic<uint32_t> generation[kEagerSlots];
  std::atomic<uint32_t> retired[kEagerSlots];  // the retired generation + 1, or an older value: live
  Export exports[kEagerSlots];
  std::atomic<uint64_t> mapped[kMaxRanks][kEagerSlots];
  std::atomic<uint32_t> mapped_generation[kMaxRanks][kEagerSlots];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "mailbox atomics are shared between processes");
static_assert(std::is_standard_layout_v<EagerMailbox>, "the mailbox lives in shared memory");

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
  uint64_t reuses = 0;    // own retired slots exported again (counted in exports too)
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

  // Opens the slots peers exported (or re-exported in a new generation) since the last service and
  // closes the ones they retired.
  void service();

  // Returns true and fills views[p] (p < world_size) with the address of [input, input + bytes)
  // in rank p's process (views[rank] = input) when every peer has mapped the allocation that holds
  // it, in its current generation. Returns false otherwise, with *why saying why (when why is not
  // null); the input's allocation is then exported (once), into a new slot or a retired one every
  // peer has closed, so that a later call can return true.
  // Example: the first call with a new torch block returns false ("exported just now"), and the
  // calls after every peer's next service() return true.
  bool views(const void* input, size_t bytes, const void* views[kMaxRanks], std::string* why = nullptr);

  const EagerDirectoryStats& stats() const { return stats_; }

 private:
  struct OwnSlot {
    EagerAllocation allocation;
    uint32_t generation = 0;
    bool retired = false;
  };
  struct PeerSlot {
    void* address = nullptr;  // what open returned for `generation` (null: none open)
    uint32_t generation = 0;  // the generation this rank last published for the slot
  };
  // Opens, closes or leaves peer p's slot s as its generation and retired flag say.
  void service_slot(int p, uint32_t s, bool first);
  // The first peer that still may hold or open own slot s's current generation, or -1: none.
  int peer_holding(size_t s) const;
  int rank_;
  int world_size_;
  std::vector<EagerMailbox*> mailboxes_;
  EagerDirectoryFns fns_;
  std::vector<OwnSlot> own_;                 // this rank's slots, in slot order
  uint32_t changes_ = 0;                     // this rank's retirements and reuses so far
  std::vector<uint64_t> unexportable_;       // allocation ids export_handle refused
  std::vector<uint32_t> seen_;               // per peer: slots looked at so far
  std::vector<uint32_t> peer_changes_;       // per peer: its changes count at the last rescan
  std::vector<std::vector<PeerSlot>> peer_;  // per peer, per slot
  EagerDirectoryStats stats_;
};

}  // namespace exactcoll
