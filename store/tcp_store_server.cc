#include "store/tcp_store_server.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

// Only the parts of Asio used here: <boost/asio.hpp> pulls in awaitable.hpp, which in Boost 1.74
// misses <utility> under C++20.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
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

// Buffers larger than this are released after use, so an idle connection that once sent a big
// frame does not keep holding it.
constexpr size_t kKeepBufferBytes = 64 << 10;
// A frame's buffer grows by at most this much per read: memory follows the bytes that arrived,
// never the length a frame announces.
constexpr size_t kReadChunkBytes = 64 << 10;

std::vector<uint8_t> ok_reply() { return PayloadWriter().u8(static_cast<uint8_t>(Status::kOk)).frame(); }

std::vector<uint8_t> error_reply(std::string_view message) {
  return PayloadWriter().u8(static_cast<uint8_t>(Status::kError)).str(message).frame();
}

std::vector<uint8_t> busy_reply(std::string_view message) {
  return PayloadWriter().u8(static_cast<uint8_t>(Status::kBusy)).str(message).frame();
}

// `arrived` callers were there; `present` are the ranks those of them gave, `left` the ranks of
// callers that came and left before the end.
std::vector<uint8_t> timeout_reply(size_t arrived, const std::vector<uint32_t>& present,
                                   const std::vector<uint32_t>& left) {
  PayloadWriter w;
  w.u8(static_cast<uint8_t>(Status::kTimeout)).u32(static_cast<uint32_t>(arrived));
  for (const std::vector<uint32_t>* ranks : {&present, &left}) {
    w.u32(static_cast<uint32_t>(ranks->size()));
    for (const uint32_t r : *ranks) w.u32(r);
  }
  return w.frame();
}

void release_if_large(std::vector<uint8_t>& buffer) {
  buffer.clear();
  if (buffer.capacity() > kKeepBufferBytes) buffer.shrink_to_fit();
}

void erase_id(std::vector<uint64_t>& ids, uint64_t id) {
  ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
}

// One client connection. Touched only on the server's io thread.
struct Session {
  Session(asio::io_context& io, tcp::socket connected, uint64_t session_id)
      : socket(std::move(connected)), timer(io), id(session_id) {}

  enum class Wait { kNone, kGet, kBarrier };

  tcp::socket socket;
  asio::steady_timer timer;  // the hello deadline, then the deadline of a parked request
  uint64_t id;
  std::array<uint8_t, store_wire::kLengthPrefixBytes> prefix{};
  std::vector<uint8_t> body;                     // the frame being received: grows as its bytes arrive
  uint32_t expected = 0;                         // the payload length its prefix announced
  size_t buffered = 0;                           // body.capacity() as counted in the server's buffered bytes
  std::list<uint64_t>::iterator in_hello_queue;  // while !authenticated: its place in accept order
  std::vector<uint8_t> outgoing;
  bool authenticated = false;
  bool writing = false;
  bool close_after_write = false;
  bool closed = false;
  Wait wait = Wait::kNone;
  std::string wait_key;                         // the key of a parked get, or the name of a parked barrier
  uint32_t barrier_rank = store_wire::kNoRank;  // the rank a parked barrier caller gave
  // Bumped whenever a parked request ends; a timer or readiness handler that captured an older
  // value belongs to a request that was already answered and does nothing.
  uint64_t wait_generation = 0;
};
using SessionPtr = std::shared_ptr<Session>;

}  // namespace

class TcpStoreServer::Impl {
 public:
  explicit Impl(TcpStoreServerOptions options);
  ~Impl() { stop(); }

  uint16_t port() const { return port_; }
  void stop();
  Usage usage() const {
    return {connections_.load(), unauthenticated_.load(), buffered_bytes_.load(), stored_bytes_.load()};
  }

