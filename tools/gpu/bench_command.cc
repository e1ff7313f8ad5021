// `exactcoll bench --nproc N [--op …] [--dtype …] [sizes] [--algos …] [--contract C] [--json FILE]
// [--csv FILE]`: an nccl-tests-style table of one op's algorithms, NCCL's among them, measured in the
// same run. --contract (canonical or tree) is the communicator's and the check's: the same
// algorithms are timed under either (tree against canonical: two runs, the same flags otherwise).
// The driver is the same for every op; what differs (sizes, algorithms, one call, its check) is the
// op's GpuOp (tools/gpu/gpu_op.h: bench_load and the BenchProblem it returns).
//
// Steps:
//   1. Sizes: --rows × --hidden elements, or nccl-tests' -b/-e/-f bytes (rows of --hidden
//      elements; the collectives' default hidden is then 1, one element per row).
//   2. One communicator (buffers: the op's least for these sizes or the library's 128 MiB,
//      whichever is larger, or --buffer-mib), and the op's problem: its buffers for the largest
//      size, the input registered once (what CUDA-graph users do).
//   3. The NVLink bound (2+ ranks, unless --no-bound): a copy-engine copy from rank 1's buffer
//      into rank 0's (the others idle), and every rank pulling from rank + 1 at once.
//   4. Per size, per algorithm: one checked run (outputs poisoned first; #wrong = output elements,
//      summed over ranks, outside what the implementation promises; an inexact algorithm's
//      #!=contract = its elements whose bits differ from the contract's), then the per-op time by
//      CUDA-graph replay (ops per graph, median of replays) and by eager launches, each timed
//      replay or round queued behind an untimed one (device_util.h, LaunchCost). Rank 0 prints
//      each size's times as they are measured (stderr). An op whose problem tunes_auto() (the
//      fused op's --write-table) measures auto last, after making its table from the others.
//   5. Times are the maximum over ranks of each rank's median; algbw = bytes / time, busbw =
//      algbw × the op's bus factor (all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n),
//      as nccl-tests. Tables (graph, eager), a summary of auto against the op's baselines, and
//      the JSON/CSV files (atomic).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/registry.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/nccl_api.h"
#include "tools/cli.h"
#include "tools/contract_flag.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/gpu_op.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"

