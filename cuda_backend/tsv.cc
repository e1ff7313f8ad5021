#include "cuda_backend/tsv.h"

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

std::optional<long> parse_long_field(const std::string& field) {
  char* end = nullptr;
  const long value = std::strtol(field.c_str(), &end, 10);
  if (field.empty() || *end != '\0') return std::nullopt;
  return value;
}

std::optional<unsigned long long> parse_unsigned_field(const std::string& field) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(field.c_str(), &end, 10);
  if (field.empty() || *end != '\0') return std::nullopt;
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
