// The ops of the GPU commands (tools/gpu/gpu_op.h): the one list a new op joins.
#include "tools/gpu/gpu_op.h"

namespace exactcoll::gpu {

std::vector<std::unique_ptr<GpuOp>> gpu_ops() {
  std::vector<std::unique_ptr<GpuOp>> ops = make_collective_ops();
  ops.push_back(make_fused_rmsnorm_op());
  return ops;
}

std::string gpu_op_names() {
  std::string names;
  for (const auto& op : gpu_ops()) names += (names.empty() ? "" : ", ") + op->name();
  return names;
}

}  // namespace exactcoll::gpu
