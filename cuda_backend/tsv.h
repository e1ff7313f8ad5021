// The tab-separated tables of the CUDA backend (auto's dispatch table, the fused op's table): the
// line loop with its comments, the tab split, the field count check with an error naming
// file:line, whole-field number parsing, the stable sort of rows by a key, and the optional last
// column measured_on that both tables share (writing it, and what a run writes in it). Plain C++.
//
// Example (8 columns and measured_on):
//   for_each_measured_row<TableError>(text, "sm90.tsv", 9, [&](const TsvLine& line, const std::string& on) {
//     const auto ws = parse_long_field(line.fields[1]);
//     if (!ws || *ws < 1) throw TableError(line.error("world_size must be positive"));
//   });
#pragma once

#include <algorithm>
#include <ctime>
#include <functional>
#include <ostream>
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

// The comment lines of `text` in order, each without its '#' and the one blank after it:
// "# last tuned …" gives "last tuned …".
std::vector<std::string> tsv_comments(const std::string& text);

// ---- measured_on: the optional last column of both tables ----
// Free text without tabs naming where and when a row was measured: the machine (the lent machine's
// name, e.g. nvidia-h100-x4) and the UTC date, "nvidia-h100-x4 2026-11-27". Rows of older tables
// (and users' files) have no such field: it reads as "".
inline constexpr const char* kMeasuredOnColumn = "measured_on";

// Calls `each` on every data line of a table of `field_count` fields whose last is measured_on:
// lines of field_count - 1 or field_count fields; any other count throws
// Error(line.error("expected N-1 or N tab-separated fields, got M")) (a tab inside measured_on makes
// one field more). Hands each line's measured_on ("" without it) to `each` beside the line.
template <typename Error>
void for_each_measured_row(const std::string& text, const std::string& name, size_t field_count,
                           const std::function<void(const TsvLine&, const std::string& measured_on)>& each) {
  for_each_tsv_line(text, name, [&](const TsvLine& line) {
    const size_t got = line.fields.size();
    if (got + 1 != field_count && got != field_count) {
      throw Error(line.error("expected " + std::to_string(field_count - 1) + " or " + std::to_string(field_count) +
                             " tab-separated fields, got " + std::to_string(got)));
    }
    static const std::string kNone;
    each(line, got == field_count ? line.fields.back() : kNone);
  });
}

// Is `text` a whole measured_on field (no tab, no line break)?
bool is_measured_on_text(const std::string& text);

// Writes a table's header: "# " + each comment line, then "# " + the columns joined by tabs.
void write_tsv_header(std::ostream& os, const std::vector<std::string>& comments,
                      const std::vector<std::string>& columns);

// Ends a row: a tab and measured_on unless it is empty (then the row has one field less), and a
// line break. Throws std::invalid_argument when measured_on holds a tab or a line break.
void end_measured_row(std::ostream& os, const std::string& measured_on);

// The UTC date of `when` as YYYY-MM-DD.
std::string utc_date(std::time_t when);

// What a run writes in measured_on: `machine` (the lent machine's name) or, when it is empty, the
// GPU's name with every space as '-' and "-x" + world size ("NVIDIA-H100-80GB-HBM3-x4"); then a
// space and the UTC date of `when`. Example: measured_on_text("nvidia-h100-x4", "NVIDIA H100 80GB
// HBM3", 4, now) == "nvidia-h100-x4 2026-11-27".
std::string measured_on_text(const std::string& machine, const std::string& device_name, int world_size,
                             std::time_t when);

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
