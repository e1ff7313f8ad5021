#include "tools/inputs/rank_inputs.h"

#include <utility>

#include "npy/npy.h"
#include "tools/cli.h"

namespace exactcoll::gpu {

std::string read_rank_inputs(const std::string& path, DType dtype, int ranks, const std::string& ranks_flag,
                             RankInputs* out) {
  npy::NpyArray a;
  try {
    a = npy::read_npy(cli::resolve_path(path));
  } catch (const npy::NpyError& e) {
    return e.what();
  }
  const std::string want = dtype == DType::kFP32 ? npy::kF32 : npy::kU16;
  if (a.dtype != want) {
    return path + " holds '" + a.dtype + "' but --dtype " + dtype_name(dtype) + " needs '" + want +
           "' (bf16 and fp16 as uint16 bit patterns, fp32 as float32)";
  }
  if (a.shape.empty()) return path + " is a scalar; it must be [N, ...] (rank first)";
  if (a.shape[0] != ranks) {
    return path + " has " + std::to_string(a.shape[0]) + " rows in its first dimension " + npy::shape_text(a.shape) +
           " but " + ranks_flag + " is " + std::to_string(ranks);
  }
  const size_t total = a.element_count();
  if (total == 0) return path + " has no elements " + npy::shape_text(a.shape);
  out->count = total / static_cast<size_t>(ranks);
  out->note = path + " " + npy::shape_text(a.shape);
  out->shape = std::move(a.shape);
  out->data = std::move(a.data);
  return "";
}

}  // namespace exactcoll::gpu