 private:
  void accept_next();
  void admit(tcp::socket socket);
  void read_prefix(const SessionPtr& s);
  void read_body(const SessionPtr& s);
  // Counts s's buffer capacity in buffered_bytes_ (after it changed).
  void account(const SessionPtr& s);
  void handle_request(const SessionPtr& s);
  void handle_hello(const SessionPtr& s, PayloadReader& reader, std::optional<uint8_t> op);
  void handle_set(const SessionPtr& s, PayloadReader& reader);
  void handle_get(const SessionPtr& s, PayloadReader& reader);
  void handle_add(const SessionPtr& s, PayloadReader& reader);
  void handle_erase(const SessionPtr& s, PayloadReader& reader);
  void handle_barrier(const SessionPtr& s, PayloadReader& reader);

  // Stores key = value unless that would exceed max_stored_bytes (then returns an error message),
  // and answers every get parked on key.
  std::optional<std::string> store_value(const std::string& key, std::string value);
  void park(const SessionPtr& s, Session::Wait wait, const std::string& key, uint32_t timeout_ms);
  void on_wait_deadline(const SessionPtr& s);
  void unpark(const SessionPtr& s);  // forgets the parked request (waiter lists, timer, readiness)
  void reply(const SessionPtr& s, std::vector<uint8_t> frame, bool close_after = false);
  void refuse(const SessionPtr& s, const std::string& message) { reply(s, error_reply(message), true); }
  void close_session(const SessionPtr& s);
  void begin_shutdown();
  SessionPtr find_session(uint64_t id) const;

  TcpStoreServerOptions options_;
  // io_ first: it is destroyed last, after every object that refers to it.
  asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_retry_timer_{io_};
  asio::steady_timer shutdown_timer_{io_};
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex stop_mutex_;
  bool stopped_ = false;

  // State below is touched only on the io thread.
  bool shutting_down_ = false;
  uint64_t next_session_id_ = 1;
  std::unordered_map<uint64_t, SessionPtr> sessions_;
  std::list<uint64_t> hello_queue_;  // sessions without hello, oldest first (the next to give way)
  std::unordered_map<std::string, std::string> values_;
  // Written on the io thread only; atomic so that usage() may read them from any thread.
  std::atomic<size_t> stored_bytes_{0};
  std::atomic<size_t> connections_{0};  // authenticated
  std::atomic<size_t> unauthenticated_{0};
  std::atomic<size_t> buffered_bytes_{0};
  std::unordered_map<std::string, std::vector<uint64_t>> get_waiters_;  // key -> parked sessions
  struct BarrierState {
    uint32_t world_size = 0;
    std::vector<uint64_t> arrived;  // parked sessions, in arrival order
    std::vector<uint32_t> left;     // ranks of callers that left before the end (timeout, exit), sorted
  };
  std::unordered_map<std::string, BarrierState> barriers_;
  // The ranks its callers gave, sorted (callers without one are left out).
  std::vector<uint32_t> ranks_in(const BarrierState& barrier) const;
  // Remembers that `rank` came to the barrier and left before it completed.
  static void note_left(BarrierState& barrier, uint32_t rank);
};

TcpStoreServer::Impl::Impl(TcpStoreServerOptions options) : options_(std::move(options)) {
  if (options_.token.empty()) {
    throw StoreError("store server: refusing to start without a token (every client must present one)");
  }
  if (options_.token.size() > store_wire::kMaxTokenBytes) {
    throw StoreError("store server: the token has " + std::to_string(options_.token.size()) +
                     " characters; a hello carries at most " + std::to_string(store_wire::kMaxTokenBytes));
  }
  const std::string where = options_.bind_address + ":" + std::to_string(options_.port);
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(options_.bind_address, ec);
  if (ec) {
    throw StoreError("store server: bind address '" + options_.bind_address + "' is not a numeric IP address");
  }
  const tcp::endpoint endpoint(address, options_.port);
  auto fail_if = [&](const char* step) {
    if (ec) throw StoreError("store server: cannot listen on " + where + " (" + step + ": " + ec.message() + ")");
  };
  acceptor_.open(endpoint.protocol(), ec);
  fail_if("open");
  // Lets a restarted job reuse MASTER_PORT while the last job's connections sit in TIME_WAIT.
  acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  fail_if("SO_REUSEADDR");
  acceptor_.bind(endpoint, ec);
  fail_if("bind");
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  fail_if("listen");
  port_ = acceptor_.local_endpoint(ec).port();
  fail_if("local_endpoint");

  accept_next();
  thread_ = std::thread([this] {
    // Handlers catch their own errors; this is the last resort so that one bad surprise does not
    // terminate the whole worker. run() returns for good once stop() has closed everything.
    for (int attempt = 0; attempt < 1000; ++attempt) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "exactcoll store server: unexpected error, continuing: %s\n", e.what());
      }
    }
  });
}

