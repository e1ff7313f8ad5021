// cuda_backend/tsv.h: comments and empty lines skipped, line numbers counted over all lines, the
// field-count error's text, the optional measured_on field (read, written, made), and whole-field
// number parsing.
#include "cuda_backend/tsv.h"

#include <gtest/gtest.h>

#include <ctime>
#include <sstream>
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
    for_each_measured_row<std::runtime_error>("a\tb\tc\n# c\na\n", "dir/t.tsv", 3,
                                              [](const TsvLine&, const std::string&) {});
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "dir/t.tsv:3: expected 2 or 3 tab-separated fields, got 1 in 'a'");
  }
}

// The last field, measured_on, is optional: "" without it; one field more (a tab inside it) is an
// error naming the line.
TEST(Tsv, MeasuredOnIsTheOptionalLastField) {
  std::vector<std::pair<int, std::string>> seen;
  for_each_measured_row<std::runtime_error>("# h\na\tb\na\tb\tnvidia-h100-x4 2026-11-27\na\tb\t\n", "t.tsv", 3,
                                            [&](const TsvLine& line, const std::string& measured_on) {
                                              seen.push_back({line.number, measured_on});
                                            });
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], (std::pair<int, std::string>{2, ""}));
  EXPECT_EQ(seen[1], (std::pair<int, std::string>{3, "nvidia-h100-x4 2026-11-27"}));
  EXPECT_EQ(seen[2], (std::pair<int, std::string>{4, ""}));  // a trailing tab: no field
  try {
    for_each_measured_row<std::runtime_error>("a\tb\n\na\tb\tnvidia-h100-x4\t2026-11-27\n", "t.tsv", 3,
                                              [](const TsvLine&, const std::string&) {});
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "t.tsv:3: expected 2 or 3 tab-separated fields, got 4 in 'a\tb\tnvidia-h100-x4\t2026-11-27'");
  }
}

TEST(Tsv, WritesHeaderAndRowEnds) {
  std::ostringstream os;
  write_tsv_header(os, {"one", "two"}, {"a", "b", kMeasuredOnColumn});
  os << "1\t2";
  end_measured_row(os, "nvidia-h100-x4 2026-11-27");
  os << "3\t4";
  end_measured_row(os, "");
  EXPECT_EQ(os.str(), "# one\n# two\n# a\tb\tmeasured_on\n1\t2\tnvidia-h100-x4 2026-11-27\n3\t4\n");
  EXPECT_THROW(end_measured_row(os, "a\tb"), std::invalid_argument);
  EXPECT_THROW(end_measured_row(os, "a\nb"), std::invalid_argument);
  EXPECT_TRUE(is_measured_on_text("nvidia-h200-x4 2026-11-21"));
  EXPECT_FALSE(is_measured_on_text("x\r"));
}

TEST(Tsv, CommentsWithoutTheirMark) {
  EXPECT_EQ(tsv_comments("# one\na\tb\n#two\n#\n# arch\tb\n"), (std::vector<std::string>{"one", "two", "", "arch\tb"}));
}

TEST(Tsv, MeasuredOnTextIsTheMachineAndTheUtcDate) {
  const std::time_t when = 1795773600;  // 2026-11-27 10:00 UTC
  EXPECT_EQ(utc_date(when), "2026-11-27");
  EXPECT_EQ(measured_on_text("nvidia-h100-x4", "NVIDIA H100 80GB HBM3", 2, when), "nvidia-h100-x4 2026-11-27");
  EXPECT_EQ(measured_on_text("", "NVIDIA H100 80GB HBM3", 4, when), "NVIDIA-H100-80GB-HBM3-x4 2026-11-27");
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
