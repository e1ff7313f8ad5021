// `exactcoll gpu fused_rmsnorm --nproc N …`: the fused all-reduce + residual add + RMSNorm on the
// GPUs, with the flags and .npy conventions of `exactcoll sim fused_rmsnorm`: x.npy [N, rows, H]
// (rank r's partial sums at [r]), r.npy [rows, H], w.npy [H]; bf16/fp16 as '<u2' bit patterns,
// fp32 as '<f4'; outputs [N, rows, H] (every rank's result). Plus the GPU's own --algo choices
// (one_stage_reg, push_one_stage, gather_norm, auto, nccl_split), --registered, --graph,
// --blocks/--threads; or random inputs (--rows, --hidden, --seed).
//
// Steps: 1. the parent checks the flags and the input files (bad input exits 2 before any worker
// starts); 2. each worker reads its row of x, the residual and the weight; 3. runs the op; 4. writes
// its two outputs to part files; 5. rank 0 assembles the .npy files (atomically) and prints a
// summary ending with the sha256 of each output.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "sim/fused/reference.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/fused/fused_commands.h"
#include "tools/gpu/fused/fused_inputs.h"
#include "tools/gpu/part_files.h"
#include "tools/gpu/worker.h"
#include "tools/npy/npy.h"
#include "tools/sim/sha256.h"

namespace exactcoll::gpu {
namespace {

using tools::sha256_hex;

constexpr const char* kCommand = "gpu fused_rmsnorm";

using cuda::fused::FusedAlgorithm;


struct Options {
  DType dtype = DType::kBF16;
  FusedAlgorithm algo = FusedAlgorithm::kAuto;
  std::string input, residual, weight, output, residual_output;
  int64_t rows = 0, hidden = 0, seed = 1, blocks = 0, threads = 0, timeout_ms = 10000;
  double eps = 1e-6;
  bool registered = false, graph = false, specials = false;
};

// This rank's problem: from the files, or made from the seed. Returns an error message or "".
std::string load_inputs(const Options& o, int ranks, int rank, FusedInputs* in, std::vector<uint8_t>* mine) {
  if (o.input.empty()) {
    *in = make_fused_inputs(o.dtype, ranks, static_cast<int>(o.rows), static_cast<int>(o.hidden),
                            static_cast<uint64_t>(o.seed), o.specials, rank);
    *mine = in->x[static_cast<size_t>(rank)];
    return "";
  }
  npy::NpyArray x, residual, weight;
  try {
    x = npy::read_npy(cli::resolve_path(o.input));
    residual = npy::read_npy(cli::resolve_path(o.residual));
    weight = npy::read_npy(cli::resolve_path(o.weight));
  } catch (const npy::NpyError& e) {
    return e.what();
  }
  if (const std::string problem = check_fused_arrays(o.dtype, ranks, "--nproc", {o.input, x}, {o.residual, residual},
                                                     {o.weight, weight});
      !problem.empty()) {
    return problem;
  }
  const int64_t rows = x.shape[1], hidden = x.shape[2];
  in->ranks = ranks, in->rows = static_cast<int>(rows), in->hidden = static_cast<int>(hidden), in->dtype = o.dtype;
  const size_t bytes = in->count() * static_cast<size_t>(dtype_size(o.dtype));
  if (rank >= 0) {
    mine->assign(x.data.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(rank)),
                 x.data.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(rank + 1)));
  }
  in->residual = std::move(residual.data);
  in->weight = std::move(weight.data);
  return "";
}

