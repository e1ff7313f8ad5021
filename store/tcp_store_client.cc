#include "store/tcp_store_client.h"

#include <algorithm>
#include <climits>
#include <mutex>
#include <optional>
#include <utility>
#include <thread>
#include <vector>

// Only the parts of Asio used here: <boost/asio.hpp> pulls in awaitable.hpp, which in Boost 1.74
// misses <utility> under C++20.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

namespace exactcoll {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using store_wire::Op;
using store_wire::PayloadReader;
using store_wire::PayloadWriter;
using store_wire::Status;

// Longest wait the client will ever ask for (~24 days): keeps now() + duration from overflowing
// and fits the protocol's u32 milliseconds.
constexpr std::chrono::milliseconds kLongestWait{uint32_t{1} << 31};

std::chrono::milliseconds clamp_wait(std::chrono::milliseconds wait) {
  return std::clamp(wait, std::chrono::milliseconds(0), kLongestWait);
}

std::string quoted(const std::string& text) { return "'" + text + "'"; }

}  // namespace

class TcpStoreClient::Impl {
 public:
  explicit Impl(TcpStoreClientOptions options)
      : options_(std::move(options)),
        endpoint_text_(options_.host + ":" + std::to_string(options_.port)),
        server_text_("the store server at " + endpoint_text_ +
                     (options_.server_owner.empty() ? "" : " (run by " + options_.server_owner + ")")) {
    if (options_.token.size() > store_wire::kMaxTokenBytes) {
      throw StoreError("store: the token has " + std::to_string(options_.token.size()) +
                       " characters; a hello carries at most " + std::to_string(store_wire::kMaxTokenBytes));
    }
    join();
  }

  ~Impl() {
    error_code ignored;
    socket_.close(ignored);
  }

  // Sends one request frame and waits for its reply, at most `reply_within`. Returns the reply's
  // status and a reader positioned after it. `what` names the operation in errors ("get 'key'").
  std::pair<Status, PayloadReader> round_trip(const PayloadWriter& request, std::chrono::milliseconds reply_within,
                                              const std::string& what) {
    if (lost_) {
      throw StoreError("store " + what + ": the connection to the store server at " + endpoint_text_ +
                       " was lost earlier (" + *lost_ + ")");
    }
    if (request.payload_bytes() > options_.max_frame_bytes) {
      throw StoreError("store " + what + ": the request is " + std::to_string(request.payload_bytes()) +
                       " bytes, more than the frame limit of " + std::to_string(options_.max_frame_bytes));
    }
    const std::vector<uint8_t> frame = request.frame();
    std::array<uint8_t, store_wire::kLengthPrefixBytes> prefix{};
    error_code result = asio::error::would_block;  // stays so until the exchange finishes
    bool oversized_reply = false;

    // 1. Write the request, then read the reply's prefix, then its payload (one chain of handlers).
    io_.restart();
    asio::async_write(socket_, asio::buffer(frame), [&](error_code ec, size_t) {
      if (ec) {
        result = ec;
        return;
      }
      asio::async_read(socket_, asio::buffer(prefix), [&](error_code prefix_ec, size_t) {
        if (prefix_ec) {
          result = prefix_ec;
          return;
        }
        const uint32_t length = store_wire::decode_length(prefix);
        if (length == 0 || length > options_.max_frame_bytes) {
          oversized_reply = true;
          result = asio::error::message_size;
          return;
        }
        reply_.resize(length);
        asio::async_read(socket_, asio::buffer(reply_), [&](error_code body_ec, size_t) { result = body_ec; });
      });
    });
    // 2. Run it for at most reply_within; past that the connection is out of step and unusable.
    io_.run_for(clamp_wait(reply_within));
    if (result == asio::error::would_block) {
      error_code ignored;
      socket_.close(ignored);
      io_.restart();
      io_.run();  // the aborted handlers run now, while the locals they refer to still exist
      lose(what, "no reply within " + std::to_string(reply_within.count()) + " ms");
    }
    if (oversized_reply) lose(what, "the server sent a malformed reply frame");
    if (result == asio::error::eof || result == asio::error::connection_reset || result == asio::error::broken_pipe) {
      lose(what, kClosedByServer);
    }
    if (result) lose(what, result.message());

    // 3. Decode the status.
    PayloadReader reader(reply_);
    const auto status = reader.u8();
    if (status == static_cast<uint8_t>(Status::kError)) {
      const auto message = reader.str();
      throw StoreError("store " + what + ": " + (message ? *message : std::string("error (no message)")) +
                       " (store server " + endpoint_text_ + ")");
    }
    if (status == static_cast<uint8_t>(Status::kBusy)) {
      const auto message = reader.str();
      lose(what,
           "the server is at a limit and closed the connection: " + (message ? *message : std::string("(no message)")));
    }
    if (status != static_cast<uint8_t>(Status::kOk) && status != static_cast<uint8_t>(Status::kTimeout)) {
      lose(what, "the server sent a reply with unknown status");
    }
    return {static_cast<Status>(*status), reader};
  }

