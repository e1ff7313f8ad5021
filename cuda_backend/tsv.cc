#include "cuda_backend/tsv.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

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

std::vector<std::string> tsv_comments(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '#') continue;
    out.push_back(line.substr(line.size() > 1 && line[1] == ' ' ? 2 : 1));
  }
  return out;
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

bool is_measured_on_text(const std::string& text) { return text.find_first_of("\t\r\n") == std::string::npos; }

void write_tsv_header(std::ostream& os, const std::vector<std::string>& comments,
                      const std::vector<std::string>& columns) {
  for (const auto& c : comments) os << "# " << c << "\n";
  os << "#";
  for (size_t i = 0; i < columns.size(); ++i) os << (i == 0 ? " " : "\t") << columns[i];
  os << "\n";
}

void end_measured_row(std::ostream& os, const std::string& measured_on) {
  if (!is_measured_on_text(measured_on)) {
    throw std::invalid_argument("measured_on '" + measured_on + "' holds a tab or a line break");
  }
  if (!measured_on.empty()) os << '\t' << measured_on;
  os << '\n';
}

std::string utc_date(std::time_t when) {
  std::tm parts{};
  gmtime_r(&when, &parts);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", &parts);
  return date;
}

std::string measured_on_text(const std::string& machine, const std::string& device_name, int world_size,
                             std::time_t when) {
  std::string name = machine;
  if (name.empty()) {
    name = device_name;
    std::replace(name.begin(), name.end(), ' ', '-');
    name += "-x" + std::to_string(world_size);
  }
  return name + " " + utc_date(when);
}

std::string format_time_us(double time_us) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", time_us);
  return text;
}

}  // namespace exactcoll::cuda
