// `exactcoll tune --nproc N [--ops …] [--output FILE]`: measures every IPC algorithm over a grid of
// launch configurations for message sizes 1 KiB … 64 MiB per rank and writes the dispatch table
// (cuda_backend/dispatch_table.h) that `auto` reads: per (arch, world size, op, size, algorithm)
// the fastest grid, its time and where and when it was measured (measured_on: --machine, or the
// GPU's name and world size, and the UTC date). Rows of other world sizes, ops and archs already
// in FILE are kept, and so are its rows of sizes outside --min-bytes .. --max-bytes and its header
// comments (but the 'last tuned' and 'time_us' lines, which this run writes anew).
//
// Steps per (op, size, algorithm, grid): a registered input of random bf16 values; the op captured
// `graph-ops` times into a CUDA graph; median of `replays` replays per op on every rank; the
// maximum over ranks is the grid's time. The table is written atomically by rank 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/lamport.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/tsv.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/tune_table.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"

namespace exactcoll::gpu {
namespace {

using cuda::Algorithm;
using cuda::Communicator;
using cuda::LaunchConfig;
using cuda::Op;

struct TuneOptions {
  std::vector<Op> ops;
  std::string output;
  int64_t min_bytes = 1024, max_bytes = int64_t{64} << 20;
  int64_t graph_ops = 10, replays = 9;
  bool quick = false;
  bool pdl = true;
  int64_t buffer_mib = 0;  // 0: a default communicator's buffers
  std::string machine;     // measured_on's machine; "": the GPU's name and world size
};

// The grids tried for a message whose busiest rank works on `packs` 16-byte packs.
std::vector<LaunchConfig> candidate_grids(uint64_t packs, bool quick) {
  std::vector<LaunchConfig> out;
  const std::vector<int> threads = quick ? std::vector<int>{512, 1024} : std::vector<int>{256, 512, 1024};
  // Up to kMaxBlocks (128 of the H200's 132 SMs): large messages move more bytes over NVLink
  // with more SMs issuing loads and stores.
  const std::vector<int> blocks = quick
                                      ? std::vector<int>{1, 2, 4, 8, 16, 32, 48, 64, 96, 128}
                                      : std::vector<int>{1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128};
  for (int t : threads) {
    for (int b : blocks) {
      // Skip grids with more than twice as many threads as packs (all but the first).
      if (b > 1 && static_cast<uint64_t>(b) * static_cast<uint64_t>(t) > 2 * packs + static_cast<uint64_t>(t)) continue;
      out.push_back(LaunchConfig{b, t});
    }
  }
  return out;
}

// Times every grid of `grids` for one (op, count, algo) on the registered input: the op captured
// o.graph_ops times into a CUDA graph, each grid's time the slowest rank's median per-op time over
// o.replays replays. Returns the fastest grid's time, and the grid in *best_out.
double fastest_grid(Worker& w, Communicator& comm, const TuneOptions& o, Op op, uint64_t count, DType dtype,
                    Algorithm algo, const std::vector<LaunchConfig>& grids, const DeviceBuffer& input,
                    const DeviceBuffer& output, const cuda::RegisteredBuffer& reg, const Stream& stream,
                    LaunchConfig* best_out) {
  double best_us = 0;
  LaunchConfig& best = *best_out;
  for (const LaunchConfig& grid : grids) {
    auto enqueue = [&] {
      switch (op) {
        case Op::kAllReduce:
          comm.allreduce(input.get(), output.get(), count, dtype, algo, stream.get(), &reg, grid);
          break;
        case Op::kReduceScatter:
          comm.reduce_scatter(input.get(), output.get(), count, dtype, algo, stream.get(), &reg, grid);
          break;
        case Op::kAllGather:
          comm.allgather(input.get(), output.get(), count, dtype, algo, stream.get(), &reg, grid);
          break;
      }
    };
    w.barrier("grid");
    const double us = time_graph_us(stream.get(), enqueue, static_cast<int>(o.graph_ops), 2,
                                    static_cast<int>(o.replays), [&] { comm.check(stream.get()); });
    comm.check(stream.get());
    char text[32];
    std::snprintf(text, sizeof text, "%.6f", us);
    double worst = 0;
    for (const auto& s : w.all_gather("us", text)) worst = std::max(worst, std::stod(s));
    if (best_us == 0 || worst < best_us) {
      best_us = worst;
      best = grid;
    }
  }
  return best_us;
}

// Rank 0's last step: the dispatch table at o.output merged with `rows` (tools/gpu/tune_table.h:
// the file's other rows and header comments kept), written atomically.
void write_table(Worker& w, const TuneOptions& o, const std::string& arch, const std::string& measured_on,
                 const std::vector<cuda::TableRow>& rows) {
  const std::string path = cli::resolve_path(o.output);
  std::string existing;
  if (std::ifstream file(path); file) {
    std::stringstream text;
    text << file.rdbuf();
    existing = text.str();
  }
  TuneRun run;
  run.arch = arch;
  run.world_size = w.world_size();
  run.ops = o.ops;
  run.min_bytes = static_cast<uint64_t>(o.min_bytes);
  run.max_bytes = static_cast<uint64_t>(o.max_bytes);
  run.measured_on = measured_on;
  run.device_name = w.device_name();
  run.graph_ops = o.graph_ops;
  const TunedTable table = tuned_table(existing, path, run, rows);
  npy::write_file_atomic(path, table.text.data(), table.text.size());
  print_leader(w, "# wrote " + path + " (" + std::to_string(table.rows) + " rows)\n");
}

int tune_worker(const TuneOptions& o) {
  Worker w("tune");
  const int n = w.world_size(), rank = w.rank();
  const DType dtype = DType::kBF16;
  cuda::CommunicatorOptions co;
  co.name = "tune";
  // two_shot's scratch (inputs are registered), and the push algorithms' 2 x n slots up to what the
  // buffers hold (a default communicator's, or --buffer-mib): they are measured only where they
  // fit there (beyond, auto would not run them on such a communicator).
  const size_t push_buffer =
      o.buffer_mib > 0 ? static_cast<size_t>(o.buffer_mib) << 20 : cuda::CommunicatorOptions{}.buffer_bytes;
  co.buffer_bytes = std::max(static_cast<size_t>(o.max_bytes), push_buffer);
  co.table = cuda::DispatchTable();  // tuning measures forced grids; no table needed
  co.programmatic_launch = o.pdl;
  Communicator comm(w.store(), rank, n, co);
  if (!comm.ipc_ready()) return cli::fail("tune", "the IPC path is unavailable: " + comm.ipc_unavailable_reason(), 3);
  const size_t max_in = static_cast<size_t>(o.max_bytes);
  size_t max_out = max_in * static_cast<size_t>(n);
  DeviceBuffer input(max_in), output(max_out);
  const cuda::RegisteredBuffer reg = comm.register_buffer(input.get(), max_in);
  Stream stream;
  {
    const std::vector<uint8_t> mine = make_input(dtype, max_in / 2, rank, 7, Pattern::kRandom);
    EXC_CUDA_CHECK(cudaMemcpy(input.get(), mine.data(), mine.size(), cudaMemcpyHostToDevice));
  }
  // Every row of this run says where and when it was measured (the date of the run's start).
  const std::string measured_on = cuda::measured_on_text(o.machine, w.device_name(), n, std::time(nullptr));
  std::vector<cuda::TableRow> rows;
  std::ostringstream report;
  report << "# exactcoll tune: " << n << " ranks on " << w.device_name() << " (" << comm.arch() << ")\n";
  for (Op op : o.ops) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      uint64_t count = static_cast<uint64_t>(bytes) / 2;
      if (op == Op::kReduceScatter) count -= count % static_cast<uint64_t>(n);
      if (count == 0) continue;
      for (Algorithm algo : cuda::ipc_algorithms(op)) {
        // bf16 (2 bytes), as every tuned row.
        if (cuda::is_push_algorithm(algo) && !cuda::push_fits(count, 2, n, push_buffer)) continue;
        // The Lamport algorithms: measured where they run in one launch (a default communicator's
        // lamport_message_bytes); beyond, the communicator runs them in chunks and auto never takes them.
        if (cuda::is_lamport_algorithm(algo) && !lamport_fits(algo, count, 2, n, comm.lamport_region_bytes())) continue;
        uint64_t packs = count / 8 + 1;
        if (algo == Algorithm::kTwoShot || algo == Algorithm::kPushTwoShot || algo == Algorithm::kLamportTwoShot ||
            op == Op::kReduceScatter)
          packs = packs / static_cast<uint64_t>(n) + 1;
        if (op == Op::kAllGather) packs *= static_cast<uint64_t>(n);
        std::vector<LaunchConfig> grids = candidate_grids(packs, o.quick);
        if (algo == Algorithm::kCopyEngine) grids = {LaunchConfig{1, 64}};  // no SM grid
        LaunchConfig best{};
        const double best_us =
            fastest_grid(w, comm, o, op, count, dtype, algo, grids, input, output, reg, stream, &best);
        cuda::TableRow row;
        row.arch = comm.arch();
        row.world_size = n;
        row.op = op;
        row.bytes = static_cast<uint64_t>(bytes);
        row.algo = algo;
        row.grid = best;
        row.time_us = best_us;
        row.measured_on = measured_on;
        rows.push_back(row);
        char line[160];
        std::snprintf(line, sizeof line, "%-15s %10lld %-12s %3d x %4d %9.2f us\n", op_name(op),
                      static_cast<long long>(bytes), cuda::algorithm_name(algo), best.blocks, best.threads, best_us);
        report << line;
        print_leader(w, line);
      }
    }
  }
  if (!w.leader()) return cli::kExitOk;
  write_table(w, o, comm.arch(), measured_on, rows);
  return cli::kExitOk;
}