void TcpStoreServer::Impl::stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    if (stopped_) return;
    stopped_ = true;
  }
  asio::post(io_, [this] { begin_shutdown(); });
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::Impl::begin_shutdown() {
  shutting_down_ = true;
  error_code ignored;
  acceptor_.close(ignored);
  accept_retry_timer_.cancel();
  std::vector<SessionPtr> all;
  for (const auto& entry : sessions_) all.push_back(entry.second);
  for (const auto& s : all) {
    if (s->writing) {
      s->close_after_write = true;  // let the reply reach its client first
    } else {
      close_session(s);
    }
  }
  if (!sessions_.empty()) {
    shutdown_timer_.expires_after(options_.shutdown_grace);
    shutdown_timer_.async_wait([this](error_code ec) {
      if (ec) return;
      std::vector<SessionPtr> rest;
      for (const auto& entry : sessions_) rest.push_back(entry.second);
      for (const auto& s : rest) close_session(s);
    });
  }
}

SessionPtr TcpStoreServer::Impl::find_session(uint64_t id) const {
  const auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

void TcpStoreServer::Impl::accept_next() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (shutting_down_ || !acceptor_.is_open()) return;
    if (ec) {
      // E.g. out of file descriptors: try again shortly instead of spinning on the error.
      accept_retry_timer_.expires_after(std::chrono::milliseconds(50));
      accept_retry_timer_.async_wait([this](error_code timer_ec) {
        if (!timer_ec && !shutting_down_) accept_next();
      });
      return;
    }
    admit(std::move(socket));
    accept_next();
  });
}

void TcpStoreServer::Impl::admit(tcp::socket socket) {
  // Make room among the connections that have not said hello: the oldest gives way. Strangers
  // can only ever crowd each other; the ranks' slots (max_connections) count hellos.
  while (!hello_queue_.empty() && hello_queue_.size() >= options_.max_unauthenticated) {
    const SessionPtr oldest = find_session(hello_queue_.front());
    if (oldest) {
      close_session(oldest);  // removes it from the queue
    } else {
      hello_queue_.pop_front();
    }
  }
  if (options_.max_unauthenticated == 0) {
    error_code ignored;
    socket.close(ignored);
    return;
  }
  error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);  // small frames, answered at once
  auto s = std::make_shared<Session>(io_, std::move(socket), next_session_id_++);
  sessions_.emplace(s->id, s);
  s->in_hello_queue = hello_queue_.insert(hello_queue_.end(), s->id);
  unauthenticated_.store(hello_queue_.size());
  s->timer.expires_after(options_.hello_timeout);
  s->timer.async_wait([this, s](error_code timer_ec) {
    if (timer_ec || s->closed || s->authenticated) return;
    close_session(s);  // no hello in time: a stranger or a stuck client
  });
  read_prefix(s);
}

void TcpStoreServer::Impl::read_prefix(const SessionPtr& s) {
  asio::async_read(s->socket, asio::buffer(s->prefix), [this, s](error_code ec, size_t) {
    if (s->closed) return;
    if (ec) {
      close_session(s);  // the client left (or broke the connection)
      return;
    }
    const uint32_t length = store_wire::decode_length(s->prefix);
    const uint32_t limit = s->authenticated ? options_.max_frame_bytes
                                            : std::min(options_.max_frame_bytes, store_wire::kMaxHelloFrameBytes);
    if (length == 0) {
      refuse(s, "refused: empty frame");
      return;
    }
    if (length > limit) {
      refuse(s, "refused: frame of " + std::to_string(length) + " bytes exceeds the limit of " + std::to_string(limit) +
                    " bytes" + (s->authenticated ? "" : " before hello"));
      return;
    }
    s->expected = length;
    s->body.clear();
    read_body(s);
  });
}

