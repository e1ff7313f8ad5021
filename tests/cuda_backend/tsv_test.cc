// cuda_backend/tsv.h: comments and empty lines skipped, line numbers counted over all lines, the
// field-count error's text, and whole-field number parsing.
#include "cuda_backend/tsv.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <tuple>

namespace exactcoll::cuda {
namespace {

TEST(Tsv, SkipsCommentsAndEmptyLinesAndNumbersEveryLine) {
  std::vector<std::pair<int, std::vector<std::string>>> seen;
  for_each_tsv_line("# header\n\na\tb\n#x\tc\nd\t\te\n", "t.tsv", [&](const TsvLine& line) {
    seen.push_back({line.number, line.fields});
  });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, 3);
  EXPECT_EQ(seen[0].second, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(seen[1].first, 5);
  EXPECT_EQ(seen[1].second, (std::vector<std::string>{"d", "", "e"}));
}

TEST(Tsv, FieldCountErrorNamesFileLineAndText) {
  try {
    for_each_tsv_row<std::runtime_error>("a\tb\tc\n# c\na\tb\n", "dir/t.tsv", 3, [](const TsvLine&) {});
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "dir/t.tsv:3: expected 3 tab-separated fields, got 2 in 'a\tb'");
  }
}

TEST(Tsv, NumbersMustFillTheWholeNonEmptyField) {
  EXPECT_EQ(parse_long_field("42"), 42L);
  EXPECT_EQ(parse_long_field("-3"), -3L);
  EXPECT_FALSE(parse_long_field(""));
  EXPECT_FALSE(parse_long_field("4x"));
  EXPECT_EQ(parse_unsigned_field("18446744073709551615"), 18446744073709551615ull);
  EXPECT_FALSE(parse_unsigned_field("1.5"));
  // strtoull alone would read these as 2^64 - 5, 5, 5 and wrap the last to 2^64 - 1.
  EXPECT_FALSE(parse_unsigned_field("-5"));
  EXPECT_FALSE(parse_unsigned_field(" 5"));
  EXPECT_FALSE(parse_unsigned_field("+5"));
  EXPECT_FALSE(parse_unsigned_field("18446744073709551616"));
  EXPECT_EQ(parse_long_field("-5"), -5);
  EXPECT_FALSE(parse_long_field("-"));
  EXPECT_FALSE(parse_long_field(" 5"));
  EXPECT_FALSE(parse_long_field("99999999999999999999"));
  EXPECT_EQ(parse_double_field("2.25"), 2.25);
  EXPECT_FALSE(parse_double_field(""));
  EXPECT_FALSE(parse_double_field("1us"));
  EXPECT_EQ(format_time_us(3.14159), "3.14");
}

TEST(Tsv, SortIsStableByKey) {
  std::vector<std::pair<int, char>> rows = {{2, 'a'}, {1, 'b'}, {2, 'c'}, {1, 'd'}};
  sort_rows_by(rows, [](const std::pair<int, char>& r) { return std::make_tuple(r.first); });
  EXPECT_EQ(rows, (std::vector<std::pair<int, char>>{{1, 'b'}, {1, 'd'}, {2, 'a'}, {2, 'c'}}));
}

}  // namespace
}  // namespace exactcoll::cuda
