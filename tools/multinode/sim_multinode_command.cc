// `exactcoll sim <op> --nodes M ...`: the multi-node collectives (core/multinode.h) on the
// simulator (sim/multinode): M nodes of ranks / M local ranks each, ranks numbered node-major.
//
//   exactcoll sim allreduce|reduce_scatter|allgather --nodes M --ranks N --dtype D (--input in.npy | --count C [--seed
//   S])
//       [--output out.npy] [--contract canonical|tree] [--chunk-elements E] [--blocks B]
//       [--schedule threads|seeded] [--schedule-seed K] [--trace FILE] [--trace-elements I,J,...] [--timeout-ms T]
//   exactcoll sim fused_rmsnorm --nodes M --ranks N (--input x.npy --residual r.npy --weight w.npy |
//       --rows R --hidden H [--seed S] [--specials]) [--eps E]
//       [--output out.npy] [--residual-output ro.npy] (same scheduling and trace flags)
//
// Inputs are .npy files read as the one-node commands read them (tools/inputs/rank_inputs.h,
// read_fused_files), or the one-node commands' random inputs for the same --count/--rows/--hidden
// and --seed (tools/inputs/inputs.h, tools/inputs/fused_inputs.h), so the summary's sha256 equals
// the one-node command's: the bits do not depend on the number of nodes (under --contract tree too:
// the one-node command's with --contract tree, for M and L powers of two). --fail-rank and
// --fail-at-step are refused (exit 2): the multi-node simulator kills no rank. --contract takes the
// one-node command's choices and refuses (exit 2) one that does not run across nodes (the
// registry's kOnMultiNode). The collectives first print the
// one-node command's input banner (tools::input_banner, the same function). Registered as
// "<op> --nodes" with tools/sim/sim_subcommands.h; tools/sim routes any `sim <op>` given --nodes
// here.
// The collectives run through the C API (exactcoll_sim_multinode_collective, which writes the
// trace); the command keeps what the C API cannot sensibly offer: the .npy files and the random
// inputs (a program holds its arrays), the flags' own messages and their order (checked before
// anything is reserved or printed, as the one-node commands do). The fused op runs through
// exactcoll_sim_multinode_fused_add_rmsnorm the same way.
// Exit codes: 2 bad input or layout (nothing written), 3 a failed run (its trace is written).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "core/multinode.h"
#include "core/multinode_layout.h"
#include "core/registry.h"
#include "core/signal.h"
#include "core/storage.h"
#include "exactcoll/exactcoll.h"
#include "sim/fused/reference.h"
#include "sim/multinode/multinode_sim.h"
#include "tools/cli.h"
#include "tools/contract_flag.h"
#include "tools/sim/sim_subcommands.h"
#include "tools/inputs/fused_inputs.h"
#include "tools/inputs/inputs.h"
#include "tools/inputs/rank_inputs.h"
#include "npy/npy.h"
#include "tools/sha256/sha256.h"
#include "tools/sim/api_options.h"
#include "tools/sim/sim_flags.h"

