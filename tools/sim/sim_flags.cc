#include "tools/sim/sim_flags.h"

#include <cerrno>
#include <cstdlib>

#include "core/signal.h"
#include "exactcoll/exactcoll.h"
#include "npy/npy.h"
#include "sim/trace_files.h"

namespace exactcoll::tools {

void add_world_flags(cli::ArgParser& parser, SimFlags* f, WorldFlagSet set) {
  parser.add_int("ranks", &f->ranks, "simulated ranks, 1..16");
  if (f->ranks == 0) parser.mark_required("ranks");  // commands without a default world size
  parser.add_choice("dtype", &f->dtype, {"bf16", "fp16", "fp32"}, "storage type");
  parser.add_choice("schedule", &f->schedule, {"threads", "seeded"},
                    "threads: free-running, one thread per rank; seeded: one simulated thread at a time, "
                    "picked by a PRNG at every flag signal and wait");
  parser.add_int("schedule-seed", &f->schedule_seed, "seed of the seeded scheduler");
  if (set.traces) {
    parser.add_string("trace", &f->trace, "write a JSON-lines trace (one event per rank, block and step)");
    if (set.element_traces) {
      parser.add_string("trace-elements", &f->trace_elements,
                        "also trace every fold and rounding of these element indices (I,J,...; at most 4096)");
    }
    parser.add_string("chrome-trace", &f->chrome_trace,
                      "write a Chrome trace (open it in Perfetto): ts is the scheduling step under --schedule seeded "
                      "(a logical clock, shown as microseconds; the same seed gives the same file) and microseconds "
                      "of wall time since the run started under threads");
  }
  parser.add_int("timeout-ms", &f->timeout_ms, "threads scheduler: a flag wait longer than this is an error");
  parser.add_int("max-steps", &f->max_steps, "seeded scheduler: scheduling steps before a livelock is reported");
  if (set.faults) {
    parser.add_int("fail-rank", &f->fail_rank,
                   "fault injection: this rank dies (stops, as a killed process) at its --fail-at-step K-th flag "
                   "signal or wait; its peers report a deadlock naming it once every live rank waits (threads: or "
                   "time out first, --timeout-ms); no output is written");
    parser.set_default_note("fail-rank", "default: none");
    parser.add_int("fail-at-step", &f->fail_at_step, "fault injection: the step (>= 1) at which --fail-rank dies");
    parser.set_default_note("fail-at-step", "required with --fail-rank");
  }
}

std::string parse_trace_elements(const std::string& text, std::vector<uint64_t>* out) {
  if (!parse_indices(text, out)) return "--trace-elements wants element indices like 3,17,42, got '" + text + "'";
  if (out->size() > EXACTCOLL_MAX_TRACE_ELEMENTS) {
    return "--trace-elements names " + std::to_string(out->size()) + " elements; at most " +
           std::to_string(EXACTCOLL_MAX_TRACE_ELEMENTS);
  }
  return "";
}

bool parse_indices(const std::string& text, std::vector<uint64_t>* out) {
  out->clear();
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) return false;
    errno = 0;
    const unsigned long long v = std::strtoull(item.c_str(), nullptr, 10);
    if (errno != 0) return false;
    out->push_back(v);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return !out->empty();
}

