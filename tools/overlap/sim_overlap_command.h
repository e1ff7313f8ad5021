// `exactcoll sim overlap`: the all-gather + matmul overlap schedules (core/overlap_plan.h) on the
// simulated world, with seeded random inputs; prints the plan on request, checks the result, and
// writes traces.
//
//   exactcoll sim overlap --ranks N [--pattern ag_matmul|prefetch] [--dtype bf16|fp16|fp32]
//       [--m M --k K --n N] [--gather-count C] [--seed S] [--comm-streams S] [--calls K] [--plan]
//       [--no-check] [--schedule threads|seeded] [--schedule-seed K] [--trace FILE] [--chrome-trace FILE]
//
// Checks (unless --no-check), every rank, every call: the gathered A equals the concatenated shards
// bit for bit, C equals the unpipelined schedule's bits (the simulator's all-gather, then the same
// per-shard products), and sampled elements of C are within tolerance of a float64 reference.
// The summary ends with the sha256 of every rank's gathered A and of every rank's C (rank order).
// Exit codes: 0 all checks pass; 1 a check failed; 2 bad usage; 3 the run failed (deadlock,
// livelock, timeout).
#pragma once

namespace exactcoll::tools {

// argv[0] is "overlap". Returns the exit code.
int sim_overlap_main(int argc, char** argv);

}  // namespace exactcoll::tools
