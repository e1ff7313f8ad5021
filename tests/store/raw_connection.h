// A hand-driven connection to the rendezvous store, for tests and the store fuzzer to send bytes
// the real client never would (tests/store/tcp_store_test.cc, tests/fuzz/store_fuzz_test.cc).
#pragma once

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "store/wire.h"

namespace exactcoll::storetest {

namespace asio = boost::asio;
using asio::ip::tcp;
using std::chrono::milliseconds;

// The frame of a hello carrying `token` (the current protocol version).
inline std::vector<uint8_t> hello_frame(const std::string& token) {
  return store_wire::PayloadWriter()
      .u8(static_cast<uint8_t>(store_wire::Op::kHello))
      .u32(store_wire::kProtocolVersion)
      .str(token)
      .frame();
}

// A hand-driven connection for sending bytes the real client never would.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  }

  void send(const std::vector<uint8_t>& bytes) { asio::write(socket_, asio::buffer(bytes)); }

  // Sends what the server takes; stops quietly when it closes the connection mid-way.
  void send_until_closed(const std::vector<uint8_t>& bytes) {
    boost::system::error_code ec;
    asio::write(socket_, asio::buffer(bytes), ec);
    if (ec) ended_ = true;
  }

  // True once a read or write found the connection closed.
  bool ended() const { return ended_; }

  // Returns one reply payload, or nullopt if none arrives within `timeout` or the connection ends.
  std::optional<std::vector<uint8_t>> read_frame(milliseconds timeout) {
    std::array<uint8_t, 4> prefix{};
    std::vector<uint8_t> payload;
    boost::system::error_code result = asio::error::would_block;
    io_.restart();
    asio::async_read(socket_, asio::buffer(prefix), [&](boost::system::error_code ec, size_t) {
      if (ec) {
        result = ec;
        return;
      }
      payload.resize(store_wire::decode_length(prefix));
      asio::async_read(socket_, asio::buffer(payload),
                       [&](boost::system::error_code body_ec, size_t) { result = body_ec; });
    });
    io_.run_for(timeout);
    if (result == asio::error::would_block) {
      socket_.cancel();
      io_.restart();
      io_.run();
      return std::nullopt;
    }
    if (result) {
      ended_ = true;
      return std::nullopt;
    }
    return payload;
  }

  // Returns true once the server has closed the connection (EOF or reset), false if it is still
  // open after `timeout`. Anything the server sent first is discarded.
  bool closed_by_server_within(milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::array<uint8_t, 256> sink{};
    while (std::chrono::steady_clock::now() < deadline) {  // bounded by the deadline
      boost::system::error_code result = asio::error::would_block;
      io_.restart();
      socket_.async_read_some(asio::buffer(sink), [&](boost::system::error_code ec, size_t) { result = ec; });
      io_.run_until(deadline);
      if (result == asio::error::would_block) {
        socket_.cancel();
        io_.restart();
        io_.run();
        return false;
      }
      if (result) return true;  // eof or connection_reset
    }
    return false;
  }

  void close() { socket_.close(); }

 private:
  asio::io_context io_;
  tcp::socket socket_;
  bool ended_ = false;
};

}  // namespace exactcoll::storetest
