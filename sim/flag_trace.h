// Records a flag signal or a completed flag wait in the tracer of the (rank, block) that made it:
// the events every executor of sim::SimCtx's flags writes (sim/schedulers.cc, sim/multinode).
#pragma once

#include <cstdint>
#include <utility>

#include "sim/trace.h"
#include "sim/world.h"

namespace exactcoll::sim {

// No-op when env has no tracer. kind: kSignal or kWait; since: when a wait began (0 for signals).
inline void trace_flag(const BlockEnv& env, TraceEvent::Kind kind, uint64_t t, uint64_t since, int peer, int set,
                       uint32_t value) {
  if (env.tracer == nullptr) return;
  TraceEvent e;
  e.kind = kind;
  e.t = t;
  e.since = since;
  e.launch = env.launch;
  e.rank = env.rank;
  e.block = env.block;
  e.peer = peer;
  e.set = set;
  e.epoch = value;
  env.tracer->add(std::move(e));
}

}  // namespace exactcoll::sim
