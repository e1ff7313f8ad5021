// `exactcoll bench --nproc N [--op …] [--dtype …] [--json FILE] [--csv FILE]`: an nccl-tests-style
// table of the CUDA collectives against NCCL, measured in the same run.
//
// Per message size (rows × hidden elements; defaults bf16, hidden 8192, rows 1, 2, 4 … 4096):
//   1. every rank makes every rank's input; the simulator computes the expected outputs;
//   2. this rank's input goes into a registered buffer (what CUDA-graph users do);
//   3. per algorithm (the op's IPC algorithms, auto, nccl): one checked run (#wrong = output
//      elements, summed over ranks, outside what the implementation promises: exactcoll the
//      simulator's bits, NCCL's sums the bound of check_sum_within_bound; NCCL's #!=contract = its
//      elements whose bits differ from the simulator's), then the per-op time by CUDA-graph replay
//      (ops per graph, median of replays) and by eager launches; rank 0 says when a size is done;
//   4. times are the maximum over ranks of each rank's median; algbw = bytes / time, busbw =
//      algbw × 2(n-1)/n (all-reduce) or × (n-1)/n (reduce-scatter, all-gather), as nccl-tests.
// Also measured first: the NVLink bound, a 64 MiB copy-engine copy from rank 1's buffer into rank
// 0's (the others idle), and the all-reduce time it implies for the largest message.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/nccl_api.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/fused/fused_commands.h"
#include "tools/inputs/inputs.h"
#include "tools/gpu/reference.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"