void TcpStoreServer::Impl::account(const SessionPtr& s) {
  buffered_bytes_.store(buffered_bytes_.load() - s->buffered + s->body.capacity());
  s->buffered = s->body.capacity();
}

void TcpStoreServer::Impl::read_body(const SessionPtr& s) {
  // Grow the buffer for the next chunk only: a frame that announces 16 MiB and sends 64 bytes
  // holds 64 KiB. Capacity doubles (amortized copying) but never passes the announced length.
  const size_t have = s->body.size();
  const size_t chunk = std::min<size_t>(s->expected - have, kReadChunkBytes);
  const size_t capacity =
      std::max(s->body.capacity(), std::min<size_t>(s->expected, std::max(have + chunk, 2 * s->body.capacity())));
  if (buffered_bytes_.load() - s->buffered + capacity > options_.max_buffered_bytes) {
    reply(s,
          busy_reply("busy: the server holds " + std::to_string(buffered_bytes_.load()) +
                     " bytes of unfinished requests, its limit is " + std::to_string(options_.max_buffered_bytes) +
                     "; try again"),
          true);
    return;
  }
  s->body.reserve(capacity);
  s->body.resize(have + chunk);
  account(s);
  asio::async_read(s->socket, asio::buffer(s->body.data() + have, chunk), [this, s](error_code ec, size_t) {
    if (s->closed) return;
    if (ec) {
      close_session(s);
      return;
    }
    if (s->body.size() < s->expected) {
      read_body(s);
      return;
    }
    try {
      handle_request(s);
    } catch (const std::exception& e) {  // e.g. bad_alloc: this connection pays, not the server
      if (!s->closed && !s->writing) refuse(s, std::string("refused: server error: ") + e.what());
    }
  });
}

void TcpStoreServer::Impl::handle_request(const SessionPtr& s) {
  // The frame leaves the session's buffer before any reply is started (a reply may reach its
  // client at once, and the buffer count must not lag behind what the client sees); a small
  // buffer goes back to the session afterwards, to be reused.
  std::vector<uint8_t> frame;
  frame.swap(s->body);
  account(s);
  struct GiveBack {
    Impl* server;
    const SessionPtr& session;
    std::vector<uint8_t>& frame;
    ~GiveBack() {
      if (session->closed || frame.capacity() > kKeepBufferBytes) return;
      frame.clear();
      session->body = std::move(frame);
      server->account(session);
    }
  } give_back{this, s, frame};
  PayloadReader reader(frame);
  const std::optional<uint8_t> op = reader.u8();
  if (!s->authenticated) {
    handle_hello(s, reader, op);
  } else if (op == static_cast<uint8_t>(Op::kSet)) {
    handle_set(s, reader);
  } else if (op == static_cast<uint8_t>(Op::kGet)) {
    handle_get(s, reader);
  } else if (op == static_cast<uint8_t>(Op::kAdd)) {
    handle_add(s, reader);
  } else if (op == static_cast<uint8_t>(Op::kErase)) {
    handle_erase(s, reader);
  } else if (op == static_cast<uint8_t>(Op::kBarrier)) {
    handle_barrier(s, reader);
  } else if (op == static_cast<uint8_t>(Op::kHello)) {
    refuse(s, "refused: a second hello on one connection");
  } else {
    refuse(s, "refused: unknown op " + std::to_string(op.value_or(0)));
  }
}

void TcpStoreServer::Impl::handle_hello(const SessionPtr& s, PayloadReader& reader, std::optional<uint8_t> op) {
  if (op != static_cast<uint8_t>(Op::kHello)) {
    refuse(s, "refused: the first frame of a connection must be a hello carrying the job's token");
    return;
  }
  const auto version = reader.u32();
  const auto token = reader.str();
  if (!version || !token || !reader.at_end()) {
    refuse(s, "refused: malformed hello");
    return;
  }
  if (*version != store_wire::kProtocolVersion) {
    refuse(s, "refused: client speaks store protocol " + std::to_string(*version) + ", this server speaks " +
                  std::to_string(store_wire::kProtocolVersion));
    return;
  }
  if (!store_wire::constant_time_equal(*token, options_.token)) {
    refuse(s, "refused: wrong token (every rank needs the same EXACTCOLL_STORE_TOKEN)");
    return;
  }
  if (connections_.load() >= options_.max_connections) {
    refuse(s, "refused: " + std::to_string(options_.max_connections) +
                  " connections have joined already (the server's max_connections)");
    return;
  }
  s->authenticated = true;
  hello_queue_.erase(s->in_hello_queue);
  unauthenticated_.store(hello_queue_.size());
  connections_.store(connections_.load() + 1);
  s->timer.cancel();
  reply(s, ok_reply());
}