namespace exactcoll::multinode {
namespace {

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kFused };

const char* kind_name(Kind k) {
  return k == Kind::kAllReduce       ? "allreduce"
         : k == Kind::kReduceScatter ? "reduce_scatter"
         : k == Kind::kAllGather     ? "allgather"
                                     : "fused_rmsnorm";
}

// One `sim <op> --nodes` invocation: the flags' values (make_parser), what check_flags resolves
// them to, and the run's trace, failure and files.
struct Job {
  Kind kind = Kind::kAllReduce;
  std::string command;  // "sim <op>", as the messages name it
  bool fused = false;
  // The flags.
  tools::SimFlags f;
  int64_t nodes = 0, count = 0, seed = 1, blocks = 1, chunk = static_cast<int64_t>(kDefaultChunkElements);
  gpu::FusedInputFlags fused_in;  // the fused op's inputs: the one-node command's flags
  std::string output, input_path, contract_text = "canonical";
  // Resolved by check_flags.
  NodeLayout layout;
  DType dtype = DType::kBF16;
  Contract contract = Contract::kCanonical;
  std::vector<uint64_t> trace_elements;
  NetworkOptions net;
  int n = 0;
  size_t esize = 0;
  std::string npy_type, schedule_text, input_note;
  // The resolved paths of the trace and the outputs (the C API writes the trace).
  std::string trace_path, output_path, residual_path;
};

// Fault injection (--fail-rank, --fail-at-step) kills a rank of one simulated world; the
// multi-node simulator has no such hook (its tests drop messages instead), so the flags are
// refused here rather than accepted and ignored. Returns nullopt, or the exit code (the message
// printed).
std::optional<int> refuse_fault_flags(const std::string& command, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--fail-rank", 0) == 0 || arg.rfind("--fail-at-step", 0) == 0) {
      return cli::fail(command, arg.substr(0, arg.find('=')) +
                                    " is not available with --nodes: the multi-node simulator kills no rank (run "
                                    "without --nodes for fault injection)");
    }
  }
  return std::nullopt;
}

// The command's flags, bound to j's fields.
cli::ArgParser make_parser(Job* j) {
  const std::string& command = j->command;
  const bool fused = j->fused;
  cli::ArgParser parser(
      "exactcoll " + command + " --nodes M --ranks N --dtype bf16|fp16|fp32 " +
          (fused ? "(--input x.npy --residual r.npy --weight w.npy | --rows R --hidden H [--seed S] [--specials]) "
                   "[--eps E] [--output out.npy] [--residual-output ro.npy]"
                 : "(--input in.npy | --count C [--seed S]) [--output out.npy]") +
          " [--contract " + library_contract_names(kOnMultiNode, "|") +
          "] [--chunk-elements E] [--blocks B] [--schedule threads|seeded] [--schedule-seed K] [--trace FILE] "
          "[--trace-elements I,J,...] [--timeout-ms T]",
      "Runs " + std::string(kind_name(j->kind)) +
          " across M simulated nodes of N / M ranks each (ranks numbered node-major): inside a node\n"
          "the ranks share memory (the IPC kernels), between nodes an unrounded fp32 carry travels the\n"
          "chain in rank order over a simulated network (core/multinode.h). Under --contract tree each\n"
          "node folds its ranks' subtree instead, and the nodes combine their subtrees by recursive\n"
          "doubling (halving for reduce_scatter): log2(M) exchanges; M and N / M powers of two. Inputs\n"
          "are .npy files as the one-node command takes them, or its random inputs for the same sizes\n"
          "and --seed, so the sha256 in the last line equals the one-node command's (with the same\n"
          "--contract). --schedule seeded explores the order in which messages cross node boundaries\n"
          "(--fail-rank is not available here); --trace writes every message (with the boundary it\n"
          "crossed) and every node kernel. --trace-elements I,J,... (input element indices; not for\n"
          "fused_rmsnorm) adds each element's fold: under canonical its fold events in global rank\n"
          "order along the chain and the last node's round; under tree a tree_node event per node of\n"
          "the tree that a rank computes (its node's subtree, then one per exchange step it combines,\n"
          "each naming the first global rank of both subtrees), and the round on each rank that\n"
          "computes the root.");
  tools::add_world_flags(parser, &j->f, {.traces = true, .element_traces = true, .faults = false});
  parser.add_int("nodes", &j->nodes, "nodes M; --ranks must be a multiple of M (every node the same size)");
  if (fused) {
    gpu::add_fused_input_flags(parser, &j->fused_in);
  } else {
    parser.add_string("input", &j->input_path, "input .npy [N, ...] (rank first)");
    parser.add_int("count", &j->count, "elements per rank of random input (instead of --input)");
    parser.set_default_note("count", "required without --input");
  }
  parser.add_int("seed", &j->seed, "seed of the random inputs");
  parser.add_string("output", &j->output, fused ? "out.npy: [N, rows, H] normed output" : "write the output .npy here");
  parser.add_int("chunk-elements", &j->chunk, "elements per pipeline step (a multiple of 64)");
  parser.add_int("blocks", &j->blocks, "blocks of every node kernel (the work split; same bits)");
  // The one-node command's choices, so that a contract that runs on one node only is refused with
  // a reason rather than as an unknown name.
  cli::add_contract_flag(parser, &j->contract_text, kOnSimulator,
                         "the rounding contract (across nodes: " + library_contract_names(kOnMultiNode) + " only)");
  return parser;
}