std::string world_options(const SimFlags& f, const cli::ArgParser& parser, sim::WorldOptions* o) {
  if (f.ranks == 0 && !parser.given("ranks")) return "give --ranks N (1.." + std::to_string(kMaxRanks) + ")";
  if (f.ranks < 1 || f.ranks > kMaxRanks) {
    return "--ranks must be 1.." + std::to_string(kMaxRanks) + ", got " + std::to_string(f.ranks);
  }
  if (!parse_dtype(f.dtype)) return "--dtype must be bf16, fp16 or fp32";
  if (f.schedule_seed < 0) return "--schedule-seed must be >= 0, got " + std::to_string(f.schedule_seed);
  if (parser.given("schedule-seed") && f.schedule != "seeded") return "--schedule-seed needs --schedule seeded";
  if (std::string problem = check_timeout_ms(f.timeout_ms); !problem.empty()) return problem;
  if (f.max_steps < 1) return "--max-steps must be >= 1";
  o->ranks = static_cast<int>(f.ranks);
  o->schedule = f.schedule == "seeded" ? sim::Schedule::kSeeded : sim::Schedule::kThreads;
  o->schedule_seed = static_cast<uint64_t>(f.schedule_seed);
  o->wait_timeout = std::chrono::milliseconds(f.timeout_ms);
  o->max_steps = static_cast<uint64_t>(f.max_steps);
  o->trace_elements.clear();
  if (!f.trace_elements.empty()) {
    if (std::string problem = parse_trace_elements(f.trace_elements, &o->trace_elements); !problem.empty()) {
      return problem;
    }
  }
  o->trace = !f.trace.empty() || !f.chrome_trace.empty();
  if (!o->trace_elements.empty() && f.trace.empty()) return "--trace-elements needs --trace FILE";
  if (parser.given("fail-rank") != parser.given("fail-at-step")) return "--fail-rank and --fail-at-step go together";
  if (parser.given("fail-rank")) {
    if (f.fail_rank < 0 || f.fail_rank >= f.ranks) {
      return "--fail-rank must be a rank, 0.." + std::to_string(f.ranks - 1) + ", got " + std::to_string(f.fail_rank);
    }
    if (f.fail_at_step < 1) return "--fail-at-step must be >= 1, got " + std::to_string(f.fail_at_step);
    o->fail_rank = static_cast<int>(f.fail_rank);
    o->fail_at_step = static_cast<uint64_t>(f.fail_at_step);
  }
  return "";
}

std::vector<std::string> trace_paths(const SimFlags& f) {
  std::vector<std::string> paths;
  for (const std::string* path : {&f.trace, &f.chrome_trace}) {
    if (!path->empty()) paths.push_back(cli::resolve_path(*path));
  }
  return paths;
}

std::unique_ptr<npy::OutputFiles> reserve_outputs(const std::string& command, const std::vector<std::string>& paths) {
  try {
    return std::make_unique<npy::OutputFiles>(paths);
  } catch (const npy::NpyError& e) {
    cli::fail(command, std::string(e.what()) + " (no output can be written there; nothing was run)");
    return nullptr;
  }
}

void write_traces(const SimFlags& f, const sim::World& world, npy::OutputFiles& files) {
  sim::write_trace_texts(world, f.trace.empty() ? "" : cli::resolve_path(f.trace),
                         f.chrome_trace.empty() ? "" : cli::resolve_path(f.chrome_trace), files);
}

std::string unreached_fault(const sim::WorldOptions& o, const sim::World& world) {
  if (o.fail_rank < 0 || world.rank_dead(o.fail_rank)) return "";
  return "--fail-at-step " + std::to_string(o.fail_at_step) + " was never reached: rank " +
         std::to_string(o.fail_rank) + " took " + std::to_string(world.fault_steps()) +
         " synchronization steps in this run (no output was written)";
}

std::string random_input_note(int64_t seed, bool given, bool specials) {
  return std::string(specials ? "random with specials" : "random") + ", --seed " + std::to_string(seed) +
         (given ? "" : " (the default)");
}

std::string input_banner(const std::string& command, int ranks, uint64_t count, const std::string& dtype,
                         const std::string& input_note) {
  return "exactcoll " + command + ": " + std::to_string(ranks) + " ranks x " + std::to_string(count) + " " + dtype +
         " elements; inputs: " + input_note + "\n";
}

std::string schedule_note(const sim::WorldOptions& o) {
  if (o.schedule == sim::Schedule::kThreads) return "threads schedule";
  return "seeded schedule (--schedule-seed " + std::to_string(o.schedule_seed) + ")";
}

}  // namespace exactcoll::tools