std::optional<std::string> TcpStoreServer::Impl::store_value(const std::string& key, std::string value) {
  auto it = values_.find(key);
  const size_t old_bytes = it == values_.end() ? 0 : key.size() + it->second.size();
  const size_t new_total = stored_bytes_.load() - old_bytes + key.size() + value.size();
  if (new_total > options_.max_stored_bytes) {
    return "store full: keeping '" + key + "' would hold " + std::to_string(new_total) + " bytes, the limit is " +
           std::to_string(options_.max_stored_bytes);
  }
  stored_bytes_.store(new_total);
  if (it == values_.end()) {
    it = values_.emplace(key, std::move(value)).first;
  } else {
    it->second = std::move(value);
  }
  // Answer every get parked on this key.
  const auto waiting = get_waiters_.find(key);
  if (waiting != get_waiters_.end()) {
    const std::vector<uint64_t> ids = std::move(waiting->second);
    get_waiters_.erase(waiting);
    for (const uint64_t id : ids) {
      const SessionPtr waiter = find_session(id);
      if (!waiter || waiter->closed) continue;
      unpark(waiter);
      reply(waiter, PayloadWriter().u8(static_cast<uint8_t>(Status::kOk)).str(it->second).frame());
    }
  }
  return std::nullopt;
}

void TcpStoreServer::Impl::handle_set(const SessionPtr& s, PayloadReader& reader) {
  auto key = reader.str();
  auto value = reader.str();
  if (!key || !value || !reader.at_end()) {
    refuse(s, "refused: malformed set");
    return;
  }
  if (const auto error = store_value(*key, std::move(*value))) {
    reply(s, error_reply(*error));
    return;
  }
  reply(s, ok_reply());
}

void TcpStoreServer::Impl::handle_get(const SessionPtr& s, PayloadReader& reader) {
  const auto key = reader.str();
  const auto timeout_ms = reader.u32();
  if (!key || !timeout_ms || !reader.at_end()) {
    refuse(s, "refused: malformed get");
    return;
  }
  const auto it = values_.find(*key);
  if (it != values_.end()) {
    reply(s, PayloadWriter().u8(static_cast<uint8_t>(Status::kOk)).str(it->second).frame());
  } else if (*timeout_ms == 0) {
    reply(s, timeout_reply(0, {}, {}));
  } else {
    get_waiters_[*key].push_back(s->id);
    park(s, Session::Wait::kGet, *key, *timeout_ms);
  }
}

void TcpStoreServer::Impl::handle_add(const SessionPtr& s, PayloadReader& reader) {
  const auto key = reader.str();
  const auto delta = reader.i64();
  if (!key || !delta || !reader.at_end()) {
    refuse(s, "refused: malformed add");
    return;
  }
  int64_t current = 0;
  if (const auto it = values_.find(*key); it != values_.end()) {
    const std::string& text = it->second;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), current);
    if (ec != std::errc() || end != text.data() + text.size()) {
      reply(s, error_reply("add '" + *key + "': the key holds a value that is not a whole number"));
      return;
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, *delta, &sum)) {
    reply(s, error_reply("add '" + *key + "': " + std::to_string(current) + " + " + std::to_string(*delta) +
                         " overflows int64"));
    return;
  }
  if (const auto error = store_value(*key, std::to_string(sum))) {
    reply(s, error_reply(*error));
    return;
  }
  reply(s, PayloadWriter().u8(static_cast<uint8_t>(Status::kOk)).i64(sum).frame());
}

