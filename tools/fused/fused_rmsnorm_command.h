// `exactcoll sim fused_rmsnorm`: the fused all-reduce + residual add + RMSNorm on the simulator.
//
//   exactcoll sim fused_rmsnorm --ranks N --dtype bf16|fp16|fp32 (--input x.npy --residual r.npy
//       --weight w.npy | --rows R --hidden H [--seed S] [--specials]) [--eps E] [--output out.npy]
//       [--residual-output ro.npy]
//       [--algo ALGO] [--contract CONTRACT] [--blocks B] [--schedule threads|seeded] [--schedule-seed K]
//       [--trace FILE] [--trace-elements I,J,...] [--chrome-trace FILE]
//
// ALGO and CONTRACT: the registry's simulator entries (core/registry.h; --help lists them).
// x.npy [N, rows, H] (rank r's partial sums at [r]), r.npy [rows, H], w.npy [H]; bf16 and fp16 as
// '<u2' bit patterns, fp32 as '<f4'. Without files, inputs are random (tools/inputs/fused_inputs.h,
// the inputs `exactcoll gpu fused_rmsnorm` makes from the same --rows, --hidden, --seed, --specials,
// so the two summaries' sha256 compare directly). Outputs are [N, rows, H] (every rank's result). The library's
// contracts (canonical, tree: FusedSpec::contract) run core/fused_rmsnorm.h's algorithm on the simulated world
// (--trace-elements: the reference's steps under the same contract, checked against the run); the alternative
// contracts (simulator only) are computed by sim/fused/reference.h and take no --algo. The summary line ends
// with the sha256 of each output's bytes (tools/sha256/sha256.h,
// as every `exactcoll sim` op). World flags (--ranks, --dtype, schedulers, traces, --timeout-ms,
// --max-steps) are tools/sim/sim_flags.h's. Bad input (dtype or shape not matching the flags, H not
// a multiple of the pack, a malformed file) exits 2 before any output is written.
//
// The run goes through the C API (exactcoll_sim_fused_add_rmsnorm), as a C or Python caller's:
// its options carry the world's flags, the grid (--blocks, --threads), fault injection and the
// progress callback behind the bar, and the library writes the traces; the command checks its
// flags first (exit 2 naming them) and writes the .npy outputs (atomically) itself. Two parts stay
// here: --trace-elements (the element report is checked against the run's own fold events and
// output rows, which a C caller never sees, and under an alternative contract it comes from the
// reference call that makes the outputs), and --nodes (tools/multinode; no C entry point).
#pragma once

namespace exactcoll::fused {

// argv[0] is the subcommand's name ("fused_rmsnorm").
int fused_rmsnorm_main(int argc, char** argv);

}  // namespace exactcoll::fused
