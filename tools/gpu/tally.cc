#include "tools/gpu/tally.h"

#include <cstdio>
#include <iomanip>
#include <sstream>

namespace exactcoll::gpu {

void Tally::add(const Tally& other) {
  runs += other.runs;
  compared += other.compared;
  sim_mismatches += other.sim_mismatches;
  reference_mismatches += other.reference_mismatches;
}

std::string serialize_tallies(const Tallies& tallies) {
  std::ostringstream os;
  for (const auto& [key, t] : tallies) {
    os << key << '\t' << t.runs << '\t' << t.compared << '\t' << t.sim_mismatches << '\t' << t.reference_mismatches
       << '\n';
  }
  return os.str();
}

Tallies sum_tallies(const std::vector<std::string>& per_rank_texts) {
  Tallies total;
  for (const std::string& text : per_rank_texts) {
    std::istringstream is(text);
    std::string line;
    while (std::getline(is, line)) {
      const size_t tab = line.find('\t');
      std::istringstream fields(line.substr(tab + 1));
      Tally t;
      fields >> t.runs >> t.compared >> t.sim_mismatches >> t.reference_mismatches;
      total[line.substr(0, tab)].add(t);
    }
  }
  return total;
}

std::string format_tally_table(const Tallies& total, const char* reference_column, Tally* grand) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-15s %-5s %-12s %-12s %8s %14s %12s %12s\n", "op", "dtype", "algorithm", "variant",
                "runs", "elements", "diff_vs_sim", reference_column);
  os << line;
  for (const auto& [key, t] : total) {
    std::istringstream parts(key);
    std::string op, dtype, algo, variant;
    parts >> op >> dtype >> algo >> variant;
    std::snprintf(line, sizeof line, "%-15s %-5s %-12s %-12s %8llu %14llu %12llu %12llu\n", op.c_str(), dtype.c_str(),
                  algo.c_str(), variant.c_str(), static_cast<unsigned long long>(t.runs),
                  static_cast<unsigned long long>(t.compared), static_cast<unsigned long long>(t.sim_mismatches),
                  static_cast<unsigned long long>(t.reference_mismatches));
    os << line;
    grand->add(t);
  }
  return os.str();
}

std::string verify_summary_line(const std::string& title, const Tally& grand, const std::string& compared_what,
                                const std::string& reference_name, double seconds) {
  std::ostringstream os;
  os << title << ": " << grand.runs << " runs, " << grand.compared << " elements compared (" << compared_what << "), "
     << grand.sim_mismatches << " differ from the simulator, " << grand.reference_mismatches << " from the "
     << reference_name << " (" << std::fixed << std::setprecision(1) << seconds << " s)\n";
  return os.str();
}

}  // namespace exactcoll::gpu