// Step 2 of multinode_main: the layout first (the most likely mistake), then the rest; resolves
// j's remaining fields. Nothing is written yet. Returns nullopt to go on, or the exit code to
// return now (the message printed).
std::optional<int> check_flags(const cli::ArgParser& parser, Job* j) {
  const std::string& command = j->command;
  const tools::SimFlags& f = j->f;
  const int64_t nodes = j->nodes, seed = j->seed;
  NodeLayout& layout = j->layout;
  if (!parser.given("nodes")) return cli::fail(command, "give --nodes M");
  if (const Contract contract = cli::library_contract(j->contract_text); (info(contract).runs_on & kOnMultiNode) == 0) {
    return cli::fail(command, "--contract " + j->contract_text + " runs on one node only (across nodes: " +
                                  library_contract_names(kOnMultiNode) + "); run without --nodes");
  }
  if (!parser.given("ranks")) return cli::fail(command, "give --ranks N (the whole job's ranks)");
  if (nodes > 1024 || f.ranks > 1 << 16)
    return cli::fail(command, "--nodes and --ranks are too large for a simulation");
  if (std::string p = layout_from_counts(static_cast<int>(f.ranks), static_cast<int>(nodes), &layout); !p.empty()) {
    return cli::fail(command, "bad layout: " + p);
  }
  if (layout.local_ranks > kMaxRanks) {
    return cli::fail(command, "bad layout: " + std::to_string(layout.local_ranks) + " ranks per node; a node has 1.." +
                                  std::to_string(kMaxRanks));
  }
  const DType dtype = *tools::parse_dtype(f.dtype);
  if (seed < 0) return cli::fail(command, "--seed must be >= 0, got " + std::to_string(seed));
  if (!f.chrome_trace.empty()) return cli::fail(command, "--chrome-trace is not available with --nodes (use --trace)");
  if (parser.given("schedule-seed") && f.schedule != "seeded")
    return cli::fail(command, "--schedule-seed needs --schedule seeded");
  if (f.schedule_seed < 0 || f.max_steps < 1) {
    return cli::fail(command, "--schedule-seed must be >= 0, --max-steps >= 1");
  }
  if (const std::string problem = tools::check_timeout_ms(f.timeout_ms); !problem.empty()) {
    return cli::fail(command, problem);
  }
  std::vector<uint64_t>& trace_elements = j->trace_elements;
  if (!f.trace_elements.empty()) {
    if (std::string p = tools::parse_trace_elements(f.trace_elements, &trace_elements); !p.empty()) {
      return cli::fail(command, p);
    }
  }
  if (!trace_elements.empty() && f.trace.empty()) return cli::fail(command, "--trace-elements needs --trace FILE");
  // The multi-node fused op records no element (run_multinode_fused takes none): refused rather
  // than accepted and ignored.
  if (!trace_elements.empty() && j->fused) {
    return cli::fail(command,
                     "--trace-elements is not available for fused_rmsnorm with --nodes (the collectives take it; "
                     "without --nodes, sim fused_rmsnorm traces every step of an element)");
  }
  j->contract = *parse_contract_name(j->contract_text, kOnMultiNode);
  if (j->contract == Contract::kTree) {
    if (const std::string p = check_tree_layout(layout); !p.empty()) return cli::fail(command, "bad layout: " + p);
  }
  NetworkOptions& net = j->net;
  net.layout = layout;
  net.schedule = f.schedule == "seeded" ? sim::Schedule::kSeeded : sim::Schedule::kThreads;
  net.seed = static_cast<uint64_t>(f.schedule_seed);
  net.timeout = std::chrono::milliseconds(f.timeout_ms);
  net.max_steps = static_cast<uint64_t>(f.max_steps);
  net.trace = !f.trace.empty();
  j->dtype = dtype;
  j->n = layout.world_size();
  j->esize = static_cast<size_t>(dtype_size(dtype));
  j->npy_type = dtype == DType::kFP32 ? npy::kF32 : npy::kU16;
  j->schedule_text = net.schedule == sim::Schedule::kSeeded
                         ? "seeded schedule (--schedule-seed " + std::to_string(net.seed) + ")"
                         : "threads schedule";
  j->input_note = tools::random_input_note(seed, parser.given("seed"), j->fused_in.specials);
  if (parser.given("seed") && (!j->input_path.empty() || !j->fused_in.input.empty())) {
    return cli::fail(command, "--seed applies to random inputs, not to --input files");
  }
  j->trace_path = f.trace.empty() ? "" : cli::resolve_path(f.trace);
  j->output_path = j->output.empty() ? "" : cli::resolve_path(j->output);
  j->residual_path = j->fused_in.residual_output.empty() ? "" : cli::resolve_path(j->fused_in.residual_output);
  return std::nullopt;
}

