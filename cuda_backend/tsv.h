// The tab-separated tables of the CUDA backend (auto's dispatch table, the fused op's table): the
// line loop with its comments, the tab split, the field count check with an error naming
// file:line, whole-field number parsing, and the stable sort of rows by a key. Plain C++.
//
// Example:
//   for_each_tsv_row<TableError>(text, "sm90.tsv", 8, [&](const TsvLine& line) {
//     const auto ws = parse_long_field(line.fields[1]);
//     if (!ws || *ws < 1) throw TableError(line.error("world_size must be positive"));
//   });
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace exactcoll::cuda {

// One data line of a table: its 1-based number, its text and its tab-separated fields.
struct TsvLine {
  const std::string& name;  // the table's name in errors: a path, or what it was embedded from
  int number = 0;
  const std::string& text;
  std::vector<std::string> fields;

  // Returns "name:number: what in 'text'".
  std::string error(const std::string& what) const;
};

// Calls `each` on every line of `text` in order, except empty ones and comments ('#' first).
void for_each_tsv_line(const std::string& text, const std::string& name,
                       const std::function<void(const TsvLine&)>& each);

// The same, and first throws Error(line.error("expected N tab-separated fields, got M")) on a line
// whose field count is not `field_count`.
template <typename Error>
void for_each_tsv_row(const std::string& text, const std::string& name, size_t field_count,
                      const std::function<void(const TsvLine&)>& each) {
  for_each_tsv_line(text, name, [&](const TsvLine& line) {
    if (line.fields.size() != field_count) {
      throw Error(line.error("expected " + std::to_string(field_count) + " tab-separated fields, got " +
                             std::to_string(line.fields.size())));
    }
    each(line);
  });
}

// Return the field's value when strtol / strtoull / strtod (base 10) reads all of a non-empty
// field; nullopt otherwise. Integer fields are digits only (a leading '-' for parse_long_field)
// and in range: no blanks, no '+', no "-5" read as 2^64 - 5, no overflow.
std::optional<long> parse_long_field(const std::string& field);
std::optional<unsigned long long> parse_unsigned_field(const std::string& field);
std::optional<double> parse_double_field(const std::string& field);

// Returns a time in µs as the tables write it ("%.2f").
std::string format_time_us(double time_us);

// Sorts rows by key(row) (a std::tuple, compared lexicographically); rows with equal keys keep
// their order.
template <typename Row, typename Key>
void sort_rows_by(std::vector<Row>& rows, Key key) {
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) { return key(a) < key(b); });
}

}  // namespace exactcoll::cuda
