#include "cuda_backend/tsv.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace exactcoll::cuda {

std::string TsvLine::error(const std::string& what) const {
  return name + ":" + std::to_string(number) + ": " + what + " in '" + text + "'";
}

void for_each_tsv_line(const std::string& text, const std::string& name,
                       const std::function<void(const TsvLine&)>& each) {
  std::istringstream in(text);
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty() || line[0] == '#') continue;
    TsvLine tsv{name, line_number, line, {}};
    std::istringstream fs(line);
    std::string field;
    while (std::getline(fs, field, '\t')) tsv.fields.push_back(field);
    each(tsv);
  }
}

namespace {
bool is_digit(char c) { return c >= '0' && c <= '9'; }
}  // namespace

std::optional<long> parse_long_field(const std::string& field) {
  // strtol would skip leading blanks and take "+5"; a field is digits with an optional '-'.
  const size_t first = !field.empty() && field[0] == '-' ? 1 : 0;
  if (field.size() <= first || !is_digit(field[first])) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(field.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return value;
}

std::optional<unsigned long long> parse_unsigned_field(const std::string& field) {
  // strtoull would take "-5" as 2^64 - 5 and wrap on overflow: digits only, in range.
  if (field.empty() || !is_digit(field[0])) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(field.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return value;
}

std::optional<double> parse_double_field(const std::string& field) {
  char* end = nullptr;
  const double value = std::strtod(field.c_str(), &end);
  if (field.empty() || *end != '\0') return std::nullopt;
  return value;
}

std::string format_time_us(double time_us) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", time_us);
  return text;
}

}  // namespace exactcoll::cuda
