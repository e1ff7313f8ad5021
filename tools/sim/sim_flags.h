// The flags every `exactcoll sim <op>` shares (ranks, dtype, scheduler, traces), turned into
// sim::WorldOptions, and the trace files written after a run. Ops outside tools/sim may use them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/storage.h"
#include "sim/world.h"
#include "tools/cli.h"

namespace exactcoll::tools {

struct SimFlags {
  int64_t ranks = 0;
  std::string dtype = "bf16";
  std::string schedule = "threads";
  int64_t schedule_seed = 1;
  std::string trace;           // JSON-lines trace path
  std::string trace_elements;  // "3,17,42"
  std::string chrome_trace;    // Chrome trace path
  int64_t timeout_ms = 20000;  // threads: one flag wait
  int64_t max_steps = 100'000'000;  // seeded: livelock bound
};

// Adds --ranks --dtype --schedule --schedule-seed --trace --trace-elements --chrome-trace
// --timeout-ms --max-steps.
void add_world_flags(cli::ArgParser& parser, SimFlags* flags);

// Checks the flags and fills *options. Returns "" or what is wrong (no --ranks while flags.ranks
// has no default (0), ranks outside 1..16, a negative seed, malformed --trace-elements, ...).
std::string world_options(const SimFlags& flags, const cli::ArgParser& parser, sim::WorldOptions* options);

// Writes the JSON-lines and Chrome traces requested by flags (atomically). Returns "" or the error.
std::string write_traces(const SimFlags& flags, const sim::World& world);

// Writes world's trace as JSON lines to json_path and in Chrome's format to chrome_path (each
// atomically; an empty path skips it; paths as given, not resolved). Returns "" or the error.
// Nothing is written when the world was not traced.
std::string write_trace_files(const sim::World& world, const std::string& json_path, const std::string& chrome_path);

// "threads schedule" or "seeded schedule (--schedule-seed K)".
std::string schedule_note(const sim::WorldOptions& options);

// bf16 | fp16 | fp32.
std::optional<DType> parse_dtype(const std::string& name);

// Parses "3,17,42" into *out; false on anything else.
bool parse_indices(const std::string& text, std::vector<uint64_t>* out);

}  // namespace exactcoll::tools
