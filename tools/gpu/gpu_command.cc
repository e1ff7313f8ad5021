// `exactcoll gpu allreduce|reduce_scatter|allgather --nproc N …`: one collective on the GPUs, with
// the flags and .npy conventions of `exactcoll sim` (input [N, …] rank first; bf16/fp16 as '<u2'
// bit patterns, fp32 as '<f4'; output all-reduce [N, …], reduce_scatter [N, count/N], allgather
// [N, N·count]) plus --algo …|nccl.
//
// Steps: 1. each worker reads its row of the input (or makes it from --seed); 2. runs the op
// (staged, or registered with --registered, optionally replayed from a CUDA graph with --graph);
// 3. writes its output row to a part file beside the output; 4. rank 0 assembles the .npy
// (atomically) and prints a one-line summary ending with the sha256 of the output bytes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/signal.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/fused/fused_commands.h"
#include "tools/gpu/inputs.h"
#include "tools/gpu/part_files.h"
#include "tools/gpu/reference.h"
#include "tools/gpu/worker.h"
#include "tools/npy/npy.h"
#include "tools/sim/sha256.h"

namespace exactcoll::gpu {
namespace {

using cuda::Algorithm;
using cuda::Op;

struct GpuOptions {
  Op op = Op::kAllReduce;
  DType dtype = DType::kBF16;
  Algorithm algo = Algorithm::kAuto;
  std::string input_path, output_path;
  int64_t count = 0;
  uint64_t seed = 0;
  int64_t blocks = 0, threads = 0;
  bool registered = false, graph = false;
  int64_t timeout_ms = 10000;
};

int gpu_worker(const GpuOptions& o) {
  Worker w("gpu");
  const int n = w.world_size(), rank = w.rank();
  const size_t elem = static_cast<size_t>(dtype_size(o.dtype));
  // 1. This rank's input.
  Bytes mine;
  std::vector<int64_t> row_shape;
  size_t count = 0;
  if (!o.input_path.empty()) {
    const npy::NpyArray in = npy::read_npy(cli::resolve_path(o.input_path));
    const std::string want = o.dtype == DType::kFP32 ? npy::kF32 : npy::kU16;
    if (in.dtype != want) {
      return cli::fail("gpu", o.input_path + " holds '" + in.dtype + "', --dtype " + dtype_name(o.dtype) + " needs '" + want + "'");
    }
    if (in.shape.empty() || in.shape[0] != n) {
      return cli::fail("gpu", o.input_path + " has shape " + npy::shape_text(in.shape) + ": the first dimension must be the " +
                                  std::to_string(n) + " ranks");
    }
    row_shape.assign(in.shape.begin() + 1, in.shape.end());
    count = in.element_count() / static_cast<size_t>(n);
    mine.assign(in.data.begin() + static_cast<std::ptrdiff_t>(count * elem * static_cast<size_t>(rank)),
                in.data.begin() + static_cast<std::ptrdiff_t>(count * elem * static_cast<size_t>(rank + 1)));
  } else {
    count = static_cast<size_t>(o.count);
    row_shape = {o.count};
    mine = make_input(o.dtype, count, rank, o.seed, Pattern::kRandom);
  }
  if (count == 0) return cli::fail("gpu", "the input has no elements per rank");
  if (o.op == Op::kReduceScatter && count % static_cast<size_t>(n) != 0) {
    return cli::fail("gpu", "reduce_scatter needs a count divisible by the ranks: " + std::to_string(count) +
                                " elements over " + std::to_string(n) + " ranks");
  }
  const size_t out_count = output_count(o.op, count, n);

  // 2. The op.
  cuda::CommunicatorOptions co;
  co.name = "gpu";
  co.flag_timeout_ms = static_cast<uint64_t>(o.timeout_ms);
  co.buffer_bytes = std::max<size_t>(count * elem, 1 << 20);
  cuda::Communicator comm(w.store(), rank, n, co);
  DeviceBuffer input(count * elem), output(out_count * elem);
  EXC_CUDA_CHECK(cudaMemcpy(input.get(), mine.data(), mine.size(), cudaMemcpyHostToDevice));
  cuda::RegisteredBuffer reg;
  if (o.registered) reg = comm.register_buffer(input.get(), count * elem);
  std::optional<cuda::LaunchConfig> grid;
  if (o.blocks > 0 || o.threads > 0) {
    const cuda::Choice c = comm.choose(o.op, count, o.dtype, o.algo);
    grid = cuda::LaunchConfig{o.blocks > 0 ? static_cast<int>(o.blocks) : c.grid.blocks,
                              o.threads > 0 ? static_cast<int>(o.threads) : c.grid.threads};
  }
  Stream stream;
  cuda::CallInfo info;
  auto call = [&] {
    const cuda::RegisteredBuffer* r = o.registered ? &reg : nullptr;
    switch (o.op) {
      case Op::kAllReduce: info = comm.allreduce(input.get(), output.get(), count, o.dtype, o.algo, stream.get(), r, grid); break;
      case Op::kReduceScatter:
        info = comm.reduce_scatter(input.get(), output.get(), count, o.dtype, o.algo, stream.get(), r, grid);
        break;
      case Op::kAllGather: info = comm.allgather(input.get(), output.get(), count, o.dtype, o.algo, stream.get(), r, grid); break;
    }
  };
  if (o.graph) {
    const CapturedGraph graph(stream.get(), call);
    graph.launch(stream.get());
    comm.check(stream.get());
  } else {
    call();
    comm.check(stream.get());
  }
  Bytes result(out_count * elem);
  EXC_CUDA_CHECK(cudaMemcpy(result.data(), output.get(), result.size(), cudaMemcpyDeviceToHost));

  // 3. Rows to rank 0 through part files in the output's directory (or /tmp).
  PartFiles parts(w, o.output_path, "gpu");
  parts.write(result);
  int code = cli::kExitOk;
  if (w.leader()) {
    Bytes all;
    all.reserve(result.size() * static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      const std::optional<Bytes> piece = parts.read(r, result.size());
      if (!piece) {
        code = cli::fail("gpu", "rank " + std::to_string(r) + "'s output part is missing or short", cli::kExitFailure);
        break;
      }
      all.insert(all.end(), piece->begin(), piece->end());
    }
    // 4. The output file and the summary.
    if (code == cli::kExitOk) {
      std::vector<int64_t> shape = {n};
      if (o.op == Op::kAllReduce) {
        shape.insert(shape.end(), row_shape.begin(), row_shape.end());
      } else {
        shape.push_back(static_cast<int64_t>(out_count));
      }
      if (!o.output_path.empty()) {
        npy::write_npy(cli::resolve_path(o.output_path), o.dtype == DType::kFP32 ? npy::kF32 : npy::kU16, shape, all.data(),
                       all.size());
      }
      std::ostringstream os;
      os << "gpu " << op_name(o.op) << ": " << n << " ranks, " << dtype_name(o.dtype) << ", " << count
         << " elements per rank, algo " << cuda::algorithm_name(info.algo);
      if (info.grid.blocks > 0) os << " (" << info.grid.blocks << "x" << info.grid.threads << ")";
      if (info.algo != Algorithm::kNccl) os << (info.staged ? ", staged" : ", registered");
      os << (o.graph ? ", CUDA graph" : "");
      if (!info.exact) os << ", NOT bit-exact (" << (info.note.empty() ? "NCCL" : info.note) << ")";
      if (!o.output_path.empty()) os << ", output " << o.output_path << " " << npy::shape_text(shape);
      os << ", sha256 " << tools::sha256_hex(all.data(), all.size()) << "\n";
      print_leader(w, os.str());
    }
  }
  parts.finish();
  return code;
}

int run_gpu(int argc, char** argv) {
  // `exactcoll gpu fused_rmsnorm …` (tools/gpu/fused).
  if (argc >= 2 && std::string(argv[1]) == "fused_rmsnorm") return run_gpu_fused_rmsnorm(argc, argv);
  int64_t nproc = 0, seed = 1;
  std::string op_text, dtype_text = "bf16", algo_text = "auto";
  GpuOptions o;
  cli::ArgParser parser(
      "exactcoll gpu allreduce|reduce_scatter|allgather --nproc N --dtype bf16|fp16|fp32 [--input in.npy | --count C "
      "--seed S] [--output out.npy] [--algo one_shot|two_shot|push_one_shot|push_two_shot|lamport_one_shot|direct|copy_engine|auto|nccl] [--blocks B] [--threads T] "
      "[--registered] [--graph]",
      "Runs one collective on N GPUs (one process each) with the conventions of `exactcoll sim`:\n"
      "in.npy is [N, …] (rank first; bf16/fp16 as uint16 bit patterns '<u2', fp32 as '<f4'); the\n"
      "output is all-reduce [N, …], reduce_scatter [N, count/N], allgather [N, N·count]. The summary\n"
      "line ends with the sha256 of the output bytes. --algo nccl gives NCCL's result (not bit-exact).");
  parser.add_positional(
      "op", &op_text,
      "allreduce | reduce_scatter | allgather (fused_rmsnorm has its own flags: gpu fused_rmsnorm --help)");
  parser.add_int("nproc", &nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_choice("dtype", &dtype_text, {"bf16", "fp16", "fp32"}, "storage type");
  parser.add_string("input", &o.input_path, "input .npy [N, …]");
  parser.add_int("count", &o.count, "elements per rank of random input (without --input)");
  parser.set_default_note("count", "required without --input");
  parser.add_int("seed", &seed, "seed of the random input");
  parser.add_string("output", &o.output_path, "output .npy (written atomically by rank 0)");
  parser.add_choice("algo", &algo_text, {"one_shot", "two_shot", "push_one_shot", "push_two_shot", "lamport_one_shot", "direct", "copy_engine", "auto", "nccl"},
                    "algorithm; auto = the tuned table's fastest for the size and GPU count "
                    "(cuda_backend/tuning/, EXACTCOLL_TABLE), or without a row one_shot below 512 KiB (1 MiB on "
                    "2 GPUs) and two_shot above; every IPC algorithm gives the same bits");
  parser.add_int("blocks", &o.blocks,
                 "force the grid's block count (1.." + std::to_string(kMaxBlocks) + ", as auto's table may)");
  parser.set_default_note("blocks", "default: the table's choice");
  parser.add_int("threads", &o.threads, "force the threads per block (multiple of 32, 64..1024)");
  parser.set_default_note("threads", "default: the table's choice");
  parser.add_bool("registered", &o.registered, "register the input buffer (no staging)");
  parser.add_bool("graph", &o.graph, "capture the call into a CUDA graph and replay it");
  parser.add_int("timeout-ms", &o.timeout_ms, "bound on every in-kernel flag wait");
  if (const auto code = parser.parse(argc, argv)) return *code;
  const auto op = cuda::parse_op(op_text);
  if (!op) return cli::fail("gpu", "unknown op '" + op_text + "' (allreduce, reduce_scatter, allgather)");
  o.op = *op;
  o.dtype = *parse_dtype(dtype_text);
  o.algo = *cuda::parse_algorithm(algo_text);
  o.seed = static_cast<uint64_t>(seed);
  const auto allowed = cuda::ipc_algorithms(o.op);
  if (o.algo != Algorithm::kAuto && o.algo != Algorithm::kNccl &&
      std::find(allowed.begin(), allowed.end(), o.algo) == allowed.end()) {
    return cli::fail("gpu", "--algo " + algo_text + " does not apply to " + op_text);
  }
  if (o.input_path.empty() == !parser.given("count")) {
    return cli::fail("gpu", "give either --input FILE or --count C (with --seed S)");
  }
  if (o.input_path.empty() && o.count < 1) return cli::fail("gpu", "--count must be at least 1");
  if (parser.given("seed") && !o.input_path.empty()) return cli::fail("gpu", "--seed applies to random inputs (--count)");
  if (seed < 0) return cli::fail("gpu", "--seed must be >= 0, got " + std::to_string(seed));
  if (o.blocks < 0 || o.blocks > kMaxBlocks) {
    return cli::fail("gpu", "--blocks must be 1.." + std::to_string(kMaxBlocks) + ", got " + std::to_string(o.blocks));
  }
  if (o.threads != 0 && (o.threads < 64 || o.threads > 1024 || o.threads % 32 != 0)) {
    return cli::fail("gpu", "--threads must be a multiple of 32 in 64..1024");
  }
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "gpu")) return *code;
  try {
    return gpu_worker(o);
  } catch (const npy::NpyError& e) {
    return cli::fail("gpu", e.what(), cli::kExitUsage);
  } catch (const std::exception& e) {
    return cli::fail("gpu", e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"gpu", "one collective on the GPUs (same flags and .npy conventions as sim)", run_gpu});

}  // namespace
}  // namespace exactcoll::gpu