// What crossed the nodes, for the summary line: "carry chain", "tree contract, recursive doubling"
// (halving for reduce_scatter), or "direct exchange" (all-gather, a copy under every contract).
std::string exchange_text(const Job& j, Op op) {
  if (op == Op::kAllGather) return "direct exchange";
  if (j.contract != Contract::kTree) return "carry chain";
  return op == Op::kAllReduce ? "tree contract, recursive doubling" : "tree contract, recursive halving";
}

// The simulated world's flags as the C API's options (blocks, schedule, seed, bound on waits, step
// bound, trace file); each op adds its own fields.
exactcoll_sim_options world_options(const Job& j, int blocks) {
  exactcoll_sim_options options;
  exactcoll_sim_options_init(&options);
  options.blocks = blocks;
  options.seeded_schedule = j.net.schedule == sim::Schedule::kSeeded ? 1 : 0;
  options.schedule_seed = j.net.seed;
  options.timeout_ms = j.net.timeout.count();
  options.max_steps = j.net.max_steps;
  options.trace_path = j.trace_path.empty() ? nullptr : j.trace_path.c_str();
  return options;
}

// The rest of a multi-node C call's arguments: the chunk (exactcoll_sim_multinode_options), the
// stats it fills, and the dtype's C value (the name was checked by check_flags).
struct MultiNodeArgs {
  exactcoll_sim_multinode_options options;
  exactcoll_sim_multinode_stats stats;
  int dtype = 0;
};
MultiNodeArgs multinode_args(const Job& j, size_t chunk_elements) {
  MultiNodeArgs args;
  exactcoll_sim_multinode_options_init(&args.options);
  args.options.chunk_elements = chunk_elements;
  exactcoll_sim_multinode_stats_init(&args.stats);
  exactcoll_dtype_from_name(j.f.dtype.c_str(), &args.dtype);
  return args;
}

