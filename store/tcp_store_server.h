// The rendezvous store's TCP server (rank 0 runs it; every rank, rank 0 too, talks to it through
// TcpStoreClient). Boost.Asio, one io_context on one thread owned by the server object.
//
// Wire format (all integers little-endian; `str` = u32 byte count + bytes; wire.h has the codes):
//   frame   = u32 payload_bytes, payload            1 <= payload_bytes <= max_frame_bytes (16 MiB)
//   request = u8 op, fields                          hello: u32 version, str token
//                                                    set: str key, str value
//                                                    get: str key, u32 timeout_ms
//                                                    add: str key, i64 delta
//                                                    erase: str key
//                                                    barrier: str name, u32 world_size, u32 timeout_ms,
//                                                             u32 rank (0xFFFFFFFF: not given)
//   reply   = u8 status, fields                      ok: get: str value; add: i64 sum;
//                                                        erase: u8 existed; others: nothing
//                                                    timeout: u32 callers arrived (get: 0),
//                                                             u32 n, n x u32 rank (those that gave one),
//                                                             u32 m, m x u32 rank (came and left)
//                                                    error: str message
//                                                    busy: str message (a limit; connect again)
// Strictly one request, then its reply, per connection: the server reads the next frame only after
// its reply to the previous one is written. A client that sends while its request is pending is
// breaking the protocol and is disconnected. `add` stores its sum as decimal text, so `get` of an
// add-key returns e.g. "3".
//
// Security model: the store exchanges CUDA IPC handles, which let any local process map a rank's
// GPU memory, so joining must be limited to the job's own processes.
//   1. The server binds 127.0.0.1 unless told otherwise (EXACTCOLL_STORE_BIND for multi-host jobs).
//   2. The first frame of every connection must be a hello carrying the job's shared token
//      (EXACTCOLL_STORE_TOKEN; `exactcoll launch` makes 128 random bits). It is compared in
//      constant time. Wrong token, wrong version, any other first frame, a first frame longer than
//      4 KiB, or no hello within hello_timeout (3 s): an error reply and the connection is closed.
//   3. Connections that have not said hello yet are capped on their own (max_unauthenticated, 64):
//      when one more arrives, the oldest of them is closed. Strangers without the token can
//      therefore never fill the slots of the job's ranks (max_connections counts only connections
//      that said hello), and a rank's own connection, whose hello follows its connect at once, is
//      evicted only by a flood of over 64 connections within that moment — and the client
//      connects again until its connect_timeout (store/tcp_store_client.h).
//   4. Malformed frames (unknown op, truncated or trailing fields, zero or oversized length) get an
//      error reply and that connection is closed; other connections never notice.
//   5. Memory is bounded: a frame buffer grows as its bytes arrive (64 KiB at a time), never from
//      the announced length alone; <= max_frame_bytes per connection (4 KiB before hello) and
//      <= max_buffered_bytes over all connections (a frame that would pass it: busy reply, closed);
//      one reply per connection; at most max_connections + max_unauthenticated connections; at
//      most max_stored_bytes of keys plus values.
//   Not a defence against a process that knows the token (it is a member of the job), nor against
//   someone who can read the job's environment (same user): that user could ptrace the ranks anyway.
//
// Waiting requests (get of a missing key, barrier) never block the server thread: they are parked
// with a deadline timer and answered when the key is set, the barrier fills, or the deadline passes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/store.h"
#include "store/wire.h"

namespace exactcoll {

struct TcpStoreServerOptions {
  // A numeric IPv4/IPv6 address; "0.0.0.0" serves every interface (multi-host jobs only).
  std::string bind_address = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks a free port; read it back with port()
  std::string token;  // required, non-empty: the hello of every connection must carry it
  uint32_t max_frame_bytes = store_wire::kDefaultMaxFrameBytes;
  size_t max_connections = kMaxStoreRanks;        // that said hello: one per rank (core/store.h)
  size_t max_unauthenticated = 64;                // that have not said hello yet; the oldest gives way
  size_t max_buffered_bytes = size_t{256} << 20;  // request bytes received, over all connections
  size_t max_stored_bytes = size_t{1} << 30;      // keys + values
  std::chrono::milliseconds hello_timeout{3000};
  // On stop(), replies already being written get this long to reach their clients.
  std::chrono::milliseconds shutdown_grace{1000};
};

class TcpStoreServer {
 public:
  // Binds, listens and starts serving on a thread of its own.
  // Throws StoreError naming the address and port when it cannot listen (e.g. port in use), or
  // when the token is empty or longer than a hello can carry (store_wire::kMaxTokenBytes).
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();  // stop()
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port it listens on (the chosen one when options.port was 0).
  uint16_t port() const;

  // Stops accepting, lets replies in flight finish (at most shutdown_grace), closes every
  // connection (waiting clients see the connection drop) and joins the thread. Idempotent.
  void stop();

  // What the server holds now (tests and the store fuzzer check its bounds). Thread-safe.
  struct Usage {
    size_t connections = 0;      // that said hello
    size_t unauthenticated = 0;  // that have not (yet)
    size_t buffered_bytes = 0;   // request buffers, capacity
    size_t stored_bytes = 0;     // keys + values
  };
  Usage usage() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace exactcoll
