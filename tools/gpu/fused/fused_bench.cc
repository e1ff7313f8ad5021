// `exactcoll bench --op fused_rmsnorm --nproc N [--hidden 4096,8192] [--rows …] [--algos …]`: the
// fused all-reduce + residual + RMSNorm against the split paths, measured in the same run:
//   one_stage, one_stage_reg, push_one_stage,   the fused kernels (one launch each)
//   two_stage, gather_norm
//   auto                                what the table picks (after --write-table: the new table)
//   unfused                             the project's all-reduce (auto) + the separate residual +
//                                       RMSNorm kernel (the split path that keeps the contract)
//   nccl_split                          NCCL all-reduce + the same separate kernel
//   allreduce, norm                     the split's two parts alone (the project's all-reduce; the
//                                       separate kernel), to see where the time goes
// Per (H, rows): 1. every rank makes its x and every rank's x of the checked rows (all rows up to
// 256, else 256 spread evenly; seeded per row) and the scalar reference computes their outputs;
// 2. x goes into a registered buffer (what CUDA-graph users do); 3. per algorithm: one checked run
// (#wrong = elements of both outputs in the checked rows, summed over ranks, whose bits differ
// from the reference; nccl_split's are reported apart, its sums follow no contract), then
// the per-op time by CUDA-graph replay (ops per graph, median of replays; --eager adds eager
// launches); 4. times are the maximum over ranks of each rank's median. speedup = the best split
// (min of unfused, nccl_split) / auto.
// --write-table FILE: after the fused algorithms and unfused are measured at every point, their
// times (agreed by all ranks) become auto's table, written to FILE, and auto is measured with it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/fused/fused_rmsnorm.h"
#include "cuda_backend/nccl_api.h"
#include "sim/fused/reference.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/fused/fused_commands.h"
#include "tools/inputs/fused_inputs.h"
#include "tools/gpu/fused/fused_reference.h"
#include "tools/gpu/reference.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"

