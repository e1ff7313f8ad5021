// Element traces of `exactcoll sim fused_rmsnorm` (docs/design.md section 7): every step of a traced
// element's computation (the fold, the all-reduce's rounding, the residual add, its path through
// the sum-of-squares tree, inv, the output products), under any contract.
//
// Where the values come from: an alternative contract's outputs ARE fused_reference's, and its
// trace is recorded by that same call. The library contracts' outputs (canonical, tree) come from
// the simulated algorithms (core/fused_rmsnorm.h and core/fused_rmsnorm_kernels.h), whose fold
// steps the run records itself (sim::Tracer's fold and round events, or tree_node and round under
// tree); the trace is fused_reference's under the same contract, checked against the run before it
// is shown (trace_simulated_run): any bit that differs is an error, not a trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/fused/reference.h"
#include "sim/trace.h"

namespace exactcoll::fused {

// The traces of `elements` (indices into [rows, H], row-major) under a library contract (canonical
// or tree: the contract the run folded under), appended to *traces, after checking them against
// that simulated run of the same problem:
//   - every rank's residual_out and out rows that hold a traced element (whole rows: the norm
//     reads the whole row) equal fused_reference's, bit for bit;
//   - every fold event (canonical: fold; tree: tree_node) and round event that the run recorded
//     for a traced element (run_events, from sim::Tracer::merged(); every rank that folded it) has
//     the trace's values, each rank recording the whole fold then one round: canonical, the same
//     input ranks in the same order, the same x, accumulator and stored bits; tree, the same nodes
//     in the same order (both subtrees' first ranks, both values, the fp32 sum, the stored node);
//     the round's accumulator and stored bits; at least one rank recorded them;
//   - the steps after the fold equal core's functions applied to the run's values:
//     contract::residual_add(s, residual), contract::sum_squares of the run's residual_out row,
//     contract::rmsnorm_inverse, contract::rmsnorm_scale.
// run_residual_out[r] and run_out[r] are rank r's [rows, H] outputs. Returns "" when everything
// agrees (then *traces holds the traces), else what differs first (and *traces is unchanged).
// Throws std::invalid_argument for a contract that is not the library's (an alternative has no run:
// trace_alternative).
template <class T>
std::string trace_simulated_run(Contract contract, const FusedProblem<T>& problem,
                                const std::vector<uint64_t>& elements, const std::vector<const T*>& run_residual_out,
                                const std::vector<const T*>& run_out, const std::vector<sim::TraceEvent>& run_events,
                                std::vector<ElementTrace>* traces);

// An alternative contract's outputs and traces in one fused_reference call (the trace comes from the
// computation that makes the outputs), each trace compared with the canonical trace of the same
// element (compare_with_canonical). Returns, per traced element (rising index), the seq of the
// step where it departs from canonical, or -1.
template <class T>
std::vector<int> trace_alternative(Contract contract, const FusedProblem<T>& problem,
                                   const std::vector<uint64_t>& elements, T* residual_out, T* out,
                                   std::vector<ElementTrace>* traces);

}  // namespace exactcoll::fused
