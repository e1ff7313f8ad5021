// bench-overlap's output (Bench, bench_overlap.h): a row per measured variant and a note per check
// as they come (printed by rank 0), then the summary table, the targets and, with --json, the JSON.
#include <cstdio>
#include <sstream>
#include <string>

#include "tools/cli.h"
#include "tools/overlap/bench_overlap.h"
#include "npy/npy.h"

namespace exactcoll::gpu::bench_overlap {

void Bench::add(const std::string& section, DType dtype, const std::string& variant, double us, double flops,
                double efficiency, const std::string& note) {
  Row r{section, dtype_name(dtype), variant, us, flops > 0 ? flops / (us * 1e6) : 0, efficiency, note};
  rows_.push_back(r);
  if (w_.leader()) {
    std::printf("  %-6s %-5s %-40s %10.1f us %8s TFLOP/s %6s %s\n", section.c_str(), r.dtype.c_str(), variant.c_str(),
                us, r.tflops > 0 ? fmt("%.1f", r.tflops).c_str() : "-",
                efficiency > 0 ? fmt("%.3f", efficiency).c_str() : "", note.c_str());
    std::fflush(stdout);
  }
}

void Bench::note(const std::string& text) {
  notes_.push_back(text);
  print_leader(w_, "  # " + text + "\n");
}

void Bench::report() {
  std::ostringstream t;
  t << "\n# summary (" << n_ << " ranks, " << w_.device_name() << "; max over ranks of the median of " << o_.iters
    << " iterations; eff = max(matmul alone, all-gather alone) / time)\n";
  t << "| section | dtype | variant | time (us) | TFLOP/s | eff | note |\n|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows_) {
    t << "| " << r.section << " | " << r.dtype << " | " << r.variant << " | " << fmt("%.1f", r.us) << " | "
      << (r.tflops > 0 ? fmt("%.1f", r.tflops) : "-") << " | " << (r.efficiency > 0 ? fmt("%.3f", r.efficiency) : "-")
      << " | " << r.note << " |\n";
  }
  for (const std::string& line : targets_) t << "# " << line << "\n";
  t << "# checks: " << (failed_check_ ? "SOME FAILED (see the notes above)" : "all passed") << "\n";
  print_leader(w_, t.str());
  if (w_.leader() && !o_.json_path.empty()) {
    std::ostringstream j;
    j << "{\"ranks\":" << n_ << ",\"device\":\"" << w_.device_name() << "\",\"cublaslt\":\"" << lt_version_
      << "\",\"rows\":[";
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      j << (i ? "," : "") << "{\"section\":\"" << r.section << "\",\"dtype\":\"" << r.dtype << "\",\"variant\":\""
        << r.variant << "\",\"us\":" << fmt("%.3f", r.us) << ",\"tflops\":" << fmt("%.2f", r.tflops)
        << ",\"efficiency\":" << fmt("%.4f", r.efficiency) << ",\"note\":\"" << r.note << "\"}";
    }
    j << "],\"notes\":[";
    for (size_t i = 0; i < notes_.size(); ++i) j << (i ? "," : "") << "\"" << notes_[i] << "\"";
    j << "],\"targets\":[";
    for (size_t i = 0; i < targets_.size(); ++i) j << (i ? "," : "") << "\"" << targets_[i] << "\"";
    j << "],\"checks_passed\":" << (failed_check_ ? "false" : "true") << "}\n";
    const std::string text = j.str();
    npy::write_file_atomic(cli::resolve_path(o_.json_path), text.data(), text.size());
  }
}

}  // namespace exactcoll::gpu::bench_overlap
