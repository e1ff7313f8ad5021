#include "tools/gpu/tune_table.h"

#include <algorithm>

#include "core/signal.h"
#include "cuda_backend/tsv.h"

namespace exactcoll::gpu {

bool is_tune_own_comment(const std::string& comment) {
  for (const char* own : {"exactcoll dispatch table (", "last tuned ", "time_us = ", "arch\t"}) {
    if (comment.rfind(own, 0) == 0) return true;
  }
  return false;
}

TunedTable tuned_table(const std::string& existing, const std::string& name, const TuneRun& run,
                       const std::vector<cuda::TableRow>& rows) {
  std::vector<cuda::TableRow> merged;
  std::vector<std::string> kept_comments;
  if (!existing.empty()) {
    const cuda::DispatchTable old = cuda::DispatchTable::parse(existing, name);
    for (const auto& r : old.rows()) {
      const bool replaced = r.arch == run.arch && r.world_size == run.world_size &&
                            std::find(run.ops.begin(), run.ops.end(), r.op) != run.ops.end() &&
                            r.bytes >= run.min_bytes && r.bytes <= run.max_bytes;
      if (!replaced) merged.push_back(r);
    }
    for (const auto& c : cuda::tsv_comments(existing)) {
      if (!is_tune_own_comment(c)) kept_comments.push_back(c);
    }
  }
  merged.insert(merged.end(), rows.begin(), rows.end());
  std::string sizes, ops;
  for (int ws = 1; ws <= kMaxRanks; ++ws) {
    if (std::any_of(merged.begin(), merged.end(), [ws](const cuda::TableRow& r) { return r.world_size == ws; })) {
      if (!sizes.empty()) sizes += ", ";
      sizes += std::to_string(ws);
    }
  }
  for (cuda::Op op : run.ops) {
    if (!ops.empty()) ops += ",";
    ops += op_name(op);
  }
  std::vector<std::string> comments = {
      "exactcoll dispatch table (cuda_backend/dispatch_table.h): written by `exactcoll tune`.",
      "last tuned on " + run.measured_on + " (" + std::to_string(run.world_size) + " x " + run.device_name +
          "): " + ops + " " + std::to_string(run.min_bytes) + " .. " + std::to_string(run.max_bytes) +
          " bytes; world sizes in this file: " + sizes + ".",
      "time_us = max over ranks of the median per-op time, CUDA graph of " + std::to_string(run.graph_ops) +
          " ops, bf16, registered inputs."};
  comments.insert(comments.end(), kept_comments.begin(), kept_comments.end());
  TunedTable out;
  out.rows = merged.size();
  out.text = cuda::DispatchTable(std::move(merged)).to_text(comments);
  return out;
}

}  // namespace exactcoll::gpu
