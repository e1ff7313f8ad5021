#include "tools/sim/api_options.h"

namespace exactcoll::tools {

exactcoll_sim_options api_sim_options(const SimFlags& f, const sim::WorldOptions& w,
                                      const std::vector<std::string>& trace_paths, ApiProgress* progress) {
  exactcoll_sim_options o;
  exactcoll_sim_options_init(&o);
  o.seeded_schedule = w.schedule == sim::Schedule::kSeeded ? 1 : 0;
  o.schedule_seed = w.schedule_seed;
  o.timeout_ms = w.wait_timeout.count();
  o.trace_path = f.trace.empty() ? nullptr : trace_paths.front().c_str();
  o.chrome_trace_path = f.chrome_trace.empty() ? nullptr : trace_paths.back().c_str();
  o.trace_elements = w.trace_elements.data();
  o.num_trace_elements = w.trace_elements.size();
  o.max_steps = w.max_steps;
  o.fail_rank = w.fail_rank;
  o.fail_at_step = w.fail_at_step;
  o.progress = [](void* user_data, uint64_t done, uint64_t total) {
    auto* p = static_cast<ApiProgress*>(user_data);
    p->total.store(total);
    p->done.store(done);
  };
  o.progress_user_data = progress;
  return o;
}

std::string api_error(const std::string& function) {
  std::string why = exactcoll_last_error();
  const std::string prefix = function + ": ";
  if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
  return why;
}

}  // namespace exactcoll::tools
