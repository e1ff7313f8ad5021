// Simulator traces: what every simulated (rank, block) did, in the order it happened.
//
// Events (docs/design.md shows one JSON line of each):
//   launch  a rank's stream starts a launch (after its input staging)
//   step    one algorithm step of one (rank, block): its name and every access (read/write,
//           peer, buffer, element range [begin, end))
//   signal  a flag store: to which peer, flag set, epoch (the barrier value)
//   wait    a flag wait that completed: from which peer, set, epoch, and when it began (since)
//   fold    (traced elements only) one fold step: input rank, accumulator before/after, the input
//   round   (traced elements only) the final rounding: accumulator bits and stored bits
// (The fused op's later steps of a traced element, after the fold, are sim/fused/element_trace.h's.)
// Time `t`: under the seeded scheduler the scheduling step (deterministic: the same seed gives
// the same bytes); under the threads scheduler nanoseconds since the run started.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/collectives.h"

namespace exactcoll::sim {

struct TraceAccess {
  Access access;
  int peer;
  Buffer buffer;
  uint64_t begin, end;
};

struct TraceEvent {
  enum class Kind : uint8_t { kLaunch, kStep, kSignal, kWait, kFold, kRound, kTreeNode };
  Kind kind = Kind::kStep;
  uint64_t t = 0;
  uint64_t since = 0;  // wait: when it began
  uint32_t launch = 0;
  int rank = 0;
  int block = 0;          // launch: the launch's block count
  const char* step = "";  // step: name (a string literal from core)
  std::vector<TraceAccess> accesses;
  int peer = 0, set = 0;  // signal / wait
  uint32_t epoch = 0;
  uint64_t index = 0;                          // fold / round: element index
  int input_rank = 0;                          // fold: whose input was added; tree_node: right_rank
  int left_rank = 0;                           // tree_node: the first rank of the left subtree
  float acc_before = 0, x = 0, acc_after = 0;  // fold; round uses acc_before as the accumulator;
                                               // tree_node: left, right and their fp32 sum
  uint32_t stored_bits = 0;                    // round, tree_node
  float stored_value = 0;                      // round, tree_node: the stored value widened to float
  int storage_bytes = 0;                       // round, tree_node: 2 or 4
};

class Tracer {
 public:
  // elements: the element indices whose fold and rounding are recorded (may be empty).
  Tracer(int ranks, std::vector<uint64_t> elements);

  // Names of the launches, in enqueue order (the `op` field of every event).
  void set_launch_names(std::vector<std::string> names) { launch_names_ = std::move(names); }

  // Appends an event to rank's log. Thread-safe across ranks; one writer per rank at a time.
  void add(TraceEvent event) { logs_[event.rank].push_back(std::move(event)); }

  // Is element `index` one of the traced elements?
  bool element_traced(uint64_t index) const;

  // Every event of every rank, ordered by time (ties: rank, then recording order).
  std::vector<TraceEvent> merged() const;

  // JSON lines, one event per line.
  std::string json_lines() const;
  // Chrome trace format (Perfetto / chrome://tracing): one process track per rank, one thread
  // per block; steps and waits are slices, launches, signals, folds and roundings instants.
  // `time_is_steps`: t counts scheduling steps (seeded) and ts is that count (a logical clock that
  // Perfetto shows as microseconds); else t is nanoseconds and ts microseconds of wall time.
  std::string chrome_trace(bool time_is_steps) const;

 private:
  std::vector<std::vector<TraceEvent>> logs_;
  std::vector<uint64_t> elements_;  // sorted
  std::vector<std::string> launch_names_;
};

// Formats a float as the shortest decimal that reads back to the same float ("nan", "-inf"...).
std::string float_text(float f);

}  // namespace exactcoll::sim