  // Marks the connection unusable and throws. Never returns.
  [[noreturn]] void lose(const std::string& what, const std::string& why) {
    lost_ = why;
    error_code ignored;
    socket_.close(ignored);
    if (why == kClosedByServer) {
      // The server's process ended (or stopped its server): say whose it was.
      throw StoreError("store " + what + ": " + server_text_ + " closed the connection" +
                       (options_.server_owner.empty() ? "" : ": " + options_.server_owner + " exited or died"));
    }
    throw StoreError("store " + what + ": " + why + " (" + server_text_ + ")");
  }

  // A timeout reply's fields: callers waiting, the ranks among them, the ranks that left.
  struct TimeoutFields {
    uint32_t arrived = 0;
    std::vector<int> present, left;
  };
  // Returns nullopt when the fields are malformed.
  static std::optional<TimeoutFields> timeout_fields(PayloadReader& reader) {
    TimeoutFields f;
    const auto arrived = reader.u32();
    if (!arrived) return std::nullopt;
    f.arrived = *arrived;
    for (std::vector<int>* ranks : {&f.present, &f.left}) {
      const auto count = reader.u32();
      if (!count) return std::nullopt;  // a count beyond the data fails at the first missing rank
      for (uint32_t i = 0; i < *count; ++i) {
        const auto rank = reader.u32();
        if (!rank || *rank > static_cast<uint32_t>(INT32_MAX)) return std::nullopt;
        ranks->push_back(static_cast<int>(*rank));
      }
    }
    if (f.present.size() > f.arrived || !reader.at_end()) return std::nullopt;
    return f;
  }

  // A reply whose fields do not match its request: the server is not speaking our protocol.
  [[noreturn]] void malformed(const std::string& what) { lose(what, "the server sent a malformed reply"); }

  const TcpStoreClientOptions& options() const { return options_; }

  std::mutex mutex;

 private:
  // Connects and says hello, trying again with backoff until connect_timeout has passed: the
  // server may not listen yet, or may drop the connection before answering (at a limit, or
  // crowded by strangers: tcp_store_server.h). An explicit refusal (wrong token, protocol, the
  // server's max_connections) ends it at once. Bounded: every pass ends at the deadline, or
  // sleeps toward it.
  void join() {
    const auto deadline = std::chrono::steady_clock::now() + clamp_wait(options_.connect_timeout);
    std::chrono::milliseconds backoff(20);
    std::string last_error = "no attempt made";
    for (;;) {
      const auto remaining =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (remaining.count() <= 0) break;
      if (connect_once(remaining, &last_error)) {
        try {
          hello(std::min(remaining, options_.request_timeout));
          return;
        } catch (const StoreError& e) {
          if (!lost_) throw;  // the server refused us explicitly: trying again cannot help
          last_error =
              *lost_ == kClosedByServer ? "the server closed the connection before answering the hello" : *lost_;
          lost_.reset();
          error_code ignored;
          socket_.close(ignored);
        }
      }
      // Back off before the next attempt, but never sleep past the deadline.
      const std::chrono::steady_clock::duration left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) break;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(backoff, left));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
    throw StoreError("store: could not join the store server at " + endpoint_text_ + " within " +
                     std::to_string(options_.connect_timeout.count()) + " ms (last error: " + last_error +
                     "); is rank 0 running, and are MASTER_ADDR and EXACTCOLL_STORE_PORT (default MASTER_PORT + 1) "
                     "right?");
  }

  // One connection attempt of at most `within`. Returns whether it connected; else *error says why.
  bool connect_once(std::chrono::milliseconds within, std::string* error) {
    error_code ec;
    tcp::resolver resolver(io_);
    const auto endpoints = resolver.resolve(options_.host, std::to_string(options_.port), ec);
    if (ec) {
      *error = "cannot resolve " + options_.host + ": " + ec.message();
      return false;
    }
    error_code connect_result = asio::error::would_block;
    io_.restart();
    asio::async_connect(socket_, endpoints,
                        [&](error_code connect_ec, const tcp::endpoint&) { connect_result = connect_ec; });
    io_.run_for(within);
    if (connect_result == asio::error::would_block) {
      error_code ignored;
      socket_.close(ignored);
      io_.restart();
      io_.run();
      *error = "connect timed out";
      return false;
    }
    if (connect_result) {
      *error = connect_result.message();
      error_code ignored;
      socket_.close(ignored);
      return false;
    }
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    return true;
  }

  // Throws StoreError: with lost_ set when the connection failed (worth another attempt), without
  // when the server refused the hello.
  void hello(std::chrono::milliseconds reply_within) {
    PayloadWriter request;
    request.u8(static_cast<uint8_t>(Op::kHello)).u32(store_wire::kProtocolVersion).str(options_.token);
    auto [status, reader] = round_trip(request, reply_within, "hello");
    if (status != Status::kOk || !reader.at_end()) malformed("hello");
  }

  static constexpr const char* kClosedByServer = "the store server closed the connection";

  TcpStoreClientOptions options_;
  std::string endpoint_text_;
  std::string server_text_;  // "the store server at host:port (run by rank 0)"
  asio::io_context io_;
  tcp::socket socket_{io_};
  std::optional<std::string> lost_;  // why the connection is unusable, once it is
  std::vector<uint8_t> reply_;
};

