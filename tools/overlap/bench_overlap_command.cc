// `exactcoll bench-overlap --nproc N`: all-gather + matmul overlap on the GPUs, checked and timed.
//
//   exactcoll bench-overlap --nproc N [--dtypes bf16,fp16] [--iters 30] [--warmup 3] [--seed S]
//       [--fsdp-size 8192] [--gather-mib 64] [--ag-shapes 8192x8192x8192,2048x16384x8192]
//       [--check-shape 1024x512x768] [--products all] [--sections check,fsdp,ag] [--json FILE]
//       [--timeout-ms T]
//
// --products: the AG->matmul product groupings to check and time side by side (core/overlap_plan.h
// ProductGrouping): per_shard, merged, pairs, comma-separated; both = per_shard,merged; all = the
// three. Each grouping runs its own pipeline on the same shards.
//
// Sections (per dtype):
//   check  AG->matmul at a small shape, per grouping: the pipeline's gathered A against the
//          simulator's (sim/overlap, the same plan on simulated ranks, same seeded operands) bit for
//          bit, C within tolerance of the simulator's; C against the GPU's own unpipelined schedule
//          (the SM all-gather of core/collectives.h, then one product per row block of the grouping
//          with the pipeline's cuBLASLt configuration for that row count) bit for bit; and what
//          holds for one big GEMM (the heuristic's algorithm for the full shape, and the shard's
//          algorithm run on the full shape).
//   fsdp   an m=n=k product beside an unrelated all-gather of --gather-mib MiB (output): matmul
//          alone; each all-gather alone (SM kernel = the communicator's direct all-gather from a
//          registered buffer; copy engine = the get-protocol pull with no SM; NCCL); sequential
//          (all-gather, then the matmul, one stream); overlapped (all-gather on a side stream). The
//          gathered bits are checked against the shards and the overlapped product against the
//          product alone.
//   ag     AG->matmul per shape: the full matmul alone (tuned and heuristic algorithm, full A),
//          per grouping its products alone (this rank's row blocks, no communication), the
//          all-gather alone, sequential (copy-engine or NCCL all-gather, then the full matmul), and
//          per grouping the pipeline; gathered A and C checked as in `check` (the reference: an NCCL
//          all-gather, then the grouping's row blocks). Every product row count of every grouping
//          gets its own tuned algorithm.
// Times: per variant, the maximum over ranks of each rank's median of --iters per-iteration
// event times (after --warmup), eager launches. TFLOP/s = 2mkn / time. Overlap efficiency =
// max(matmul alone, all-gather alone) / overlapped time.
//
// The command's files: this one (flags, the per-rank driver); bench_overlap.h (what the others
// share) and its .cc files, by topic.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "cuda_backend/nccl_api.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/worker.h"
#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {
namespace {

constexpr const char* kCommand = "bench-overlap";

bool parse_shape(const std::string& text, Shape* out) {
  unsigned long long m = 0, k = 0, n = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%llux%llux%llu%c", &m, &k, &n, &tail) != 3 || m == 0 || k == 0 || n == 0) return false;
  *out = Shape{m, k, n};
  return true;
}

int worker_main(const Options& o) {
  Worker w(kCommand);
  Bench bench(w, o);
  print_leader(w, "# exactcoll bench-overlap: " + std::to_string(w.world_size()) + " ranks on " + w.device_name() +
                      "; cuBLASLt " + bench.lt_version() + "; NCCL " +
                      (bench.comm().nccl_ready() ? cuda::NcclApi::get().version() : std::string("unavailable")) + "\n");
  for (DType dtype : o.dtypes) {
    if (o.check) bench.check_section(dtype);
    if (o.fsdp) bench.fsdp_section(dtype);
    if (o.ag) {
      for (const Shape& s : o.ag_shapes) bench.ag_section(dtype, s);
    }
  }
  bench.report();
  return bench.failed_check() ? cli::kExitDiffer : cli::kExitOk;
}

int run_bench_overlap(int argc, char** argv) {
  Options o;
  int64_t nproc = 0;
  std::string dtypes = "bf16,fp16", shapes = "8192x8192x8192,2048x16384x8192", check_shape = "1024x512x768",
              sections = "check,fsdp,ag", products = "all";
  cli::ArgParser parser(
      "exactcoll bench-overlap --nproc N [--dtypes bf16,fp16] [--iters K] [--warmup K] [--seed S] [--fsdp-size D] "
      "[--gather-mib M] [--ag-shapes MxKxN,...] [--check-shape MxKxN] [--products per_shard,merged,pairs|both|all] "
      "[--sections check,fsdp,ag] [--json FILE] [--timeout-ms T]",
      "All-gather + matmul overlap on the GPUs: checks (gathered bits vs the simulator, C vs the unpipelined schedule) "
      "and times (matmul alone, all-gathers alone, sequential, overlapped; TFLOP/s and overlap efficiency). AG->matmul "
      "runs one pipeline per product grouping, side by side: per_shard (one product per shard), merged (the peers' "
      "rows in at most two products, one per contiguous row block of C), pairs (at most two shards per product).");
  parser.add_int("nproc", &nproc, "processes (one per GPU)");
  parser.mark_required("nproc");
  parser.add_string("dtypes", &dtypes, "bf16,fp16 (comma-separated)");
  parser.add_int("iters", &o.iters, "timed iterations per variant (the median is reported)");
  parser.add_int("warmup", &o.warmup, "untimed iterations first");
  parser.add_int("seed", &o.seed, "seed of the random operands");
  parser.add_int("fsdp-size", &o.fsdp_size, "m = n = k of the FSDP section's product");
  parser.add_int("gather-mib", &o.gather_mib, "FSDP all-gather output size in MiB");
  parser.add_string("ag-shapes", &shapes, "AG->matmul shapes MxKxN, comma-separated (M: all ranks' rows)");
  parser.add_string("check-shape", &check_shape, "the check section's AG->matmul shape MxKxN");
  parser.add_string(
      "products", &products,
      "AG->matmul product groupings: per_shard, merged, pairs (comma-separated); both = per_shard,merged; "
      "all = the three");
  parser.add_string("sections", &sections, "check, fsdp, ag (comma-separated)");
  parser.add_string("json", &o.json_path, "write every row, note and target as JSON (rank 0)");
  parser.add_int("timeout-ms", &o.timeout_ms, "bound on every wait (flags, streams)");
  parser.add_int("comm-streams", &o.comm_streams,
                 "communication streams per pipeline (pulls alternate over them; fewer spread the copies' "
                 "memory traffic over more of the products)");
  if (auto code = parser.parse(argc, argv)) return *code;
  for (const std::string& d : split_list(dtypes)) {
    if (d == "bf16") {
      o.dtypes.push_back(DType::kBF16);
    } else if (d == "fp16") {
      o.dtypes.push_back(DType::kFP16);
    } else {
      return cli::fail(kCommand, "--dtypes takes bf16 and fp16, not '" + d + "'");
    }
  }
  for (const std::string& text : split_list(shapes)) {
    Shape s;
    if (!parse_shape(text, &s)) return cli::fail(kCommand, "--ag-shapes wants MxKxN, got '" + text + "'");
    o.ag_shapes.push_back(s);
  }
  if (!parse_shape(check_shape, &o.check_shape))
    return cli::fail(kCommand, "--check-shape wants MxKxN, got '" + check_shape + "'");
  for (const std::string& g : split_list(products == "both"  ? "per_shard,merged"
                                         : products == "all" ? "per_shard,merged,pairs"
                                                             : products)) {
    ProductGrouping grouping;
    if (!overlap::parse_grouping(g, &grouping)) {
      return cli::fail(kCommand, "--products takes per_shard, merged, pairs, both or all, not '" + g + "'");
    }
    if (std::find(o.groupings.begin(), o.groupings.end(), grouping) == o.groupings.end())
      o.groupings.push_back(grouping);
  }
  if (o.groupings.empty()) return cli::fail(kCommand, "--products must name a grouping");
  o.check = o.fsdp = o.ag = false;
  for (const std::string& s : split_list(sections)) {
    if (s == "check") {
      o.check = true;
    } else if (s == "fsdp") {
      o.fsdp = true;
    } else if (s == "ag") {
      o.ag = true;
    } else {
      return cli::fail(kCommand, "--sections takes check, fsdp and ag, not '" + s + "'");
    }
  }
  if (o.dtypes.empty() || o.iters < 1 || o.warmup < 0 || o.seed < 0 || o.fsdp_size < 1 || o.gather_mib < 1 ||
      o.timeout_ms < 1 || o.comm_streams < 1 || o.comm_streams > 8) {
    return cli::fail(kCommand,
                     "--dtypes must name a type; --iters, --fsdp-size, --gather-mib, --timeout-ms must be positive; "
                     "--comm-streams 1..8");
  }
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), kCommand)) return *code;
  try {
    return worker_main(o);
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"bench-overlap", "all-gather + matmul overlap on the GPUs: checks and times",
                                 run_bench_overlap});

}  // namespace

}  // namespace exactcoll::gpu::bench_overlap