int worker(const Options& o) {
  Worker w("gpu_fused_rmsnorm");
  const int n = w.world_size(), rank = w.rank();
  // 1. Inputs.
  FusedInputs in;
  std::vector<uint8_t> mine;
  if (const std::string problem = load_inputs(o, n, rank, &in, &mine); !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  const size_t elem = static_cast<size_t>(dtype_size(o.dtype));
  const size_t bytes = in.count() * elem;

  // 2. The op.
  cuda::CommunicatorOptions co;
  co.name = "gpu_fused";
  co.flag_timeout_ms = static_cast<uint64_t>(o.timeout_ms);
  co.buffer_bytes = std::max<size_t>(2 * bytes, size_t{1} << 20);
  co.use_nccl = o.algo == FusedAlgorithm::kNcclSplit;
  cuda::Communicator comm(w.store(), rank, n, co);
  cuda::fused::FusedRmsNorm fused(comm);
  DeviceBuffer x(bytes), residual(bytes), weight(in.weight.size()), residual_out(bytes), out(bytes);
  EXC_CUDA_CHECK(cudaMemcpy(x.get(), mine.data(), bytes, cudaMemcpyHostToDevice));
  EXC_CUDA_CHECK(cudaMemcpy(residual.get(), in.residual.data(), bytes, cudaMemcpyHostToDevice));
  EXC_CUDA_CHECK(cudaMemcpy(weight.get(), in.weight.data(), in.weight.size(), cudaMemcpyHostToDevice));
  cuda::RegisteredBuffer reg;
  if (o.registered) reg = comm.register_buffer(x.get(), bytes);
  const cuda::fused::FusedRmsNormShape shape{in.rows, in.hidden, static_cast<float>(o.eps), o.dtype};
  std::optional<cuda::LaunchConfig> grid;
  if (o.blocks > 0 || o.threads > 0) {
    const cuda::fused::FusedChoice c = fused.choose(shape, o.algo);
    grid = cuda::LaunchConfig{o.blocks > 0 ? static_cast<int>(o.blocks) : c.grid.blocks,
                              o.threads > 0 ? static_cast<int>(o.threads) : c.grid.threads};
  }
  Stream stream;
  cuda::fused::FusedCallInfo info;
  auto call = [&] {
    info = fused.run({x.get(), residual.get(), weight.get(), residual_out.get(), out.get()}, shape, o.algo, stream.get(),
                     o.registered ? &reg : nullptr, grid);
  };
  if (o.graph) {
    const CapturedGraph graph(stream.get(), call);
    graph.launch(stream.get());
    comm.check(stream.get());
  } else {
    call();
    comm.check(stream.get());
  }
  std::vector<uint8_t> result(2 * bytes);
  EXC_CUDA_CHECK(cudaMemcpy(result.data(), out.get(), bytes, cudaMemcpyDeviceToHost));
  EXC_CUDA_CHECK(cudaMemcpy(result.data() + bytes, residual_out.get(), bytes, cudaMemcpyDeviceToHost));

  // 3. Outputs to rank 0 through part files beside the output (or in /tmp).
  PartFiles parts(w, !o.output.empty() ? o.output : o.residual_output, "gpu_fused");
  parts.write(result);
  int code = cli::kExitOk;
  if (w.leader()) {
    std::vector<uint8_t> all_out, all_ro;
    all_out.reserve(bytes * static_cast<size_t>(n));
    all_ro.reserve(bytes * static_cast<size_t>(n));
    for (int r = 0; r < n && code == cli::kExitOk; ++r) {
      const std::optional<std::vector<uint8_t>> piece = parts.read(r, result.size());
      if (!piece) {
        code = cli::fail(kCommand, "rank " + std::to_string(r) + "'s output part is missing or short", cli::kExitFailure);
        break;
      }
      all_out.insert(all_out.end(), piece->begin(), piece->begin() + static_cast<std::ptrdiff_t>(bytes));
      all_ro.insert(all_ro.end(), piece->begin() + static_cast<std::ptrdiff_t>(bytes), piece->end());
    }
    // 4. The output files and the summary.
    if (code == cli::kExitOk) {
      const std::vector<int64_t> out_shape = {n, in.rows, in.hidden};
      const std::string npy_dtype = o.dtype == DType::kFP32 ? npy::kF32 : npy::kU16;
      if (!o.output.empty()) npy::write_npy(cli::resolve_path(o.output), npy_dtype, out_shape, all_out.data(), all_out.size());
      if (!o.residual_output.empty()) {
        npy::write_npy(cli::resolve_path(o.residual_output), npy_dtype, out_shape, all_ro.data(), all_ro.size());
      }
      std::ostringstream os;
      os << "gpu fused_rmsnorm: " << dtype_name(o.dtype) << ", " << n << " ranks, " << in.rows << " rows, H " << in.hidden
         << ", contract canonical, " << cuda::fused::fused_algorithm_name(info.algo);
      if (!info.allreduce.empty()) os << " (all-reduce " << info.allreduce << ")";
      os << " " << info.grid.blocks << "x" << info.grid.threads << (info.staged ? ", staged" : ", registered")
         << (o.graph ? ", CUDA graph" : "");
      if (!info.exact) os << ", NOT bit-exact (NCCL's sums follow no contract)";
      os << ": out sha256 " << sha256_hex(all_out.data(), all_out.size()) << " residual_out sha256 "
         << sha256_hex(all_ro.data(), all_ro.size()) << "\n";
      print_leader(w, os.str());
    }
  }
  parts.finish();
  return code;
}

}  // namespace

