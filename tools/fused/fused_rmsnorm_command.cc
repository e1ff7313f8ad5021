#include "tools/fused/fused_rmsnorm_command.h"

#include <cstring>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "exactcoll/exactcoll.h"
#include "sim/fused/element_trace.h"
#include "sim/fused/fused_sim.h"
#include "sim/fused/reference.h"
#include "sim/world.h"
#include "tools/cli.h"
#include "tools/contract_flag.h"
#include "tools/sim/sim_subcommands.h"
#include "tools/inputs/fused_inputs.h"
#include "npy/npy.h"
#include "tools/progress/progress.h"
#include "tools/sha256/sha256.h"
#include "tools/sim/api_options.h"
#include "tools/sim/sim_flags.h"

namespace exactcoll::fused {
namespace {

constexpr const char* kCommand = "sim fused_rmsnorm";

// The inputs as typed copies (the npy buffers carry no alignment promise) and the problem over them.
template <class T>
struct TypedProblem {
  std::vector<T> x, residual, weight;
  FusedProblem<T> problem;
  TypedProblem(int ranks, int rows, int hidden, float eps, const npy::NpyArray& x_in, const npy::NpyArray& r_in,
               const npy::NpyArray& w_in)
      : x(x_in.element_count()), residual(static_cast<size_t>(rows) * hidden), weight(hidden) {
    std::memcpy(x.data(), x_in.data.data(), x_in.data.size());
    std::memcpy(residual.data(), r_in.data.data(), r_in.data.size());
    std::memcpy(weight.data(), w_in.data.data(), w_in.data.size());
    problem.ranks = ranks, problem.rows = rows, problem.hidden = hidden, problem.eps = eps;
    problem.x = x.data(), problem.residual = residual.data(), problem.weight = weight.data();
  }
};

// An alternative contract with traced elements: the reference computes the outputs and the traces
// of `elements` in the same call (departs: per element, the seq where it leaves canonical or -1).
template <class T>
void run_reference(Contract contract, int ranks, int rows, int hidden, float eps, const npy::NpyArray& x,
                   const npy::NpyArray& residual, const npy::NpyArray& weight, std::vector<uint8_t>* out,
                   std::vector<uint8_t>* residual_out, const std::vector<uint64_t>& elements,
                   std::vector<ElementTrace>* traces, std::vector<int>* departs) {
  const size_t count = static_cast<size_t>(rows) * hidden;
  const TypedProblem<T> in(ranks, rows, hidden, eps, x, residual, weight);
  std::vector<T> ro(count), y(count);
  *departs = trace_alternative<T>(contract, in.problem, elements, ro.data(), y.data(), traces);
  // Every rank gets the same bits under every contract.
  for (int r = 0; r < ranks; ++r) {
    std::memcpy(out->data() + r * count * sizeof(T), y.data(), count * sizeof(T));
    std::memcpy(residual_out->data() + r * count * sizeof(T), ro.data(), count * sizeof(T));
  }
}

// A simulated run's element traces (canonical or tree): the reference's under the same contract,
// checked against the run (its outputs on every rank, its own fold or tree_node events). Returns ""
// or what differs.
template <class T>
std::string trace_run(Contract contract, int ranks, int rows, int hidden, float eps, const npy::NpyArray& x,
                      const npy::NpyArray& residual, const npy::NpyArray& weight, const std::vector<uint8_t>& out,
                      const std::vector<uint8_t>& residual_out, const std::vector<uint64_t>& elements,
                      const sim::Tracer& tracer, std::vector<ElementTrace>* traces) {
  const size_t count = static_cast<size_t>(rows) * hidden;
  const TypedProblem<T> in(ranks, rows, hidden, eps, x, residual, weight);
  std::vector<std::vector<T>> run_ro(ranks, std::vector<T>(count)), run_out(ranks, std::vector<T>(count));
  std::vector<const T*> ro_ptrs, out_ptrs;
  for (int r = 0; r < ranks; ++r) {
    std::memcpy(run_ro[r].data(), residual_out.data() + r * count * sizeof(T), count * sizeof(T));
    std::memcpy(run_out[r].data(), out.data() + r * count * sizeof(T), count * sizeof(T));
    ro_ptrs.push_back(run_ro[r].data());
    out_ptrs.push_back(run_out[r].data());
  }
  return trace_simulated_run<T>(contract, in.problem, elements, ro_ptrs, out_ptrs, tracer.merged(), traces);
}

// One line per traced element for stdout: where its trace is, and how it was checked against the
// run (the library's contracts) or compares with canonical (an alternative).
std::string element_summary(const ElementTrace& t, int departs, const std::string& trace_path) {
  std::string line = "element " + std::to_string(t.index) + " [row " + std::to_string(t.row) + ", col " +
                     std::to_string(t.col) + "]: " + std::to_string(t.steps.size()) + " steps in " + trace_path;
  if (info(t.contract).library_contract) {  // canonical (unnamed, the default) or tree
    const std::string named = t.contract == Contract::kCanonical ? "" : std::string(", ") + contract_name(t.contract);
    return line + named + ", checked against the run bit for bit";
  }
  line += std::string(", ") + contract_name(t.contract);
  if (departs < 0) return line + " has canonical's bits at every step";
  line += " departs from canonical at seq " + std::to_string(departs) + " (" + t.steps[departs].step + ")";
  // Whether the two outputs end up differing: the residual_add and scale steps' marks.
  for (const char* step : {"residual_add", "scale"}) {
    for (const ElementStep& s : t.steps) {
      if (std::string(s.step) != step) continue;
      const bool same = s.vs_canonical == ElementStep::VsCanonical::kSame;
      line +=
          std::string(step == std::string("scale") ? ", out " : "; residual_out ") + (same ? "the same" : "differs");
    }
  }
  return line;
}

// What `sim fused_rmsnorm` was asked for: the flags' values (make_parser), then what check_flags
// resolves them to.
struct Request {
  // The flags (the world's flags are shared with every `exactcoll sim <op>`: tools/sim/sim_flags.h).
  tools::SimFlags f;
  int64_t blocks = 1, threads = 0, seed = 1;
  gpu::FusedInputFlags in;  // the input flags `gpu fused_rmsnorm` has too
  std::string output, algo_text = "one_stage", contract_text = "canonical";
  // Resolved by check_flags.
  sim::WorldOptions options;
  bool from_files = false;  // --input, --residual and --weight, not random inputs
  bool seed_given = false;  // --seed on the command line (the summary's input note says so)
  Contract contract = Contract::kCanonical;
  // A library contract (canonical, tree): the algorithms on the simulated world. Otherwise an
  // alternative: the scalar reference's emulation.
  bool simulated = true;
  DType dtype = DType::kBF16;
  std::string want;  // the npy dtype of the inputs and outputs
  int64_t ranks = 0;
  std::string output_file, residual_output_file;  // resolved paths; "" when not asked for
};

// The inputs (step 2 of run), and where they came from for the summary.
struct Inputs {
  npy::NpyArray x, residual, weight;
  std::string note;
};

// What step 3 of run computes: every rank's outputs, and the traced elements' steps.
struct Results {
  std::vector<uint8_t> out, residual_out;
  std::vector<ElementTrace> traces;  // --trace-elements: every step of each traced element
  std::vector<int> departs;          // alternatives: where each leaves canonical (-1: never)
};

// --contract's help: the library's contracts (the simulated algorithms), then the emulations.
std::string contract_help() {
  std::string text =
      "rounding contract. The library's, run by the simulated algorithms: " + cli::library_contract_help(kOnSimulator) +
      ". Emulations by the scalar reference:";
  bool first = true;
  for (const ContractInfo& e : kContractInfos) {
    if (e.library_contract) continue;
    text += std::string(first ? " " : "; ") + e.name;
    first = false;
  }
  return text + " (see above)";
}

// The command's flags, bound to q's fields.
cli::ArgParser make_parser(Request* q) {
  tools::SimFlags& f = q->f;
  gpu::FusedInputFlags& in = q->in;
  cli::ArgParser parser(
      "exactcoll sim fused_rmsnorm --ranks N --dtype bf16|fp16|fp32 (--input x.npy --residual r.npy --weight w.npy | "
      "--rows R --hidden H [--seed S] [--specials]) [--eps E] [--output out.npy] [--residual-output ro.npy] "
      "[--algo " +
          fused_algorithm_names(kOnSimulator, "|") + "] [--contract " + contract_names(0, "|") +
          "] [--blocks B] [--threads T] "
          "[--schedule threads|seeded] [--schedule-seed K] [--trace FILE] [--trace-elements I,J,...] "
          "[--chrome-trace FILE]",
      "Fused all-reduce + residual add + RMSNorm on the simulator. x.npy is [N, rows, H] (rank r's partial\n"
      "sums at [r]), r.npy [rows, H], w.npy [H]; bf16/fp16 as '<u2' bit patterns, fp32 as '<f4'. Outputs\n"
      "are [N, rows, H]. Without files, inputs are random from --seed (tools/inputs/fused_inputs.h: the\n"
      "same as `exactcoll gpu fused_rmsnorm` with the same --rows, --hidden and --seed).\n"
      "The library's contracts (canonical, and tree: the all-reduce folds the ranks as a balanced binary\n"
      "tree, every node rounded to storage, then the canonical residual add and RMSNorm) run the GPU's\n"
      "algorithms on the simulated ranks: core/fused_rmsnorm.h's one_stage, two_stage, push_one_stage,\n"
      "lamport_one_stage, lamport_two_stage and unfused, and core/fused_rmsnorm_kernels.h's\n"
      "one_stage_reg, gather_norm and push_one_stage_reg (the GPU's push_one_stage kernel), on blocks of\n"
      "--threads threads; the last three hold each row in registers where a block has exactly the RMSNorm\n"
      "tree's lanes (their default; H up to 2048 packs), and take core's path otherwise. Every algorithm,\n"
      "grid and schedule gives the same bits. The alternative contracts (simulator only) reproduce other\n"
      "systems' rounding with the scalar reference (sim/fused/reference.h). The last line ends with the\n"
      "sha256 of each output's bytes.\n"
      "--trace-elements I,J,... (with --trace FILE, under every contract) traces the whole op for each\n"
      "element (at most 4096): an index into [rows, H], row-major (row * H + col; the same index on every\n"
      "rank). FILE gets one \"element\" line per step (canonical and tree: after the run's events): the\n"
      "fold (each rank's add; under tree, each node of the ranks' tree instead: tree_node), the\n"
      "all-reduce's rounding, the residual add, the element's square and its lane, each butterfly level\n"
      "on its path to the row's sum of squares, inv and the output products, with exact hex bits. The\n"
      "steps of canonical and tree are checked against the run (every rank's output rows and its own\n"
      "fold or tree_node events) before they are written; an alternative contract's come from the\n"
      "reference call that computes its outputs and are marked \"same\"/\"departs\"/\"differs\" against\n"
      "canonical's (docs/numerics.md, \"Tracing one element\"). Alternatives take --trace and\n"
      "--trace-elements, not --chrome-trace (they have no schedule, so no timeline).\n"
      "With --nodes M it runs across M simulated nodes instead (the same bits, under --contract " +
          library_contract_names(kOnMultiNode, "|") +
          "; `exactcoll sim\n"
          "fused_rmsnorm --nodes M --help` lists that command's flags).");
  tools::add_world_flags(parser, &f);
  gpu::add_fused_input_flags(parser, &in);
  parser.add_int("seed", &q->seed, "seed of random inputs");
  parser.add_string("output", &q->output, "out.npy: [N, rows, H] normed output");
  parser.add_choice("algo", &q->algo_text, fused_algorithm_name_list(kOnSimulator),
                    "algorithm of the library's contracts (all give the same bits; auto = one_stage)");
  parser.add_choice("contract", &q->contract_text, contract_name_list(), contract_help());
  parser.add_int("blocks", &q->blocks,
                 "blocks per rank (1.." + std::to_string(kMaxBlocks) + "; the work split, same bits)");
  parser.add_int("threads", &q->threads,
                 "threads per block (1.." + std::to_string(contract::kMaxLanes) +
                     "; picks the register path or core's, same bits)");
  parser.set_default_note("threads",
                          "default: the RMSNorm tree's lanes (32 x ceil(min(H / pack, 1024) / 32)) for one_stage_reg, "
                          "gather_norm and push_one_stage_reg, 1 for the others (the register path of "
                          "lamport_one_stage and lamport_two_stage runs with its lanes, on rows of at most as many "
                          "packs as lanes)");
  parser.set_default_note("trace-elements",
                          "here an index is into [rows, H], row-major (row * H + col), and the whole fused op of each "
                          "is traced (every contract; see above)");
  return parser;
}

// Checks the parsed flags together and resolves q's remaining fields. Returns nullopt to go on, or
// the exit code to return now (the message printed).
std::optional<int> check_flags(const cli::ArgParser& parser, Request* q) {
  const tools::SimFlags& f = q->f;
  const std::string &input = q->in.input, &residual_path = q->in.residual, &weight_path = q->in.weight,
                    &residual_output = q->in.residual_output;
  const std::string& output = q->output;
  const std::string& contract_text = q->contract_text;
  const int64_t blocks = q->blocks, threads = q->threads, seed = q->seed;
  sim::WorldOptions& options = q->options;
  if (const std::string problem = tools::world_options(f, parser, &options); !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  const bool from_files = !input.empty() || !residual_path.empty() || !weight_path.empty();
  if (from_files && (input.empty() || residual_path.empty() || weight_path.empty())) {
    return cli::fail(kCommand,
                     "give all of --input, --residual and --weight (or --rows and --hidden for random inputs)");
  }
  if (from_files && (parser.given("rows") || parser.given("hidden") || parser.given("seed") || q->in.specials)) {
    return cli::fail(kCommand, "--rows, --hidden, --seed and --specials are for random inputs, not with --input");
  }
  if (!from_files && (!parser.given("rows") || !parser.given("hidden"))) {
    return cli::fail(kCommand, "give --input, --residual and --weight, or --rows and --hidden for random inputs");
  }
  if (seed < 0) return cli::fail(kCommand, "--seed must be >= 0, got " + std::to_string(seed));
  if (!output.empty() && output == residual_output) {
    return cli::fail(kCommand, "--output and --residual-output name the same file");
  }
  if (blocks < 1 || blocks > kMaxBlocks) {
    return cli::fail(kCommand, "--blocks must be 1.." + std::to_string(kMaxBlocks) + ", got " + std::to_string(blocks));
  }
  if (parser.given("threads") && (threads < 1 || threads > contract::kMaxLanes)) {
    return cli::fail(
        kCommand, "--threads must be 1.." + std::to_string(contract::kMaxLanes) + ", got " + std::to_string(threads));
  }
  if (const std::string problem = check_eps(q->in.eps); !problem.empty()) return cli::fail(kCommand, problem);
  Contract contract = Contract::kCanonical;
  parse_contract(contract_text, &contract);
  const bool simulated = info(contract).library_contract;
  if (!simulated) {
    // Name the flag actually given: "--algo one_stage" refused with a word about trace flags
    // read as a bug.
    std::string given;
    for (const char* flag : {"algo", "blocks", "threads", "schedule", "schedule-seed", "chrome-trace"}) {
      if (parser.given(flag)) given += (given.empty() ? "--" : ", --") + std::string(flag);
    }
    if (!given.empty()) {
      return cli::fail(kCommand, given + " applies only to --contract " + library_contract_names(0, " or ") +
                                     " (the simulated algorithms); " + contract_text +
                                     " is one fixed computation, by the scalar reference " +
                                     "(sim/fused/reference.h), so it has no algorithm, grid, schedule or timeline " +
                                     "(its elements' steps can still be traced)");
    }
    if (!f.trace.empty() && options.trace_elements.empty()) {
      return cli::fail(kCommand, "--trace with --contract " + contract_text +
                                     " needs --trace-elements: the reference has no run to trace, only elements");
    }
  }
  q->from_files = from_files;
  q->seed_given = parser.given("seed");
  q->contract = contract;
  q->simulated = simulated;
  q->dtype = *tools::parse_dtype(f.dtype);
  q->want = q->dtype == DType::kFP32 ? npy::kF32 : npy::kU16;
  q->ranks = options.ranks;
  q->output_file = output.empty() ? "" : cli::resolve_path(output);
  q->residual_output_file = residual_output.empty() ? "" : cli::resolve_path(residual_output);
  return std::nullopt;
}

// "" or why the inputs, outputs and the world's staging (about 4 (ranks + 1) row blocks) of a
// [rows, hidden] problem do not fit this process's memory.
std::string check_memory(DType dtype, int64_t ranks, uint64_t rows, uint64_t hidden) {
  const unsigned __int128 bytes = static_cast<unsigned __int128>(rows) * hidden *
                                  static_cast<unsigned>(dtype_size(dtype)) * (4 * static_cast<uint64_t>(ranks) + 4);
  return cli::check_memory(bytes > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(bytes),
                           "the inputs, outputs and staging of " + std::to_string(ranks) + " ranks");
}

// Step 2 of run: the inputs, from files (readable, the flags' dtype, consistent shapes) or random.
// Returns nullopt to go on, or the exit code to return now (the message printed).
std::optional<int> read_inputs(const Request& q, Inputs* inputs) {
  const std::string &input = q.in.input, &residual_path = q.in.residual, &weight_path = q.in.weight;
  const int64_t rows_flag = q.in.rows, hidden_flag = q.in.hidden, seed = q.seed, ranks = q.ranks;
  const bool specials = q.in.specials;
  const DType dtype = q.dtype;
  const std::string& want = q.want;
  npy::NpyArray &x = inputs->x, &residual = inputs->residual, &weight = inputs->weight;
  std::string& input_note = inputs->note;
  if (!q.from_files) {
    if (rows_flag < 1 || rows_flag > (1 << 24) || hidden_flag < 1 || hidden_flag > (1 << 24)) {
      return cli::fail(kCommand, "--rows and --hidden must be in 1..16777216");
    }
    if (static_cast<uint64_t>(rows_flag) * static_cast<uint64_t>(hidden_flag) * static_cast<uint64_t>(ranks + 3) *
            static_cast<uint64_t>(dtype_size(dtype)) >
        (uint64_t{1} << 34)) {
      return cli::fail(kCommand, "--rows x --hidden x --ranks is more than 16 GiB of inputs and outputs");
    }
    const int pack = dtype == DType::kFP32 ? Storage<float>::kPack : Storage<bf16>::kPack;
    if (hidden_flag % pack != 0) {
      return cli::fail(kCommand, "hidden size " + std::to_string(hidden_flag) + " is not a positive multiple of the " +
                                     q.f.dtype + " pack (" + std::to_string(pack) + " elements)");
    }
    if (const std::string problem = check_memory(dtype, ranks, rows_flag, hidden_flag); !problem.empty()) {
      return cli::fail(kCommand, problem);
    }
    const gpu::FusedInputs in =
        gpu::make_fused_inputs(dtype, static_cast<int>(ranks), static_cast<int>(rows_flag),
                               static_cast<int>(hidden_flag), static_cast<uint64_t>(seed), specials);
    x.dtype = residual.dtype = weight.dtype = want;
    x.shape = {ranks, rows_flag, hidden_flag};
    for (const auto& xr : in.x) x.data.insert(x.data.end(), xr.begin(), xr.end());
    residual.shape = {rows_flag, hidden_flag};
    residual.data = in.residual;
    weight.shape = {hidden_flag};
    weight.data = in.weight;
    input_note = tools::random_input_note(seed, q.seed_given, specials);
  }
  if (q.from_files) {
    try {
      x = npy::read_npy(cli::resolve_path(input));
      residual = npy::read_npy(cli::resolve_path(residual_path));
      weight = npy::read_npy(cli::resolve_path(weight_path));
    } catch (const npy::NpyError& e) {
      return cli::fail(kCommand, e.what());
    }
    input_note = input + " " + npy::shape_text(x.shape);
  }
  if (const std::string problem = gpu::check_fused_arrays(dtype, ranks, "--ranks", {input, x},
                                                          {residual_path, residual}, {weight_path, weight});
      !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  const int64_t rows = x.shape[1], hidden = x.shape[2];
  if (const std::string problem = check_memory(dtype, ranks, rows, hidden); !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  return std::nullopt;
}

// The simulated run's spec for [rows, hidden] inputs, checked (and the traced elements with it).
// Returns nullopt to go on, or the exit code to return now (the message printed).
std::optional<int> make_spec(const Request& q, int64_t rows, int64_t hidden, FusedSpec* spec_out) {
  FusedSpec& spec = *spec_out;
  // The choices are the simulator's names; auto stands for one_stage (the same bits).
  spec.algo = parse_fused_algorithm_name(q.algo_text, kOnSimulator).value_or(FusedAlgorithm::kAuto);
  if (spec.algo == FusedAlgorithm::kAuto) spec.algo = FusedAlgorithm::kOneStage;
  spec.dtype = q.dtype;
  spec.rows = static_cast<int>(rows);
  spec.hidden = static_cast<int>(hidden);
  spec.eps = static_cast<float>(q.in.eps);
  spec.blocks = static_cast<int>(q.blocks);
  spec.threads = static_cast<int>(q.threads);
  spec.contract = q.simulated ? q.contract : Contract::kCanonical;  // an alternative is the reference's
  if (const std::string problem = check_fused_spec(spec, static_cast<int>(q.ranks), q.options.schedule);
      !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  for (uint64_t i : q.options.trace_elements) {
    if (i >= static_cast<uint64_t>(rows * hidden)) {
      return cli::fail(kCommand, "--trace-elements index " + std::to_string(i) +
                                     " is past rows * H = " + std::to_string(rows * hidden));
    }
  }
  return std::nullopt;
}

// Step 3 of run through the C API (exactcoll_sim_fused_add_rmsnorm), as a C or Python caller's:
// a library contract's algorithm on the simulated world (its options carry the world's flags, the
// grid, fault injection and the progress callback behind the bar; the library writes the traces, a
// failed run's too), or an alternative contract's scalar reference (every rank the same bits).
// Every flag was checked before (check_flags, read_inputs, make_spec), so a refusal here is a fault
// never reached (exit 2) or a bug; a failed run exits 3, and its outputs are never written.
// Returns nullopt to go on, or the exit code to return now (the message printed).
std::optional<int> run_through_api(const Request& q, const Inputs& inputs, const FusedSpec& spec, Results* results) {
  const std::vector<std::string> paths = tools::trace_paths(q.f);
  tools::ApiProgress progress;
  exactcoll_sim_options options = tools::api_sim_options(q.f, q.options, paths, &progress);
  int algo = EXACTCOLL_FUSED_AUTO;  // an alternative contract's: the reference has no algorithm
  if (q.simulated) {
    algo = static_cast<int>(spec.algo);  // the registry's values are the C values
    options.blocks = spec.blocks;
    options.threads = spec.threads;
  } else {
    // The reference has no run for a fault to stop: the command has always accepted --fail-rank and
    // --fail-at-step with an alternative contract and ignored them (the C API refuses them).
    options.fail_rank = -1;
    options.fail_at_step = 0;
  }
  int dtype = 0;
  exactcoll_dtype_from_name(q.f.dtype.c_str(), &dtype);  // checked by world_options
  int status = EXACTCOLL_OK;
  {
    std::optional<tools::ProgressBar> bar;  // the reference has no run to show
    if (q.simulated) bar.emplace(kCommand, [&progress] { return progress.now(); });
    status = exactcoll_sim_fused_add_rmsnorm(algo, static_cast<int>(q.contract), dtype, static_cast<int>(q.ranks),
                                             spec.rows, spec.hidden, spec.eps, inputs.x.data.data(),
                                             inputs.residual.data.data(), inputs.weight.data.data(),
                                             results->residual_out.data(), results->out.data(), &options, nullptr);
  }
  if (status == EXACTCOLL_OK) return std::nullopt;
  const std::string why = tools::api_error("exactcoll_sim_fused_add_rmsnorm");
  if (status != EXACTCOLL_ERROR_INVALID_ARGUMENT)
    return cli::fail(kCommand, "the run failed: " + why, cli::kExitFailure);
  // The library names its option fields; the command names its flags, and says no output was written.
  const std::string unreached = "fail_at_step ", unwritable = "cannot write the trace: ";
  if (why.rfind(unreached, 0) == 0) {
    return cli::fail(kCommand, "--fail-at-step " + why.substr(unreached.size()) + " (no output was written)");
  }
  // A trace that cannot be written after the run (its path was reserved before): an I/O failure.
  if (why.rfind(unwritable, 0) == 0) return cli::fail(kCommand, why.substr(unwritable.size()), cli::kExitFailure);
  return cli::fail(kCommand, why + " (no output was written)");
}

// Step 3 of run under a library contract (canonical or tree: spec.contract; count: the elements of
// one rank's [rows, H]) with traced elements: the algorithm on a simulated world of this command's,
// the traced elements checked against the run, and the traces written (a failed run's too; its
// outputs never). This stays out of the C API: the check compares the reference's steps with the
// run's own fold or tree_node events (the world's sim::Tracer) and its every output row, and a C
// caller gets only the trace files back, not the events nor a report (the stdout lines: steps per
// element, checked or departing); an element report through the C API would be a second trace
// format and result struct made for this command alone.
// Returns nullopt to go on, or the exit code to return now (the message printed).
std::optional<int> run_traced(const Request& q, const Inputs& inputs, const FusedSpec& spec, size_t count,
                              npy::OutputFiles* files, Results* results) {
  const sim::WorldOptions& options = q.options;
  const tools::SimFlags& f = q.f;
  const int64_t ranks = q.ranks;
  const npy::NpyArray &x = inputs.x, &residual = inputs.residual, &weight = inputs.weight;
  std::vector<uint8_t>&out = results->out, &residual_out = results->residual_out;
  std::vector<ElementTrace>& traces = results->traces;
  const size_t elem = static_cast<size_t>(dtype_size(q.dtype));
  FusedIo io;
  for (int r = 0; r < ranks; ++r) {
    io.x.push_back(x.data.data() + r * count * elem);
    io.residual.push_back(residual.data.data());
    io.weight.push_back(weight.data.data());
    io.out.push_back(out.data() + r * count * elem);
    io.residual_out.push_back(residual_out.data() + r * count * elem);
  }
  std::optional<sim::World> world;
  std::string failure;
  int failure_code = cli::kExitFailure;
  try {
    world.emplace(options);
    tools::ProgressBar bar(kCommand, [&world] { return world->progress(); });
    run_fused(*world, spec, io);
    failure = tools::unreached_fault(options, *world);
    if (!failure.empty()) failure_code = cli::kExitUsage;
  } catch (const sim::SimError& e) {
    failure = std::string("the run failed: ") + e.what();
  }
  // The traced elements' whole computation, checked against the run (a difference is an error).
  if (failure.empty() && !options.trace_elements.empty() && world && world->tracer() != nullptr) {
    const int n = static_cast<int>(ranks);
    const std::vector<uint64_t>& el = options.trace_elements;
    const Contract c = spec.contract;
    std::string problem;
    switch (q.dtype) {
      case DType::kBF16:
        problem = trace_run<bf16>(c, n, spec.rows, spec.hidden, spec.eps, x, residual, weight, out, residual_out, el,
                                  *world->tracer(), &traces);
        break;
      case DType::kFP16:
        problem = trace_run<fp16>(c, n, spec.rows, spec.hidden, spec.eps, x, residual, weight, out, residual_out, el,
                                  *world->tracer(), &traces);
        break;
      case DType::kFP32:
        problem = trace_run<float>(c, n, spec.rows, spec.hidden, spec.eps, x, residual, weight, out, residual_out, el,
                                   *world->tracer(), &traces);
        break;
    }
    if (!problem.empty()) {
      return cli::fail(kCommand, "the element trace disagrees with the run (a bug; nothing written): " + problem,
                       cli::kExitFailure);
    }
  }
  // The traces show what happened, a failed run's too; its outputs are never written.
  try {
    if (world && world->tracer() != nullptr) {
      if (!f.trace.empty()) {
        const std::string text = world->tracer()->json_lines() + element_trace_json(traces);
        files->write(cli::resolve_path(f.trace), text.data(), text.size());
      }
      if (!f.chrome_trace.empty()) {
        const std::string text = world->tracer()->chrome_trace(options.schedule == sim::Schedule::kSeeded);
        files->write(cli::resolve_path(f.chrome_trace), text.data(), text.size());
      }
    }
    if (!failure.empty()) files->commit();
  } catch (const npy::NpyError& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
  if (!failure.empty()) return cli::fail(kCommand, failure, failure_code);
  return std::nullopt;
}

// Step 3 of run under an alternative contract with traced elements: the scalar reference's outputs
// (every rank the same) and the traced elements' steps, marked against canonical's, from the one
// reference call (sim/fused/element_trace.h: the trace comes from the computation that makes the
// outputs). Stays out of the C API for the reason run_traced does: the report is this command's.
void run_alternative(const Request& q, const Inputs& inputs, const FusedSpec& spec, Results* results) {
  const npy::NpyArray &x = inputs.x, &residual = inputs.residual, &weight = inputs.weight;
  const int n = static_cast<int>(q.ranks);
  const Contract contract = q.contract;
  const std::vector<uint64_t>& el = q.options.trace_elements;
  Results& r = *results;
  switch (q.dtype) {
    case DType::kBF16:
      run_reference<bf16>(contract, n, spec.rows, spec.hidden, spec.eps, x, residual, weight, &r.out, &r.residual_out,
                          el, &r.traces, &r.departs);
      break;
    case DType::kFP16:
      run_reference<fp16>(contract, n, spec.rows, spec.hidden, spec.eps, x, residual, weight, &r.out, &r.residual_out,
                          el, &r.traces, &r.departs);
      break;
    case DType::kFP32:
      run_reference<float>(contract, n, spec.rows, spec.hidden, spec.eps, x, residual, weight, &r.out, &r.residual_out,
                           el, &r.traces, &r.departs);
      break;
  }
}

// Step 4 of run: the outputs of `shape` ([ranks, rows, H]), each written atomically (an
// alternative contract's element trace too). Returns nullopt to go on, or the exit code to return now (the message
// printed).
std::optional<int> write_outputs(const Request& q, const std::vector<int64_t>& shape, npy::OutputFiles* files,
                                 const Results& results) {
  const std::string& want = q.want;
  const std::vector<uint8_t>&out = results.out, &residual_out = results.residual_out;
  try {
    if (!q.simulated && !q.f.trace.empty()) {
      const std::string text = element_trace_json(results.traces);
      files->write(cli::resolve_path(q.f.trace), text.data(), text.size());
    }
    if (!q.output_file.empty()) files->write_npy(q.output_file, want, shape, out.data(), out.size());
    if (!q.residual_output_file.empty()) {
      files->write_npy(q.residual_output_file, want, shape, residual_out.data(), residual_out.size());
    }
    files->commit();
  } catch (const npy::NpyError& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
  return std::nullopt;
}

// The last lines: one per traced element, then the run's summary (shape: [ranks, rows, H]) with
// each output's sha256.
void print_summary(const Request& q, const Inputs& inputs, const FusedSpec& spec, const std::vector<int64_t>& shape,
                   const Results& results) {
  const std::vector<ElementTrace>& traces = results.traces;
  const std::vector<int>& departs = results.departs;
  const std::vector<uint8_t>&out = results.out, &residual_out = results.residual_out;
  for (size_t k = 0; k < traces.size(); ++k) {
    std::cout << element_summary(traces[k], k < departs.size() ? departs[k] : -1, q.f.trace) << "\n";
  }
  std::cout << kCommand << " " << q.f.dtype << ": " << q.ranks << " ranks x [" << shape[1] << ", " << shape[2] << "] ("
            << inputs.note << "), contract " << q.contract_text;
  if (q.simulated) {
    std::cout << ", " << fused_algorithm_name(spec.algo) << ", " << spec.blocks
              << (spec.blocks == 1 ? " block" : " blocks");
    if (const int t = fused_threads(spec); t > 1) std::cout << " x " << t << " threads";
    if (spec.algo == FusedAlgorithm::kGatherNorm || spec.algo == FusedAlgorithm::kOneStageReg ||
        spec.algo == FusedAlgorithm::kPushOneStageReg) {
      std::cout << (fused_register_path(spec) ? " (register path)" : " (core's path)");
    }
    std::cout << ", " << tools::schedule_note(q.options);
  }
  std::cout << "; out sha256 " << tools::sha256_hex(out.data(), out.size()) << " residual_out sha256 "
            << tools::sha256_hex(residual_out.data(), residual_out.size()) << "\n";
}

int run(int argc, char** argv) {
  // 1. Flags, checked together.
  Request q;
  cli::ArgParser parser = make_parser(&q);
  if (auto code = parser.parse(argc, argv)) return *code;
  if (auto code = check_flags(parser, &q)) return *code;
  // The outputs, reserved before any work: an unwritable path is bad input (exit 2), and a failed
  // write of one output leaves none of them behind. Without traced elements the C API runs the op
  // and writes the traces itself (reserving them beside the same paths): the command then keeps
  // only its .npy outputs reserved.
  const bool through_api = q.options.trace_elements.empty();
  auto files = tools::reserve_outputs(kCommand, [&] {
    std::vector<std::string> paths = tools::trace_paths(q.f);
    paths.push_back(q.output_file);
    paths.push_back(q.residual_output_file);
    return paths;
  }());
  if (!files) return cli::kExitUsage;
  if (through_api) {
    files.reset();
    files = tools::reserve_outputs(kCommand, {q.output_file, q.residual_output_file});
    if (!files) return cli::kExitUsage;
  }

  // 2. Inputs, and the run's spec for their shape.
  Inputs inputs;
  if (auto code = read_inputs(q, &inputs)) return *code;
  const int64_t rows = inputs.x.shape[1], hidden = inputs.x.shape[2];
  FusedSpec spec;
  if (auto code = make_spec(q, rows, hidden, &spec)) return *code;

  // 3. Run: the algorithm on the simulated world under a library contract (canonical, tree), or the
  //    alternative contract's reference; through the C API unless elements are traced.
  const size_t count = static_cast<size_t>(rows * hidden);
  const size_t elem = static_cast<size_t>(dtype_size(q.dtype));
  Results results;
  results.out.resize(count * elem * q.ranks);
  results.residual_out.resize(count * elem * q.ranks);
  if (through_api) {
    if (auto code = run_through_api(q, inputs, spec, &results)) return *code;
  } else if (q.simulated) {
    if (auto code = run_traced(q, inputs, spec, count, files.get(), &results)) return *code;
  } else {
    run_alternative(q, inputs, spec, &results);
  }

  // 4. Outputs (each written atomically), then the summary.
  const std::vector<int64_t> shape = {q.ranks, rows, hidden};
  if (auto code = write_outputs(q, shape, files.get(), results)) return *code;
  print_summary(q, inputs, spec, shape, results);
  return cli::kExitOk;
}

const cli::SimSubcommandRegistrar kRegistrar(
    {"fused_rmsnorm", "fused all-reduce + residual add + RMSNorm (canonical, tree or an alternative contract)",
     fused_rmsnorm_main});

}  // namespace

int fused_rmsnorm_main(int argc, char** argv) {
  // Messages name the command as the user typed it: "exactcoll sim fused_rmsnorm: ...".
  std::vector<char*> args(argv, argv + argc);
  std::string name = kCommand;
  if (!args.empty()) args[0] = name.data();
  return run(static_cast<int>(args.size()), args.data());
}

}  // namespace exactcoll::fused