// Step 3a of multinode_main: the fused op (its input flags checked, the inputs read or made, the
// run, the files, the summary). Returns the exit code.
int run_fused_op(const cli::ArgParser& parser, Job& j) {
  const std::string& command = j.command;
  const gpu::FusedInputFlags& fused_in = j.fused_in;
  const DType dtype = j.dtype;
  const int n = j.n;
  const bool from_files = parser.given("input") || parser.given("residual") || parser.given("weight");
  if (from_files && (fused_in.input.empty() || fused_in.residual.empty() || fused_in.weight.empty())) {
    return cli::fail(command, "give all three of --input, --residual and --weight");
  }
  if (from_files && (parser.given("rows") || parser.given("hidden") || fused_in.specials)) {
    return cli::fail(command, "--rows, --hidden and --specials shape random inputs, not --input files");
  }
  if (!from_files && (!parser.given("rows") || !parser.given("hidden"))) {
    return cli::fail(command, "give --rows R and --hidden H, or --input, --residual and --weight");
  }
  if (!from_files &&
      (fused_in.rows < 1 || fused_in.hidden < 1 || fused_in.rows > (1 << 20) || fused_in.hidden > (1 << 20))) {
    return cli::fail(command, "--rows and --hidden must be in 1..1048576");
  }
  if (!j.output.empty() && j.output == fused_in.residual_output)
    return cli::fail(command, "--output and --residual-output must differ");
  // The one-node command's check and message (the C API refuses such an eps too).
  if (const std::string p = fused::check_eps(fused_in.eps); !p.empty()) return cli::fail(command, p);
  gpu::FusedInputs in;
  if (from_files) {
    if (const std::string p = gpu::read_fused_files(fused_in, dtype, n, "--ranks", -1, &in); !p.empty()) {
      return cli::fail(command, p);
    }
    j.input_note = fused_in.input + " " + npy::shape_text({n, in.rows, in.hidden});
  }
  MultiNodeFusedSpec spec;
  spec.dtype = dtype;
  spec.rows = from_files ? in.rows : static_cast<int>(fused_in.rows);
  spec.hidden = from_files ? in.hidden : static_cast<int>(fused_in.hidden);
  spec.eps = static_cast<float>(fused_in.eps);
  spec.blocks = static_cast<int>(j.blocks);
  spec.chunk_elements = static_cast<size_t>(j.chunk);
  spec.contract = j.contract;
  if (std::string p = check_multinode_fused_spec(spec, j.layout); !p.empty()) return cli::fail(command, p);
  // The outputs and the trace, checked before any work (an unwritable path is bad input, exit 2).
  // The C API writes the trace (a failed run's too); this command writes the outputs after the run.
  if (!tools::reserve_outputs(command, {j.trace_path, j.output_path, j.residual_path})) return cli::kExitUsage;
  if (!from_files) {
    in = gpu::make_fused_inputs(dtype, n, spec.rows, spec.hidden, static_cast<uint64_t>(j.seed), fused_in.specials);
  }
  const size_t per = in.count() * j.esize;
  std::vector<uint8_t> x, out(per * static_cast<size_t>(n)), ro(out.size());
  for (const auto& rank : in.x) x.insert(x.end(), rank.begin(), rank.end());
  // The run through the C API (exactcoll_sim_multinode_fused_add_rmsnorm): the world's flags as
  // exactcoll_sim_options, the chunk as exactcoll_sim_multinode_options, the contract as its
  // argument.
  exactcoll_sim_options options = world_options(j, spec.blocks);
  MultiNodeArgs call = multinode_args(j, spec.chunk_elements);
  exactcoll_sim_multinode_stats& stats = call.stats;
  const int status = exactcoll_sim_multinode_fused_add_rmsnorm(
      static_cast<int>(spec.contract), call.dtype, j.layout.nodes, j.layout.local_ranks, spec.rows, spec.hidden,
      spec.eps, x.data(), in.residual.data(), in.weight.data(), ro.data(), out.data(), &options, &call.options, &stats,
      nullptr);
  if (status != EXACTCOLL_OK) {
    const std::string why = tools::api_error("exactcoll_sim_multinode_fused_add_rmsnorm");
    if (status == EXACTCOLL_ERROR_INVALID_ARGUMENT) return cli::fail(command, why + " (no output was written)");
    return cli::fail(command, "the run failed: " + why, cli::kExitFailure);
  }
  const std::vector<int64_t> shape = {n, spec.rows, spec.hidden};
  try {
    npy::OutputFiles files({j.output_path, j.residual_path});
    if (!j.output_path.empty()) files.write_npy(j.output_path, j.npy_type, shape, out.data(), out.size());
    if (!j.residual_path.empty()) files.write_npy(j.residual_path, j.npy_type, shape, ro.data(), ro.size());
    files.commit();
  } catch (const npy::NpyError& e) {
    return cli::fail(command, e.what(), cli::kExitFailure);
  }
  std::cout << command << " " << j.f.dtype << ": " << n << " ranks x [" << spec.rows << ", " << spec.hidden << "] ("
            << j.input_note << "), " << layout_text(j.layout) << ", " << exchange_text(j, Op::kAllReduce) << ", "
            << j.schedule_text << ", " << stats.messages << " messages; out sha256 "
            << tools::sha256_hex(out.data(), out.size()) << " residual_out sha256 "
            << tools::sha256_hex(ro.data(), ro.size()) << "\n";
  return cli::kExitOk;
}

