// core/fnv1a.h against the published FNV-1a 64-bit test vectors, and fnv1a_u64 as the bytes of
// its value, least significant first.
#include "core/fnv1a.h"

#include <gtest/gtest.h>

#include <cstring>

namespace exactcoll {
namespace {

TEST(Fnv1a, PublishedVectors) {
  EXPECT_EQ(fnv1a_bytes(kFnv1aOffset, "", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a_bytes(kFnv1aOffset, "a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a_bytes(kFnv1aOffset, "foobar", 6), 0x85944171f73967e8ull);
}

TEST(Fnv1a, U64IsItsLittleEndianBytes) {
  const unsigned char bytes[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
  EXPECT_EQ(fnv1a_u64(kFnv1aOffset, 0x0102030405060708ull), fnv1a_bytes(kFnv1aOffset, bytes, 8));
  EXPECT_NE(fnv1a_u64(kFnv1aOffset, 1), fnv1a_u64(kFnv1aOffset, 1ull << 8));  // byte order matters
}

}  // namespace
}  // namespace exactcoll
