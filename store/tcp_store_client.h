// The rendezvous store's TCP client: the Store every rank (rank 0 too) uses. Wire format and
// security model: store/tcp_store_server.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/store.h"
#include "store/wire.h"

namespace exactcoll {

struct TcpStoreClientOptions {
  std::string host = "127.0.0.1";  // a name or a numeric address
  uint16_t port = 0;
  std::string token;  // at most store_wire::kMaxTokenBytes characters
  // Joining retries (with backoff) until this passes: the server may start after the client, and
  // a server at a limit (or one flooded by strangers: tcp_store_server.h) may drop a connection
  // before its hello is answered. Only an explicit refusal (wrong token or protocol) ends it early.
  std::chrono::milliseconds connect_timeout{60000};
  // How long set, add, erase and the hello may take; also the slack a get or barrier reply gets
  // beyond its own timeout before the client gives up on the server.
  std::chrono::milliseconds request_timeout{30000};
  uint32_t max_frame_bytes = store_wire::kDefaultMaxFrameBytes;
  // Who runs the server, for errors when it goes away: e.g. "rank 0" makes a lost connection
  // read "... the store server at 127.0.0.1:29500 (run by rank 0) closed the connection: rank 0
  // exited or died". Empty: errors name only the address.
  std::string server_owner;
};

// Thread-safe (calls are serialized). After a connection failure or a request that got no reply
// in time, every later call throws StoreError saying the connection was lost and why.
class TcpStoreClient final : public Store {
 public:
  // Connects and authenticates. Throws StoreError naming host:port when no connection succeeds
  // within connect_timeout, or when the server refuses the token or the protocol version, or
  // (before any attempt) when the token is longer than a hello can carry.
  explicit TcpStoreClient(TcpStoreClientOptions options);
  ~TcpStoreClient() override;
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool erase(const std::string& key) override;
  using Store::barrier;
  void barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) override;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace exactcoll
