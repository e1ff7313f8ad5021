// `exactcoll sim <op>`: the collectives on the CPU simulator.
//
//   exactcoll sim allreduce|reduce_scatter|allgather --ranks N --dtype bf16|fp16|fp32
//       [--input in.npy | --count C --seed S] [--output out.npy] [--algo ALGO (all-reduce: the
//       registry's simulator entries, core/registry.h)] [--contract canonical|tree] [--blocks B]
//       [--schedule threads|seeded] [--schedule-seed K] [--trace FILE]
//       [--trace-elements I,J,...] [--chrome-trace FILE] [--print]
//
// in.npy is [N, ...] (rank first); bf16 and fp16 are '<u2' bit patterns, fp32 '<f4'. Outputs keep
// the per-rank shape: all-reduce [N, ...]; reduce_scatter [N, count/N]; allgather [N, N*count].
// Random inputs come from //tools/gpu:inputs (pattern "random"), so `exactcoll gpu` with the same
// --count and --seed runs on the same inputs. Small runs (count <= 32, or --print) print inputs
// and outputs as floats. The last line is a summary ending with the sha256 of the output bytes.
// Bad input exits 2 before anything is written; a failed run (deadlock, timeout) exits 3 and
// writes no output (the traces are written: they show what happened). --contract tree folds every
// element as the tree contract (sim::CollectiveSpec::contract); a traced element then records a
// tree_node event per internal node of its tree, then its round.
//
// The run itself goes through the C API (exactcoll_sim_collective, include/exactcoll/exactcoll.h),
// as a C or Python caller's would: its options carry the world's flags, fault injection and a
// progress callback (the bar on stderr), and the library writes the traces. This command checks its
// flags first (exit 2 with the flags' names), and writes the output .npy (atomically) itself.
//
// Other ops (`exactcoll sim fused_rmsnorm`) register through tools/sim/sim_subcommands.h and
// are dispatched from here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/registry.h"
#include "core/signal.h"
#include "core/storage.h"
#include "exactcoll/exactcoll.h"
#include "sim/collectives.h"
#include "sim/trace.h"
#include "sim/world.h"
#include "tools/cli.h"
#include "tools/contract_flag.h"
#include "tools/sim/sim_subcommands.h"
#include "tools/inputs/inputs.h"
#include "tools/inputs/rank_inputs.h"
#include "npy/npy.h"
#include "tools/progress/progress.h"
#include "tools/sha256/sha256.h"
#include "tools/sim/api_options.h"
#include "tools/sim/sim_flags.h"

