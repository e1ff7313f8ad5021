// The collectives' --input file, read the same way by `sim <op>`, `sim <op> --nodes` and `gpu <op>`:
// an .npy array [N, ...] whose first dimension is the ranks (rank r's input at [r]), holding the
// dtype's storage ('<u2' bit patterns for bf16/fp16, '<f4' for fp32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/storage.h"

namespace exactcoll::gpu {

struct RankInputs {
  std::vector<uint8_t> data;   // every rank's input, rank-major, storage bits
  std::vector<int64_t> shape;  // the file's shape, [N, ...]
  size_t count = 0;            // elements per rank
  std::string note;            // "<path> [N, ...]" for banners
};

// Reads `path` (resolved against the caller's directory, cli::resolve_path) into *out. Returns ""
// or what is wrong, naming the file: unreadable or malformed, another dtype than `dtype`, a scalar,
// a first dimension other than `ranks` (`ranks_flag` names the flag that set it, e.g. "--ranks"),
// or no elements.
// Example: read_rank_inputs("x.npy", DType::kBF16, 4, "--ranks", &in) with x.npy [4, 1000] '<u2'
//   -> "", in.count == 1000, in.note == "x.npy [4, 1000]".
std::string read_rank_inputs(const std::string& path, DType dtype, int ranks, const std::string& ranks_flag,
                             RankInputs* out);

}  // namespace exactcoll::gpu
