// Fuzzing the rendezvous store's server with frames against a live server (issue 15): connections
// with and without a hello send well-formed requests with random fields, mutated ones, truncated
// and oversized frames and cut streams, and come and go. Every reply must be well-formed, and
// after the fuzzing (and every 500 inputs) a well-formed client must still be served while the
// server's connections, buffered bytes and this process's RSS stay within their bounds.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"
#include "store/wire.h"
#include "tests/fuzz/fuzz_harness.h"
#include "tests/resident_memory.h"
#include "tests/store/raw_connection.h"

namespace exactcoll {
namespace {

using std::chrono::milliseconds;
using store_wire::Op;
using store_wire::PayloadReader;
using store_wire::PayloadWriter;
using store_wire::Status;
using storetest::RawConnection;

const std::string kToken = "fuzz-token-0123456789abcdef";

using testing_memory::resident_bytes;

const char* const kKeys[] = {"a", "b", "handles/1/miss/0", "", "k\xff", "a-much-longer-key-for-the-fuzzer"};

// One request, well-formed or broken on purpose.
std::vector<uint8_t> request(sim::Xoshiro256& rng) {
  PayloadWriter w;
  const uint32_t short_timeouts[] = {0, 1, 5, 20};
  switch (rng.below(9)) {
    case 0:
      w.u8(static_cast<uint8_t>(Op::kSet)).str(fuzz::pick(rng, kKeys)).str(std::string(rng.below(3000), 'v'));
      break;
    case 1:
      w.u8(static_cast<uint8_t>(Op::kGet)).str(fuzz::pick(rng, kKeys)).u32(fuzz::pick(rng, short_timeouts));
      break;
    case 2: {
      const int64_t deltas[] = {1, -1, 0, INT64_MAX, INT64_MIN};
      w.u8(static_cast<uint8_t>(Op::kAdd)).str(fuzz::pick(rng, kKeys)).i64(fuzz::pick(rng, deltas));
      break;
    }
    case 3: w.u8(static_cast<uint8_t>(Op::kErase)).str(fuzz::pick(rng, kKeys)); break;
    case 4: {
      const uint32_t ranks[] = {0, 1, 2, 3, store_wire::kNoRank, 0x7FFFFFFF};
      const uint32_t sizes[] = {0, 1, 2, 3, 0xFFFFFFFF};
      w.u8(static_cast<uint8_t>(Op::kBarrier))
          .str(rng.below(2) ? "b" : "c")
          .u32(fuzz::pick(rng, sizes))
          .u32(fuzz::pick(rng, short_timeouts))
          .u32(fuzz::pick(rng, ranks));
      break;
    }
    case 5:  // a hello, right or wrong
      w.u8(static_cast<uint8_t>(Op::kHello))
          .u32(rng.below(4) ? store_wire::kProtocolVersion : static_cast<uint32_t>(rng.next()))
          .str(rng.below(2) ? kToken : std::string(rng.below(40), 'x'));
      break;
    case 6:  // random bytes
      for (uint64_t n = rng.below(64); n > 0; --n) w.u8(static_cast<uint8_t>(rng.next()));
      break;
    case 7:  // a string field that claims more bytes than follow
      w.u8(static_cast<uint8_t>(1 + rng.below(6))).u32(static_cast<uint32_t>(rng.next())).u8(0);
      break;
    default:  // a valid op with trailing bytes
      w.u8(static_cast<uint8_t>(Op::kErase)).str("a").u8(1);
      break;
  }
  std::vector<uint8_t> frame = w.frame();
  if (rng.below(10) == 0) {  // lie in the length prefix: zero, huge, or off by a few
    const uint32_t lies[] = {0,
                             0xFFFFFFFF,
                             64 << 10,
                             16 << 20,
                             static_cast<uint32_t>(frame.size() - 4 + 3),
                             static_cast<uint32_t>(rng.below(100))};
    const auto prefix = store_wire::encode_length(fuzz::pick(rng, lies));
    std::copy(prefix.begin(), prefix.end(), frame.begin());
  }
  if (rng.below(10) == 0) frame.resize(rng.below(frame.size() + 1));  // cut short
  return frame;
}

// A reply frame the server sent must be one the protocol allows.
void expect_well_formed_reply(const std::vector<uint8_t>& payload) {
  PayloadReader reader(payload);
  const auto status = reader.u8();
  ASSERT_TRUE(status.has_value()) << "empty reply";
  switch (static_cast<Status>(*status)) {
    case Status::kOk: break;  // the fields depend on the request
    case Status::kTimeout: {
      const auto arrived = reader.u32();
      ASSERT_TRUE(arrived) << "timeout reply without its count";
      for (int list = 0; list < 2; ++list) {  // the ranks waiting, then those that left
        const auto n = reader.u32();
        ASSERT_TRUE(n) << "timeout reply without its rank lists";
        if (list == 0) {
          EXPECT_LE(*n, *arrived);
        }
        for (uint32_t i = 0; i < *n; ++i) EXPECT_TRUE(reader.u32().has_value());
      }
      EXPECT_TRUE(reader.at_end());
      break;
    }
    case Status::kError:
    case Status::kBusy: {
      const auto message = reader.str();
      ASSERT_TRUE(message.has_value()) << "error reply without a message";
      EXPECT_FALSE(message->empty());
      EXPECT_TRUE(reader.at_end());
      break;
    }
    default: ADD_FAILURE() << "reply with unknown status " << static_cast<int>(*status);
  }
}

// A well-formed client joins and is served.
void expect_served(uint16_t port, uint64_t input) {
  TcpStoreClientOptions options;
  options.port = port;
  options.token = kToken;
  options.connect_timeout = milliseconds(5000);
  options.request_timeout = milliseconds(5000);
  try {
    TcpStoreClient client(options);
    const std::string key = "served/" + std::to_string(input);
    client.set(key, "yes");
    EXPECT_EQ(client.get(key, milliseconds(0)), "yes");
    const int64_t counted = client.add("served/count", 1);
    EXPECT_EQ(client.add("served/count", 0), counted);
    client.barrier("served/alone", 0, 1, milliseconds(1000));
    EXPECT_TRUE(client.erase(key));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "a well-formed client was not served after input " << input << ": " << e.what();
  }
}

TEST(StoreFuzz, FramesNeverHarmTheServer) {
  TcpStoreServerOptions options;
  options.token = kToken;
  options.max_frame_bytes = 64 << 10;
  options.max_connections = 32;
  options.max_unauthenticated = 8;
  options.max_buffered_bytes = 4 << 20;
  options.max_stored_bytes = 1 << 20;
  options.hello_timeout = milliseconds(300);
  TcpStoreServer server(options);
  const size_t rss_start = resident_bytes();
  size_t rss_peak = rss_start;
  std::vector<std::unique_ptr<RawConnection>> pool;
  uint64_t replies = 0;
  fuzz::SeededRun run("fuzz store", "EXACTCOLL_FUZZ", 30.0);
  run.each([&](sim::Xoshiro256& rng, uint64_t input) {
    const uint64_t action = rng.below(10);
    if (pool.empty() || (action < 3 && pool.size() < 12)) {
      try {
        pool.push_back(std::make_unique<RawConnection>(server.port()));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "cannot connect: " << e.what();
        return;
      }
      if (rng.below(3) != 0) pool.back()->send_until_closed(storetest::hello_frame(kToken));
    } else if (action == 3) {
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(rng.below(pool.size())));
      return;
    }
    RawConnection& c = *pool[rng.below(pool.size())];
    // 1..4 requests, as one stream cut into pieces.
    std::vector<uint8_t> stream;
    for (uint64_t n = 1 + rng.below(4); n > 0; --n) {
      const std::vector<uint8_t> one = request(rng);
      stream.insert(stream.end(), one.begin(), one.end());
    }
    for (size_t at = 0; at < stream.size();) {
      const size_t piece = std::min<size_t>(stream.size() - at, 1 + rng.below(stream.size()));
      c.send_until_closed(std::vector<uint8_t>(stream.begin() + at, stream.begin() + at + piece));
      at += piece;
    }
    for (int i = 0; i < 4; ++i) {  // the replies that come at once (now and then: within 20 ms)
      const auto reply = c.read_frame(milliseconds(rng.below(16) ? 1 : 20));
      if (!reply) break;
      ++replies;
      expect_well_formed_reply(*reply);
    }
    std::erase_if(pool, [](const std::unique_ptr<RawConnection>& p) { return p->ended(); });
    const TcpStoreServer::Usage usage = server.usage();
    EXPECT_LE(usage.connections, options.max_connections);
    EXPECT_LE(usage.unauthenticated, options.max_unauthenticated);
    EXPECT_LE(usage.buffered_bytes, options.max_buffered_bytes);
    EXPECT_LE(usage.stored_bytes, options.max_stored_bytes);
    rss_peak = std::max(rss_peak, resident_bytes());
    if (input % 500 == 499) expect_served(server.port(), input);
  });
  pool.clear();
  expect_served(server.port(), run.inputs());
  const size_t grown = std::max(rss_peak, resident_bytes()) - rss_start;
  std::printf("fuzz store: %llu replies checked; RSS %.1f MiB at the start, peak %.1f MiB (+%.1f MiB)\n",
              static_cast<unsigned long long>(replies), rss_start / 1048576.0, rss_peak / 1048576.0, grown / 1048576.0);
  if (fuzz::kRssIsMeaningful) {
    EXPECT_LT(grown, size_t{64} << 20) << "the server's memory must stay bounded";
  }
  EXPECT_GT(replies, 0u);
}

}  // namespace
}  // namespace exactcoll
