// How the GPU commands (`exactcoll gpu`, `gpu fused_rmsnorm`) bring every rank's output to rank 0:
// through part files beside the output (the store carries only small values). Collective: every
// rank constructs one, writes its part, and finishes.
//
// Steps: 1. the part directory is the output's (or /tmp without one) and rank 0's pid names the
// job (all_gather "part_token"); 2. write(): each rank writes its part atomically, then barrier
// "parts"; 3. rank 0 read()s every part; 4. finish(): barrier "assembled", then each rank removes
// its own part.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/gpu/worker.h"

namespace exactcoll::gpu {

class PartFiles {
 public:
  // `output_path` as the user gave it (resolved like the CLI resolves paths; "" for /tmp); `tag`
  // names the command in the part files' names: <dir>/.exactcoll_<tag>_<token>_rank<r>.part.
  PartFiles(Worker& worker, const std::string& output_path, const std::string& tag);

  // Writes this rank's part (atomically), then waits for every rank's.
  void write(const std::vector<uint8_t>& bytes);
  // Returns rank r's part when it holds exactly `size` bytes; nullopt when missing or of another size.
  std::optional<std::vector<uint8_t>> read(int rank, size_t size) const;
  // Waits until rank 0 has read every part, then removes this rank's.
  void finish();

 private:
  std::string path(int rank) const;
  Worker& worker_;
  std::string prefix_;
};

}  // namespace exactcoll::gpu