namespace exactcoll::gpu {
namespace {

constexpr const char* kCommand = "bench";

using cuda::fused::FusedAlgorithm;

// What a column measures: a FusedAlgorithm, or one part of the split path alone.
enum class Column {
  kOneStage,
  kOneStageReg,
  kPushOneStage,
  kLamportOneStage,
  kTwoStage,
  kGatherNorm,
  kAuto,
  kUnfused,
  kNcclSplit,
  kAllReduce,
  kNorm
};
constexpr Column kColumns[] = {
    Column::kOneStage,  Column::kOneStageReg, Column::kPushOneStage, Column::kLamportOneStage,
    Column::kTwoStage,  Column::kGatherNorm,  Column::kAuto,         Column::kUnfused,
    Column::kNcclSplit, Column::kAllReduce,   Column::kNorm};
// The columns whose times make auto's table (--write-table): every exact algorithm but auto.
constexpr Column kTableColumns[] = {Column::kOneStage,        Column::kOneStageReg, Column::kPushOneStage,
                                    Column::kLamportOneStage, Column::kTwoStage,    Column::kGatherNorm,
                                    Column::kUnfused};

const char* column_name(Column c) {
  switch (c) {
    case Column::kOneStage: return "one_stage";
    case Column::kOneStageReg: return "one_stage_reg";
    case Column::kPushOneStage: return "push_one_stage";
    case Column::kLamportOneStage: return "lamport_one_stage";
    case Column::kTwoStage: return "two_stage";
    case Column::kGatherNorm: return "gather_norm";
    case Column::kAuto: return "auto";
    case Column::kUnfused: return "unfused";
    case Column::kNcclSplit: return "nccl_split";
    case Column::kAllReduce: return "allreduce";
    case Column::kNorm: return "norm";
  }
  return "?";
}

std::optional<FusedAlgorithm> algorithm_of(Column c) {
  switch (c) {
    case Column::kOneStage: return FusedAlgorithm::kOneStage;
    case Column::kOneStageReg: return FusedAlgorithm::kOneStageReg;
    case Column::kPushOneStage: return FusedAlgorithm::kPushOneStage;
    case Column::kLamportOneStage: return FusedAlgorithm::kLamportOneStage;
    case Column::kTwoStage: return FusedAlgorithm::kTwoStage;
    case Column::kGatherNorm: return FusedAlgorithm::kGatherNorm;
    case Column::kAuto: return FusedAlgorithm::kAuto;
    case Column::kUnfused: return FusedAlgorithm::kUnfused;
    case Column::kNcclSplit: return FusedAlgorithm::kNcclSplit;
    default: return std::nullopt;
  }
}

struct BenchOptions {
  DType dtype = DType::kBF16;
  std::vector<int64_t> hidden = {4096, 8192};
  std::vector<int64_t> rows = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  std::vector<Column> columns;
  int64_t graph_ops = 20, replays = 25, warmup = 3, eager_rounds = 10, timeout_ms = 10000;
  bool eager = false;
  std::string csv_path, table_path;
  uint64_t seed = 1;
  float eps = 1e-6f;
};

struct Point {
  int64_t hidden = 0, rows = 0;
  std::map<Column, double> graph_us, eager_us;  // max over ranks
  std::map<Column, std::string> chosen;         // what ran (auto: its choice; unfused: its all-reduce)
  uint64_t wrong = 0, nccl_wrong = 0;           // summed over ranks
};

std::string us_text(const std::map<Column, double>& m, Column c) {
  const auto it = m.find(c);
  if (it == m.end()) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", it->second);
  return b;
}

int bench_worker(const BenchOptions& o) {
  Worker w("bench_fused");
  const int n = w.world_size(), rank = w.rank();
  const size_t elem = static_cast<size_t>(dtype_size(o.dtype));
  const bool wants_nccl = std::find(o.columns.begin(), o.columns.end(), Column::kNcclSplit) != o.columns.end();
  size_t max_count = 0, max_hidden = 0;
  for (int64_t h : o.hidden) {
    max_hidden = std::max(max_hidden, static_cast<size_t>(h));
    for (int64_t r : o.rows) max_count = std::max(max_count, static_cast<size_t>(h * r));
  }
  const size_t max_bytes = max_count * elem;
  cuda::CommunicatorOptions co;
  co.name = "bench_fused";
  co.flag_timeout_ms = static_cast<uint64_t>(o.timeout_ms);
  // Room for every algorithm's largest problem in one launch: two_stage's 2 x rows x H, and
  // push_one_stage's (and push_one_shot's, in unfused) 2 x n x rows x H.
  co.buffer_bytes = std::max<size_t>(2 * static_cast<size_t>(std::max(n, 1)) * max_bytes, size_t{8} << 20);
  co.use_nccl = wants_nccl;
  cuda::Communicator comm(w.store(), rank, n, co);
  if (!comm.ipc_ready()) return cli::fail(kCommand, "the IPC path is unavailable: " + comm.ipc_unavailable_reason(), 3);
  cuda::fused::FusedRmsNorm fused(comm);
  {
    std::ostringstream os;
    os << "# exactcoll bench fused_rmsnorm: " << n << " ranks on " << w.device_name() << " (" << comm.arch() << "), "
       << dtype_name(o.dtype) << ", eps " << o.eps << ", CUDA graph of " << o.graph_ops << " ops, median of "
       << o.replays << " replays, max over ranks (us per op); NCCL "
       << (comm.nccl_ready() ? cuda::NcclApi::get().version() : std::string("not loaded")) << "; table "
       << (o.table_path.empty() ? "as built (or $EXACTCOLL_FUSED_TABLE)" : "measured in this run") << "\n";
    print_leader(w, os.str());
  }
  DeviceBuffer x(max_bytes), residual(max_bytes), weight(max_hidden * elem), ro(max_bytes), out(max_bytes);
  const cuda::RegisteredBuffer registered = comm.register_buffer(x.get(), max_bytes);
  Stream stream;

  // This rank's inputs and the expected outputs of the checked rows of every point (all rows up
  // to kCheckedRows, else kCheckedRows rows spread evenly), kept for the auto pass.
  constexpr int kCheckedRows = 256;
  struct Case {
    FusedInputs in;  // x holds this rank's only
    std::vector<int> checked;
    FusedOutputs want;  // of the checked rows
  };
  std::vector<Case> cases;
  std::vector<Point> points;
  for (int64_t h : o.hidden) {
    for (int64_t r : o.rows) {
      Case c;
      const uint64_t seed = o.seed * 7919 + static_cast<uint64_t>(h * 131 + r);
      c.in = make_fused_inputs(o.dtype, n, static_cast<int>(r), static_cast<int>(h), seed, false, rank);
      const int checked = static_cast<int>(std::min<int64_t>(r, kCheckedRows));
      for (int k = 0; k < checked; ++k) c.checked.push_back(static_cast<int>(static_cast<int64_t>(k) * r / checked));
      c.want = reference_fused(make_fused_rows(o.dtype, n, static_cast<int>(h), seed, false, c.checked), o.eps);
      cases.push_back(std::move(c));
      Point p;
      p.hidden = h;
      p.rows = r;
      points.push_back(p);
    }
  }

  // Measures `column` at point i: a checked run, then the timings. Collective.
  auto measure = [&](size_t i, Column column) {
    const Case& c = cases[i];
    Point& p = points[i];
    const size_t count = c.in.count(), bytes = count * elem;
    EXC_CUDA_CHECK(cudaMemcpy(x.get(), c.in.x[static_cast<size_t>(rank)].data(), bytes, cudaMemcpyHostToDevice));
    EXC_CUDA_CHECK(cudaMemcpy(residual.get(), c.in.residual.data(), bytes, cudaMemcpyHostToDevice));
    EXC_CUDA_CHECK(cudaMemcpy(weight.get(), c.in.weight.data(), c.in.weight.size(), cudaMemcpyHostToDevice));
    const cuda::fused::FusedRmsNormShape shape{c.in.rows, c.in.hidden, o.eps, o.dtype};
    const cuda::fused::FusedRmsNormBuffers b{x.get(), residual.get(), weight.get(), ro.get(), out.get()};
    std::string chosen;
    std::function<void()> enqueue;
    if (const auto algo = algorithm_of(column)) {
      enqueue = [&, algo] {
        const cuda::fused::FusedCallInfo info = fused.run(b, shape, *algo, stream.get(), &registered);
        chosen = cuda::fused::fused_algorithm_name(info.algo);
        if (!info.allreduce.empty()) chosen += "+" + info.allreduce;
      };
    } else if (column == Column::kAllReduce) {
      enqueue = [&] {
        chosen = cuda::algorithm_name(
            comm.allreduce(x.get(), out.get(), count, o.dtype, cuda::Algorithm::kAuto, stream.get(), &registered).algo);
      };
    } else {
      enqueue = [&] {
        fused.residual_rmsnorm(out.get(), residual.get(), weight.get(), ro.get(), out.get(), shape, stream.get());
      };
    }
    // 1. A checked run (outputs poisoned first).
    EXC_CUDA_CHECK(cudaMemsetAsync(ro.get(), 0xA5, bytes, stream.get()));
    EXC_CUDA_CHECK(cudaMemsetAsync(out.get(), 0x5A, bytes, stream.get()));
    enqueue();
    comm.check(stream.get());
    uint64_t wrong = 0;
    if (algorithm_of(column)) {
      const size_t row_bytes = static_cast<size_t>(c.in.hidden) * elem;
      std::vector<uint8_t> got_ro(bytes), got_out(bytes);
      EXC_CUDA_CHECK(cudaMemcpy(got_ro.data(), ro.get(), bytes, cudaMemcpyDeviceToHost));
      EXC_CUDA_CHECK(cudaMemcpy(got_out.data(), out.get(), bytes, cudaMemcpyDeviceToHost));
      for (size_t k = 0; k < c.checked.size(); ++k) {
        const size_t at = static_cast<size_t>(c.checked[k]) * row_bytes;
        wrong += compare_bits(o.dtype, got_ro.data() + at, c.want.residual_out.data() + k * row_bytes,
                              static_cast<size_t>(c.in.hidden))
                     .mismatches;
        wrong += compare_bits(o.dtype, got_out.data() + at, c.want.out.data() + k * row_bytes,
                              static_cast<size_t>(c.in.hidden))
                     .mismatches;
      }
    }
    // 2. Timings.
    const double graph = time_graph_us(stream.get(), enqueue, static_cast<int>(o.graph_ops), static_cast<int>(o.warmup),
                                       static_cast<int>(o.replays), [&] { comm.check(stream.get()); });
    double eager = 0;
    if (o.eager) {
      eager = time_eager_us(stream.get(), enqueue, static_cast<int>(o.graph_ops), static_cast<int>(o.warmup),
                            static_cast<int>(o.eager_rounds), [&] { comm.check(stream.get()); });
    }
    comm.check(stream.get());
    // 3. Agreed over ranks: the maximum time, the summed mismatches.
    char mine[96];
    std::snprintf(mine, sizeof mine, "%.4f %.4f %llu", graph, eager, static_cast<unsigned long long>(wrong));
    const std::string key = "m/" + std::to_string(i) + "/" + column_name(column);
    double g = 0, e = 0;
    uint64_t total_wrong = 0;
    for (const std::string& s : w.all_gather(key, mine)) {
      double gi = 0, ei = 0;
      unsigned long long wi = 0;
      std::sscanf(s.c_str(), "%lf %lf %llu", &gi, &ei, &wi);
      g = std::max(g, gi);
      e = std::max(e, ei);
      total_wrong += wi;
    }
    p.graph_us[column] = g;
    if (o.eager) p.eager_us[column] = e;
    p.chosen[column] = chosen;
    if (column == Column::kNcclSplit) {
      p.nccl_wrong += total_wrong;
    } else {
      p.wrong += total_wrong;
    }
  };

  auto print_point = [&](const Point& p) {
    std::ostringstream os;
    os << "H " << p.hidden << " rows " << p.rows << ":";
    for (Column c : o.columns) {
      if (p.graph_us.count(c)) os << " " << column_name(c) << " " << us_text(p.graph_us, c);
    }
    if (p.chosen.count(Column::kAuto)) os << " (auto=" << p.chosen.at(Column::kAuto) << ")";
    os << " #wrong " << p.wrong << "\n";
    print_leader(w, os.str());
  };

  // 1. Every column but auto at every point.
  for (size_t i = 0; i < points.size(); ++i) {
    for (Column c : o.columns) {
      if (c != Column::kAuto) measure(i, c);
    }
    if (o.table_path.empty() && std::find(o.columns.begin(), o.columns.end(), Column::kAuto) != o.columns.end()) {
      measure(i, Column::kAuto);
    }
    print_point(points[i]);
  }
  // 2. With --write-table: the measured table (the same on every rank), then auto with it.
  if (!o.table_path.empty()) {
    std::vector<cuda::fused::FusedTableRow> rows;
    for (const Point& p : points) {
      for (Column c : kTableColumns) {
        if (!p.graph_us.count(c)) continue;
        cuda::fused::FusedTableRow row;
        row.arch = comm.arch();
        row.world_size = n;
        row.row_bytes = static_cast<uint64_t>(p.hidden) * elem;
        row.rows = static_cast<int>(p.rows);
        row.algo = *algorithm_of(c);
        row.grid = c == Column::kUnfused ? cuda::fused::residual_rmsnorm_grid(static_cast<int>(p.rows),
                                                                              static_cast<int>(p.hidden), o.dtype)
                                         : cuda::fused::default_fused_grid(row.algo, static_cast<int>(p.rows),
                                                                           static_cast<int>(p.hidden), o.dtype, n);
        row.time_us = p.graph_us.at(c);
        rows.push_back(row);
      }
    }
    cuda::fused::FusedTable table(rows);
    if (w.leader()) {
      const std::string text = table.to_text(
          {"exactcoll fused all-reduce + residual + RMSNorm table: measured by `exactcoll bench --op fused_rmsnorm "
           "--write-table` on " +
           std::to_string(n) + " x " + w.device_name() + ", " + dtype_name(o.dtype) +
           ", CUDA graph, max over ranks of the median per-op time (us)."});
      npy::write_file_atomic(cli::resolve_path(o.table_path), text.data(), text.size());
    }
    fused.set_table(table);
    if (std::find(o.columns.begin(), o.columns.end(), Column::kAuto) != o.columns.end()) {
      for (size_t i = 0; i < points.size(); ++i) {
        measure(i, Column::kAuto);
        std::ostringstream os;
        os << "H " << points[i].hidden << " rows " << points[i].rows << ": auto "
           << us_text(points[i].graph_us, Column::kAuto) << " (" << points[i].chosen[Column::kAuto] << ")\n";
        print_leader(w, os.str());
      }
    }
  }

  // 3. The table (and the CSV).
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "\n# fused_rmsnorm, %d ranks, %s, CUDA graph, us per op (max over ranks)\n", n,
                dtype_name(o.dtype));
  os << line;
  std::snprintf(line, sizeof line, "%5s %4s %7s %9s %9s %9s %9s %9s %9s %7s %-16s %7s %7s %7s %5s %6s %5s\n", "H",
                "rows", "KB", "one_stage", "1stg_reg", "push_1stg", "lamp_1stg", "two_stage", "gath_norm", "auto",
                "(auto=)", "unfused", "nccl_sp", "allred", "norm", "speedup", "wrong");
  os << line;
  std::ostringstream csv;
  csv << "world_size,dtype,hidden,rows,bytes,column,chosen,graph_us,eager_us\n";
  for (const Point& p : points) {
    const double kb = static_cast<double>(p.hidden * p.rows) * static_cast<double>(elem) / 1024.0;
    std::string speedup = "-";
    if (p.graph_us.count(Column::kAuto)) {
      double best_split = 0;
      for (Column c : {Column::kUnfused, Column::kNcclSplit}) {
        if (p.graph_us.count(c))
          best_split = best_split == 0 ? p.graph_us.at(c) : std::min(best_split, p.graph_us.at(c));
      }
      if (best_split > 0) {
        char b[32];
        std::snprintf(b, sizeof b, "%.2fx", best_split / p.graph_us.at(Column::kAuto));
        speedup = b;
      }
    }
    const std::string auto_choice = p.chosen.count(Column::kAuto) ? p.chosen.at(Column::kAuto) : "";
    std::snprintf(
        line, sizeof line, "%5lld %4lld %7.0f %9s %9s %9s %9s %9s %9s %7s %-16s %7s %7s %7s %5s %6s %5llu\n",
        static_cast<long long>(p.hidden), static_cast<long long>(p.rows), kb,
        us_text(p.graph_us, Column::kOneStage).c_str(), us_text(p.graph_us, Column::kOneStageReg).c_str(),
        us_text(p.graph_us, Column::kPushOneStage).c_str(), us_text(p.graph_us, Column::kLamportOneStage).c_str(),
        us_text(p.graph_us, Column::kTwoStage).c_str(), us_text(p.graph_us, Column::kGatherNorm).c_str(),
        us_text(p.graph_us, Column::kAuto).c_str(), auto_choice.c_str(), us_text(p.graph_us, Column::kUnfused).c_str(),
        us_text(p.graph_us, Column::kNcclSplit).c_str(), us_text(p.graph_us, Column::kAllReduce).c_str(),
        us_text(p.graph_us, Column::kNorm).c_str(), speedup.c_str(), static_cast<unsigned long long>(p.wrong));
    os << line;
    for (const auto& [c, t] : p.graph_us) {
      const auto e = p.eager_us.find(c);
      csv << n << ',' << dtype_name(o.dtype) << ',' << p.hidden << ',' << p.rows << ','
          << p.hidden * p.rows * static_cast<int64_t>(elem) << ',' << column_name(c) << ','
          << (p.chosen.count(c) ? p.chosen.at(c) : "") << ',' << t << ',' << (e == p.eager_us.end() ? 0.0 : e->second)
          << '\n';
    }
  }
  uint64_t total_wrong = 0, total_nccl_wrong = 0;
  for (const Point& p : points) {
    total_wrong += p.wrong;
    total_nccl_wrong += p.nccl_wrong;
  }
  std::snprintf(line, sizeof line,
                "#wrong: %llu elements differ from the contract in the exact algorithms (must be 0); nccl_split: %llu "
                "(NCCL's sums follow no contract)\n",
                static_cast<unsigned long long>(total_wrong), static_cast<unsigned long long>(total_nccl_wrong));
  os << line;
  print_leader(w, os.str());
  if (w.leader() && !o.csv_path.empty()) {
    const std::string text = csv.str();
    npy::write_file_atomic(cli::resolve_path(o.csv_path), text.data(), text.size());
  }
  return total_wrong == 0 ? cli::kExitOk : cli::kExitDiffer;
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

int run_fused_bench(int argc, char** argv) {
  int64_t nproc = 0, seed = 1;
  double eps = 1e-6;
  std::string op_text,
      dtype_text = "bf16", hidden_text = "4096,8192", rows_text = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096",
      columns_text =
          "one_stage,one_stage_reg,push_one_stage,lamport_one_stage,two_stage,gather_norm,auto,unfused,"
          "nccl_split,allreduce,norm";
  BenchOptions o;
  cli::ArgParser parser(
      "exactcoll bench --op fused_rmsnorm --nproc N [--dtype bf16|fp16|fp32] [--hidden 4096,8192] [--rows …] "
      "[--algos …] [--write-table FILE] [--csv FILE] [--eager]",
      "Times the fused all-reduce + residual + RMSNorm (one_stage, one_stage_reg, push_one_stage, two_stage,\n"
      "gather_norm, auto) against the split paths measured in the same run: the project's all-reduce + a\n"
      "separate residual + RMSNorm kernel (unfused), and NCCL's all-reduce + the same kernel (nccl_split);\n"
      "allreduce and norm are the split's parts alone. CUDA-graph replay; every exact algorithm's outputs\n"
      "are checked against the contract (#wrong). --write-table makes auto's table from this run's times\n"
      "and measures auto with it.");
  parser.add_string("op", &op_text, "fused_rmsnorm");
  parser.add_int("nproc", &nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_choice("dtype", &dtype_text, {"bf16", "fp16", "fp32"}, "storage type");
  parser.add_string("hidden", &hidden_text, "comma list of H");
  parser.add_string("rows", &rows_text, "comma list of row counts");
  parser.add_string(
      "algos", &columns_text,
      "comma list of one_stage, one_stage_reg, push_one_stage, lamport_one_stage, two_stage, gather_norm, "
      "auto, unfused, nccl_split, allreduce, norm");
  parser.add_int("graph-ops", &o.graph_ops, "ops captured per CUDA graph");
  parser.add_int("replays", &o.replays, "timed graph replays (the median is reported)");
  parser.add_int("warmup", &o.warmup, "untimed replays first");
  parser.add_bool("eager", &o.eager, "also time eager launches (CSV only)");
  parser.add_double("eps", &eps, "RMSNorm epsilon");
  parser.add_int("seed", &seed, "seed of the inputs");
  parser.add_string("write-table", &o.table_path, "write auto's table measured in this run to FILE (and use it)");
  parser.add_string("csv", &o.csv_path, "also write every measurement as CSV");
  parser.add_int("timeout-ms", &o.timeout_ms, "bound on every in-kernel flag wait");
  if (const auto code = parser.parse(argc, argv)) return *code;
  if (op_text != "fused_rmsnorm") return cli::fail(kCommand, "--op must be fused_rmsnorm here, got '" + op_text + "'");
  if (const std::string problem = exactcoll::fused::check_eps(eps); !problem.empty())
    return cli::fail(kCommand, problem);
  o.dtype = dtype_text == "fp32" ? DType::kFP32 : dtype_text == "fp16" ? DType::kFP16 : DType::kBF16;
  if (!parse_counts(hidden_text, &o.hidden))
    return cli::fail(kCommand, "--hidden wants positive numbers like 4096,8192");
  if (!parse_counts(rows_text, &o.rows)) return cli::fail(kCommand, "--rows wants positive numbers like 1,2,4");
  for (int64_t h : o.hidden) {
    if (h % pack_elements(o.dtype) != 0) {
      return cli::fail(kCommand, "H " + std::to_string(h) + " is not a multiple of the " + dtype_text + " pack");
    }
  }
  for (const std::string& s : split_list(columns_text)) {
    bool found = false;
    for (Column c : kColumns) {
      if (s == column_name(c)) {
        o.columns.push_back(c);
        found = true;
      }
    }
    if (!found) return cli::fail(kCommand, "unknown algorithm '" + s + "'");
  }
  if (o.columns.empty()) return cli::fail(kCommand, "nothing to measure");
  if (o.graph_ops < 1 || o.replays < 1 || o.warmup < 0 || o.timeout_ms < 1 || seed < 0) {
    return cli::fail(kCommand, "--graph-ops, --replays and --timeout-ms must be positive; --warmup, --seed >= 0");
  }
  o.seed = static_cast<uint64_t>(seed);
  o.eps = static_cast<float>(eps);
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "bench")) return *code;
  try {
    return bench_worker(o);
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
}

}  // namespace exactcoll::gpu
