// The counts of a verify run (`exactcoll verify`, `verify --ops fused_rmsnorm`): per case label
// "op dtype algorithm variant", how many runs, how many elements were compared, and how many of
// them differ from the simulator and from the reference (the scalar transcription of the
// contract). Each rank counts its own; they travel as text through the store and rank 0 prints
// the sum as a table.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace exactcoll::gpu {

struct Tally {
  uint64_t runs = 0, compared = 0, sim_mismatches = 0, reference_mismatches = 0;

  void add(const Tally& other);
  // True when something was compared and nothing differed.
  bool clean() const { return compared > 0 && sim_mismatches == 0 && reference_mismatches == 0; }
};

// Key: "op dtype algorithm variant" (four words, no tabs).
using Tallies = std::map<std::string, Tally>;

// Returns one line per key: "key\truns\tcompared\tsim_mismatches\treference_mismatches\n".
std::string serialize_tallies(const Tallies& tallies);

// Returns the sum, key by key, of every rank's serialize_tallies() text.
Tallies sum_tallies(const std::vector<std::string>& per_rank_texts);

// Returns the table rank 0 prints: a header (the last column headed `reference_column`, e.g.
// "diff_vs_ref") and one row per key, in key order. Adds every row into *grand.
std::string format_tally_table(const Tallies& total, const char* reference_column, Tally* grand);

// Returns verify's last line: "<title>: R runs, C elements compared (<compared_what>), S differ
// from the simulator, F from the <reference_name> (T s)\n".
// Example: verify_summary_line("verify 4 ranks", grand, "all ranks", "contract", 5.4).
std::string verify_summary_line(const std::string& title, const Tally& grand, const std::string& compared_what,
                                const std::string& reference_name, double seconds);

}  // namespace exactcoll::gpu
