// The handle-exchange protocol: how the ranks of a communicator learn each other's symmetric
// buffers. Host-only; runs over the rendezvous Store (core/store.h), so the same code serves the
// CUDA backend (handles = CUDA IPC handles, opened with cudaIpcOpenMemHandle) and the simulator
// (handles name a peer's heap region, opened as a plain pointer), where it is tested.
//
// Every rank exports buffers: opaque handle bytes, the allocation's base address and size in the
// exporting process, and the buffer's offset inside that allocation. exchange() returns, for every
// buffer and every peer, a pointer to that peer's corresponding buffer in this process.
//
// ---- The same-decision rule -------------------------------------------------------------------
// A real exchange (publish every handle, open what is new, barrier) costs store round trips and,
// on GPUs, IPC opens; repeated calls with the same buffers should skip it. Whether a rank "already
// has everything" is rank-local knowledge, though: a rank whose buffers did not move can skip while
// a peer whose allocator moved a buffer waits for handles that never come — the known hang (nvFuser's
// caching-allocator hang, ../shared/facts/anchors.md). So the decision is collective:
//   1. every rank publishes one miss bit for this round: 1 when any of its buffers is not in its
//      record of earlier exchanges (new base, size, offset or handle bytes), beside a digest of
//      its whole list;
//   2. every rank reads every rank's miss bit and digest; all ranks therefore see the same values
//      and take the same decision: exchange iff ANY rank missed, or the ranks' digests differ
//      from the last exchange's (the records pair buffer i with each peer's buffer i as that
//      exchange did; lists that pair differently, each made of known buffers, need a new one);
//   3. on exchange, every rank publishes all its handles, reads every peer's, opens the ones not
//      in its open cache (keyed by the peer's allocation base, size and rank; equal handle bytes
//      required, so a freed-and-reallocated buffer at the same address is reopened), and then
//      passes a store barrier, so no rank uses (or deletes) this round's keys before all are done.
// Store keys carry the round number (every rank counts rounds identically, exchange being
// collective), so a fast rank's next round can never be confused with this one (nvFuser's store
// key reuse race). A rank deletes its own keys of round k-1 once it has read every miss bit of
// round k: every rank has then finished round k-1.
// Every store wait is bounded by the timeout; a timeout throws StoreError naming the round, the
// rank that never arrived and the key.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/store.h"

namespace exactcoll {

// One buffer as its owner exports it.
struct ExportedBuffer {
  std::string handle;   // opaque bytes (a cudaIpcMemHandle_t, the simulator's region name, ...)
  uint64_t base = 0;    // allocation base address in the owner's process
  uint64_t size = 0;    // allocation size in bytes
  uint64_t offset = 0;  // where the buffer starts inside the allocation
};

// Opens a peer's allocation in this process. Returns the local address of the allocation's base
// (the buffer is at that address + offset). Throws on failure.
using OpenHandleFn = std::function<void*(int peer, const ExportedBuffer& buffer)>;
// Releases an allocation opened earlier (its handle bytes changed). May be empty.
using CloseHandleFn = std::function<void(int peer, void* opened_base)>;

struct HandleExchangeOptions {
  std::string key_prefix = "handles";        // one namespace per communicator
  std::chrono::milliseconds timeout{30000};  // every store wait
};

struct HandleExchangeStats {
  uint64_t calls = 0;           // exchange() calls (rounds)
  uint64_t exchanges = 0;       // rounds in which some rank missed and handles were exchanged
  uint64_t opens = 0;           // open callbacks made
  uint64_t closes = 0;          // close callbacks made
  bool last_missed = false;     // this rank missed in the last round
  bool last_exchanged = false;  // the last round exchanged
};

class HandleExchange {
 public:
  // Preconditions: 0 <= rank < world_size; every rank of the communicator builds one with the same
  // world_size and key_prefix over a store they share.
  HandleExchange(Store& store, int rank, int world_size, OpenHandleFn open, CloseHandleFn close = {},
                 HandleExchangeOptions options = {});

  // Collective: every rank calls it, the same number of times, with the same number of buffers
  // in corresponding order. Returns peers[i][p] = the address, in this process, of rank p's
  // buffers[i] (this rank's own address for p == rank).
  // Throws StoreError on a timeout (naming round, rank and key) and std::runtime_error when a peer
  // published a different number of buffers or a malformed handle list.
  // Example: auto peers = hx.exchange({{handle, base, size, 0}}); float* p1 = (float*)peers[0][1];
  std::vector<std::vector<void*>> exchange(const std::vector<ExportedBuffer>& mine);

  const HandleExchangeStats& stats() const { return stats_; }

  // The store key of `what` ("miss", "handles" or "barrier") for round `round` of `rank`.
  std::string key(uint64_t round, const std::string& what, int rank) const;

 private:
  struct Record {
    std::string handle;
    std::vector<void*> peers;
  };
  struct Opened {
    std::string handle;
    void* base = nullptr;
  };
  using LocalKey = std::tuple<uint64_t, uint64_t, uint64_t>;  // base, size, offset
  using OpenKey = std::tuple<uint64_t, uint64_t, int>;        // peer's base, size, peer

  bool misses(const std::vector<ExportedBuffer>& mine) const;
  // The count and a digest of a list's buffers in order (published beside the miss bit).
  static std::string list_digest(const std::vector<ExportedBuffer>& buffers);
  std::string get_or_explain(const std::string& key, int peer, const char* what);
  void* open_cached(int peer, const ExportedBuffer& buffer);

  Store& store_;
  int rank_;
  int world_size_;
  OpenHandleFn open_;
  CloseHandleFn close_;
  HandleExchangeOptions options_;
  uint64_t round_ = 0;
  std::map<LocalKey, Record> records_;
  std::vector<std::string> exchanged_digests_;  // every rank's list digest in the last exchange
  std::map<OpenKey, Opened> opened_;
  HandleExchangeStats stats_;
};

// The wire form of a handle list (exposed for tests): count, then per buffer base, size, offset
// and the handle bytes, little-endian, length-prefixed.
std::string encode_handles(const std::vector<ExportedBuffer>& buffers);
// Throws std::runtime_error naming `source` when the bytes are malformed.
std::vector<ExportedBuffer> decode_handles(const std::string& bytes, const std::string& source);

}  // namespace exactcoll
