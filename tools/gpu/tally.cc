#include "tools/gpu/tally.h"

#include <algorithm>
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
  // The word columns are as wide as their longest entry (at least 15, 5, 12, 12), so that a long
  // algorithm name (push_one_stage_reg) does not push its row out of line.
  struct Row {
    std::string op, dtype, algo, variant;
    const Tally* tally;
  };
  std::vector<Row> rows;
  size_t op_width = 15, dtype_width = 5, algo_width = 12, variant_width = 12;
  for (const auto& [key, t] : total) {
    std::istringstream parts(key);
    Row row{"", "", "", "", &t};
    parts >> row.op >> row.dtype >> row.algo >> row.variant;
    op_width = std::max(op_width, row.op.size());
    dtype_width = std::max(dtype_width, row.dtype.size());
    algo_width = std::max(algo_width, row.algo.size());
    variant_width = std::max(variant_width, row.variant.size());
    rows.push_back(row);
  }
  std::ostringstream os;
  auto words = [&](const std::string& op, const std::string& dtype, const std::string& algo,
                   const std::string& variant) {
    os << std::left << std::setw(static_cast<int>(op_width)) << op << " " << std::setw(static_cast<int>(dtype_width))
       << dtype << " " << std::setw(static_cast<int>(algo_width)) << algo << " "
       << std::setw(static_cast<int>(variant_width)) << variant << std::right;
  };
  words("op", "dtype", "algorithm", "variant");
  os << " " << std::setw(8) << "runs"
     << " " << std::setw(14) << "elements"
     << " " << std::setw(12) << "diff_vs_sim"
     << " " << std::setw(12) << reference_column << "\n";
  for (const Row& row : rows) {
    words(row.op, row.dtype, row.algo, row.variant);
    const Tally& t = *row.tally;
    os << " " << std::setw(8) << t.runs << " " << std::setw(14) << t.compared << " " << std::setw(12)
       << t.sim_mismatches << " " << std::setw(12) << t.reference_mismatches << "\n";
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