namespace exactcoll::tools {
namespace {

using sim::Algorithm;
using sim::Op;

constexpr size_t kPrintLimit = 32;

float element_value(DType d, const uint8_t* bytes, size_t i) {
  if (d == DType::kFP32) {
    float f;
    std::memcpy(&f, bytes + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes + 2 * i, 2);
  return d == DType::kBF16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
}

// The values as floats (shortest text that reads back exactly), 8 to a line; continuation lines
// are indented by `indent` spaces.
std::string row_text(DType d, const uint8_t* bytes, size_t count, size_t indent) {
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    if (i > 0 && i % 8 == 0) {
      out.push_back('\n');
      out.append(indent, ' ');
    } else if (i > 0) {
      out.push_back(' ');
    }
    std::string v = sim::float_text(element_value(d, bytes, i));
    if (v.size() < 12) v.insert(0, 12 - v.size(), ' ');
    out += v;
  }
  return out;
}

std::string rank_label(int r, int n) {
  std::string label = "  rank " + std::to_string(r) + ":";
  if (n > 10 && r < 10) label += " ";
  return label;
}

// Returns "" when the run's buffers fit in this process's memory (cli::check_memory), else why not:
// the inputs and outputs here, the world's staging of both and the algorithm's scratch per rank.
std::string check_memory(const sim::CollectiveSpec& spec, int ranks) {
  const unsigned __int128 element = static_cast<unsigned>(dtype_size(spec.dtype));
  const unsigned __int128 per_rank = 2 * element * spec.count +
                                     2 * element * sim::output_count(spec.op, spec.count, ranks) +
                                     sim::scratch_bytes(spec, ranks);
  const unsigned __int128 total = per_rank * static_cast<unsigned>(ranks);
  return cli::check_memory(total > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(total),
                           "the inputs, outputs, staging and scratch of " + std::to_string(ranks) + " ranks");
}

// What `sim <op>` was asked for: the flags' values (make_parser), then what check_flags resolves
// them to.
struct Request {
  Op op = Op::kAllReduce;
  std::string command;  // "sim <op>", as the messages name it
  SimFlags f;
  std::string input_path, output_path, algo_text = "auto", contract_text = "canonical";
  int64_t count = 0, seed = 1, blocks = 1;
  bool print = false;
  // Resolved by check_flags.
  sim::WorldOptions options;
  Contract contract = Contract::kCanonical;
  DType dtype = DType::kBF16;
  size_t esize = 0;
};

// Every rank's input, concatenated (step 3 of collective_main), with its shape and where it came
// from.
struct Inputs {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> shape;
  std::string note;
};

// The command's flags for q->op, bound to q's fields.
cli::ArgParser make_parser(Request* q) {
  const Op op = q->op;
  const std::string& command = q->command;
  cli::ArgParser parser(
      "exactcoll " + command +
          " --ranks N --dtype bf16|fp16|fp32 [--input in.npy | --count C --seed S] [--output out.npy]" +
          (op == Op::kAllReduce ? " [--algo " + algorithm_names(kOnSimulator, op, "|") + "]" : "") + " [--contract " +
          library_contract_names(kOnSimulator, "|") +
          "] [--blocks B] [--schedule threads|seeded] [--schedule-seed K] [--trace FILE] [--trace-elements I,J,...] "
          "[--chrome-trace FILE] [--print]",
      std::string("Runs ") + sim::op_name(op) +
          " on N simulated ranks under a rounding contract (--contract; docs/numerics.md). in.npy is\n"
          "[N, ...], rank first ('<u2' bit patterns for bf16/fp16, '<f4' for fp32). The last line ends\n"
          "with the sha256 of the output bytes.\n"
          "With --nodes M it runs across M simulated nodes instead (the same bits, under --contract " +
          library_contract_names(kOnMultiNode, "|") + "; `exactcoll sim " + sim::op_name(op) +
          " --nodes M --help` lists that command's flags).");
  add_world_flags(parser, &q->f);
  parser.add_string("input", &q->input_path, "input .npy [N, ...] (rank first)");
  parser.add_int("count", &q->count, "elements per rank of random input (instead of --input)");
  parser.set_default_note("count", "required without --input");
  parser.add_int("seed", &q->seed, "seed of the random input");
  parser.add_string("output", &q->output_path, "write the output .npy here");
  if (op == Op::kAllReduce) {
    parser.add_choice("algo", &q->algo_text, algorithm_name_list(kOnSimulator, op),
                      ("algorithm; auto = one_shot below 256 KiB per rank, two_shot above (the GPUs' auto picks by its "
                       "tuned table instead; every choice gives the same bits)"));
  }
  cli::add_contract_flag(parser, &q->contract_text, kOnSimulator,
                         "the rounding contract every element's fold over the ranks follows (every algorithm gives "
                         "its bits; a traced element records its fold under either: fold events, or tree_node events)");
  parser.add_int("blocks", &q->blocks, "blocks per rank (the work split; same bits for every count)");
  parser.add_bool("print", &q->print, "print inputs and outputs as floats (default when count <= 32)");
  return parser;
}

// Checks the parsed flags together and resolves q's remaining fields. Returns nullopt to go on, or
// the exit code to return now (the message printed).
std::optional<int> check_flags(const cli::ArgParser& parser, Request* q) {
  const std::string& command = q->command;
  const std::string& input_path = q->input_path;
  const int64_t seed = q->seed, blocks = q->blocks;
  std::string problem = world_options(q->f, parser, &q->options);
  if (!problem.empty()) return cli::fail(command, problem);
  q->dtype = *parse_dtype(q->f.dtype);
  q->esize = static_cast<size_t>(dtype_size(q->dtype));
  if (!input_path.empty() && parser.given("count")) return cli::fail(command, "give --input or --count, not both");
  if (input_path.empty() && !parser.given("count")) return cli::fail(command, "give --input FILE or --count C");
  if (parser.given("seed") && !input_path.empty())
    return cli::fail(command, "--seed applies to random inputs (--count)");
  if (seed < 0) return cli::fail(command, "--seed must be >= 0, got " + std::to_string(seed));
  if (blocks < 1 || blocks > kMaxBlocks) {
    return cli::fail(command, "--blocks must be 1.." + std::to_string(kMaxBlocks) + ", got " + std::to_string(blocks));
  }
  q->contract = cli::library_contract(q->contract_text);
  return std::nullopt;
}

// Step 3 of collective_main: the inputs, the file (checked against --dtype and --ranks) or random
// ones, into *inputs, and the run's spec for them (checked, with the traced elements and the
// memory). Returns nullopt to go on, or the exit code to return now (the message printed).
std::optional<int> read_inputs(const cli::ArgParser& parser, const Request& q, sim::CollectiveSpec* spec_out,
                               Inputs* inputs) {
  const std::string& command = q.command;
  const DType dtype = q.dtype;
  const size_t esize = q.esize;
  const int64_t seed = q.seed;
  const int n = q.options.ranks;
  int64_t count = q.count;
  sim::CollectiveSpec& spec = *spec_out;
  std::vector<uint8_t>& input = inputs->bytes;
  std::vector<int64_t>& input_shape = inputs->shape;
  std::string& input_note = inputs->note;
  std::string problem;
  spec.op = q.op;
  spec.dtype = dtype;
  spec.blocks = static_cast<int>(q.blocks);
  spec.contract = q.contract;
  if (!sim::parse_algorithm(q.algo_text, &spec.algorithm)) return cli::fail(command, "unknown --algo " + q.algo_text);
  if (!q.input_path.empty()) {
    gpu::RankInputs file;
    if (problem = gpu::read_rank_inputs(q.input_path, dtype, n, "--ranks", &file); !problem.empty()) {
      return cli::fail(command, problem);
    }
    count = static_cast<int64_t>(file.count);
    input = std::move(file.data);
    input_shape = std::move(file.shape);
    input_note = std::move(file.note);
  } else {
    if (count < 1) return cli::fail(command, "--count must be >= 1, got " + std::to_string(count));
    if (static_cast<unsigned __int128>(count) * static_cast<unsigned>(n) * esize > (uint64_t{1} << 34)) {
      return cli::fail(command, "--count " + std::to_string(count) + " x " + std::to_string(n) +
                                    " ranks is more than 16 GiB of input");
    }
    spec.count = static_cast<size_t>(count);
    problem = sim::check_spec(spec, n);
    if (problem.empty()) problem = check_memory(spec, n);
    if (!problem.empty()) return cli::fail(command, problem);
    for (const auto& rank_bytes :
         gpu::make_inputs(dtype, static_cast<size_t>(count), n, static_cast<uint64_t>(seed), gpu::Pattern::kRandom)) {
      input.insert(input.end(), rank_bytes.begin(), rank_bytes.end());
    }
    input_shape = {n, count};
    input_note = random_input_note(seed, parser.given("seed"));
  }

  spec.count = static_cast<size_t>(count);
  problem = sim::check_spec(spec, n);
  if (!problem.empty()) return cli::fail(command, problem);
  for (uint64_t index : q.options.trace_elements) {
    if (index >= spec.count) {
      return cli::fail(command, "--trace-elements index " + std::to_string(index) + " is past the " +
                                    std::to_string(spec.count) + " elements per rank");
    }
  }
  problem = check_memory(spec, n);
  if (!problem.empty()) return cli::fail(command, problem);
  return std::nullopt;
}

// The run's C API options (exactcoll_sim_options) from q's flags: the world's (api_sim_options;
// the trace paths point into *trace_paths, the progress callback writes to *progress, so both must
// outlive the call), and the collective's blocks and contract.
exactcoll_sim_options api_options(const Request& q, const std::vector<std::string>& trace_paths,
                                  ApiProgress* progress) {
  exactcoll_sim_options o = api_sim_options(q.f, q.options, trace_paths, progress);
  o.blocks = static_cast<int>(q.blocks);
  o.contract = static_cast<int>(q.contract);  // the registry's values are the C values
  return o;
}

// Step 4 of collective_main: the collective through the C API (exactcoll_sim_collective), from
// input (every rank's, concatenated) into *output; the library writes the traces, a failed run's
// too (they show what happened), and a failed run's output is never written. *info: what ran;
// *elapsed_ms: the call's wall time. Returns nullopt to go on, or the exit code to return now (the
// message printed): 2 for a fault never reached (bad input), 3 for a failed run.
std::optional<int> run_collective(const Request& q, const sim::CollectiveSpec& spec, const std::vector<uint8_t>& input,
                                  std::vector<uint8_t>* output, exactcoll_call_info* info, double* elapsed_ms) {
  const std::vector<std::string> paths = trace_paths(q.f);
  ApiProgress progress;
  const exactcoll_sim_options options = api_options(q, paths, &progress);
  int dtype = 0;
  exactcoll_dtype_from_name(q.f.dtype.c_str(), &dtype);  // checked by world_options
  exactcoll_call_info_init(info);
  const auto start = std::chrono::steady_clock::now();
  int status = EXACTCOLL_OK;
  {
    ProgressBar bar(q.command, [&progress] { return progress.now(); });
    status = exactcoll_sim_collective(static_cast<int>(spec.op), static_cast<int>(spec.algorithm), dtype,
                                      q.options.ranks, spec.count, input.data(), output->data(), &options, info);
  }
  *elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (status == EXACTCOLL_OK) return std::nullopt;
  const std::string why = api_error("exactcoll_sim_collective");
  if (status == EXACTCOLL_ERROR_INVALID_ARGUMENT) return cli::fail(q.command, why + " (no output was written)");
  return cli::fail(q.command, "the run failed: " + why, cli::kExitFailure);
}

// Step 5 of collective_main (small runs, or --print): every rank's output as floats, once when
// every rank holds the same bits. what: the run's name ("all-reduce, one_shot (auto)", "allgather").
void print_outputs(DType dtype, int n, const std::vector<uint8_t>& output, size_t out_count, size_t esize,
                   const std::string& what) {
  const size_t row_bytes = out_count * esize;
  bool all_same = true;
  for (int r = 1; r < n; ++r) {
    all_same = all_same && std::memcmp(output.data(), output.data() + r * row_bytes, row_bytes) == 0;
  }
  if (all_same && n > 1) {
    const std::string label = "  every rank:";
    std::cout << what << " (identical bits on all " << n << " ranks):\n"
              << label << row_text(dtype, output.data(), out_count, label.size()) << "\n";
  } else {
    std::cout << what << " output:\n";
    for (int r = 0; r < n; ++r) {
      const std::string label = rank_label(r, n);
      std::cout << label << row_text(dtype, output.data() + r * row_bytes, out_count, label.size()) << "\n";
    }
  }
}

int collective_main(Op op, int argc, char** argv) {
  // 1. Flags.
  Request q;
  q.op = op;
  q.command = std::string("sim ") + sim::op_name(op);
  const std::string& command = q.command;
  cli::ArgParser parser = make_parser(&q);
  if (auto code = parser.parse(argc, argv)) return *code;
  if (auto code = check_flags(parser, &q)) return *code;
  const DType dtype = q.dtype;
  const size_t esize = q.esize;

  // 2. The outputs, checked before any work: an unwritable path is bad input (exit 2). The C API
  //    writes the traces; this command writes the output file after the run (atomically).
  if (!reserve_outputs(command, [&] {
        std::vector<std::string> paths = trace_paths(q.f);
        if (!q.output_path.empty()) paths.push_back(cli::resolve_path(q.output_path));
        return paths;
      }())) {
    return cli::kExitUsage;
  }

  // 3. Inputs: the file (checked against --dtype and --ranks) or random ones.
  const int n = q.options.ranks;
  sim::CollectiveSpec spec;
  Inputs in;
  if (auto code = read_inputs(parser, q, &spec, &in)) return *code;

  // 4. Run.
  const size_t out_count = sim::output_count(op, spec.count, n);
  std::vector<uint8_t> output(static_cast<size_t>(n) * out_count * esize);
  const bool show = q.print || spec.count <= kPrintLimit;
  std::cout << input_banner(command, n, spec.count, q.f.dtype, in.note);
  if (show) {
    std::cout << "input (as floats):\n";
    for (int r = 0; r < n; ++r) {
      const std::string label = rank_label(r, n);
      std::cout << label
                << row_text(dtype, in.bytes.data() + static_cast<size_t>(r) * spec.count * esize, spec.count,
                            label.size())
                << "\n";
    }
  }
  std::cout.flush();
  double elapsed_ms = 0;
  exactcoll_call_info info;
  if (auto code = run_collective(q, spec, in.bytes, &output, &info, &elapsed_ms)) return *code;

  // 5. Results.
  const std::string algo_note = op == Op::kAllReduce ? std::string(exactcoll_algo_name(info.algo)) +
                                                           (spec.algorithm == Algorithm::kAuto ? " (auto)" : "")
                                                     : "";
  if (show) {
    print_outputs(dtype, n, output, out_count, esize,
                  op == Op::kAllReduce ? "all-reduce, " + algo_note : sim::op_name(op));
  }
  std::vector<int64_t> output_shape = {n, static_cast<int64_t>(out_count)};
  if (op == Op::kAllReduce) output_shape = in.shape;
  try {
    if (!q.output_path.empty()) {
      npy::write_npy(cli::resolve_path(q.output_path), dtype == DType::kFP32 ? npy::kF32 : npy::kU16, output_shape,
                     output.data(), output.size());
    }
  } catch (const npy::NpyError& e) {
    return cli::fail(command, e.what(), cli::kExitFailure);
  }
  char ms[32];
  std::snprintf(ms, sizeof ms, "%.3f", elapsed_ms);
  std::cout << command << " " << q.f.dtype << ": " << n << " ranks x " << spec.count << " elements"
            << (algo_note.empty() ? "" : ", " + algo_note) << ", contract " << q.contract_text << ", " << spec.blocks
            << (spec.blocks == 1 ? " block" : " blocks") << ", " << schedule_note(q.options) << ", " << ms
            << " ms; output " << npy::shape_text(output_shape) << (q.output_path.empty() ? "" : " -> " + q.output_path)
            << " sha256 " << sha256_hex(output.data(), output.size()) << "\n";
  return cli::kExitOk;
}

int sim_main(int argc, char** argv) {
  auto list = [] {
    size_t width = 0;
    for (const auto& s : cli::sim_subcommands()) width = std::max(width, s.name.size());
    std::string out;
    for (const auto& s : cli::sim_subcommands()) {
      out += "  " + s.name + std::string(width + 2 - s.name.size(), ' ') + s.summary + "\n";
    }
    return out;
  };
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    (argc < 2 ? std::cerr : std::cout)
        << "usage: exactcoll sim <op> [flags]   (exactcoll sim <op> --help for its flags)\n\n"
           "The collectives on the CPU simulator: N ranks as threads in one process, the same\n"
           "algorithm code as the GPUs, the bits of the rounding contract.\n\nops:\n"
        << list() << "(" << op_aliases_note() << ")\n";
    return argc < 2 ? cli::kExitUsage : cli::kExitOk;
  }
  // The op in either spelling (core/registry.h kOpAliases); the command names it canonically.
  std::string op_name(canonical_op_name(argv[1]));
  argv[1] = op_name.data();
  // `--nodes M`: the op's multi-node form, registered as "<op> --nodes" (tools/multinode).
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--nodes") == 0 || std::strncmp(argv[i], "--nodes=", 8) == 0) {
      if (const auto* multinode = cli::find_sim_subcommand(std::string(argv[1]) + " --nodes")) {
        return multinode->run(argc - 1, argv + 1);
      }
      break;
    }
  }
  const cli::SimSubcommand* sub = cli::find_sim_subcommand(argv[1]);
  if (sub == nullptr) {
    std::cerr << "exactcoll sim: unknown op '" << argv[1] << "'; ops:\n" << list();
    return cli::kExitUsage;
  }
  return sub->run(argc - 1, argv + 1);
}

const cli::Registrar kSim({"sim", "the collectives on the CPU simulator (exactcoll sim --help)", sim_main});
const cli::SimSubcommandRegistrar kAllReduce(
    {"allreduce", "all-reduce: " + algorithm_names(kOnSimulator, Op::kAllReduce) + " (the same bits)",
     [](int argc, char** argv) { return collective_main(Op::kAllReduce, argc, argv); }});
const cli::SimSubcommandRegistrar kReduceScatter({"reduce_scatter", "reduce-scatter: rank r gets the fold of slice r",
                                                  [](int argc, char** argv) {
                                                    return collective_main(Op::kReduceScatter, argc, argv);
                                                  }});
const cli::SimSubcommandRegistrar kAllGather({"allgather", "all-gather: a bit copy of every rank's input",
                                              [](int argc, char** argv) {
                                                return collective_main(Op::kAllGather, argc, argv);
                                              }});

}  // namespace
}  // namespace exactcoll::tools
