#include "store/wire.h"

#include <cstring>

namespace exactcoll::store_wire {

std::array<uint8_t, kLengthPrefixBytes> encode_length(uint32_t payload_bytes) {
  return {static_cast<uint8_t>(payload_bytes), static_cast<uint8_t>(payload_bytes >> 8),
          static_cast<uint8_t>(payload_bytes >> 16), static_cast<uint8_t>(payload_bytes >> 24)};
}

uint32_t decode_length(const std::array<uint8_t, kLengthPrefixBytes>& prefix) {
  return static_cast<uint32_t>(prefix[0]) | (static_cast<uint32_t>(prefix[1]) << 8) |
         (static_cast<uint32_t>(prefix[2]) << 16) | (static_cast<uint32_t>(prefix[3]) << 24);
}

PayloadWriter& PayloadWriter::u8(uint8_t value) {
  payload_.push_back(value);
  return *this;
}

PayloadWriter& PayloadWriter::u32(uint32_t value) {
  for (int i = 0; i < 4; ++i) payload_.push_back(static_cast<uint8_t>(value >> (8 * i)));
  return *this;
}

PayloadWriter& PayloadWriter::i64(int64_t value) {
  const uint64_t bits = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) payload_.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  return *this;
}

PayloadWriter& PayloadWriter::str(std::string_view text) {
  u32(static_cast<uint32_t>(text.size()));
  // resize + memcpy rather than insert(): GCC 12 at -O3 reports a false stringop-overflow there.
  const size_t at = payload_.size();
  payload_.resize(at + text.size());
  if (!text.empty()) std::memcpy(payload_.data() + at, text.data(), text.size());
  return *this;
}

std::vector<uint8_t> PayloadWriter::frame() const {
  std::vector<uint8_t> out(kLengthPrefixBytes + payload_.size());
  const auto prefix = encode_length(static_cast<uint32_t>(payload_.size()));
  std::memcpy(out.data(), prefix.data(), kLengthPrefixBytes);
  if (!payload_.empty()) std::memcpy(out.data() + kLengthPrefixBytes, payload_.data(), payload_.size());
  return out;
}

std::optional<uint8_t> PayloadReader::u8() {
  if (payload_.size() - offset_ < 1) return std::nullopt;
  return payload_[offset_++];
}

std::optional<uint32_t> PayloadReader::u32() {
  if (payload_.size() - offset_ < 4) return std::nullopt;
  std::array<uint8_t, 4> bytes;
  std::memcpy(bytes.data(), payload_.data() + offset_, 4);
  offset_ += 4;
  return decode_length(bytes);
}

std::optional<int64_t> PayloadReader::i64() {
  if (payload_.size() - offset_ < 8) return std::nullopt;
  uint64_t bits = 0;
  for (int i = 0; i < 8; ++i) bits |= static_cast<uint64_t>(payload_[offset_ + i]) << (8 * i);
  offset_ += 8;
  return static_cast<int64_t>(bits);
}

std::optional<std::string> PayloadReader::str() {
  const auto length = u32();
  if (!length) return std::nullopt;
  // Compare against what is left, never add to offset_ first: a huge length must not wrap.
  if (payload_.size() - offset_ < *length) return std::nullopt;
  std::string text(reinterpret_cast<const char*>(payload_.data() + offset_), *length);
  offset_ += *length;
  return text;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Visit max(|a|, |b|) positions whatever the contents; fold every difference into one word and
  // decide only at the end. volatile keeps the compiler from turning this into an early exit.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile uint8_t difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0;
    const uint8_t y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0;
    difference = difference | static_cast<uint8_t>(x ^ y);
  }
  return difference == 0;
}

}  // namespace exactcoll::store_wire