namespace exactcoll::gpu {
namespace {

constexpr const char* kCommand = "bench";

struct BenchOptions {
  BenchSettings settings;
  std::vector<BenchSize> sizes;
  std::vector<std::string> algos;
  int64_t graph_ops = 20, replays = 25, warmup = 3, eager_rounds = 10;
  int64_t timeout_ms = 10000, buffer_mib = 0;
  bool eager = true, bound = true, pdl = true;
  LaunchCost launch_cost = LaunchCost::kHidden;
  std::string json_path, csv_path;
};

std::string fmt(const char* format, double v) {
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

// Returns the median of 10 timed copy-engine copies of `bytes` from src to dst on stream (2
// untimed first), in µs; `before` runs ahead of each copy.
double time_copy_us(const void* src, void* dst, size_t bytes, cudaStream_t stream,
                    const std::function<void()>& before) {
  std::vector<double> us;
  cudaEvent_t a, b;
  EXC_CUDA_CHECK(cudaEventCreate(&a));
  EXC_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 12; ++i) {
    before();
    EXC_CUDA_CHECK(cudaEventRecord(a, stream));
    EXC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    EXC_CUDA_CHECK(cudaEventRecord(b, stream));
    EXC_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EXC_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2) us.push_back(ms * 1000.0);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return median(us);
}

// The NVLink bound: (1) a copy-engine copy from rank 1's registered buffer into rank 0's, the
// others idle, and (2) every rank at once pulling from rank + 1 (lined up by a device barrier
// before each copy), NVLink busy both ways as in an all-reduce. Returns GB/s of (1), and of (2)
// the slowest rank's, in *all_pull_gbs.
// src and dst (of `bytes`) outlive the communicator: src is registered with it.
double measure_bound_gbs(Worker& w, ApiComm& api, const DeviceBuffer& src, const DeviceBuffer& dst, size_t bytes,
                         cudaStream_t stream, double* all_pull_gbs) {
  const cuda::RegisteredBuffer reg = api.backend_registered(api.register_buffer(src.get(), bytes));
  cuda::Communicator& comm = api.backend();  // peers' addresses and a device barrier: not in the C API
  w.barrier("bound");
  double gbs = 0;
  if (w.rank() == 0) {
    gbs = static_cast<double>(bytes) / (time_copy_us(comm.peer_address(reg, 1), dst.get(), bytes, stream, [] {}) * 1e3);
  }
  w.barrier("bound_done");
  gbs = std::stod(w.all_gather("bound_gbs", fmt("%.6f", gbs))[0]);
  const void* peer = comm.peer_address(reg, (w.rank() + 1) % w.world_size());
  const double mine = static_cast<double>(bytes) /
                      (time_copy_us(peer, dst.get(), bytes, stream, [&] { comm.device_barrier(stream); }) * 1e3);
  comm.check(stream);
  *all_pull_gbs = 0;
  for (const auto& s : w.all_gather("all_pull_gbs", fmt("%.6f", mine))) {
    const double v = std::stod(s);
    *all_pull_gbs = *all_pull_gbs == 0 ? v : std::min(*all_pull_gbs, v);
  }
  return gbs;
}

// Step 4 for one (size, algorithm): the checked run, the timings, agreed over ranks.
BenchResult measure(Worker& w, ApiComm& comm, BenchProblem& problem, const BenchSize& size, const std::string& algo,
                    const BenchOptions& o, cudaStream_t stream) {
  BenchResult r;
  r.size = size;
  r.algo = algo;
  r.count = problem.count_of(size);
  r.bytes = problem.bytes_of(size);
  const std::function<CallReport(cudaStream_t)> bound = problem.call_of(algo);
  const Enqueue enqueue = [&](const Variant&, cudaStream_t s) { return bound(s); };
  Variant registered;
  registered.name = "registered";
  registered.registered = true;
  // 4a. One checked run.
  w.barrier("check");
  std::vector<Bytes> got;
  const CallReport ran = run_checked(enqueue, registered, problem.outputs(), 1, comm, stream,
                                     [&](int, const std::vector<Bytes>& outputs) { got = outputs; });
  const BenchCheck mine = problem.check(algo, ran, got);
  r.chosen = ran.algo;
  if (!ran.detail.empty()) r.chosen += "+" + ran.detail.substr(ran.detail.rfind(' ') + 1);
  if (ran.grid.blocks > 0) r.chosen += " " + std::to_string(ran.grid.blocks) + "x" + std::to_string(ran.grid.threads);
  r.exact = ran.exact;
  // 4b. Graph replay, 4c. eager.
  const auto call = [&] { bound(stream); };
  const auto check = [&] { comm.check(stream); };
  w.barrier("graph");
  const double graph_us = time_graph_us(stream, call, static_cast<int>(o.graph_ops), static_cast<int>(o.warmup),
                                        static_cast<int>(o.replays), check, o.launch_cost);
  comm.check(stream);
  double eager_us = 0;
  if (o.eager) {
    w.barrier("eager");
    eager_us = time_eager_us(stream, call, static_cast<int>(o.graph_ops), static_cast<int>(o.warmup),
                             static_cast<int>(o.eager_rounds), check, o.launch_cost);
    comm.check(stream);
  }
  // 5. Over ranks: the slowest rank's time, the summed counts.
  const auto all = w.all_gather("result", fmt("%.6f", graph_us) + " " + fmt("%.6f", eager_us) + " " +
                                              std::to_string(mine.wrong) + " " + std::to_string(mine.differ) + " " +
                                              (mine.promise_checked ? "1 " : "0 ") + (mine.compared ? "1" : "0"));
  r.check.promise_checked = r.check.compared = true;
  for (const auto& text : all) {
    std::istringstream is(text);
    double g = 0, e = 0;
    uint64_t wrong = 0, differ = 0;
    int promise_checked = 0, compared = 0;
    is >> g >> e >> wrong >> differ >> promise_checked >> compared;
    r.graph_us = std::max(r.graph_us, g);
    r.eager_us = std::max(r.eager_us, e);
    r.check.wrong += wrong;
    r.check.differ += differ;
    r.check.promise_checked = r.check.promise_checked && promise_checked == 1;
    r.check.compared = r.check.compared && compared == 1;
  }
  return r;
}

// Step 2's header lines (rank 0): the op, the ranks, how times are taken and what #wrong means.
void print_bench_head(Worker& w, const GpuOp& op, const BenchOptions& o, const ApiCommOptions& co,
                      const exactcoll_comm_properties& p, const BenchProblem& problem) {
  const BenchSettings& s = o.settings;
  const int n = w.world_size();
  std::ostringstream head;
  head << "# exactcoll bench: " << op.name() << " " << dtype_name(s.dtype) << ", contract "
       << contract_name(static_cast<Contract>(p.contract)) << ", " << n << " ranks on " << w.device_name() << " ("
       << p.arch << "); NCCL " << (p.nccl_ready ? cuda::NcclApi::get().version() : std::string("not loaded")) << "\n"
       << "# time: max over ranks of the median per-op µs; graph: " << o.graph_ops << " ops per CUDA graph, "
       << o.replays << " replays; eager: " << o.eager_rounds << " rounds of " << o.graph_ops << " launches; "
       << (o.launch_cost == LaunchCost::kHidden ? "each behind an untimed launch of the same ops"
                                                : "each from an idle stream (--launch-in-span)")
       << "; inputs registered; programmatic launch " << (o.pdl ? "on" : "off") << "; buffers "
       << (co.buffer_bytes >> 20) << " MiB per rank"
       << "\n# #wrong: output elements (all ranks) outside what the implementation promises: exactcoll the\n"
       << "#   contract's bits; NCCL's all-reduce and reduce-scatter sums |got - exact| <= gamma_n * sum|x|\n"
       << "#   (sim/reference.h), its all-gather the input bits; '-' = not judged (the fused op's\n"
       << "#   nccl_split, the split's parts alone, --no-check). #!=contract (NCCL): elements whose bits\n"
       << "#   differ from the contract: the rounding NCCL's order gives, not corruption\n"
       << "# " << problem.header() << "\n";
  print_leader(w, head.str());
}

// Step 3: the NVLink bound (2+ ranks on GPUs of their own, unless --no-bound), printed by rank 0.
// Returns its GB/s, 0 when not measured. bound_src and bound_dst get the copy's buffers: the
// caller declares them before the communicator, since src is registered with it and must outlive it.
double nvlink_bound(Worker& w, ApiComm& comm, const BenchOptions& o, uint64_t max_bytes, DeviceBuffer* bound_src,
                    DeviceBuffer* bound_dst, cudaStream_t stream) {
  const int n = w.world_size();
  const exactcoll_comm_properties& p = comm.properties();
  double bound_gbs = 0;
  if (o.bound && n >= 2 && p.shared_gpu) {
    print_leader(w, "# NVLink bound: not measured (ranks share a GPU)\n");
  } else if (o.bound && n >= 2) {
    const size_t copy_bytes = std::min<uint64_t>(max_bytes, uint64_t{64} << 20);
    if (copy_bytes >= (size_t{1} << 20)) {
      double all_pull_gbs = 0;
      *bound_src = DeviceBuffer(copy_bytes);
      *bound_dst = DeviceBuffer(copy_bytes);
      bound_gbs = measure_bound_gbs(w, comm, *bound_src, *bound_dst, copy_bytes, stream, &all_pull_gbs);
      std::ostringstream os;
      os << "# NVLink bound: copy-engine peer copy rank 1 -> rank 0 of " << (copy_bytes >> 20)
         << " MiB: " << fmt("%.1f", bound_gbs)
         << " GB/s (the others idle); every rank pulling from rank+1 at once: " << fmt("%.1f", all_pull_gbs)
         << " GB/s per GPU (slowest rank)\n";
      print_leader(w, os.str());
    }
  }
  return bound_gbs;
}

// Step 4: every size × algorithm measured (auto last when the problem tunes it), rank 0 printing
// each size's graph times to stderr as they come. Returns the results size-major, in --algos order.
std::vector<BenchResult> measure_all(Worker& w, ApiComm& comm, const GpuOp& op, BenchProblem& problem,
                                     const BenchOptions& o, cudaStream_t stream) {
  std::map<std::pair<size_t, std::string>, BenchResult> by_point;
  const bool auto_last = problem.tunes_auto();
  auto progress = [&](size_t i, bool auto_only) {
    if (!w.leader()) return;
    std::ostringstream os;
    os << "# bench " << op.name() << ": size " << i + 1 << " of " << o.sizes.size() << ", "
       << problem.bytes_of(o.sizes[i]) << " bytes (rows " << o.sizes[i].rows << ", hidden " << o.sizes[i].hidden
       << "):";
    for (const std::string& a : o.algos) {
      const auto it = by_point.find({i, a});
      if (it == by_point.end() || (auto_only && a != "auto")) continue;
      os << " " << a << " " << fmt("%.2f", it->second.graph_us);
    }
    os << " us (graph)\n";
    std::fputs(os.str().c_str(), stderr);
  };
  for (size_t i = 0; i < o.sizes.size(); ++i) {
    problem.prepare(o.sizes[i]);
    for (const std::string& a : o.algos) {
      if (auto_last && a == "auto") continue;
      by_point[{i, a}] = measure(w, comm, problem, o.sizes[i], a, o, stream);
    }
    progress(i, false);
  }
  if (auto_last) {
    std::vector<BenchResult> measured;
    for (const auto& [key, r] : by_point) measured.push_back(r);
    problem.tune(measured, w);
    if (std::find(o.algos.begin(), o.algos.end(), "auto") != o.algos.end()) {
      for (size_t i = 0; i < o.sizes.size(); ++i) {
        problem.prepare(o.sizes[i]);
        by_point[{i, "auto"}] = measure(w, comm, problem, o.sizes[i], "auto", o, stream);
        progress(i, true);
      }
    }
  }
  std::vector<BenchResult> results;  // size-major, in --algos order
  for (size_t i = 0; i < o.sizes.size(); ++i) {
    for (const std::string& a : o.algos) results.push_back(by_point.at({i, a}));
  }
  return results;
}

// Does a size's hidden differ from the first's (the tables then show a hidden column)?
bool several_hidden_sizes(const std::vector<BenchSize>& sizes) {
  bool several_hidden = false;
  for (const BenchSize& size : sizes) several_hidden = several_hidden || size.hidden != sizes[0].hidden;
  return several_hidden;
}

// Step 5 (rank 0): the CUDA-graph table, and the eager one unless --no-eager.
std::string bench_tables(const GpuOp& op, const BenchOptions& o, int n, const std::vector<BenchResult>& results) {
  const BenchSettings& s = o.settings;
  const double bf = op.bus_factor(n);
  const size_t per_size = o.algos.size();
  const bool several_hidden = several_hidden_sizes(o.sizes);
  std::map<std::string, bool> inexact;  // per algorithm: some call ran NCCL's sums
  for (const BenchResult& r : results) inexact[r.algo] = inexact[r.algo] || !r.exact;
  // Each column's first field holds its name in the header and auto's choice in the rows: as wide
  // as the longest of those (at least 12), so that the numbers stay under their headings.
  auto chosen_name = [](const BenchResult& r) {
    return r.algo == "auto" ? r.chosen.substr(0, r.chosen.find(' ')) : std::string();
  };
  size_t name_width = 12;
  for (const std::string& a : o.algos) name_width = std::max(name_width, a.size());
  for (const BenchResult& r : results) name_width = std::max(name_width, chosen_name(r).size());
  auto table = [&](bool graph) {
    std::ostringstream os;
    os << "\n# " << (graph ? "CUDA graph" : "eager") << "\n";
    os << "#      size      count  type redop" << (several_hidden ? " hidden" : "");
    for (const std::string& a : o.algos) {
      os << " | " << a << std::string(name_width - a.size(), ' ') << "  time(us) algbw busbw #wrong"
         << (inexact[a] ? " #!=contract" : "");
    }
    os << "\n";
    for (size_t i = 0; i < results.size(); i += per_size) {
      char lead[80];
      std::snprintf(lead, sizeof lead, "%11llu %10llu %5s %5s", static_cast<unsigned long long>(results[i].bytes),
                    static_cast<unsigned long long>(results[i].count), dtype_name(s.dtype), op.bench_redop().c_str());
      os << lead;
      if (several_hidden) os << fmt(" %6.0f", static_cast<double>(results[i].size.hidden));
      for (size_t j = 0; j < per_size; ++j) {
        const BenchResult& r = results[i + j];
        const double us = graph ? r.graph_us : r.eager_us;
        const double algbw = static_cast<double>(r.bytes) / (us * 1e3);
        const std::string wrong = r.check.promise_checked ? std::to_string(r.check.wrong) : "-";
        char cell[160];
        std::snprintf(cell, sizeof cell, " | %-*s %8.2f %5.1f %5.1f %6s", static_cast<int>(name_width),
                      chosen_name(r).c_str(), us, algbw, algbw * bf, wrong.c_str());
        os << cell;
        if (inexact[r.algo]) {
          std::snprintf(cell, sizeof cell, " %11s", r.check.compared ? std::to_string(r.check.differ).c_str() : "-");
          os << cell;
        }
      }
      os << "\n";
    }
    return os.str();
  };
  std::ostringstream out;
  out << table(true);
  if (o.eager) out << table(false);
  return out.str();
}

// Step 5 (rank 0): auto against the op's baselines (graph), and the largest size against the
// NVLink bound (bound_gbs > 0).
std::string bench_summary(const GpuOp& op, const BenchOptions& o, int n, double bound_gbs,
                          const std::vector<BenchResult>& results) {
  const double bf = op.bus_factor(n);
  const size_t per_size = o.algos.size();
  const bool several_hidden = several_hidden_sizes(o.sizes);
  std::ostringstream out;
  const auto find = [&](size_t i, const std::string& a) -> const BenchResult* {
    for (size_t j = 0; j < per_size; ++j) {
      if (results[i + j].algo == a) return &results[i + j];
    }
    return nullptr;
  };
  std::vector<std::string> baselines;
  for (const std::string& b : op.bench_baselines()) {
    if (std::find(o.algos.begin(), o.algos.end(), b) != o.algos.end()) baselines.push_back(b);
  }
  if (std::find(o.algos.begin(), o.algos.end(), "auto") != o.algos.end()) {
    out << "\n# summary (CUDA graph): auto against";
    for (const std::string& b : baselines) out << " " << b;
    out << (baselines.empty() ? " nothing (no baseline measured)" : "") << "; ratio = auto / baseline\n";
    out << "#      size" << (several_hidden ? " hidden" : "") << "   auto(us)";
    for (const std::string& b : baselines) {
      char head[64];
      std::snprintf(head, sizeof head, " %10s  ratio", (b + "(us)").c_str());
      out << head;
    }
    out << "  auto ran\n";
    for (size_t i = 0; i < results.size(); i += per_size) {
      const BenchResult* a = find(i, "auto");
      char cell[96];
      std::snprintf(cell, sizeof cell, "%11llu", static_cast<unsigned long long>(a->bytes));
      out << cell;
      if (several_hidden) out << fmt(" %6.0f", static_cast<double>(a->size.hidden));
      out << fmt(" %10.2f", a->graph_us);
      for (const std::string& b : baselines) {
        const BenchResult* base = find(i, b);
        out << fmt(" %10.2f", base->graph_us)
            << (base->graph_us > 0 ? fmt(" %6.3f", a->graph_us / base->graph_us) : std::string("      -"));
      }
      out << "  " << a->chosen << "\n";
    }
  }
  if (bound_gbs > 0 && !results.empty()) {
    const BenchResult& last = results[results.size() - per_size];
    const double bound_us = static_cast<double>(last.bytes) * bf / (bound_gbs * 1e3);  // bytes into each GPU
    const BenchResult* a = find(results.size() - per_size, "auto");
    out << "# NVLink bound for " << last.bytes << " bytes: " << fmt("%.1f", bound_us) << " us at "
        << fmt("%.1f", bound_gbs) << " GB/s";
    if (a != nullptr && bound_us > 0)
      out << "; auto " << fmt("%.1f", a->graph_us) << " us = " << fmt("%.3f", a->graph_us / bound_us) << " x bound";
    out << "\n";
  }
  return out.str();
}

// Step 5 (rank 0): the #wrong totals line. The exit code is exactcoll's promise: *total_wrong,
// over the exact algorithms; NCCL's sums outside their bound are printed, not failed on.
std::string wrong_totals(const std::vector<BenchResult>& results, uint64_t* total_wrong_out) {
  std::ostringstream out;
  uint64_t total_wrong = 0, inexact_outside = 0;
  bool inexact_judged = false, inexact_ran = false;
  for (const BenchResult& r : results) {
    if (!r.exact) inexact_ran = true;
    if (!r.exact && r.check.promise_checked) inexact_judged = true;
    if (r.check.promise_checked) (r.exact ? total_wrong : inexact_outside) += r.check.wrong;
  }
  out << "# #wrong total over exact algorithms: " << total_wrong;
  if (inexact_judged) {
    out << "; NCCL outside its sum bound: " << inexact_outside;
  } else if (inexact_ran) {
    out << "; NCCL's results: not judged (only #!=contract)";
  }
  out << "\n";
  *total_wrong_out = total_wrong;
  return out.str();
}

// Step 6 (rank 0): the JSON and CSV files (atomic), where asked for. Throws on a write failure.
void write_bench_files(Worker& w, const GpuOp& op, const BenchOptions& o, double bound_gbs,
                       const std::vector<BenchResult>& results) {
  const BenchSettings& s = o.settings;
  const int n = w.world_size();
  const double bf = op.bus_factor(n);
  auto record = [&](const BenchResult& r, bool graph, bool json) {
    const double us = graph ? r.graph_us : r.eager_us;
    const double algbw = static_cast<double>(r.bytes) / (us * 1e3);
    std::ostringstream os;
    if (json) {
      os << "{\"op\":\"" << op.name() << "\",\"dtype\":\"" << dtype_name(s.dtype) << "\",\"contract\":\""
         << contract_name(s.contract) << "\",\"ranks\":" << n << ",\"device\":\"" << w.device_name()
         << "\",\"rows\":" << r.size.rows << ",\"hidden\":" << r.size.hidden << ",\"bytes\":" << r.bytes
         << ",\"count\":" << r.count << ",\"algo\":\"" << r.algo << "\",\"ran\":\"" << r.chosen << "\",\"mode\":\""
         << (graph ? "graph" : "eager") << "\",\"time_us\":" << fmt("%.3f", us)
         << ",\"algbw_gbs\":" << fmt("%.3f", algbw) << ",\"busbw_gbs\":" << fmt("%.3f", algbw * bf)
         << ",\"wrong\":" << (r.check.promise_checked ? std::to_string(r.check.wrong) : "null")
         << ",\"differ_from_contract\":" << (r.check.compared ? std::to_string(r.check.differ) : "null")
         << ",\"exact\":" << (r.exact ? "true" : "false") << "}";
    } else {
      os << op.name() << ',' << dtype_name(s.dtype) << ',' << n << ',' << r.size.rows << ',' << r.size.hidden << ','
         << r.bytes << ',' << r.count << ',' << r.algo << ',' << r.chosen << ',' << (graph ? "graph" : "eager") << ','
         << fmt("%.3f", us) << ',' << fmt("%.3f", algbw) << ',' << fmt("%.3f", algbw * bf) << ','
         << (r.check.promise_checked ? std::to_string(r.check.wrong) : "") << ','
         << (r.check.compared ? std::to_string(r.check.differ) : "") << ',' << (r.exact ? 1 : 0) << ','
         << contract_name(s.contract);
    }
    return os.str();
  };
  if (!o.json_path.empty()) {
    std::ostringstream js;
    js << "{\"bound_gbs\":" << fmt("%.3f", bound_gbs) << ",\"results\":[\n";
    bool first = true;
    for (const auto& r : results) {
      for (bool graph : {true, false}) {
        if (!graph && !o.eager) continue;
        js << (first ? "" : ",\n") << record(r, graph, true);
        first = false;
      }
    }
    js << "\n]}\n";
    npy::write_file_atomic(cli::resolve_path(o.json_path), js.str().data(), js.str().size());
  }
  if (!o.csv_path.empty()) {
    std::ostringstream cs;
    cs << "op,dtype,ranks,rows,hidden,bytes,count,algo,ran,mode,time_us,algbw_gbs,busbw_gbs,wrong,differ_from_"
          "contract,exact,contract\n";
    for (const auto& r : results) {
      for (bool graph : {true, false}) {
        if (!graph && !o.eager) continue;
        cs << record(r, graph, false) << "\n";
      }
    }
    npy::write_file_atomic(cli::resolve_path(o.csv_path), cs.str().data(), cs.str().size());
  }
}

int bench_worker(GpuOp& op, const BenchOptions& o) {
  Worker w(kCommand);
  const int n = w.world_size(), rank = w.rank();
  const BenchSettings& s = o.settings;
  // 2. The communicator and the op's problem.
  ApiCommOptions co;
  co.name = "bench";
  co.flag_timeout_ms = static_cast<uint64_t>(o.timeout_ms);
  co.programmatic_launch = o.pdl;
  co.contract = s.contract;
  size_t least_bytes = 0;
  op.bench_communicator(s, o.sizes, n, o.algos, &co, &least_bytes);
  co.buffer_bytes = std::max(least_bytes, buffer_bytes_for(o.buffer_mib));
  // Declared before the communicator, so destroyed after it: memory registered with a communicator
  // must outlive it (its peers keep their mappings until it is destroyed).
  std::unique_ptr<BenchProblem> problem;
  DeviceBuffer bound_src, bound_dst;
  ApiComm comm(w.store(), rank, n, co);
  const exactcoll_comm_properties& p = comm.properties();
  if (const std::string problem = check_comm_contract(comm, s.contract); !problem.empty()) {
    return cli::fail(kCommand, problem, cli::kExitFailure);
  }
  if (!p.ipc_ready) {
    return cli::fail(kCommand, "the IPC path is unavailable: " + std::string(p.ipc_unavailable_reason),
                     cli::kExitFailure);
  }
  problem = op.bench_load(s, comm, o.sizes, n, rank);
  Stream stream;
  uint64_t max_bytes = 0;
  for (const BenchSize& size : o.sizes) max_bytes = std::max(max_bytes, problem->bytes_of(size));
  print_bench_head(w, op, o, co, p, *problem);

  // 3. The NVLink bound.
  const double bound_gbs = nvlink_bound(w, comm, o, max_bytes, &bound_src, &bound_dst, stream.get());

  // 4. Sizes × algorithms (auto last when the problem tunes it).
  const std::vector<BenchResult> results = measure_all(w, comm, op, *problem, o, stream.get());

  // 5. Tables (rank 0).
  if (!w.leader()) return cli::kExitOk;
  uint64_t total_wrong = 0;
  std::ostringstream out;
  out << bench_tables(op, o, n, results) << bench_summary(op, o, n, bound_gbs, results)
      << wrong_totals(results, &total_wrong);
  std::fwrite(out.str().data(), 1, out.str().size(), stdout);
  std::fflush(stdout);

  // 6. Files (atomic).
  try {
    write_bench_files(w, op, o, bound_gbs, results);
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
  return total_wrong == 0 ? cli::kExitOk : cli::kExitDiffer;
}

// The op named by --op, in either spelling (before parsing: the op adds its own flags), or allreduce.
std::unique_ptr<GpuOp> op_of_arguments(int argc, char** argv) {
  std::string name = "allreduce";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--op" && i + 1 < argc) name = argv[i + 1];
    if (a.rfind("--op=", 0) == 0) name = a.substr(5);
  }
  for (auto& op : gpu_ops()) {
    if (op->name() == canonical_op_name(name)) return std::move(op);
  }
  return std::move(gpu_ops().front());  // the parser then refuses the unknown --op by name
}

// The flags of `exactcoll bench` that BenchOptions does not take as given: the process count and
// seed, the texts parsed afterwards (op, dtype, sizes, algorithms) and the switches it negates.
struct BenchFlags {
  int64_t nproc = 0, seed = 1, step_factor = 2;
  std::string op_text = "allreduce", dtype_text = "bf16", rows_text, hidden_text, algos_text, min_bytes_text,
              max_bytes_text, contract_text = "canonical";
  bool no_eager = false, no_check = false, no_bound = false, no_pdl = false, launch_in_span = false;
};

// "a, b, c": the op's algorithms, as the help and the --algos errors list them.
std::string algo_list_of(const std::vector<std::string>& algorithms) {
  std::string algo_list;
  for (const std::string& a : algorithms) algo_list += (algo_list.empty() ? "" : ", ") + a;
  return algo_list;
}

// The command's flags with op's own, bound to *flags and *o; with --op given, the usage names the
// op first, so that a flag error's hint is that op's --help.
cli::ArgParser make_parser(GpuOp& op, int argc, char** argv, BenchFlags* flags, BenchOptions* o) {
  BenchFlags& f = *flags;
  std::vector<std::string> op_names;
  std::string op_choices;
  for (const auto& candidate : gpu_ops()) {
    op_names.push_back(candidate->name());
    op_choices += (op_choices.empty() ? "" : "|") + candidate->name();
  }
  const std::string algo_list = algo_list_of(op.bench_algorithms());
  // With --op given, the usage names it first, so that a flag error's hint is that op's --help.
  bool op_given = false;
  for (int i = 1; i < argc; ++i) op_given = op_given || std::string(argv[i]).rfind("--op", 0) == 0;
  std::string usage = "exactcoll bench ";
  usage += op_given ? "--op " + op.name() + " --nproc N" : "--nproc N [--op " + op_choices + "]";
  usage += " [--dtype bf16|fp16|fp32] [--rows R,… --hidden H,… | -b BYTES -e BYTES -f F] [--algos A,…]";
  usage += " [--contract " + library_contract_names(kOnGpu, "|") + "]";
  usage += " [--json FILE] [--csv FILE]";
  cli::ArgParser parser(
      usage,
      "Times one op's algorithms (NCCL's among them) in the same run, by CUDA-graph replay and eager\n"
      "launches, and checks every exact algorithm's output bits. Prints an nccl-tests-style table: size,\n"
      "count, type, redop, then per algorithm time (µs), algbw, busbw (GB/s) and #wrong (NCCL: and\n"
      "#!=contract), then auto against the op's baselines. Message = rows × hidden elements, or\n"
      "nccl-tests' -b/-e/-f bytes (all-reduce: each rank's buffer; reduce_scatter: each rank's input;\n"
      "allgather: the gathered output; fused_rmsnorm: x, rows of --hidden). Rank 0 prints each size's\n"
      "times as it is measured (stderr), the tables at the end. `bench --op OP --help` lists the op's\n"
      "algorithms and flags. Example: exactcoll bench --nproc 8 -b 8K -e 128M -f 2");
  parser.add_int("nproc", &f.nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_op_choice("op", &f.op_text, op_names, "the op to time");
  parser.add_choice("dtype", &f.dtype_text, {"bf16", "fp16", "fp32"}, "storage type");
  parser.add_string("hidden", &f.hidden_text, "comma list of elements per row");
  auto joined = [](const std::vector<int64_t>& list) {
    std::string text;
    for (int64_t h : list) {
      if (!text.empty()) text += ',';
      text += std::to_string(h);
    }
    return text;
  };
  parser.set_default_note("hidden", "default: " + joined(op.bench_default_hidden(false)) + "; with -b/-e " +
                                        joined(op.bench_default_hidden(true)));
  parser.add_string("rows", &f.rows_text, "comma list of row counts");
  parser.set_default_note("rows", "default: 1,2,4,…,4096");
  parser.add_string("minbytes", &f.min_bytes_text,
                    "-b: the smallest message in bytes, as nccl-tests (8, 256K, 128M; with -e, instead of --rows)");
  parser.set_default_note("minbytes", "default: the --rows sizes");
  parser.add_string("maxbytes", &f.max_bytes_text, "-e: the largest message in bytes (with -b)");
  parser.set_default_note("maxbytes", "default: the --rows sizes");
  parser.add_int("stepfactor", &f.step_factor, "-f: each size is the previous times this (with -b/-e)");
  parser.add_short('b', "minbytes");
  parser.add_short('e', "maxbytes");
  parser.add_short('f', "stepfactor");
  parser.add_string("algos", &f.algos_text, "comma list of " + algo_list);
  parser.set_default_note("algos", "default: all of them");
  cli::add_contract_flag(parser, &f.contract_text, kOnGpu,
                         "the rounding contract the communicator folds under and the outputs are checked against "
                         "(the same algorithms either way; NCCL's sums follow none)");
  parser.add_int("graph-ops", &o->graph_ops, "ops captured per CUDA graph (and per eager round)");
  parser.add_int("replays", &o->replays, "timed graph replays (the median is reported)");
  parser.add_int("warmup", &o->warmup, "untimed graph replays (and eager rounds) first");
  parser.add_int("eager-rounds", &o->eager_rounds, "timed eager rounds");
  parser.add_int("timeout-ms", &o->timeout_ms, "bound on every in-kernel flag wait");
  parser.add_int("seed", &f.seed, "seed of the random inputs");
  parser.add_int("buffer-mib", &o->buffer_mib, "staging and scratch MiB per rank");
  parser.set_default_note("buffer-mib", "default: the library's, 128, or what the largest size needs");
  parser.add_string("json", &o->json_path, "also write every result as JSON");
  parser.add_string("csv", &o->csv_path, "also write every result as CSV");
  parser.add_bool("no-eager", &f.no_eager, "graph replay only");
  parser.add_bool("no-check", &f.no_check, "skip the check of the outputs");
  parser.add_bool("no-bound", &f.no_bound, "skip the peer-copy bandwidth measurement");
  parser.add_bool("no-pdl", &f.no_pdl, "launch without programmatic dependent launch");
  parser.add_bool("launch-in-span", &f.launch_in_span,
                  "start each timed replay (and eager round) on an idle stream, so that its span holds the host's "
                  "launch and the ranks' skew, as this command timed up to 2026-11-28; by default an untimed launch "
                  "of the same ops goes first, so the timed ones are queued when the span starts");
  op.add_bench_flags(parser);
  return parser;
}

// Step 1 of run_bench: the sizes, nccl-tests' -b/-e/-f bytes or --rows × --hidden, into o->sizes
// (o->settings.dtype set). Returns nullopt to go on, or the exit code to return now (the message
// printed).
std::optional<int> parse_sizes(const cli::ArgParser& parser, const GpuOp& op, const BenchFlags& f, BenchOptions* o) {
  const std::string &hidden_text = f.hidden_text, &rows_text = f.rows_text, &min_bytes_text = f.min_bytes_text,
                    &max_bytes_text = f.max_bytes_text;
  const int64_t step_factor = f.step_factor;
  const bool by_bytes = parser.given("minbytes") || parser.given("maxbytes") || parser.given("stepfactor");
  std::vector<int64_t> hidden_list = op.bench_default_hidden(by_bytes), rows_list;
  if (parser.given("hidden") && !parse_counts(hidden_text, &hidden_list)) {
    return cli::fail(kCommand, "--hidden wants positive whole numbers like 4096,8192, got '" + hidden_text + "'");
  }
  if (by_bytes) {
    // nccl-tests' sizes: -b, -b*f, -b*f^2, … up to -e, each as rows of --hidden elements.
    uint64_t min_bytes = 0, max_bytes = 0;
    if (!parser.given("minbytes") || !parser.given("maxbytes")) return cli::fail(kCommand, "-b and -e go together");
    if (parser.given("rows")) return cli::fail(kCommand, "give the sizes either as -b/-e/-f or as --rows, not both");
    if (!cli::parse_byte_size(min_bytes_text, &min_bytes)) {
      return cli::fail(kCommand, "-b wants bytes such as 8, 256K or 128M (at most 1T), got '" + min_bytes_text + "'");
    }
    if (!cli::parse_byte_size(max_bytes_text, &max_bytes)) {
      return cli::fail(kCommand, "-e wants bytes such as 8, 256K or 128M (at most 1T), got '" + max_bytes_text + "'");
    }
    if (max_bytes < min_bytes) return cli::fail(kCommand, "-e must be at least -b");
    if (step_factor < 2 || step_factor > 1024) return cli::fail(kCommand, "-f must be 2..1024");
    const uint64_t elem = static_cast<uint64_t>(dtype_size(o->settings.dtype));
    for (int64_t h : hidden_list) {
      for (uint64_t b = std::max<uint64_t>(min_bytes, 1); b <= max_bytes; b *= static_cast<uint64_t>(step_factor)) {
        o->sizes.push_back({static_cast<int64_t>(std::max<uint64_t>(b / (elem * static_cast<uint64_t>(h)), 1)), h});
      }
    }
  } else {
    if (rows_text.empty()) {
      for (int64_t r = 1; r <= 4096; r *= 2) rows_list.push_back(r);
    } else if (!parse_counts(rows_text, &rows_list)) {
      return cli::fail(kCommand, "--rows wants positive whole numbers like 1,16,256, got '" + rows_text + "'");
    }
    for (int64_t h : hidden_list) {
      for (int64_t r : rows_list) o->sizes.push_back({r, h});
    }
  }
  for (const BenchSize& size : o->sizes) {
    if (size.rows > (int64_t{1} << 30) / size.hidden) {
      return cli::fail(kCommand, "a message of " + std::to_string(size.rows) + " x " + std::to_string(size.hidden) +
                                     " elements is larger than bench's 2^30 elements");
    }
  }
  return std::nullopt;
}

// The --algos list (default: all the op's algorithms), checked against the op's and without
// repeats, into o->algos. Returns nullopt to go on, or the exit code to return now (the message
// printed).
std::optional<int> parse_algos(const GpuOp& op, const std::string& algos_text, BenchOptions* o) {
  const std::vector<std::string> algorithms = op.bench_algorithms();
  if (algos_text.empty()) {
    o->algos = algorithms;
  } else {
    for (const std::string& a : split_list(algos_text)) {
      if (std::find(algorithms.begin(), algorithms.end(), a) == algorithms.end()) {
        return cli::fail(
            kCommand, "algorithm '" + a + "' does not apply to " + op.name() + " (" + algo_list_of(algorithms) + ")");
      }
      if (std::find(o->algos.begin(), o->algos.end(), a) == o->algos.end()) o->algos.push_back(a);
    }
    if (o->algos.empty()) return cli::fail(kCommand, "--algos names no algorithm");
  }
  return std::nullopt;
}

int run_bench(int argc, char** argv) {
  const std::unique_ptr<GpuOp> op = op_of_arguments(argc, argv);
  BenchFlags f;
  BenchOptions o;
  cli::ArgParser parser = make_parser(*op, argc, argv, &f, &o);
  if (const auto code = parser.parse(argc, argv)) return *code;
  BenchSettings& s = o.settings;
  s.dtype = *parse_dtype(f.dtype_text);
  s.check = !f.no_check;
  s.contract = cli::library_contract(f.contract_text);
  o.eager = !f.no_eager;
  o.bound = !f.no_bound;
  o.pdl = !f.no_pdl;
  o.launch_cost = f.launch_in_span ? LaunchCost::kInSpan : LaunchCost::kHidden;
  if (f.seed < 0) return cli::fail(kCommand, "--seed must be >= 0");
  s.seed = static_cast<uint64_t>(f.seed);
  // 1. Sizes.
  if (const auto code = parse_sizes(parser, *op, f, &o)) return *code;
  // Algorithms.
  if (const auto code = parse_algos(*op, f.algos_text, &o)) return *code;
  if (o.graph_ops < 1 || o.replays < 1 || o.eager_rounds < 1 || o.warmup < 0) {
    return cli::fail(kCommand, "--graph-ops, --replays and --eager-rounds must be positive, --warmup >= 0");
  }
  if (const std::string problem = cli::check_timeout_ms(o.timeout_ms); !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  if (const std::string problem = check_buffer_mib(parser, o.buffer_mib); !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  if (const std::string problem = op->check_bench_flags(s, o.sizes); !problem.empty()) {
    return cli::fail(kCommand, problem);
  }
  if (const auto code = relaunch_unless_worker(argc, argv, f.nproc, parser.given("nproc"), kCommand)) return *code;
  try {
    return bench_worker(*op, o);
  } catch (const std::invalid_argument& e) {
    return cli::fail(kCommand, e.what());
  } catch (const std::exception& e) {
    return cli::fail(kCommand, e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"bench", "time one op's algorithms against NCCL (nccl-tests-style table)", run_bench});

}  // namespace
}  // namespace exactcoll::gpu