namespace exactcoll::gpu {
namespace {

using cuda::Algorithm;
using cuda::Communicator;
using cuda::Op;

struct BenchOptions {
  Op op = Op::kAllReduce;
  DType dtype = DType::kBF16;
  int64_t hidden = 8192;
  std::vector<int64_t> rows;
  std::vector<Algorithm> algos;
  int64_t graph_ops = 20, replays = 25, warmup = 3, eager_rounds = 10;
  bool eager = true, check = true, bound = true, pdl = true;
  std::string json_path, csv_path, table_path;
  int64_t timeout_ms = 10000;
  uint64_t seed = 1;
  int64_t buffer_mib = 0;  // 0: the largest message or a default communicator's, whichever is larger
};

struct Result {
  int64_t rows = 0;
  uint64_t count = 0;                 // elements (nccl-tests' count: the message's elements)
  uint64_t bytes = 0;                 // message bytes (all-reduce: per-rank buffer; RS: input; AG: output)
  Algorithm algo = Algorithm::kAuto;  // requested
  std::string chosen;                 // what ran ("one_shot 32x512")
  double graph_us = 0, eager_us = 0;
  uint64_t wrong = 0;   // elements outside what the implementation promises (see the table header)
  uint64_t differ = 0;  // elements whose bits differ from the contract (the simulator's)
  bool exact = true;
};

double bus_factor(Op op, int n) {
  if (n <= 1) return 1;
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

std::string fmt(const char* format, double v) {
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

// Copy-engine copy from rank 1's registered buffer into rank 0's output, others idle: GB/s.
double measure_peer_copy_gbs(Worker& w, Communicator& comm, const cuda::RegisteredBuffer& reg, void* dst, size_t bytes,
                             cudaStream_t stream) {
  w.barrier("bound");
  double gbs = 0;
  if (w.rank() == 0) {
    const void* src = comm.peer_address(reg, 1);
    std::vector<double> us;
    cudaEvent_t a, b;
    EXC_CUDA_CHECK(cudaEventCreate(&a));
    EXC_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 12; ++i) {
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
    gbs = static_cast<double>(bytes) / (median(us) * 1e3);
  }
  w.barrier("bound_done");
  const auto all = w.all_gather("bound_gbs", fmt("%.6f", gbs));
  return std::stod(all[0]);
}

// Every rank at once pulls `bytes` from rank + 1's registered buffer by copy engine (lined up by a
// device barrier before each copy): the per-GPU inbound GB/s with NVLink busy in both directions,
// as during an all-reduce. Returns the slowest rank's median.
double measure_all_pull_gbs(Worker& w, Communicator& comm, const cuda::RegisteredBuffer& reg, void* dst, size_t bytes,
                            cudaStream_t stream) {
  w.barrier("all_pull");
  const void* src = comm.peer_address(reg, (w.rank() + 1) % w.world_size());
  std::vector<double> us;
  cudaEvent_t a, b;
  EXC_CUDA_CHECK(cudaEventCreate(&a));
  EXC_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 12; ++i) {
    comm.device_barrier(stream);
    EXC_CUDA_CHECK(cudaEventRecord(a, stream));
    EXC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    EXC_CUDA_CHECK(cudaEventRecord(b, stream));
    EXC_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EXC_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2) us.push_back(ms * 1000.0);
  }
  comm.check(stream);
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  const double gbs = static_cast<double>(bytes) / (median(us) * 1e3);
  double slowest = 0;
  for (const auto& s : w.all_gather("all_pull_gbs", fmt("%.6f", gbs))) {
    const double v = std::stod(s);
    slowest = slowest == 0 ? v : std::min(slowest, v);
  }
  return slowest;
}

int bench_worker(const BenchOptions& o) {
  Worker w("bench");
  const int n = w.world_size(), rank = w.rank();
  const size_t elem = static_cast<size_t>(dtype_size(o.dtype));
  cuda::CommunicatorOptions co;
  co.name = "bench";
  co.flag_timeout_ms = static_cast<uint64_t>(o.timeout_ms);
  co.programmatic_launch = o.pdl;
  if (!o.table_path.empty()) {
    std::ifstream file(o.table_path);
    if (!file) return cli::fail("bench", "cannot open --table " + o.table_path);
    std::stringstream text;
    text << file.rdbuf();
    co.table = cuda::DispatchTable::parse(text.str(), o.table_path);
  }
  // 1. Sizes: per-rank input and output elements of each message.
  auto counts_of = [&](int64_t rows) {
    const uint64_t total = static_cast<uint64_t>(rows) * static_cast<uint64_t>(o.hidden);
    uint64_t in = total;
    if (o.op == Op::kReduceScatter) in = total - total % static_cast<uint64_t>(n);
    if (o.op == Op::kAllGather) in = total / static_cast<uint64_t>(n);
    return std::max<uint64_t>(in, 1);
  };
  size_t max_in = 0, max_out = 0;
  for (int64_t r : o.rows) {
    const uint64_t in = counts_of(r);
    max_in = std::max<size_t>(max_in, in * elem);
    max_out = std::max<size_t>(max_out, output_count(o.op, in, n) * elem);
  }
  // At least a default communicator's buffers, so that auto chooses as it would for a user
  // (push_one_shot and push_two_shot need 2 x n x the message of scratch; larger buffers with
  // --buffer-mib let auto run them on larger messages).
  co.buffer_bytes = std::max<size_t>(
      max_in, o.buffer_mib > 0 ? static_cast<size_t>(o.buffer_mib) << 20 : cuda::CommunicatorOptions{}.buffer_bytes);
  Communicator comm(w.store(), rank, n, co);
  if (!comm.ipc_ready()) return cli::fail("bench", "the IPC path is unavailable: " + comm.ipc_unavailable_reason(), 3);
  DeviceBuffer input(max_in), output(max_out);
  const cuda::RegisteredBuffer reg = comm.register_buffer(input.get(), max_in);
  Stream stream;
  Simulator simulator(n);

  std::ostringstream head;
  head << "# exactcoll bench: " << op_name(o.op) << " " << dtype_name(o.dtype) << ", " << n << " ranks on "
       << w.device_name() << " (" << comm.arch() << "), hidden " << o.hidden << "; NCCL "
       << (comm.nccl_ready() ? cuda::NcclApi::get().version() : std::string("unavailable")) << "\n"
       << "# time: max over ranks of the median per-op µs; graph: " << o.graph_ops << " ops per CUDA graph, "
       << o.replays << " replays; eager: " << o.eager_rounds << " rounds of " << o.graph_ops
       << " launches; inputs registered; programmatic launch " << (o.pdl ? "on" : "off") << "; buffers "
       << (co.buffer_bytes >> 20) << " MiB per rank"
       << "\n# #wrong: output elements (all ranks) outside what the implementation promises: exactcoll the\n"
       << "#   contract's bits (the simulator's); NCCL's sums |got - exact| <= gamma_n * sum|x| (tools/gpu/\n"
       << "#   reference.h), its all-gather the input bits. #!=contract (NCCL): elements whose bits differ\n"
       << "#   from the contract: the rounding NCCL's order gives, not corruption\n";
  print_leader(w, head.str());

  // 2. The NVLink bound.
  double bound_gbs = 0;
  if (o.bound && n >= 2) {
    const size_t copy_bytes = std::min<size_t>(max_in, size_t{64} << 20);
    if (copy_bytes >= (size_t{1} << 20) && max_out >= copy_bytes) {
      bound_gbs = measure_peer_copy_gbs(w, comm, reg, output.get(), copy_bytes, stream.get());
      const double all_pull_gbs = measure_all_pull_gbs(w, comm, reg, output.get(), copy_bytes, stream.get());
      std::ostringstream os;
      os << "# NVLink bound: copy-engine peer copy rank 1 -> rank 0 of " << (copy_bytes >> 20)
         << " MiB: " << fmt("%.1f", bound_gbs)
         << " GB/s (the others idle); every rank pulling from rank+1 at once: " << fmt("%.1f", all_pull_gbs)
         << " GB/s per GPU (slowest rank)\n";
      print_leader(w, os.str());
    }
  }

  // 3. Sizes × algorithms.
  std::vector<Result> results;
  for (int64_t rows : o.rows) {
    const uint64_t count = counts_of(rows);
    const uint64_t out_count = output_count(o.op, count, n);
    const uint64_t msg_count = o.op == Op::kAllGather ? out_count : count;
    const std::vector<Bytes> inputs =
        make_inputs(o.dtype, count, n, o.seed + static_cast<uint64_t>(rows), Pattern::kRandom);
    Bytes want;
    if (o.check) {
      const Algorithm sim_algo = o.op == Op::kAllReduce ? Algorithm::kOneShot : Algorithm::kDirect;
      want = simulator.run(o.op, sim_algo, o.dtype, inputs, count, 8)[static_cast<size_t>(rank)];
    }
    EXC_CUDA_CHECK(
        cudaMemcpy(input.get(), inputs[static_cast<size_t>(rank)].data(), count * elem, cudaMemcpyHostToDevice));
    for (Algorithm algo : o.algos) {
      auto enqueue = [&] {
        switch (o.op) {
          case Op::kAllReduce:
            return comm.allreduce(input.get(), output.get(), count, o.dtype, algo, stream.get(), &reg);
          case Op::kReduceScatter:
            return comm.reduce_scatter(input.get(), output.get(), count, o.dtype, algo, stream.get(), &reg);
          case Op::kAllGather:
            return comm.allgather(input.get(), output.get(), count, o.dtype, algo, stream.get(), &reg);
        }
        return cuda::CallInfo{};
      };
      Result r;
      r.rows = rows;
      r.count = msg_count;
      r.bytes = msg_count * elem;
      r.algo = algo;
      // 3a. One checked run.
      w.barrier("check");
      EXC_CUDA_CHECK(cudaMemsetAsync(output.get(), 0xA5, out_count * elem, stream.get()));
      const cuda::CallInfo info = enqueue();
      comm.check(stream.get());
      r.chosen = cuda::algorithm_name(info.algo);
      if (info.grid.blocks > 0)
        r.chosen += " " + std::to_string(info.grid.blocks) + "x" + std::to_string(info.grid.threads);
      r.exact = info.exact;
      uint64_t wrong = 0, differ = 0;
      if (o.check) {
        Bytes got(out_count * elem);
        EXC_CUDA_CHECK(cudaMemcpy(got.data(), output.get(), got.size(), cudaMemcpyDeviceToHost));
        differ = compare_bits(o.dtype, got.data(), want.data(), out_count).mismatches;
        // What each implementation promises: exactcoll the contract's bits; an inexact sum (NCCL's)
        // only the sum bound; an all-gather, whoever runs it, the bits it was given.
        wrong = info.exact || o.op == Op::kAllGather
                    ? differ
                    : check_sum_within_bound(o.op, o.dtype, inputs, count, rank, got.data()).outside;
      }
      // 3b. Graph replay, 3c. eager.
      w.barrier("graph");
      const double graph_us = time_graph_us(
          stream.get(), [&] { enqueue(); }, static_cast<int>(o.graph_ops), static_cast<int>(o.warmup),
          static_cast<int>(o.replays), [&] { comm.check(stream.get()); });
      comm.check(stream.get());
      double eager_us = 0;
      if (o.eager) {
        w.barrier("eager");
        eager_us = time_eager_us(
            stream.get(), [&] { enqueue(); }, static_cast<int>(o.graph_ops), static_cast<int>(o.warmup),
            static_cast<int>(o.eager_rounds), [&] { comm.check(stream.get()); });
        comm.check(stream.get());
      }
      // 4. Over ranks.
      const auto all = w.all_gather("result", fmt("%.6f", graph_us) + " " + fmt("%.6f", eager_us) + " " +
                                                  std::to_string(wrong) + " " + std::to_string(differ));
      for (const auto& text : all) {
        std::istringstream is(text);
        double g = 0, e = 0;
        uint64_t wr = 0, df = 0;
        is >> g >> e >> wr >> df;
        r.graph_us = std::max(r.graph_us, g);
        r.eager_us = std::max(r.eager_us, e);
        r.wrong += wr;
        r.differ += df;
      }
      results.push_back(r);
    }
    // Progress: a long run says where it is (the tables come at the end).
    if (w.leader()) {
      std::fprintf(stderr, "# bench: %llu bytes measured (size %zu of %zu)\n",
                   static_cast<unsigned long long>(results.back().bytes), results.size() / o.algos.size(),
                   o.rows.size());
    }
  }

  // 5. Tables (rank 0).
  if (!w.leader()) return cli::kExitOk;
  const double bf = bus_factor(o.op, n);
  // Each column's first field holds its name in the header and auto's choice in the rows: as wide
  // as the longest of those (at least 12), so that the numbers stay under their headings.
  auto chosen_name = [](const Result& r) {
    return r.algo == Algorithm::kAuto ? r.chosen.substr(0, r.chosen.find(' ')) : std::string();
  };
  size_t name_width = 12;
  for (Algorithm a : o.algos) name_width = std::max(name_width, std::string(cuda::algorithm_name(a)).size());
  for (const Result& r : results) name_width = std::max(name_width, chosen_name(r).size());
  auto table = [&](bool graph) {
    std::ostringstream os;
    os << "\n# " << (graph ? "CUDA graph" : "eager") << "\n";
    os << "#      size      count  type redop";
    for (Algorithm a : o.algos) {
      const std::string name = cuda::algorithm_name(a);
      os << " | " << name;
      for (size_t i = name.size(); i < name_width; ++i) os << ' ';
      os << "  time(us) algbw busbw #wrong" << (a == Algorithm::kNccl ? " #!=contract" : "");
    }
    os << "\n";
    for (size_t i = 0; i < results.size(); i += o.algos.size()) {
      char lead[64];
      std::snprintf(lead, sizeof lead, "%11llu %10llu %5s %5s", static_cast<unsigned long long>(results[i].bytes),
                    static_cast<unsigned long long>(results[i].count), dtype_name(o.dtype),
                    o.op == Op::kAllGather ? "none" : "sum");
      os << lead;
      for (size_t j = 0; j < o.algos.size(); ++j) {
        const Result& r = results[i + j];
        const double us = graph ? r.graph_us : r.eager_us;
        const double algbw = static_cast<double>(r.bytes) / (us * 1e3);
        char cell[160];
        std::snprintf(cell, sizeof cell, " | %-*s %8.2f %5.1f %5.1f %6llu", static_cast<int>(name_width),
                      chosen_name(r).c_str(), us, algbw, algbw * bf, static_cast<unsigned long long>(r.wrong));
        os << cell;
        if (r.algo == Algorithm::kNccl) {
          std::snprintf(cell, sizeof cell, " %11llu", static_cast<unsigned long long>(r.differ));
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
  // Summary against the targets: auto vs NCCL (graph).
  const auto find = [&](size_t i, Algorithm a) -> const Result* {
    for (size_t j = 0; j < o.algos.size(); ++j) {
      if (results[i + j].algo == a) return &results[i + j];
    }
    return nullptr;
  };
  out << "\n# summary (CUDA graph): auto / nccl\n#      size   auto(us)   nccl(us)  ratio  auto ran\n";
  // The exit code: exactcoll's promise; NCCL's sums outside their bound are printed, not failed on.
  uint64_t total_wrong = 0, nccl_outside = 0;
  for (const auto& r : results) (r.exact ? total_wrong : nccl_outside) += r.wrong;
  for (size_t i = 0; i < results.size(); i += o.algos.size()) {
    const Result* a = find(i, Algorithm::kAuto);
    const Result* nc = find(i, Algorithm::kNccl);
    if (a == nullptr) continue;
    char line[160];
    std::snprintf(line, sizeof line, "%11llu %10.2f %10.2f %6s  %s\n", static_cast<unsigned long long>(a->bytes),
                  a->graph_us, nc != nullptr ? nc->graph_us : 0.0,
                  nc != nullptr ? fmt("%.3f", a->graph_us / nc->graph_us).c_str() : "-", a->chosen.c_str());
    out << line;
  }
  if (bound_gbs > 0 && !results.empty()) {
    const Result& last = results.back();
    const double moved = static_cast<double>(last.bytes) * bf;  // bytes into each GPU
    const double bound_us = moved / (bound_gbs * 1e3);
    const Result* a = find(results.size() - o.algos.size(), Algorithm::kAuto);
    out << "# NVLink bound for " << last.bytes << " bytes: " << fmt("%.1f", bound_us) << " us at "
        << fmt("%.1f", bound_gbs) << " GB/s";
    if (a != nullptr)
      out << "; auto " << fmt("%.1f", a->graph_us) << " us = " << fmt("%.3f", a->graph_us / bound_us) << " x bound";
    out << "\n";
  }
  out << "# #wrong total over exact algorithms: " << total_wrong << "; NCCL outside its sum bound: " << nccl_outside
      << "\n";
  std::fwrite(out.str().data(), 1, out.str().size(), stdout);
  std::fflush(stdout);

  // 6. Files (atomic).
  auto record = [&](const Result& r, bool graph, bool json) {
    const double us = graph ? r.graph_us : r.eager_us;
    const double algbw = static_cast<double>(r.bytes) / (us * 1e3);
    std::ostringstream os;
    if (json) {
      os << "{\"op\":\"" << op_name(o.op) << "\",\"dtype\":\"" << dtype_name(o.dtype) << "\",\"ranks\":" << n
         << ",\"device\":\"" << w.device_name() << "\",\"rows\":" << r.rows << ",\"hidden\":" << o.hidden
         << ",\"bytes\":" << r.bytes << ",\"count\":" << r.count << ",\"algo\":\"" << cuda::algorithm_name(r.algo)
         << "\",\"ran\":\"" << r.chosen << "\",\"mode\":\"" << (graph ? "graph" : "eager")
         << "\",\"time_us\":" << fmt("%.3f", us) << ",\"algbw_gbs\":" << fmt("%.3f", algbw)
         << ",\"busbw_gbs\":" << fmt("%.3f", algbw * bf) << ",\"wrong\":" << r.wrong
         << ",\"differ_from_contract\":" << r.differ << ",\"exact\":" << (r.exact ? "true" : "false") << "}";
    } else {
      os << op_name(o.op) << ',' << dtype_name(o.dtype) << ',' << n << ',' << r.rows << ',' << o.hidden << ','
         << r.bytes << ',' << r.count << ',' << cuda::algorithm_name(r.algo) << ',' << r.chosen << ','
         << (graph ? "graph" : "eager") << ',' << fmt("%.3f", us) << ',' << fmt("%.3f", algbw) << ','
         << fmt("%.3f", algbw * bf) << ',' << r.wrong << ',' << r.differ << ',' << (r.exact ? 1 : 0);
    }
    return os.str();
  };
  try {
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
            "contract,exact\n";
      for (const auto& r : results) {
        for (bool graph : {true, false}) {
          if (!graph && !o.eager) continue;
          cs << record(r, graph, false) << "\n";
        }
      }
      npy::write_file_atomic(cli::resolve_path(o.csv_path), cs.str().data(), cs.str().size());
    }
  } catch (const std::exception& e) {
    return cli::fail("bench", e.what(), cli::kExitFailure);
  }
  return total_wrong == 0 ? cli::kExitOk : cli::kExitDiffer;
}

int run_bench(int argc, char** argv) {
  // `exactcoll bench --op fused_rmsnorm …` (tools/gpu/fused).
  if (asks_for_fused(argc, argv, "op")) return run_fused_bench(argc, argv);
  int64_t nproc = 0;
  std::string op_text = "allreduce", dtype_text = "bf16", rows_text, algos_text, min_bytes_text, max_bytes_text;
  int64_t step_factor = 2;
  bool no_eager = false, no_check = false, no_bound = false, no_pdl = false;
  int64_t seed = 1;
  BenchOptions o;
  cli::ArgParser parser(
      "exactcoll bench --nproc N [--op allreduce|reduce_scatter|allgather] [--dtype bf16|fp16|fp32] "
      "[--rows R,… --hidden H | -b BYTES -e BYTES -f F] [--json FILE] [--csv FILE]",
      "Times the CUDA collectives (every IPC algorithm and auto) against NCCL in the same run, by\n"
      "CUDA-graph replay and eager launches, and checks every output against the simulator. Prints\n"
      "an nccl-tests-style table: size, count, type, redop, then per algorithm time (µs), algbw, busbw\n"
      "(GB/s) and #wrong (NCCL: and #!=contract). Message = rows × hidden elements, or nccl-tests'\n"
      "-b/-e/-f bytes (all-reduce: each rank's buffer; reduce_scatter: each rank's input; allgather:\n"
      "the gathered output). Example: exactcoll bench --nproc 8 -b 8K -e 128M -f 2");
  parser.add_int("nproc", &nproc, "processes, one per GPU");
  parser.mark_required("nproc");
  parser.add_choice("op", &op_text, {"allreduce", "reduce_scatter", "allgather"},
                    "collective (the fused all-reduce + residual + RMSNorm has its own flags: bench --op "
                    "fused_rmsnorm --help)");
  parser.add_choice("dtype", &dtype_text, {"bf16", "fp16", "fp32"}, "storage type");
  parser.add_int("hidden", &o.hidden, "elements per row");
  parser.add_string("rows", &rows_text, "comma list of row counts (default 1,2,4,…,4096)");
  parser.add_string("minbytes", &min_bytes_text,
                    "-b: the smallest message in bytes, as nccl-tests (8, 256K, 128M; with -e, instead of "
                    "--rows/--hidden)");
  parser.set_default_note("minbytes", "default: the --rows sizes");
  parser.add_string("maxbytes", &max_bytes_text, "-e: the largest message in bytes (with -b)");
  parser.set_default_note("maxbytes", "default: the --rows sizes");
  parser.add_int("stepfactor", &step_factor, "-f: each size is the previous times this (with -b/-e)");
  parser.add_short('b', "minbytes");
  parser.add_short('e', "maxbytes");
  parser.add_short('f', "stepfactor");
  parser.add_string("algos", &algos_text, "comma list (default: the op's IPC algorithms, auto, nccl)");
  parser.add_int("graph-ops", &o.graph_ops, "ops captured per CUDA graph (and per eager round)");
  parser.add_int("replays", &o.replays, "timed graph replays (the median is reported)");
  parser.add_int("eager-rounds", &o.eager_rounds, "timed eager rounds");
  parser.add_int("timeout-ms", &o.timeout_ms, "bound on every in-kernel flag wait");
  parser.add_int("seed", &seed, "seed of the random inputs");
  parser.add_int("buffer-mib", &o.buffer_mib,
                 "staging and scratch MiB per rank (default: a default communicator's, or the largest message)");
  parser.add_string("table", &o.table_path, "dispatch table file for auto (default: the built-in one)");
  parser.add_string("json", &o.json_path, "also write every result as JSON");
  parser.add_string("csv", &o.csv_path, "also write every result as CSV");
  parser.add_bool("no-eager", &no_eager, "graph replay only");
  parser.add_bool("no-check", &no_check, "skip the simulator check");
  parser.add_bool("no-bound", &no_bound, "skip the peer-copy bandwidth measurement");
  parser.add_bool("no-pdl", &no_pdl, "launch without programmatic dependent launch");
  if (const auto code = parser.parse(argc, argv)) return *code;
  o.op = *cuda::parse_op(op_text);
  o.dtype = *parse_dtype(dtype_text);
  o.eager = !no_eager;
  o.check = !no_check;
  o.bound = !no_bound;
  o.pdl = !no_pdl;
  o.seed = static_cast<uint64_t>(seed);
  if (o.hidden < 1) return cli::fail("bench", "--hidden must be positive");
  const bool by_bytes = parser.given("minbytes") || parser.given("maxbytes") || parser.given("stepfactor");
  if (by_bytes) {
    // nccl-tests' sizes: -b, -b*f, -b*f^2, … up to -e. Rows of one element each (hidden 1).
    uint64_t min_bytes = 0, max_bytes = 0;
    if (!parser.given("minbytes") || !parser.given("maxbytes")) return cli::fail("bench", "-b and -e go together");
    if (parser.given("rows") || parser.given("hidden")) {
      return cli::fail("bench", "give the sizes either as -b/-e/-f or as --rows/--hidden, not both");
    }
    if (!cli::parse_byte_size(min_bytes_text, &min_bytes)) {
      return cli::fail("bench", "-b wants bytes such as 8, 256K or 128M (at most 1T), got '" + min_bytes_text + "'");
    }
    if (!cli::parse_byte_size(max_bytes_text, &max_bytes)) {
      return cli::fail("bench", "-e wants bytes such as 8, 256K or 128M (at most 1T), got '" + max_bytes_text + "'");
    }
    if (max_bytes < min_bytes) return cli::fail("bench", "-e must be at least -b");
    if (step_factor < 2 || step_factor > 1024) return cli::fail("bench", "-f must be 2..1024");
    o.hidden = 1;
    const uint64_t elem = static_cast<uint64_t>(dtype_size(o.dtype));
    for (uint64_t b = min_bytes; b <= max_bytes; b *= static_cast<uint64_t>(step_factor)) {
      o.rows.push_back(static_cast<int64_t>(std::max<uint64_t>(b / elem, 1)));
    }
  } else if (rows_text.empty()) {
    for (int64_t r = 1; r <= 4096; r *= 2) o.rows.push_back(r);
  } else {
    for (const auto& s : split_list(rows_text)) {
      char* end = nullptr;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (*end != '\0' || v < 1) return cli::fail("bench", "--rows wants positive whole numbers, got '" + s + "'");
      o.rows.push_back(v);
    }
  }
  if (algos_text.empty()) {
    o.algos = cuda::ipc_algorithms(o.op);
    o.algos.push_back(Algorithm::kAuto);
    o.algos.push_back(Algorithm::kNccl);
  } else {
    const auto allowed = cuda::ipc_algorithms(o.op);
    for (const auto& s : split_list(algos_text)) {
      const auto a = cuda::parse_algorithm(s);
      if (!a || (*a != Algorithm::kAuto && *a != Algorithm::kNccl &&
                 std::find(allowed.begin(), allowed.end(), *a) == allowed.end())) {
        return cli::fail("bench", "algorithm '" + s + "' does not apply to " + op_text);
      }
      o.algos.push_back(*a);
    }
  }
  if (o.graph_ops < 1 || o.replays < 1 || o.eager_rounds < 1 || o.timeout_ms < 1 || o.buffer_mib < 0) {
    return cli::fail("bench",
                     "--graph-ops, --replays, --eager-rounds and --timeout-ms must be positive, --buffer-mib >= 0");
  }
  if (const auto code = relaunch_unless_worker(argc, argv, nproc, parser.given("nproc"), "bench")) return *code;
  try {
    return bench_worker(o);
  } catch (const std::exception& e) {
    return cli::fail("bench", e.what(), cli::kExitFailure);
  }
}

const cli::Registrar kRegistrar({"bench", "time the CUDA collectives against NCCL (nccl-tests-style table)",
                                 run_bench});

}  // namespace
}  // namespace exactcoll::gpu
