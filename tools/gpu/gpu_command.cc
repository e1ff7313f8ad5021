// `exactcoll gpu <op> --nproc N …`: one op on the GPUs, with the flags and .npy conventions of
// `exactcoll sim <op>` (--contract canonical|tree too: the communicator's contract, so that the
// sha256 compares with `sim <op> --contract` on the same inputs). The op's own flags, inputs, outputs and summary line
// are its GpuOp's (tools/gpu/gpu_op.h); this driver is the same for every op.
//
// Steps: 1. the parent checks the flags (and the op's input files: bad input exits 2 before any
// worker starts) and starts N workers; 2. each worker loads its problem onto its GPU (from the
// files, or made from --seed); 3. runs the call (staged, or registered with --registered,
// optionally replayed from a CUDA graph with --graph, on a forced grid with --blocks/--threads);
// 4. writes its outputs to a part file beside the first output; 5. rank 0 assembles each output's
// .npy (atomically) and prints the op's summary line, ending with the sha256 of each output.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "core/registry.h"
#include "cuda_backend/communicator.h"
#include "tools/cli.h"
#include "tools/contract_flag.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/gpu_op.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/part_files.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"
#include "tools/sha256/sha256.h"

namespace exactcoll::gpu {
namespace {

constexpr const char* kNpyDtypes[] = {"bf16", "fp16", "fp32"};

int gpu_worker(GpuOp& op, const GpuSettings& s, const std::string& command) {
  Worker w("gpu");
  const int n = w.world_size(), rank = w.rank();
  ApiCommOptions co;
  co.name = "gpu";
  co.flag_timeout_ms = static_cast<uint64_t>(s.timeout_ms);
  co.buffer_bytes = buffer_bytes_for(s.buffer_mib);
  co.use_nccl = op.needs_nccl(s);
  co.contract = s.contract;
  // Declared before the communicator, so destroyed after it: an input registered with a
  // communicator must outlive it (its peers keep their mappings until it is destroyed).
  std::unique_ptr<GpuProblem> problem;
  ApiComm comm(w.store(), rank, n, co);
  if (const std::string problem = check_comm_contract(comm, s.contract); !problem.empty()) {
    return cli::fail(command, problem, cli::kExitFailure);
  }
  // 2. This rank's problem; 3. the call.
  problem = op.load(s, comm, n, rank);
  const std::vector<DeviceOutput> outputs = problem->outputs();
  Variant v;
  v.name = s.registered ? "registered" : "staged";
  v.registered = s.registered;
  v.graph = s.graph;
  Bytes mine;
  Stream stream;
  const CallReport ran = run_checked([&](const Variant& var, cudaStream_t st) { return problem->enqueue(var, st); }, v,
                                     outputs, 1, comm, stream.get(),
                                     [&](int, const std::vector<Bytes>& got) {
                                       for (const Bytes& b : got) mine.insert(mine.end(), b.begin(), b.end());
                                     });

  // 4. Every rank's outputs to rank 0 through part files beside the first output (or in /tmp).
  const std::vector<std::string> paths = problem->output_paths();
  const auto first_path = std::find_if(paths.begin(), paths.end(), [](const std::string& p) { return !p.empty(); });
  PartFiles parts(w, first_path == paths.end() ? "" : *first_path, "gpu_" + op.name());
  parts.write(mine);
  int code = cli::kExitOk;
  if (w.leader()) {
    std::vector<Bytes> all(outputs.size());
    for (int r = 0; r < n && code == cli::kExitOk; ++r) {
      const std::optional<Bytes> piece = parts.read(r, mine.size());
      if (!piece) {
        code =
            cli::fail(command, "rank " + std::to_string(r) + "'s output part is missing or short", cli::kExitFailure);
        break;
      }
      size_t offset = 0;
      for (size_t i = 0; i < outputs.size(); ++i) {
        const auto begin = piece->begin() + static_cast<std::ptrdiff_t>(offset);
        all[i].insert(all[i].end(), begin, begin + static_cast<std::ptrdiff_t>(outputs[i].bytes()));
        offset += outputs[i].bytes();
      }
    }
    // 5. The output files and the summary.
    if (code == cli::kExitOk) {
      std::vector<std::string> sha256s;
      const std::vector<int64_t> shape = problem->output_shape(n);
      for (size_t i = 0; i < outputs.size(); ++i) {
        if (!paths[i].empty()) {
          npy::write_npy(cli::resolve_path(paths[i]), s.dtype == DType::kFP32 ? npy::kF32 : npy::kU16, shape,
                         all[i].data(), all[i].size());
        }
        sha256s.push_back(tools::sha256_hex(all[i].data(), all[i].size()));
      }
      print_leader(w, problem->summary(n, ran, s, sha256s));
    }
  }
  parts.finish();
  return code;
}

// `gpu` with no op, or `gpu --help`: the ops and where their flags are.
int gpu_overview(int argc, char** argv) {
  std::string op_text;
  cli::ArgParser parser("exactcoll gpu <op> --nproc N [flags]   (op: " + gpu_op_names() + ")",
                        "Runs one op on N GPUs (one process each) with the flags and .npy conventions of\n"
                        "`exactcoll sim <op>`; the summary line ends with the sha256 of each output, comparable\n"
                        "with the simulator's. `exactcoll gpu <op> --help` lists the op's flags.");
  parser.add_positional("op", &op_text, gpu_op_names() + " (" + op_aliases_note() + ")");
  if (const auto code = parser.parse(argc, argv)) return *code;
  return cli::fail("gpu", "unknown op '" + op_text + "' (" + gpu_op_names() + ")");
}

int run_gpu(int argc, char** argv) {
  // The op is the positional argument: the first word that names one, in either spelling
  // (core/registry.h kOpAliases; flags may come first).
  std::unique_ptr<GpuOp> op;
  for (int i = 1; i < argc && !op; ++i) {
    for (auto& candidate : gpu_ops()) {
      if (candidate->name() == canonical_op_name(argv[i])) op = std::move(candidate);
    }
  }
  if (!op) return gpu_overview(argc, argv);
  const std::string command = "gpu " + op->name();
  int64_t nproc = 0, seed = 1;
  std::string op_text, dtype_text = "bf16", algo_text = "auto", contract_text = "canonical";
  GpuSettings s;
  const std::vector<std::string> algorithms = op->gpu_algorithms();
  std::string algo_list;
  for (const std::string& a : algorithms) algo_list += (algo_list.empty() ? "" : "|") + a;
  cli::ArgParser parser("exactcoll " + command + " --nproc N --dtype bf16|fp16|fp32 " + op->gpu_usage() + " [--algo " +
                            algo_list + "] [--contract " + library_contract_names(kOnGpu, "|") +
                            "] [--blocks B] [--threads T] [--registered] [--graph] [--timeout-ms T] [--buffer-mib M]",
                        op->gpu_description());
  parser.add_positional("op", &op_text, op->name());
  parser.add_int("nproc", &nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_choice("dtype", &dtype_text, {std::begin(kNpyDtypes), std::end(kNpyDtypes)}, "storage type");
  parser.add_int("seed", &seed, "seed of random inputs");
  parser.add_string("output", &s.output, "out.npy: [N, …] every rank's output (written atomically by rank 0)");
  op->add_gpu_flags(parser);
  parser.add_choice("algo", &algo_text, algorithms, op->gpu_algorithm_help());
  cli::add_contract_flag(parser, &contract_text, kOnGpu,
                         "the rounding contract the communicator folds under (every algorithm but NCCL's gives its "
                         "bits, the same as `exactcoll sim` with this --contract)");
  const int max_blocks = op->max_blocks();
  parser.add_int("blocks", &s.blocks, "force the grid's block count (1.." + std::to_string(max_blocks) + ")");
  parser.set_default_note("blocks", "default: the table's choice");
  parser.add_int("threads", &s.threads, "force the threads per block (multiple of 32, 64..1024)");
  parser.set_default_note("threads", "default: the table's choice");
  parser.add_bool("registered", &s.registered, "register the input buffer (no staging)");
  parser.add_bool("graph", &s.graph, "capture the call into a CUDA graph and replay it");
  parser.add_int("timeout-ms", &s.timeout_ms, "bound on every in-kernel flag wait");
  parser.add_int("buffer-mib", &s.buffer_mib,
                 "staging and scratch MiB per rank (larger messages run in chunks: the same bits)");
  parser.set_default_note("buffer-mib", "default: the library's, 128");
  if (const auto code = parser.parse(argc, argv)) return *code;
  s.dtype = *parse_dtype(dtype_text);
  s.algo = algo_text;
  s.contract = cli::library_contract(contract_text);
  s.seed = static_cast<uint64_t>(seed);
  if (seed < 0) return cli::fail(command, "--seed must be >= 0, got " + std::to_string(seed));
  if (const std::string problem = check_grid_flags(s.blocks, s.threads, max_blocks); !problem.empty()) {
    return cli::fail(command, problem);
  }
  if (const std::string problem = cli::check_timeout_ms(s.timeout_ms); !problem.empty()) {
    return cli::fail(command, problem);
  }
  if (const std::string problem = check_buffer_mib(parser, s.buffer_mib); !problem.empty()) {
    return cli::fail(command, problem);
  }
  const char* rank_env = std::getenv("RANK");
  const bool in_parent = rank_env == nullptr || *rank_env == '\0';
  if (const std::string problem = op->check_gpu_flags(parser, s, nproc, in_parent && parser.given("nproc"));
      !problem.empty()) {
    return cli::fail(command, problem);
  }
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "gpu")) return *code;
  try {
    return gpu_worker(*op, s, command);
  } catch (const npy::NpyError& e) {
    return cli::fail(command, e.what(), cli::kExitUsage);
  } catch (const std::invalid_argument& e) {
    return cli::fail(command, e.what());
  } catch (const std::exception& e) {
    return cli::fail(command, e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"gpu", "one op on the GPUs (same flags and .npy conventions as sim)", run_gpu});

}  // namespace
}  // namespace exactcoll::gpu