void TcpStoreServer::Impl::handle_erase(const SessionPtr& s, PayloadReader& reader) {
  const auto key = reader.str();
  if (!key || !reader.at_end()) {
    refuse(s, "refused: malformed erase");
    return;
  }
  const auto it = values_.find(*key);
  const bool existed = it != values_.end();
  if (existed) {
    stored_bytes_.store(stored_bytes_.load() - (it->first.size() + it->second.size()));
    values_.erase(it);
  }
  reply(s, PayloadWriter().u8(static_cast<uint8_t>(Status::kOk)).u8(existed ? 1 : 0).frame());
}

void TcpStoreServer::Impl::handle_barrier(const SessionPtr& s, PayloadReader& reader) {
  const auto name = reader.str();
  const auto world_size = reader.u32();
  const auto timeout_ms = reader.u32();
  const auto rank = reader.u32();
  if (!name || !world_size || !timeout_ms || !rank || !reader.at_end()) {
    refuse(s, "refused: malformed barrier");
    return;
  }
  if (*world_size == 0 || *world_size > static_cast<uint32_t>(kMaxStoreRanks)) {
    reply(s, error_reply("barrier '" + *name + "': world_size must be 1.." + std::to_string(kMaxStoreRanks) + ", got " +
                         std::to_string(*world_size)));
    return;
  }
  if (*rank != store_wire::kNoRank && *rank >= *world_size) {
    reply(s, error_reply("barrier '" + *name + "': rank " + std::to_string(*rank) + " is not below world_size " +
                         std::to_string(*world_size)));
    return;
  }
  BarrierState& barrier = barriers_[*name];
  if (barrier.arrived.empty()) {
    barrier.world_size = *world_size;
  } else if (barrier.world_size != *world_size) {
    reply(s, error_reply("barrier '" + *name + "': entered with world_size " + std::to_string(*world_size) + " while " +
                         std::to_string(barrier.arrived.size()) + " caller(s) wait with world_size " +
                         std::to_string(barrier.world_size)));
    return;
  }
  if (*rank != store_wire::kNoRank) {
    for (const uint64_t id : barrier.arrived) {
      const SessionPtr member = find_session(id);
      if (member && member->barrier_rank == *rank) {
        reply(s, error_reply("barrier '" + *name + "': rank " + std::to_string(*rank) +
                             " entered while a caller with the same rank waits in it"));
        return;
      }
    }
  }
  s->barrier_rank = *rank;
  barrier.arrived.push_back(s->id);
  if (barrier.arrived.size() >= barrier.world_size) {
    // Everyone is here: release them all and forget the barrier, so the name can be used again.
    const std::vector<uint64_t> ids = std::move(barrier.arrived);
    barriers_.erase(*name);
    for (const uint64_t id : ids) {
      const SessionPtr member = find_session(id);
      if (!member || member->closed) continue;
      if (member->wait == Session::Wait::kBarrier) unpark(member);
      reply(member, ok_reply());
    }
    return;
  }
  if (*timeout_ms == 0) {
    const std::vector<uint32_t> ranks = ranks_in(barrier);
    const size_t arrived = barrier.arrived.size();
    const std::vector<uint32_t> left = barrier.left;
    barrier.arrived.pop_back();
    note_left(barrier, *rank);
    if (barrier.arrived.empty()) barriers_.erase(*name);
    reply(s, timeout_reply(arrived, ranks, left));
    return;
  }
  park(s, Session::Wait::kBarrier, *name, *timeout_ms);
}

void TcpStoreServer::Impl::note_left(BarrierState& barrier, uint32_t rank) {
  if (rank == store_wire::kNoRank) return;
  const auto at = std::lower_bound(barrier.left.begin(), barrier.left.end(), rank);
  if (at == barrier.left.end() || *at != rank) barrier.left.insert(at, rank);
}

