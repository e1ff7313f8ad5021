// The rendezvous store's wire format: length-prefixed binary frames (the format itself is
// described at the top of store/tcp_store_server.h). This header holds the constants,
// a payload builder and a bounds-checked payload reader, shared by the server, the client and the
// tests that craft malformed frames on purpose.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace exactcoll::store_wire {

// Bumped whenever a frame's layout changes; a hello with another version is refused.
// 2 (2026-11-24): barrier carries the caller's rank; timeout replies list the ranks that arrived;
// the kBusy status.
inline constexpr uint32_t kProtocolVersion = 2;

// Largest payload accepted from an authenticated connection (16 MiB: a batch of CUDA IPC handles
// for 16 ranks is a few KiB, so this is generous and still bounds memory per connection).
inline constexpr uint32_t kDefaultMaxFrameBytes = 16u << 20;

// Largest payload accepted before the hello succeeded: a stranger cannot make the server allocate
// more than this.
inline constexpr uint32_t kMaxHelloFrameBytes = 4096;

inline constexpr size_t kLengthPrefixBytes = 4;

// A hello's payload is u8 op, u32 version, u32 token length, then the token: the longest token
// that fits the hello limit. The worker environment, the server and the client refuse longer
// tokens up front, rather than every hello being refused as an oversized frame.
inline constexpr size_t kHelloFixedBytes = 1 + 4 + 4;
inline constexpr size_t kMaxTokenBytes = kMaxHelloFrameBytes - kHelloFixedBytes;

// The rank field of a barrier from a caller that does not say who it is.
inline constexpr uint32_t kNoRank = 0xFFFFFFFFu;

enum class Op : uint8_t {
  kHello = 1,    // u32 protocol version, str token
  kSet = 2,      // str key, str value
  kGet = 3,      // str key, u32 timeout_ms
  kAdd = 4,      // str key, i64 delta
  kErase = 5,    // str key
  kBarrier = 6,  // str name, u32 world_size, u32 timeout_ms, u32 rank (kNoRank: not given)
};

enum class Status : uint8_t {
  kOk = 0,       // followed by the op's result: get: str value; add: i64 sum; erase: u8 existed
  kTimeout = 1,  // followed by u32 arrived (barrier: callers present at the deadline; get: 0),
                 // u32 n, n x u32 rank: the ranks among them that said who they are,
                 // u32 m, m x u32 rank: the ranks that came and left before the end
  kError = 2,    // followed by str message; the request (or, refusing a hello, the job) failed
  kBusy = 3,     // followed by str message; the server is at a limit and closes the connection,
                 // a client may connect again (only ever the answer to a hello or a frame it cut)
};

// Returns the 4-byte little-endian length prefix of a payload of `payload_bytes` bytes.
std::array<uint8_t, kLengthPrefixBytes> encode_length(uint32_t payload_bytes);

// Returns the payload length that a 4-byte little-endian prefix announces.
uint32_t decode_length(const std::array<uint8_t, kLengthPrefixBytes>& prefix);

// Builds one frame: the payload fields in order, then frame() prepends the length prefix.
// Example: PayloadWriter().u8(uint8_t(Op::kErase)).str("key").frame()
class PayloadWriter {
 public:
  PayloadWriter& u8(uint8_t value);
  PayloadWriter& u32(uint32_t value);
  PayloadWriter& i64(int64_t value);
  // A string field: u32 byte count, then the bytes. Precondition: text.size() < 2^32.
  PayloadWriter& str(std::string_view text);

  size_t payload_bytes() const { return payload_.size(); }
  // Returns length prefix + payload.
  std::vector<uint8_t> frame() const;

 private:
  std::vector<uint8_t> payload_;
};

// Reads fields from one payload. Every read checks bounds: a field that runs past the end returns
// nullopt (a truncated or lying frame), so a malformed frame can never read outside the buffer.
class PayloadReader {
 public:
  explicit PayloadReader(std::span<const uint8_t> payload) : payload_(payload) {}

  std::optional<uint8_t> u8();
  std::optional<uint32_t> u32();
  std::optional<int64_t> i64();
  std::optional<std::string> str();

  // True when every byte was consumed (trailing bytes make a frame malformed).
  bool at_end() const { return offset_ == payload_.size(); }

 private:
  std::span<const uint8_t> payload_;
  size_t offset_ = 0;
};

// Returns a == b in time that depends only on the lengths, not on where the first difference is,
// so that the token check leaks nothing a timing attacker could use to guess it byte by byte.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace exactcoll::store_wire
