// The table `exactcoll tune` writes (tools/gpu/tune_command.cc), made from the file it replaces and
// the run's rows. Plain C++ (no CUDA), tested on CPU.
//
// Kept from the existing file: its rows of other (arch, world size, op) and of sizes outside the
// run's --min-bytes .. --max-bytes, each with its own measured_on, and its header comment lines
// but those the run writes anew (the first line, 'last tuned', 'time_us' and the column line).
// The run's rows replace the rest. Example: tuning allreduce up to 1 MiB on 2 GPUs keeps the
// 2 MiB .. 64 MiB rows of 2 GPUs and every row of 4 GPUs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_backend/dispatch_table.h"

namespace exactcoll::gpu {

// What one tune run measured, and on what.
struct TuneRun {
  std::string arch;  // "sm90"
  int world_size = 0;
  std::vector<cuda::Op> ops;
  uint64_t min_bytes = 0, max_bytes = 0;  // the measured sizes lie in min_bytes .. max_bytes
  std::string measured_on;                // "nvidia-h100-x4 2026-11-27"
  std::string device_name;                // "NVIDIA H100 80GB HBM3"
  int64_t graph_ops = 10;                 // ops per CUDA graph (the time_us line)
};

struct TunedTable {
  std::string text;  // the file to write
  size_t rows = 0;   // its rows
};

// Is `comment` (a comment line without its "# ") one that tuned_table writes anew?
bool is_tune_own_comment(const std::string& comment);

// The table text: `existing` (a table file's text, "" without one; `name` names it in parse
// errors, which throw cuda::TableError) merged with `rows` as above; the run's header lines first,
// then the kept comment lines in their order.
TunedTable tuned_table(const std::string& existing, const std::string& name, const TuneRun& run,
                       const std::vector<cuda::TableRow>& rows);

}  // namespace exactcoll::gpu