TcpStoreClient::TcpStoreClient(TcpStoreClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

TcpStoreClient::~TcpStoreClient() = default;

void TcpStoreClient::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string what = "set " + quoted(key);
  PayloadWriter request;
  request.u8(static_cast<uint8_t>(Op::kSet)).str(key).str(value);
  auto [status, reader] = impl_->round_trip(request, impl_->options().request_timeout, what);
  if (status != Status::kOk || !reader.at_end()) impl_->malformed(what);
}

std::string TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string what = "get " + quoted(key);
  timeout = clamp_wait(timeout);
  PayloadWriter request;
  request.u8(static_cast<uint8_t>(Op::kGet)).str(key).u32(static_cast<uint32_t>(timeout.count()));
  auto [status, reader] = impl_->round_trip(request, timeout + impl_->options().request_timeout, what);
  if (status == Status::kTimeout) {
    if (!Impl::timeout_fields(reader)) impl_->malformed(what);
    throw StoreError("store " + what + ": no rank set it within " + std::to_string(timeout.count()) + " ms");
  }
  auto value = reader.str();
  if (!value || !reader.at_end()) impl_->malformed(what);
  return std::move(*value);
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string what = "add " + quoted(key);
  PayloadWriter request;
  request.u8(static_cast<uint8_t>(Op::kAdd)).str(key).i64(delta);
  auto [status, reader] = impl_->round_trip(request, impl_->options().request_timeout, what);
  const auto sum = reader.i64();
  if (status != Status::kOk || !sum || !reader.at_end()) impl_->malformed(what);
  return *sum;
}

bool TcpStoreClient::erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string what = "erase " + quoted(key);
  PayloadWriter request;
  request.u8(static_cast<uint8_t>(Op::kErase)).str(key);
  auto [status, reader] = impl_->round_trip(request, impl_->options().request_timeout, what);
  const auto existed = reader.u8();
  if (status != Status::kOk || !existed || *existed > 1 || !reader.at_end()) impl_->malformed(what);
  return *existed == 1;
}

void TcpStoreClient::barrier(const std::string& name, int rank, int world_size, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string what = "barrier " + quoted(name);
  if (world_size < 1 || world_size > kMaxStoreRanks) {
    throw StoreError("store " + what + ": world_size must be 1.." + std::to_string(kMaxStoreRanks) + ", got " +
                     std::to_string(world_size));
  }
  if (rank != kUnknownRank && (rank < 0 || rank >= world_size)) {
    throw StoreError("store " + what + ": rank " + std::to_string(rank) + " is outside 0.." +
                     std::to_string(world_size - 1));
  }
  timeout = clamp_wait(timeout);
  PayloadWriter request;
  request.u8(static_cast<uint8_t>(Op::kBarrier))
      .str(name)
      .u32(static_cast<uint32_t>(world_size))
      .u32(static_cast<uint32_t>(timeout.count()))
      .u32(rank == kUnknownRank ? store_wire::kNoRank : static_cast<uint32_t>(rank));
  auto [status, reader] = impl_->round_trip(request, timeout + impl_->options().request_timeout, what);
  if (status == Status::kTimeout) {
    const auto fields = Impl::timeout_fields(reader);
    if (!fields) impl_->malformed(what);
    throw StoreError(
        "store " + barrier_timeout_message(name, world_size, fields->arrived, fields->present, fields->left, timeout));
  }
  if (!reader.at_end()) impl_->malformed(what);
}

}  // namespace exactcoll