std::vector<uint32_t> TcpStoreServer::Impl::ranks_in(const BarrierState& barrier) const {
  std::vector<uint32_t> ranks;
  for (const uint64_t id : barrier.arrived) {
    const SessionPtr member = find_session(id);
    if (member && member->barrier_rank != store_wire::kNoRank) ranks.push_back(member->barrier_rank);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

void TcpStoreServer::Impl::park(const SessionPtr& s, Session::Wait wait, const std::string& key, uint32_t timeout_ms) {
  s->wait = wait;
  s->wait_key = key;
  const uint64_t generation = s->wait_generation;
  s->timer.expires_after(std::chrono::milliseconds(timeout_ms));
  s->timer.async_wait([this, s, generation](error_code ec) {
    if (ec || s->closed || s->wait_generation != generation) return;
    on_wait_deadline(s);
  });
  // While parked nothing is read from the socket; watch it anyway so that a client that leaves (or
  // breaks the protocol by sending again) is dropped at once, not counted in a barrier it left.
  s->socket.async_wait(tcp::socket::wait_read, [this, s, generation](error_code ec) {
    if (ec || s->closed || s->wait_generation != generation) return;
    close_session(s);
  });
}

void TcpStoreServer::Impl::on_wait_deadline(const SessionPtr& s) {
  size_t arrived = 0;
  std::vector<uint32_t> ranks, left;
  if (s->wait == Session::Wait::kBarrier) {
    const auto it = barriers_.find(s->wait_key);
    if (it != barriers_.end()) {
      arrived = it->second.arrived.size();  // this caller included
      ranks = ranks_in(it->second);
      left = it->second.left;
    }
  }
  unpark(s);
  reply(s, timeout_reply(arrived, ranks, left));
}

void TcpStoreServer::Impl::unpark(const SessionPtr& s) {
  if (s->wait == Session::Wait::kGet) {
    const auto it = get_waiters_.find(s->wait_key);
    if (it != get_waiters_.end()) {
      erase_id(it->second, s->id);
      if (it->second.empty()) get_waiters_.erase(it);
    }
  } else if (s->wait == Session::Wait::kBarrier) {
    const auto it = barriers_.find(s->wait_key);
    if (it != barriers_.end()) {
      erase_id(it->second.arrived, s->id);  // a caller that left no longer waits, but is named as one that came
      note_left(it->second, s->barrier_rank);
      if (it->second.arrived.empty()) barriers_.erase(it);
    }
  }
  const bool was_parked = s->wait != Session::Wait::kNone;
  s->wait = Session::Wait::kNone;
  s->wait_key.clear();
  ++s->wait_generation;
  if (was_parked && !s->closed) {
    s->timer.cancel();
    error_code ignored;
    s->socket.cancel(ignored);  // ends the readiness watch; nothing else is outstanding while parked
  }
}

void TcpStoreServer::Impl::reply(const SessionPtr& s, std::vector<uint8_t> frame, bool close_after) {
  s->outgoing = std::move(frame);
  s->writing = true;
  s->close_after_write = s->close_after_write || close_after;
  asio::async_write(s->socket, asio::buffer(s->outgoing), [this, s](error_code ec, size_t) {
    s->writing = false;
    if (s->closed) return;
    if (ec || s->close_after_write || shutting_down_) {
      close_session(s);
      return;
    }
    release_if_large(s->outgoing);
    read_prefix(s);  // strictly one request at a time: read the next only now
  });
}

void TcpStoreServer::Impl::close_session(const SessionPtr& s) {
  if (s->closed) return;
  unpark(s);
  s->closed = true;
  if (s->authenticated) {
    connections_.store(connections_.load() - 1);
  } else {
    hello_queue_.erase(s->in_hello_queue);
    unauthenticated_.store(hello_queue_.size());
  }
  // Its buffer stops counting now; the memory goes with the session object, after the handlers
  // still holding it (a read cancelled by the close below among them) have run.
  buffered_bytes_.store(buffered_bytes_.load() - s->buffered);
  s->buffered = 0;
  s->timer.cancel();
  error_code ignored;
  s->socket.shutdown(tcp::socket::shutdown_both, ignored);
  s->socket.close(ignored);
  sessions_.erase(s->id);
  if (shutting_down_ && sessions_.empty()) shutdown_timer_.cancel();
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

TcpStoreServer::~TcpStoreServer() = default;

uint16_t TcpStoreServer::port() const { return impl_->port(); }

TcpStoreServer::Usage TcpStoreServer::usage() const { return impl_->usage(); }

void TcpStoreServer::stop() { impl_->stop(); }

}  // namespace exactcoll
