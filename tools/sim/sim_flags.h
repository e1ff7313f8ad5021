// The flags every `exactcoll sim <op>` shares (ranks, dtype, scheduler, traces), turned into
// sim::WorldOptions, and the trace files written after a run. Ops outside tools/sim may use them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/storage.h"
#include "sim/world.h"
#include "tools/cli.h"
#include "tools/inputs/inputs.h"
#include "npy/npy.h"

namespace exactcoll::tools {

struct SimFlags {
  int64_t ranks = 0;
  std::string dtype = "bf16";
  std::string schedule = "threads";
  int64_t schedule_seed = 1;
  std::string trace;                // JSON-lines trace path
  std::string trace_elements;       // "3,17,42"
  std::string chrome_trace;         // Chrome trace path
  int64_t timeout_ms = 20000;       // threads: one flag wait
  int64_t max_steps = 100'000'000;  // seeded: livelock bound
  int64_t fail_rank = -1;           // fault injection: this rank dies ...
  int64_t fail_at_step = 0;         // ... at its K-th synchronization step (sim::WorldOptions)
};

// --timeout-ms's bound, shared with the GPU commands (tools/cli.h).
using cli::check_timeout_ms;
using cli::kLongestTimeoutMs;

// Which of the world's flags a command offers beyond --ranks --dtype --schedule --schedule-seed
// --timeout-ms --max-steps.
struct WorldFlagSet {
  bool traces = true;          // --trace --chrome-trace: the command writes a run's trace
  bool element_traces = true;  // --trace-elements: it folds something to trace (needs traces)
  bool faults = true;          // --fail-rank --fail-at-step: a run can be killed
};

// Adds the world's flags of `set` (all of them by default).
void add_world_flags(cli::ArgParser& parser, SimFlags* flags, WorldFlagSet set = {});

// Checks the flags and fills *options. Returns "" or what is wrong (no --ranks while flags.ranks
// has no default (0), ranks outside 1..16, a negative seed, malformed --trace-elements, ...).
std::string world_options(const SimFlags& flags, const cli::ArgParser& parser, sim::WorldOptions* options);

// The trace files the flags ask for (resolved paths), to reserve with the command's outputs.
std::vector<std::string> trace_paths(const SimFlags& flags);

// Reserves `paths` (empty ones skipped) as the command's outputs, all or nothing (npy::OutputFiles).
// Returns null after printing "exactcoll <command>: <why>" when one cannot be created: bad input,
// found before any work (the caller exits 2).
std::unique_ptr<npy::OutputFiles> reserve_outputs(const std::string& command, const std::vector<std::string>& paths);

// Writes the JSON-lines and Chrome traces requested by flags into `files` (which reserved
// trace_paths(flags)). Throws npy::NpyError on an I/O failure.
void write_traces(const SimFlags& flags, const sim::World& world, npy::OutputFiles& files);

// Fault injection (--fail-rank R --fail-at-step K) after a run that completed: returns "" when no
// fault was asked for, else why it never happened (rank R took fewer than K steps), for exit 2.
std::string unreached_fault(const sim::WorldOptions& options, const sim::World& world);

// Returns what --seed made: "random, --seed 7", or "random, --seed 1 (the default)" when the seed
// was not given (`given` false); "random with specials, ..." for the fused op's --specials.
std::string random_input_note(int64_t seed, bool given, bool specials = false);

// Returns the first line of `exactcoll sim <op>` for the collectives, on one node or with --nodes
// alike: which op on how many ranks, the elements per rank and their dtype, and the inputs
// (random_input_note(), or "<file> <shape>" for an --input file). Ends with '\n'.
// Example: input_banner("sim allreduce", 4, 16, "bf16", random_input_note(1, false)) ->
//   "exactcoll sim allreduce: 4 ranks x 16 bf16 elements; inputs: random, --seed 1 (the default)\n"
std::string input_banner(const std::string& command, int ranks, uint64_t count, const std::string& dtype,
                         const std::string& input_note);

// "threads schedule" or "seeded schedule (--schedule-seed K)".
std::string schedule_note(const sim::WorldOptions& options);

// bf16 | fp16 | fp32 (tools/inputs/inputs.h: one parser for the sim and GPU commands).
using gpu::parse_dtype;

// Parses "3,17,42" into *out; false on anything else.
bool parse_indices(const std::string& text, std::vector<uint64_t>* out);

// Parses --trace-elements TEXT into *out: "" or what is wrong (not indices like 3,17,42, or more
// than EXACTCOLL_MAX_TRACE_ELEMENTS of them, the C API's bound: each traced element's checks
// read its whole row, so a bounded list keeps a traced run's cost near an untraced one's).
std::string parse_trace_elements(const std::string& text, std::vector<uint64_t>* out);

}  // namespace exactcoll::tools