// Step 3b of multinode_main: a collective (its input read or made, the run, the files, the
// summary). Returns the exit code.
int run_collective(const cli::ArgParser& parser, Job& j) {
  const std::string& command = j.command;
  const std::string& input_path = j.input_path;
  const DType dtype = j.dtype;
  const int n = j.n;
  const size_t esize = j.esize;
  int64_t& count = j.count;
  std::string& input_note = j.input_note;
  const Kind kind = j.kind;
  MultiNodeSpec spec;
  spec.op = kind == Kind::kAllReduce       ? Op::kAllReduce
            : kind == Kind::kReduceScatter ? Op::kReduceScatter
                                           : Op::kAllGather;
  spec.dtype = dtype;
  spec.blocks = static_cast<int>(j.blocks);
  spec.chunk_elements = static_cast<size_t>(j.chunk);
  spec.contract = j.contract;
  if (input_path.empty() == !parser.given("count")) return cli::fail(command, "give --input FILE or --count C");
  gpu::RankInputs file;
  if (!input_path.empty()) {
    if (const std::string p = gpu::read_rank_inputs(input_path, dtype, n, "--ranks", &file); !p.empty()) {
      return cli::fail(command, p);
    }
    count = static_cast<int64_t>(file.count);
    input_note = file.note;
  }
  if (count < 1) return cli::fail(command, "give --count C >= 1");
  if (static_cast<uint64_t>(count) * static_cast<uint64_t>(n) * esize > (uint64_t{1} << 32)) {
    return cli::fail(command, "the input (--count x --ranks) is more than 4 GiB");
  }
  spec.count = static_cast<size_t>(count);
  if (std::string p = check_multinode_spec(spec, j.layout); !p.empty()) return cli::fail(command, p);
  for (uint64_t index : j.trace_elements) {
    if (index >= spec.count)
      return cli::fail(command, "--trace-elements index " + std::to_string(index) + " is past the count");
  }
  // The outputs, checked before any work (an unwritable path is bad input, exit 2). The C API
  // writes the trace (a failed run's too); this command writes the output file after the run.
  if (!tools::reserve_outputs(command, {j.trace_path, j.output_path})) return cli::kExitUsage;
  // The one-node command's banner, from the same function: what runs on which inputs.
  std::cout << tools::input_banner(command, n, spec.count, j.f.dtype, input_note);
  std::cout.flush();
  std::vector<uint8_t> random;
  if (input_path.empty()) {
    const auto in = gpu::make_inputs(dtype, spec.count, n, static_cast<uint64_t>(j.seed), gpu::Pattern::kRandom);
    for (const auto& rank : in) random.insert(random.end(), rank.begin(), rank.end());
  }
  const size_t out_count = output_count(spec.op, spec.count, n);
  std::vector<uint8_t> out(out_count * esize * static_cast<size_t>(n));
  // The run through the C API (exactcoll_sim_multinode_collective): the world's flags as
  // exactcoll_sim_options (no progress bar: the multi-node simulator reports no progress), the
  // chunk as exactcoll_sim_multinode_options.
  exactcoll_sim_options options = world_options(j, spec.blocks);
  options.contract = static_cast<int>(spec.contract);  // the registry's values are the C values
  options.trace_elements = j.trace_elements.data();
  options.num_trace_elements = j.trace_elements.size();
  MultiNodeArgs call = multinode_args(j, spec.chunk_elements);
  exactcoll_sim_multinode_stats& stats = call.stats;
  const auto start = std::chrono::steady_clock::now();
  const int status = exactcoll_sim_multinode_collective(
      static_cast<int>(spec.op), call.dtype, j.layout.nodes, j.layout.local_ranks, spec.count,
      input_path.empty() ? random.data() : file.data.data(), out.data(), &options, &call.options, &stats, nullptr);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (status != EXACTCOLL_OK) {
    const std::string why = tools::api_error("exactcoll_sim_multinode_collective");
    if (status == EXACTCOLL_ERROR_INVALID_ARGUMENT) return cli::fail(command, why + " (no output was written)");
    return cli::fail(command, "the run failed: " + why, cli::kExitFailure);
  }
  const std::vector<int64_t> shape = {n, static_cast<int64_t>(out_count)};
  try {
    if (!j.output_path.empty()) npy::write_npy(j.output_path, j.npy_type, shape, out.data(), out.size());
  } catch (const npy::NpyError& e) {
    return cli::fail(command, e.what(), cli::kExitFailure);
  }
  char ms_text[32];
  std::snprintf(ms_text, sizeof ms_text, "%.3f", ms);
  std::cout << command << " " << j.f.dtype << ": " << n << " ranks x " << spec.count << " elements (" << input_note
            << "), " << layout_text(j.layout) << ", " << exchange_text(j, spec.op) << ", " << spec.blocks
            << (spec.blocks == 1 ? " block" : " blocks") << ", " << j.schedule_text << ", " << stats.messages
            << " messages, " << stats.cross_node_bytes << " bytes across nodes, " << ms_text << " ms; output "
            << npy::shape_text(shape) << (j.output.empty() ? "" : " -> " + j.output) << " sha256 "
            << tools::sha256_hex(out.data(), out.size()) << "\n";
  return cli::kExitOk;
}