bool asks_for_fused(int argc, char** argv, const std::string& flag) {
  const std::string bare = "--" + flag, with_value = "--" + flag + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string value;
    if (a == bare && i + 1 < argc) {
      value = argv[i + 1];
    } else if (a.rfind(with_value, 0) == 0) {
      value = a.substr(with_value.size());
    } else {
      continue;
    }
    for (const std::string& item : split_list(value)) {
      if (item == "fused_rmsnorm") return true;
    }
  }
  return false;
}

int run_gpu_fused_rmsnorm(int argc, char** argv) {
  int64_t nproc = 0;
  std::string op_text, dtype_text = "bf16", algo_text = "auto", contract_text = "canonical";
  Options o;
  cli::ArgParser parser(
      "exactcoll gpu fused_rmsnorm --nproc N --dtype bf16|fp16|fp32 (--input x.npy --residual r.npy --weight w.npy | "
      "--rows R --hidden H [--seed S] [--specials]) [--eps E] [--output out.npy] [--residual-output ro.npy] "
      "[--algo one_stage|one_stage_reg|push_one_stage|lamport_one_stage|two_stage|gather_norm|unfused|auto|nccl_split] "
      "[--contract canonical] [--blocks B] [--threads T] [--registered] [--graph]",
      "Fused all-reduce + residual add + RMSNorm on N GPUs (one process each), with the conventions of\n"
      "`exactcoll sim fused_rmsnorm`: x.npy is [N, rows, H] (rank r's partial sums at [r]), r.npy [rows, H],\n"
      "w.npy [H]; bf16/fp16 as '<u2' bit patterns, fp32 as '<f4'. Outputs are [N, rows, H]. Every algorithm\n"
      "but nccl_split gives the canonical contract's bits (the simulator's); the alternative contracts are\n"
      "simulator-only. The summary ends with the sha256 of each output, comparable with the sim's.");
  parser.add_positional("op", &op_text, "fused_rmsnorm");
  parser.add_int("nproc", &nproc, "processes, one per GPU (x.npy's first dimension)");
  parser.mark_required("nproc");
  parser.add_choice("dtype", &dtype_text, {"bf16", "fp16", "fp32"}, "storage type");
  parser.add_string("input", &o.input, "x.npy: [N, rows, H] partial sums");
  parser.add_string("residual", &o.residual, "r.npy: [rows, H] residual (the same on every rank)");
  parser.add_string("weight", &o.weight, "w.npy: [H] RMSNorm weight");
  parser.add_int("rows", &o.rows, "rows of random inputs (without --input)");
  parser.set_default_note("rows", "required without --input");
  parser.add_int("hidden", &o.hidden, "H of random inputs (without --input)");
  parser.set_default_note("hidden", "required without --input");
  parser.add_int("seed", &o.seed, "seed of random inputs");
  parser.add_bool("specials", &o.specials, "random inputs with NaN, inf, overflow and subnormal rows");
  parser.add_double("eps", &o.eps, "RMSNorm epsilon");
  parser.add_string("output", &o.output, "out.npy: [N, rows, H] normed output");
  parser.add_string("residual-output", &o.residual_output, "ro.npy: [N, rows, H] residual output");
  parser.add_choice("algo", &algo_text,
                    {"one_stage", "one_stage_reg", "push_one_stage", "lamport_one_stage", "two_stage", "gather_norm", "unfused", "auto",
                     "nccl_split"},
                    "algorithm");
  parser.add_choice("contract", &contract_text, {"canonical"}, "rounding contract (the GPU has the canonical one only)");
  parser.add_int("blocks", &o.blocks, "force the fused kernel's block count (1..64)");
  parser.set_default_note("blocks", "default: the table's choice");
  parser.add_int("threads", &o.threads, "force the threads per block (multiple of 32, 64..1024)");
  parser.set_default_note("threads", "default: the table's choice");
  parser.add_bool("registered", &o.registered, "register x's buffer (no staging)");
  parser.add_bool("graph", &o.graph, "capture the call into a CUDA graph and replay it");
  parser.add_int("timeout-ms", &o.timeout_ms, "bound on every in-kernel flag wait");
  if (const auto code = parser.parse(argc, argv)) return *code;
  if (op_text != "fused_rmsnorm") return cli::fail(kCommand, "unknown op '" + op_text + "'");
  if (const std::string problem = exactcoll::fused::check_eps(o.eps); !problem.empty()) return cli::fail(kCommand, problem);
  o.dtype = dtype_text == "fp32" ? DType::kFP32 : dtype_text == "fp16" ? DType::kFP16 : DType::kBF16;
  o.algo = *cuda::fused::parse_fused_algorithm(algo_text);
  const bool files = parser.given("input") || parser.given("residual") || parser.given("weight");
  const bool random = parser.given("rows") || parser.given("hidden");
  if (files == random) {
    return cli::fail(kCommand, "give either --input, --residual and --weight, or --rows and --hidden (with --seed)");
  }
  if (files && (o.input.empty() || o.residual.empty() || o.weight.empty())) {
    return cli::fail(kCommand, "--input, --residual and --weight go together");
  }
  if (!o.output.empty() && o.output == o.residual_output) {
    return cli::fail(kCommand, "--output and --residual-output name the same file");
  }
  if (random) {
    const int pack = 16 / dtype_size(o.dtype);
    if (o.rows < 1 || o.rows > (1 << 24)) return cli::fail(kCommand, "--rows must be 1..16777216");
    if (o.hidden < 1 || o.hidden > (1 << 24) || o.hidden % pack != 0) {
      return cli::fail(kCommand, "--hidden must be a positive multiple of the " + dtype_text + " pack (" +
                                     std::to_string(pack) + " elements)");
    }
  }
  if (o.blocks < 0 || o.blocks > 64) return cli::fail(kCommand, "--blocks must be 1..64");
  if (o.threads != 0 && (o.threads < 64 || o.threads > 1024 || o.threads % 32 != 0)) {
    return cli::fail(kCommand, "--threads must be a multiple of 32 in 64..1024");
  }
  if (o.timeout_ms < 1) return cli::fail(kCommand, "--timeout-ms must be positive");
  const bool worker_process = std::getenv("RANK") != nullptr && *std::getenv("RANK") != '\0';
  // Bad input files exit 2 here, before any worker starts (workers read them again).
  if (files && !worker_process && parser.given("nproc")) {
    FusedInputs in;
    std::vector<uint8_t> unused;
    if (const std::string problem = load_inputs(o, static_cast<int>(nproc), -1, &in, &unused); !problem.empty()) {
      return cli::fail(kCommand, problem);
    }
  }
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "gpu")) return *code;
  try {
    return worker(o);
  } catch (const npy::NpyError& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  } catch (const std::invalid_argument& e) {
    return cli::fail(kCommand, e.what());
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
}

}  // namespace exactcoll::gpu
