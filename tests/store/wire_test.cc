// The store's frame codec: field round trips, little-endian layout, bounds checks on every read,
// and the constant-time token comparison.
#include <gtest/gtest.h>

#include "store/wire.h"

namespace exactcoll::store_wire {
namespace {

TEST(WireTest, FieldsRoundTripInLittleEndian) {
  const std::vector<uint8_t> frame = PayloadWriter().u8(0xAB).u32(0x01020304u).i64(-2).str("key").frame();
  // prefix (4) + u8 (1) + u32 (4) + i64 (8) + str (4 + 3) = 24 bytes, payload 20.
  ASSERT_EQ(frame.size(), 24u);
  EXPECT_EQ(std::vector<uint8_t>(frame.begin(), frame.begin() + 4), (std::vector<uint8_t>{20, 0, 0, 0}));
  EXPECT_EQ(std::vector<uint8_t>(frame.begin() + 5, frame.begin() + 9), (std::vector<uint8_t>{4, 3, 2, 1}));
  PayloadReader reader(std::span<const uint8_t>(frame).subspan(4));
  EXPECT_EQ(reader.u8(), 0xAB);
  EXPECT_EQ(reader.u32(), 0x01020304u);
  EXPECT_EQ(reader.i64(), -2);
  EXPECT_EQ(reader.str(), "key");
  EXPECT_TRUE(reader.at_end());
  EXPECT_EQ(reader.u8(), std::nullopt);  // nothing left
}

TEST(WireTest, LengthPrefixCodec) {
  for (const uint32_t n : {0u, 1u, 255u, 256u, 0x00FFFFFFu, 0xFFFFFFFFu}) {
    EXPECT_EQ(decode_length(encode_length(n)), n);
  }
  EXPECT_EQ(decode_length({0x78, 0x56, 0x34, 0x12}), 0x12345678u);
}

TEST(WireTest, ReadsPastTheEndFailWithoutConsuming) {
  const std::vector<uint8_t> three = {1, 2, 3};
  PayloadReader reader(three);
  EXPECT_EQ(reader.u32(), std::nullopt);
  EXPECT_EQ(reader.i64(), std::nullopt);
  EXPECT_EQ(reader.u8(), 1);
  EXPECT_FALSE(reader.at_end());

  // A string whose length claims more bytes than remain, including lengths that would wrap.
  for (const uint32_t claimed : {4u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
    std::vector<uint8_t> payload = PayloadWriter().u32(claimed).frame();
    payload.erase(payload.begin(), payload.begin() + 4);  // drop the frame prefix
    payload.insert(payload.end(), {'a', 'b', 'c'});
    PayloadReader lying(payload);
    EXPECT_EQ(lying.str(), std::nullopt) << claimed;
  }
}

TEST(WireTest, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("token-0123456789", "token-0123456789"));
  EXPECT_FALSE(constant_time_equal("token-0123456789", "token-0123456788"));  // last byte
  EXPECT_FALSE(constant_time_equal("token-0123456789", "Token-0123456789"));  // first byte
  EXPECT_FALSE(constant_time_equal("token", "token-0123456789"));             // a prefix
  EXPECT_FALSE(constant_time_equal("token-0123456789", "token"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_FALSE(constant_time_equal(std::string_view("a\0", 2), "a"));  // trailing NUL counts
}

}  // namespace
}  // namespace exactcoll::store_wire
