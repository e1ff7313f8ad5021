// The `exactcoll sim` commands as clients of the C API's simulator entry points
// (exactcoll_sim_collective, exactcoll_sim_fused_add_rmsnorm): the world's flags as
// exactcoll_sim_options, the progress callback behind the command's progress bar, and the
// library's error message in the command's words.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "exactcoll/exactcoll.h"
#include "sim/world.h"
#include "tools/sim/sim_flags.h"

namespace exactcoll::tools {

// What the options' progress callback last reported (set from the library's thread), for a
// ProgressBar (tools/progress/progress.h): progress.now().
struct ApiProgress {
  std::atomic<uint64_t> done{0}, total{0};
  std::pair<uint64_t, uint64_t> now() const { return {done.load(), total.load()}; }
};

// The exactcoll_sim_options of the world's flags (flags, checked into world by world_options):
// schedule, timeout, step bound, fault injection, traced elements and the trace files, which point
// into trace_paths (trace_paths(flags), resolved) and the progress callback into *progress: both
// must outlive the call. The caller adds its op's fields (blocks, contract, threads).
exactcoll_sim_options api_sim_options(const SimFlags& flags, const sim::WorldOptions& world,
                                      const std::vector<std::string>& trace_paths, ApiProgress* progress);

// exactcoll_last_error() without its "<function>: " prefix: the command names itself instead.
std::string api_error(const std::string& function);

}  // namespace exactcoll::tools