int multinode_main(Kind kind, int argc, char** argv) {
  Job j;
  j.kind = kind;
  j.command = std::string("sim ") + kind_name(kind);
  j.fused = kind == Kind::kFused;
  // 1. Flags.
  if (const auto code = refuse_fault_flags(j.command, argc, argv)) return *code;
  cli::ArgParser parser = make_parser(&j);
  if (auto code = parser.parse(argc, argv)) return *code;

  // 2. Checks: the layout first (the most likely mistake), then the rest; nothing is written yet.
  if (const auto code = check_flags(parser, &j)) return *code;

  // 3. The fused op, or the collectives.
  return j.fused ? run_fused_op(parser, j) : run_collective(parser, j);
}

// Registered as "<op> --nodes": tools/sim sends `sim <op> ... --nodes M ...` here.
const cli::SimSubcommandRegistrar kAllReduce(
    {"allreduce --nodes", "all-reduce across M simulated nodes (carry chain, or the tree's exchange)",
     [](int c, char** v) { return multinode_main(Kind::kAllReduce, c, v); }});
const cli::SimSubcommandRegistrar kReduceScatter({"reduce_scatter --nodes", "reduce-scatter across M simulated nodes",
                                                  [](int c, char** v) {
                                                    return multinode_main(Kind::kReduceScatter, c, v);
                                                  }});
const cli::SimSubcommandRegistrar kAllGather({"allgather --nodes", "all-gather across M simulated nodes",
                                              [](int c, char** v) { return multinode_main(Kind::kAllGather, c, v); }});
const cli::SimSubcommandRegistrar kFused({"fused_rmsnorm --nodes", "the fused op across M simulated nodes",
                                          [](int c, char** v) { return multinode_main(Kind::kFused, c, v); }});

}  // namespace
}  // namespace exactcoll::multinode