int run_tune(int argc, char** argv) {
  int64_t nproc = 0;
  std::string ops_text = "allreduce,reduce_scatter,allgather";
  TuneOptions o;
  o.output = "cuda_backend/tuning/sm90.tsv";
  cli::ArgParser parser("exactcoll tune --nproc N [--ops …] [--output FILE] [--quick]",
                        "Measures every IPC algorithm over launch grids for message sizes from --min-bytes to\n"
                        "--max-bytes per rank (powers of two) and writes the dispatch table that `auto` uses.\n"
                        "Rows of other world sizes, ops and GPU archs already in FILE are kept, and so are its\n"
                        "rows of sizes outside --min-bytes .. --max-bytes and its header comments. Each row\n"
                        "written says where and when it was measured (measured_on: --machine and the UTC date).");
  parser.add_int("nproc", &nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_string("ops", &ops_text, "comma list of allreduce, reduce_scatter, allgather");
  parser.add_string("output", &o.output, "table file to write (merged with its other rows)");
  parser.add_int("min-bytes", &o.min_bytes, "smallest message, bytes per rank");
  parser.add_int("max-bytes", &o.max_bytes, "largest message, bytes per rank");
  parser.add_int("graph-ops", &o.graph_ops, "ops per CUDA graph");
  parser.add_int("replays", &o.replays, "timed replays per grid");
  parser.add_bool("quick", &o.quick, "fewer grids");
  parser.add_int("buffer-mib", &o.buffer_mib,
                 "staging and scratch MiB per rank (default: a default communicator's); push algorithms are "
                 "measured where their 2 x n slots fit");
  parser.add_string("machine", &o.machine,
                    "the machine in the rows' measured_on column, e.g. the lent machine's name nvidia-h100-x4");
  parser.set_default_note("machine", "default: the GPU's name with '-' for spaces and -x<nproc>");
  bool no_pdl = false;
  parser.add_bool("no-pdl", &no_pdl, "launch without programmatic dependent launch");
  if (const auto code = parser.parse(argc, argv)) return *code;
  for (const auto& s : split_list(ops_text)) {
    const auto op = cuda::parse_op(s);
    if (!op) return cli::fail("tune", "unknown op '" + s + "'");
    o.ops.push_back(*op);
  }
  o.pdl = !no_pdl;
  if (o.ops.empty()) return cli::fail("tune", "nothing to tune");
  if (!cuda::is_measured_on_text(o.machine)) return cli::fail("tune", "--machine must hold no tab or line break");
  if (o.min_bytes < 16 || o.max_bytes < o.min_bytes || o.graph_ops < 1 || o.replays < 1 || o.buffer_mib < 0) {
    return cli::fail("tune",
                     "need 16 <= --min-bytes <= --max-bytes, positive --graph-ops, --replays, --buffer-mib >= 0");
  }
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "tune")) return *code;
  try {
    return tune_worker(o);
  } catch (const std::exception& e) {
    return cli::fail("tune", e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"tune", "measure the algorithms and grids, write auto's dispatch table", run_tune});

}  // namespace
}  // namespace exactcoll::gpu
