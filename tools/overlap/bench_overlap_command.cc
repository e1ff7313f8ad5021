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
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/nccl_api.h"
#include "cuda_backend/overlap/cublaslt_api.h"
#include "cuda_backend/overlap/lt_matmul.h"
#include "cuda_backend/overlap/pipeline.h"
#include "sim/overlap/inputs.h"
#include "sim/overlap/matmul.h"
#include "sim/overlap/overlap_sim.h"
#include "sim/world.h"
#include "tools/cli.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/worker.h"
#include "npy/npy.h"

namespace exactcoll::gpu {
namespace {

constexpr const char* kCommand = "bench-overlap";
using Bytes = std::vector<uint8_t>;
using cuda::Algorithm;
using cuda::LtMatmul;
using cuda::OverlapPipeline;
using overlap::Pattern;
using overlap::ProductGrouping;
using Algos = std::map<size_t, cublasLtMatmulAlgo_t>;  // cuBLASLt algorithm by a product's row count

struct Shape {
  size_t m = 0, k = 0, n = 0;
};

struct Options {
  std::vector<DType> dtypes;
  int64_t iters = 30, warmup = 3, seed = 1, fsdp_size = 8192, gather_mib = 64, timeout_ms = 20000;
  int64_t comm_streams = 2;  // the pipelines' communication streams (pulls alternate over them)
  std::vector<Shape> ag_shapes;
  Shape check_shape{1024, 512, 768};
  std::vector<ProductGrouping> groupings;  // AG->matmul's product groupings, compared side by side
  bool check = true, fsdp = true, ag = true;
  std::string json_path;
};

struct Row {
  std::string section, dtype, variant;
  double us = 0, tflops = 0, efficiency = 0;  // 0: not applicable
  std::string note;
};

std::string fmt(const char* format, double v) {
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

bool parse_shape(const std::string& text, Shape* out) {
  unsigned long long m = 0, k = 0, n = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%llux%llux%llu%c", &m, &k, &n, &tail) != 3 || m == 0 || k == 0 || n == 0) return false;
  *out = Shape{m, k, n};
  return true;
}

// A store key from a label (letters, digits, '/', '_', '.', '-' kept; anything else becomes '_').
std::string key_of(const std::string& label) {
  std::string out = label;
  for (char& ch : out) {
    const bool keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '/' ||
                      ch == '_' || ch == '.' || ch == '-';
    if (!keep) ch = '_';
  }
  return out;
}

std::string shape_text(const Shape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
}

// Counts elements (esize bytes each) whose bytes differ; *first: the first such index.
size_t differing_elements(const Bytes& a, const Bytes& b, size_t esize, size_t* first) {
  if (a.size() != b.size()) return std::max(a.size(), b.size()) / esize;
  size_t count = 0;
  *first = SIZE_MAX;
  for (size_t i = 0; i + esize <= a.size(); i += esize) {
    if (std::memcmp(&a[i], &b[i], esize) != 0) {
      if (count == 0) *first = i / esize;
      ++count;
    }
  }
  return count;
}

Bytes download(const void* device, size_t bytes) {
  Bytes host(bytes);
  EXC_CUDA_CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

void upload(void* device, const Bytes& host) {
  EXC_CUDA_CHECK(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice));
}

// Every rank's shard, concatenated (what every rank's gathered A must hold).
Bytes all_shards(DType dtype, size_t shard_elements, int ranks, uint64_t seed) {
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  Bytes out(shard_elements * esize * static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    overlap::fill_finite(dtype, out.data() + static_cast<size_t>(r) * shard_elements * esize, shard_elements,
                         overlap::shard_seed(seed, r));
  }
  return out;
}

// Max over sampled (i, j) of |C - ref| / max(|ref|, rms of the sampled refs), ref in float64.
double sampled_error(DType dtype, const Bytes& a, const Bytes& b, const Bytes& c, const Shape& s, uint64_t seed) {
  sim::Xoshiro256 g(seed);
  std::vector<double> refs, errs;
  for (int t = 0; t < 48; ++t) {
    const size_t i = g.below(s.m), j = g.below(s.n);
    const double ref = overlap::dot_reference(dtype, a.data(), i, s.k, b.data(), s.n, j);
    refs.push_back(ref);
    errs.push_back(std::fabs(overlap::element_value(dtype, c.data(), i * s.n + j) - ref));
  }
  double rms = 0;
  for (double r : refs) rms += r * r;
  rms = std::sqrt(rms / static_cast<double>(refs.size()));
  double worst = 0;
  for (size_t t = 0; t < refs.size(); ++t) {
    const double e = errs[t] / std::max(std::fabs(refs[t]), rms);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

class Bench {
 public:
  Bench(Worker& w, const Options& o) : w_(w), o_(o), rank_(w.rank()), n_(w.world_size()) {
    const cuda::CublasLtApi& lt = cuda::CublasLtApi::get();
    cuda::check_cublas(lt.Create(&lt_), "cublasLtCreate");
    lt_version_ = std::to_string(lt.GetVersion()) + " (" + lt.path + ")";
    workspace_ = DeviceBuffer(kWorkspaceBytes);
    cuda::CommunicatorOptions co;
    co.name = "overlap_comm";
    co.buffer_bytes = size_t{64} << 20;
    co.flag_timeout_ms = static_cast<uint64_t>(o.timeout_ms);
    comm_ = std::make_unique<cuda::Communicator>(w.store(), rank_, n_, co);
  }
  ~Bench() {
    (void)cudaEventDestroy(fork_);
    (void)cudaEventDestroy(join_);
    comm_.reset();  // closes the peers' mappings before ag_in_ (a later member) is freed
    if (lt_ != nullptr) (void)cuda::CublasLtApi::get().Destroy(lt_);
  }

  void check_section(DType dtype);
  void check_grouping(DType dtype, ProductGrouping grouping);
  void fsdp_section(DType dtype);
  void ag_section(DType dtype, const Shape& shape);
  void report();

 private:
  static constexpr size_t kWorkspaceBytes = size_t{64} << 20;

  cuda::OverlapPipelineOptions pipeline_options(const std::string& name, Pattern pattern, DType dtype, const Shape& s,
                                                size_t gather_count,
                                                ProductGrouping grouping = ProductGrouping::kPerShard,
                                                Algos algos = {}) const {
    cuda::OverlapPipelineOptions p;
    p.name = name;
    p.pattern = pattern;
    p.products = grouping;
    p.dtype = dtype;
    p.m = s.m;
    p.k = s.k;
    p.n = s.n;
    p.gather_count = gather_count;
    p.wait_timeout_ms = static_cast<uint64_t>(o_.timeout_ms);
    p.comm_streams = static_cast<int>(o_.comm_streams);
    p.product_algos = std::move(algos);
    return p;
  }
  // Returns every row count that a product of the chosen groupings has on any rank (shard_rows
  // times the shards it covers), ascending: what the ag section tunes, so that every rank tunes
  // the same shapes in the same order.
  std::vector<size_t> product_row_counts(size_t shard_rows) const {
    std::vector<size_t> out;
    for (ProductGrouping g : o_.groupings) {
      for (int r = 0; r < n_; ++r) {
        for (const overlap::ShardRange& range :
             overlap::product_ranges(overlap::make_plan(Pattern::kAgMatmul, r, n_, 1, g))) {
          out.push_back(shard_rows * static_cast<size_t>(range.count));
        }
      }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  // Enqueues on `stream` the unpipelined products of p's plan: C's row blocks of this rank's
  // product_ranges() from `gathered` (all of A) and b, each with the pipeline's configuration for
  // its row count (the reference the pipelined C must equal bit for bit).
  static void run_products(const OverlapPipeline& p, const void* gathered, const void* b, void* c, DType dtype,
                           const Shape& s, cudaStream_t stream) {
    const size_t esize = static_cast<size_t>(dtype_size(dtype));
    for (const overlap::ShardRange& range : p.product_ranges()) {
      const size_t first_row = p.shard_rows() * static_cast<size_t>(range.first);
      p.gemm(p.shard_rows() * static_cast<size_t>(range.count))
          .run(static_cast<const char*>(gathered) + first_row * s.k * esize, b,
               static_cast<char*>(c) + first_row * s.n * esize, stream);
    }
  }
  // "512 rows: algo 21 tile ...; 1024 rows: ..." for the row counts p multiplies.
  static std::string algos_text(const OverlapPipeline& p) {
    std::string out;
    std::vector<size_t> seen;
    for (const overlap::ShardRange& range : p.product_ranges()) {
      const size_t rows = p.shard_rows() * static_cast<size_t>(range.count);
      if (std::find(seen.begin(), seen.end(), rows) != seen.end()) continue;
      seen.push_back(rows);
      out += (out.empty() ? "" : "; ") + std::to_string(rows) + " rows: " + p.gemm(rows).algo_text();
    }
    return out;
  }
  // Returns the fastest of the heuristic's first kCandidates algorithms for C = A @ B of shape s
  // (row-major), timed on main_: per candidate each rank's median of 5 runs, summed over ranks, so
  // every rank picks the same one. *report says which and how fast against the heuristic's first.
  cublasLtMatmulAlgo_t tune(DType dtype, const Shape& s, const void* a, const void* b, void* c,
                            const std::string& label, std::string* report) {
    std::vector<cublasLtMatmulAlgo_t> cands =
        LtMatmul::candidates(lt_, dtype, s.m, s.k, s.n, kWorkspaceBytes, kCandidates);
    int64_t count = static_cast<int64_t>(cands.size());
    for (const std::string& v : w_.all_gather(key_of("tune/n/" + label), std::to_string(count)))
      count = std::min<int64_t>(count, std::stoll(v));
    cands.resize(static_cast<size_t>(count));
    std::vector<double> sums(cands.size(), 0);
    for (size_t i = 0; i < cands.size(); ++i) {
      double us = 1e12;  // a candidate that cannot run here never wins
      try {
        LtMatmul g(lt_, dtype, s.m, s.k, s.n, workspace_.get(), kWorkspaceBytes, cands[i]);
        g.run(a, b, c, main_.get());
        std::vector<double> runs;
        cudaEvent_t e0 = make_timed_event(), e1 = make_timed_event();
        for (int r = 0; r < 5; ++r) {
          EXC_CUDA_CHECK(cudaEventRecord(e0, main_.get()));
          g.run(a, b, c, main_.get());
          EXC_CUDA_CHECK(cudaEventRecord(e1, main_.get()));
          sync_bounded(main_.get(), "tuning " + label);
          float ms = 0;
          EXC_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
          runs.push_back(ms * 1000.0);
        }
        (void)cudaEventDestroy(e0);
        (void)cudaEventDestroy(e1);
        us = median(runs);
      } catch (const cuda::CublasError&) {
      }
      for (const std::string& v : w_.all_gather(key_of("tune/t/" + label + "/" + std::to_string(i)), fmt("%.3f", us))) {
        sums[i] += std::stod(v);
      }
    }
    const size_t best = static_cast<size_t>(std::min_element(sums.begin(), sums.end()) - sums.begin());
    LtMatmul chosen(lt_, dtype, s.m, s.k, s.n, workspace_.get(), kWorkspaceBytes, cands[best]);
    *report = label + ": candidate " + std::to_string(best) + " of " + std::to_string(cands.size()) + " (" +
              chosen.algo_text() + ") " + fmt("%.1f", sums[best] / n_) + " us vs the heuristic's first " +
              fmt("%.1f", sums[0] / n_) + " us (mean over ranks of 5-run medians)";
    return cands[best];
  }
  // Waits for stream with a deadline (NCCL and cuBLAS have no bound of their own).
  void sync_bounded(cudaStream_t stream, const std::string& what) {
    cudaEvent_t e = nullptr;
    EXC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    EXC_CUDA_CHECK(cudaEventRecord(e, stream));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.timeout_ms);
    cudaError_t q;
    while ((q = cudaEventQuery(e)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    (void)cudaEventDestroy(e);
    if (q == cudaErrorNotReady) {
      throw std::runtime_error("rank " + std::to_string(rank_) + ": " + what + " did not complete within " +
                               std::to_string(o_.timeout_ms) + " ms");
    }
    EXC_CUDA_CHECK(q);
  }
  // Max over ranks of this rank's median per-iteration time (µs) of body() on main_.
  double time_us(const std::string& label, const std::function<void()>& body, const std::function<void()>& finish) {
    const std::string name = key_of(label);
    for (int64_t i = 0; i < o_.warmup; ++i) body();
    finish();
    w_.barrier("t/" + name);
    std::vector<cudaEvent_t> start(static_cast<size_t>(o_.iters)), stop(static_cast<size_t>(o_.iters));
    for (auto& e : start) EXC_CUDA_CHECK(cudaEventCreate(&e));
    for (auto& e : stop) EXC_CUDA_CHECK(cudaEventCreate(&e));
    for (size_t i = 0; i < start.size(); ++i) {
      EXC_CUDA_CHECK(cudaEventRecord(start[i], main_.get()));
      body();
      EXC_CUDA_CHECK(cudaEventRecord(stop[i], main_.get()));
    }
    finish();
    std::vector<double> us;
    for (size_t i = 0; i < start.size(); ++i) {
      float ms = 0;
      EXC_CUDA_CHECK(cudaEventElapsedTime(&ms, start[i], stop[i]));
      us.push_back(ms * 1000.0);
    }
    for (auto e : start) (void)cudaEventDestroy(e);
    for (auto e : stop) (void)cudaEventDestroy(e);
    double worst = 0;
    for (const std::string& v : w_.all_gather("t/" + name, fmt("%.3f", median(us))))
      worst = std::max(worst, std::stod(v));
    return worst;
  }
  struct Variant {
    std::string label;
    std::function<void()> body;  // enqueues one iteration on main_
  };
  // Runs the variants round-robin on main_ (round i runs each once, in order; --warmup rounds
  // first), every iteration between two events, so that every variant sees the same clock and power
  // state (a GPU under sustained product load clocks down; timing variants one after another lets
  // the first one run on a rested GPU). Returns per variant the max over ranks of its median (µs).
  std::vector<double> time_interleaved(const std::string& label, const std::vector<Variant>& variants,
                                       const std::function<void()>& finish) {
    const std::string name = key_of(label);
    for (int64_t i = 0; i < o_.warmup; ++i) {
      for (const Variant& v : variants) v.body();
    }
    finish();
    w_.barrier("ti/" + name);
    const size_t nv = variants.size(), iters = static_cast<size_t>(o_.iters);
    std::vector<cudaEvent_t> events(2 * nv * iters);
    for (auto& e : events) EXC_CUDA_CHECK(cudaEventCreate(&e));
    for (size_t i = 0; i < iters; ++i) {
      for (size_t v = 0; v < nv; ++v) {
        EXC_CUDA_CHECK(cudaEventRecord(events[2 * (i * nv + v)], main_.get()));
        variants[v].body();
        EXC_CUDA_CHECK(cudaEventRecord(events[2 * (i * nv + v) + 1], main_.get()));
      }
    }
    finish();
    std::vector<double> out;
    for (size_t v = 0; v < nv; ++v) {
      std::vector<double> us;
      for (size_t i = 0; i < iters; ++i) {
        float ms = 0;
        EXC_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * (i * nv + v)], events[2 * (i * nv + v) + 1]));
        us.push_back(ms * 1000.0);
      }
      double worst = 0;
      for (const std::string& t : w_.all_gather("ti/" + name + "/" + std::to_string(v), fmt("%.3f", median(us)))) {
        worst = std::max(worst, std::stod(t));
      }
      out.push_back(worst);
    }
    for (auto e : events) (void)cudaEventDestroy(e);
    return out;
  }
  void add(const std::string& section, DType dtype, const std::string& variant, double us, double flops,
           double efficiency = 0, const std::string& note = "") {
    Row r{section, dtype_name(dtype), variant, us, flops > 0 ? flops / (us * 1e6) : 0, efficiency, note};
    rows_.push_back(r);
    if (w_.leader()) {
      std::printf("  %-6s %-5s %-40s %10.1f us %8s TFLOP/s %6s %s\n", section.c_str(), r.dtype.c_str(), variant.c_str(),
                  us, r.tflops > 0 ? fmt("%.1f", r.tflops).c_str() : "-",
                  efficiency > 0 ? fmt("%.3f", efficiency).c_str() : "", note.c_str());
      std::fflush(stdout);
    }
  }
  // Sums a count over ranks.
  int64_t total(const std::string& label, int64_t value) { return w_.sum(key_of(label), value); }
  void note(const std::string& text) {
    notes_.push_back(text);
    print_leader(w_, "  # " + text + "\n");
  }
  void fork_side() {
    EXC_CUDA_CHECK(cudaEventRecord(fork_, main_.get()));
    EXC_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), fork_, 0));
  }
  void join_side() {
    EXC_CUDA_CHECK(cudaEventRecord(join_, side_.get()));
    EXC_CUDA_CHECK(cudaStreamWaitEvent(main_.get(), join_, 0));
  }

  Worker& w_;
  Options o_;
  int rank_, n_;
  cublasLtHandle_t lt_ = nullptr;
  std::string lt_version_;
  DeviceBuffer workspace_;
  std::unique_ptr<cuda::Communicator> comm_;
  Stream main_, side_;
  cudaEvent_t fork_ = make_event(), join_ = make_event();
  DeviceBuffer ag_in_;  // the FSDP shard, registered with the communicator once
  cuda::RegisteredBuffer ag_reg_;
  std::vector<Row> rows_;
  std::vector<std::string> notes_;
  std::vector<std::string> targets_;
  bool failed_check_ = false;

  static constexpr int kCandidates = 8;
  static cudaEvent_t make_timed_event() {
    cudaEvent_t e = nullptr;
    EXC_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  static cudaEvent_t make_event() {
    cudaEvent_t e = nullptr;
    EXC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

 public:
  bool failed_check() const { return failed_check_; }
  const std::string& lt_version() const { return lt_version_; }
  cuda::Communicator& comm() { return *comm_; }
};

// ---- check: pipeline vs simulator vs the GPU's unpipelined schedule ----------------------------------

void Bench::check_section(DType dtype) {
  for (ProductGrouping g : o_.groupings) check_grouping(dtype, g);
}

void Bench::check_grouping(DType dtype, ProductGrouping grouping) {
  const Shape s = o_.check_shape;
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  const size_t rows = s.m / static_cast<size_t>(n_);
  const size_t shard = rows * s.k;
  const uint64_t seed = static_cast<uint64_t>(o_.seed);
  const std::string gname = overlap::grouping_name(grouping);
  const std::string tag = std::string(dtype_name(dtype)) + " AG->matmul " + shape_text(s) + " " + gname;

  // 1. The simulator's run of the same plan on the same operands (every rank runs it, small).
  overlap::OverlapShape shape;
  shape.pattern = Pattern::kAgMatmul;
  shape.grouping = grouping;
  shape.dtype = dtype;
  shape.m = s.m;
  shape.k = s.k;
  shape.n = s.n;
  std::vector<Bytes> shards, rhs, sim_gathered, sim_c;
  const Bytes b = overlap::finite_values(dtype, s.k * s.n, overlap::rhs_seed(seed));
  for (int r = 0; r < n_; ++r) {
    shards.push_back(overlap::finite_values(dtype, shard, overlap::shard_seed(seed, r)));
    rhs.push_back(b);
    sim_gathered.emplace_back(shard * esize * static_cast<size_t>(n_), 0xA5);
    sim_c.emplace_back(s.m * s.n * esize, 0xA5);
  }
  {
    sim::WorldOptions wo;
    wo.ranks = n_;
    sim::World world(wo);
    overlap::OverlapSim ov(world);
    overlap::OverlapIo io;
    for (int r = 0; r < n_; ++r) {
      io.shards.push_back(shards[static_cast<size_t>(r)].data());
      io.rhs.push_back(rhs[static_cast<size_t>(r)].data());
      io.gathered.push_back(sim_gathered[static_cast<size_t>(r)].data());
      io.products.push_back(sim_c[static_cast<size_t>(r)].data());
    }
    ov.enqueue(shape, io);
    world.run();
  }

  // 2. The GPU pipeline.
  OverlapPipeline p(w_.store(), rank_, n_,
                    pipeline_options("check/" + std::string(dtype_name(dtype)) + "/" + gname, Pattern::kAgMatmul, dtype,
                                     s, 0, grouping),
                    lt_, workspace_.get(), kWorkspaceBytes);
  DeviceBuffer db(s.k * s.n * esize), gathered(s.m * s.k * esize), c(s.m * s.n * esize),
      gathered_ref(s.m * s.k * esize), c_ref(s.m * s.n * esize), c_big(s.m * s.n * esize);
  upload(p.shard(), shards[static_cast<size_t>(rank_)]);
  upload(db.get(), b);
  for (void* d : {gathered.get(), c.get(), gathered_ref.get(), c_ref.get(), c_big.get()}) {
    EXC_CUDA_CHECK(
        cudaMemset(d, 0xFF, d == gathered.get() || d == gathered_ref.get() ? s.m * s.k * esize : s.m * s.n * esize));
  }
  EXC_CUDA_CHECK(cudaDeviceSynchronize());
  p.run(gathered.get(), nullptr, db.get(), c.get(), main_.get());
  p.finish(main_.get());
  const Bytes g = download(gathered.get(), s.m * s.k * esize), cc = download(c.get(), s.m * s.n * esize);
  size_t first = 0;
  const size_t gather_diff = differing_elements(g, sim_gathered[static_cast<size_t>(rank_)], esize, &first);
  Bytes a_full;
  for (const Bytes& sh : shards) a_full.insert(a_full.end(), sh.begin(), sh.end());
  const double sim_err = sampled_error(dtype, a_full, b, cc, s, seed + 77);
  // The simulator's C (Eigen, float accumulation) vs the GPU's (cuBLASLt): within tolerance, compared
  // element by element relative to the larger of |sim| and the rms of the sim's C.
  double rms = 0, worst_vs_sim = 0;
  for (size_t i = 0; i < s.m * s.n; ++i)
    rms += std::pow(overlap::element_value(dtype, sim_c[static_cast<size_t>(rank_)].data(), i), 2);
  rms = std::sqrt(rms / static_cast<double>(s.m * s.n));
  for (size_t i = 0; i < s.m * s.n; ++i) {
    const double x = overlap::element_value(dtype, sim_c[static_cast<size_t>(rank_)].data(), i);
    const double y = overlap::element_value(dtype, cc.data(), i);
    const double e = std::fabs(x - y) / std::max(std::fabs(x), rms);
    worst_vs_sim = std::isnan(e) ? INFINITY : std::max(worst_vs_sim, e);
  }

  // 3. The GPU's unpipelined schedule: the SM all-gather (core template), then one product per row
  //    block of the grouping with the pipeline's configuration for its row count.
  comm_->allgather(p.shard(), gathered_ref.get(), shard, dtype, Algorithm::kDirect, main_.get());
  comm_->check(main_.get());
  run_products(p, gathered_ref.get(), db.get(), c_ref.get(), dtype, s, main_.get());
  sync_bounded(main_.get(), "the unpipelined reference");
  const Bytes gref = download(gathered_ref.get(), s.m * s.k * esize), cref = download(c_ref.get(), s.m * s.n * esize);
  const size_t ref_gather_diff = differing_elements(gref, g, esize, &first);
  const size_t c_diff = differing_elements(cc, cref, esize, &first);

  // 4. One big GEMM: the heuristic's algorithm for the full shape, and the shard's algorithm on it.
  LtMatmul big(lt_, dtype, s.m, s.k, s.n, workspace_.get(), kWorkspaceBytes);
  big.run(gathered_ref.get(), db.get(), c_big.get(), main_.get());
  sync_bounded(main_.get(), "the big GEMM");
  const size_t big_diff = differing_elements(download(c_big.get(), s.m * s.n * esize), cref, esize, &first);
  std::string same_algo = "not supported for the full shape";
  int64_t same_diff = -1;
  if (LtMatmul::supports(lt_, dtype, s.m, s.k, s.n, kWorkspaceBytes, p.gemm(rows).algo())) {
    LtMatmul big_same(lt_, dtype, s.m, s.k, s.n, workspace_.get(), kWorkspaceBytes, p.gemm(rows).algo());
    EXC_CUDA_CHECK(cudaMemset(c_big.get(), 0xFF, s.m * s.n * esize));
    big_same.run(gathered_ref.get(), db.get(), c_big.get(), main_.get());
    sync_bounded(main_.get(), "the big GEMM with the shard's algorithm");
    same_diff = static_cast<int64_t>(differing_elements(download(c_big.get(), s.m * s.n * esize), cref, esize, &first));
  }

  // 5. Sums over ranks, one line each.
  const int64_t g_bad = total("check/g/" + tag, static_cast<int64_t>(gather_diff));
  const int64_t gr_bad = total("check/gr/" + tag, static_cast<int64_t>(ref_gather_diff));
  const int64_t c_bad = total("check/c/" + tag, static_cast<int64_t>(c_diff));
  const int64_t big_bad = total("check/big/" + tag, static_cast<int64_t>(big_diff));
  const int64_t same_bad = total("check/same/" + tag, same_diff);
  const int64_t sim_bad = total("check/sim/" + tag, worst_vs_sim > 2e-2 || sim_err > 2e-2 ? 1 : 0);
  const uint64_t elements_a = static_cast<uint64_t>(n_) * s.m * s.k, elements_c = static_cast<uint64_t>(n_) * s.m * s.n;
  note(tag + ": gathered A vs the simulator's: " + std::to_string(g_bad) + " of " + std::to_string(elements_a) +
       " elements differ (all ranks); vs the SM all-gather: " + std::to_string(gr_bad));
  note(tag + ": C vs the simulator's C: max relative difference " + fmt("%.2e", worst_vs_sim) + " (rank " +
       std::to_string(rank_) + "), vs float64 on 48 samples " + fmt("%.2e", sim_err) +
       (sim_bad ? " OVER 2e-2" : " (within 2e-2)"));
  note(tag + ": C pipelined vs unpipelined (SM all-gather + the same row blocks; " + algos_text(p) +
       "): " + std::to_string(c_bad) + " of " + std::to_string(elements_c) + " elements differ");
  note(tag + ": one big GEMM (heuristic " + big.algo_text() + ") vs per-row-block: " + std::to_string(big_bad) +
       " of " + std::to_string(elements_c) + " differ; the shard's algorithm on the full shape: " +
       (same_diff < 0 ? same_algo : std::to_string(same_bad) + " of " + std::to_string(elements_c) + " differ"));
  if (g_bad != 0 || gr_bad != 0 || c_bad != 0 || sim_bad != 0) failed_check_ = true;
}

// ---- fsdp: an unrelated all-gather beside a product ------------------------------------------------------

void Bench::fsdp_section(DType dtype) {
  const size_t dim = static_cast<size_t>(o_.fsdp_size);
  const Shape s{dim, dim, dim};
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  const size_t gather_bytes = static_cast<size_t>(o_.gather_mib) << 20;
  const size_t count = gather_bytes / esize / static_cast<size_t>(n_);  // per rank
  const uint64_t seed = static_cast<uint64_t>(o_.seed) + 100;
  const std::string dt = dtype_name(dtype);
  const double flops = 2.0 * static_cast<double>(dim) * static_cast<double>(dim) * static_cast<double>(dim);

  // 1. Operands: X, W (finite random), this rank's shard in a registered buffer (SM, NCCL) and in
  //    the pipeline's symmetric buffer (copy engine).
  DeviceBuffer x(dim * dim * esize), wt(dim * dim * esize), c(dim * dim * esize),
      ce_out(count * esize * static_cast<size_t>(n_));
  if (ag_in_.get() == nullptr) {  // the same bytes for every dtype: gather_bytes / ranks
    ag_in_ = DeviceBuffer(count * esize);
    ag_reg_ = comm_->register_buffer(ag_in_.get(), count * esize);
  }
  DeviceBuffer& ag_in = ag_in_;
  const cuda::RegisteredBuffer& reg = ag_reg_;
  upload(x.get(), overlap::finite_values(dtype, dim * dim, overlap::lhs_seed(seed, rank_)));
  upload(wt.get(), overlap::finite_values(dtype, dim * dim, overlap::rhs_seed(seed)));
  const Bytes my_shard = overlap::finite_values(dtype, count, overlap::shard_seed(seed, rank_));
  upload(ag_in.get(), my_shard);
  std::string tuned;
  const cublasLtMatmulAlgo_t algo =
      tune(dtype, s, x.get(), wt.get(), c.get(), "fsdp " + dt + " " + shape_text(s), &tuned);
  note(tuned);
  OverlapPipeline p(w_.store(), rank_, n_,
                    pipeline_options("fsdp/" + dt, Pattern::kPrefetch, dtype, s, count, ProductGrouping::kPerShard,
                                     Algos{{dim, algo}}),
                    lt_, workspace_.get(), kWorkspaceBytes);
  upload(p.shard(), my_shard);
  const Bytes expected = all_shards(dtype, count, n_, seed);
  LtMatmul gemm(lt_, dtype, dim, dim, dim, workspace_.get(), kWorkspaceBytes, algo);
  LtMatmul heuristic(lt_, dtype, dim, dim, dim, workspace_.get(), kWorkspaceBytes);
  print_leader(w_, "  # fsdp " + dt + ": " + std::to_string(dim) + "^3 product (" + gemm.algo_text() +
                       "), all-gather of " + std::to_string(o_.gather_mib) + " MiB output (" + std::to_string(count) +
                       " elements per rank); " + "copy-engine signals: " + p.signal_mechanism() + "\n");
  cudaStream_t m = main_.get(), side = side_.get();
  auto finish_main = [&] {
    sync_bounded(m, "fsdp " + dt);
    comm_->check(m);
  };
  auto finish_pipe = [&] { p.finish(m); };

  // 2. The matmul alone on a rested GPU (measured first), and its bits (no overlapped run may
  //    change them).
  const double mm_fresh = time_us(
      "fsdp/mm/" + dt, [&] { gemm.run(x.get(), wt.get(), c.get(), m); }, finish_main);
  const Bytes c_alone = download(c.get(), dim * dim * esize);
  note("fsdp " + dt + ": matmul alone measured first, on a rested GPU: " + fmt("%.1f", mm_fresh) + " us (" +
       fmt("%.1f", flops / (mm_fresh * 1e6)) + " TFLOP/s)");

  // 3. Each all-gather alone (communication only), and its bits.
  const size_t out_bytes = expected.size();
  DeviceBuffer ag_sm(out_bytes), ag_nccl(out_bytes), c_h(dim * dim * esize), c_seq(dim * dim * esize),
      c_sm(dim * dim * esize), c_nccl(dim * dim * esize), c_ce(dim * dim * esize);
  auto sm_gather = [&](cudaStream_t st) {
    comm_->allgather(ag_in.get(), ag_sm.get(), count, dtype, Algorithm::kDirect, st, &reg);
  };
  auto nccl_gather = [&](cudaStream_t st) {
    comm_->allgather(ag_in.get(), ag_nccl.get(), count, dtype, Algorithm::kNccl, st);
  };
  auto check_gather = [&](const std::string& what, void* out) {
    size_t first = 0;
    const int64_t bad =
        total("fsdp/g/" + dt + what,
              static_cast<int64_t>(differing_elements(download(out, out_bytes), expected, esize, &first)));
    if (bad != 0) failed_check_ = true;
    return bad;
  };
  auto check_product = [&](const std::string& what, void* product) {
    size_t first = 0;
    const int64_t bad =
        total("fsdp/c/" + dt + what,
              static_cast<int64_t>(differing_elements(download(product, dim * dim * esize), c_alone, esize, &first)));
    if (bad != 0) failed_check_ = true;
    return bad;
  };
  for (void* out : {ag_sm.get(), ag_nccl.get(), ce_out.get()}) EXC_CUDA_CHECK(cudaMemset(out, 0xFF, out_bytes));
  const double sm_alone = time_us(
      "fsdp/ag/" + dt + "sm", [&] { sm_gather(m); }, finish_main);
  add("fsdp", dtype, "SM all-gather alone", sm_alone, 0, 0,
      "#wrong " + std::to_string(check_gather("sm", ag_sm.get())));
  const double nccl_alone = time_us(
      "fsdp/ag/" + dt + "nccl", [&] { nccl_gather(m); }, finish_main);
  add("fsdp", dtype, "NCCL all-gather alone", nccl_alone, 0, 0,
      "#wrong " + std::to_string(check_gather("nccl", ag_nccl.get())));
  const double ce_alone = time_us(
      "fsdp/ag/" + dt + "ce", [&] { p.run(ce_out.get(), x.get(), wt.get(), c.get(), m, false); }, finish_pipe);
  add("fsdp", dtype, "copy-engine all-gather alone", ce_alone, 0, 0,
      "#wrong " + std::to_string(check_gather("ce", ce_out.get())));

  // 4. Everything that runs the product, interleaved round by round.
  for (void* out : {ag_sm.get(), ag_nccl.get(), ce_out.get()}) EXC_CUDA_CHECK(cudaMemset(out, 0xFF, out_bytes));
  for (void* out : {c_sm.get(), c_nccl.get(), c_ce.get()}) EXC_CUDA_CHECK(cudaMemset(out, 0xFF, dim * dim * esize));
  auto overlapped = [&](const std::function<void(cudaStream_t)>& gather, void* product) {
    fork_side();
    gather(side);
    gemm.run(x.get(), wt.get(), product, m);
    join_side();
  };
  const std::vector<Variant> variants = {
      {"matmul alone", [&] { gemm.run(x.get(), wt.get(), c.get(), m); }},
      {"matmul alone (heuristic's first algorithm)", [&] { heuristic.run(x.get(), wt.get(), c_h.get(), m); }},
      {"sequential, SM all-gather",
       [&] {
         sm_gather(m);
         gemm.run(x.get(), wt.get(), c_seq.get(), m);
       }},
      {"overlapped, SM all-gather", [&] { overlapped(sm_gather, c_sm.get()); }},
      {"sequential, NCCL all-gather",
       [&] {
         nccl_gather(m);
         gemm.run(x.get(), wt.get(), c_seq.get(), m);
       }},
      {"overlapped, NCCL all-gather", [&] { overlapped(nccl_gather, c_nccl.get()); }},
      {"sequential, copy-engine all-gather",
       [&] {
         p.run(ce_out.get(), x.get(), wt.get(), c.get(), m, false);
         gemm.run(x.get(), wt.get(), c_seq.get(), m);
       }},
      {"overlapped, copy-engine all-gather", [&] { p.run(ce_out.get(), x.get(), wt.get(), c_ce.get(), m, true); }},
  };
  const std::vector<double> t = time_interleaved("fsdp/all/" + dt, variants, [&] {
    p.finish(m);
    comm_->check(m);
  });
  const double mm = t[0];
  const double alone_of[] = {0, 0, sm_alone, sm_alone, nccl_alone, nccl_alone, ce_alone, ce_alone};
  void* const gathered_of[] = {nullptr, nullptr, nullptr, ag_sm.get(), nullptr, ag_nccl.get(), nullptr, ce_out.get()};
  void* const product_of[] = {nullptr, nullptr, nullptr, c_sm.get(), nullptr, c_nccl.get(), nullptr, c_ce.get()};
  for (size_t v = 0; v < variants.size(); ++v) {
    std::string note_text;
    if (gathered_of[v] != nullptr) {
      note_text = "#wrong " + std::to_string(check_gather(variants[v].label, gathered_of[v])) + ", C vs alone " +
                  std::to_string(check_product(variants[v].label, product_of[v]));
    }
    add("fsdp", dtype, variants[v].label, t[v], flops, alone_of[v] > 0 ? std::max(mm, alone_of[v]) / t[v] : 0,
        note_text);
  }
  const double ce_ov = t[7];
  targets_.push_back("FSDP " + dt + ": copy-engine overlapped " + fmt("%.1f", ce_ov) +
                     " us = " + fmt("%.3f", ce_ov / mm) + " x matmul alone (" + fmt("%.1f", mm) + " us, interleaved; " +
                     fmt("%.3f", ce_ov / mm_fresh) + " x the rested-GPU " + fmt("%.1f", mm_fresh) +
                     " us); target <= 1.04: " + (ce_ov <= 1.04 * mm ? "MET" : "NOT MET"));
}

// ---- ag: tensor-parallel AG->matmul -------------------------------------------------------------------------

void Bench::ag_section(DType dtype, const Shape& s) {
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  if (s.m % static_cast<size_t>(n_) != 0) {
    note("ag " + shape_text(s) + ": m is not a multiple of " + std::to_string(n_) + " ranks; skipped");
    return;
  }
  const size_t rows = s.m / static_cast<size_t>(n_), shard = rows * s.k, a_bytes = s.m * s.k * esize,
               c_bytes = s.m * s.n * esize;
  const uint64_t seed = static_cast<uint64_t>(o_.seed) + 200 + s.m + s.k;
  const std::string dt = dtype_name(dtype), tag = dt + "/" + shape_text(s);
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) * static_cast<double>(s.n);

  // 1. Operands, and the algorithms: the fastest of the heuristic's first candidates for every
  //    product row count of the groupings and for the full product.
  DeviceBuffer b(s.k * s.n * esize), gathered_ref(a_bytes), c_scratch(c_bytes), c_full(c_bytes);
  const Bytes hb = overlap::finite_values(dtype, s.k * s.n, overlap::rhs_seed(seed));
  upload(b.get(), hb);
  const Bytes a_full = all_shards(dtype, shard, n_, seed);
  upload(gathered_ref.get(), a_full);  // operands for tuning (the pipelines fill their gathered A themselves)
  Algos algos;
  for (size_t product_rows : product_row_counts(rows)) {
    std::string tuned;
    algos[product_rows] = tune(dtype, Shape{product_rows, s.k, s.n}, gathered_ref.get(), b.get(), c_scratch.get(),
                               "ag " + tag + " " + std::to_string(product_rows) + "-row product", &tuned);
    note(tuned);
  }
  std::string tuned_full;
  const cublasLtMatmulAlgo_t full_algo =
      tune(dtype, s, gathered_ref.get(), b.get(), c_full.get(), "ag " + tag + " full product", &tuned_full);
  note(tuned_full);
  LtMatmul full(lt_, dtype, s.m, s.k, s.n, workspace_.get(), kWorkspaceBytes, full_algo);
  LtMatmul full_heuristic(lt_, dtype, s.m, s.k, s.n, workspace_.get(), kWorkspaceBytes);

  // 2. One pipeline per grouping (its own symmetric region and streams), all on the same shard.
  struct Grouped {
    std::string name;
    std::unique_ptr<OverlapPipeline> pipeline;
    DeviceBuffer gathered, c, c_ref, c_alone;  // c: the pipeline's; c_ref: unpipelined; c_alone: products alone
  };
  std::vector<Grouped> groups;
  const Bytes my_shard = overlap::finite_values(dtype, shard, overlap::shard_seed(seed, rank_));
  for (ProductGrouping g : o_.groupings) {
    Grouped x;
    x.name = overlap::grouping_name(g);
    x.pipeline = std::make_unique<OverlapPipeline>(
        w_.store(), rank_, n_, pipeline_options("ag/" + tag + "/" + x.name, Pattern::kAgMatmul, dtype, s, 0, g, algos),
        lt_, workspace_.get(), kWorkspaceBytes);
    upload(x.pipeline->shard(), my_shard);
    x.gathered = DeviceBuffer(a_bytes);
    x.c = DeviceBuffer(c_bytes);
    x.c_ref = DeviceBuffer(c_bytes);
    x.c_alone = DeviceBuffer(c_bytes);
    print_leader(w_, "  # ag " + tag + " " + x.name + ": rank " + std::to_string(rank_) + "'s products " +
                         algos_text(*x.pipeline) + "\n");
    groups.push_back(std::move(x));
  }
  print_leader(w_, "  # ag " + tag + ": full product " + full.algo_text() + "\n");
  OverlapPipeline& first = *groups.front().pipeline;
  cudaStream_t m = main_.get();
  auto finish_main = [&] {
    sync_bounded(m, "ag " + tag);
    comm_->check(m);
  };
  auto finish_pipes = [&] {
    for (Grouped& x : groups) x.pipeline->finish(m);
    comm_->check(m);
  };

  // 3. Checks per grouping: the pipeline's gathered A and C; the unpipelined reference (NCCL
  //    all-gather, then the grouping's row blocks with the pipeline's configurations); one big
  //    GEMM; float64 samples.
  comm_->allgather(first.shard(), gathered_ref.get(), shard, dtype, Algorithm::kNccl, m);
  full.run(gathered_ref.get(), b.get(), c_full.get(), m);
  for (Grouped& x : groups) {
    EXC_CUDA_CHECK(cudaMemsetAsync(x.gathered.get(), 0xFF, a_bytes, m));
    EXC_CUDA_CHECK(cudaMemsetAsync(x.c.get(), 0xFF, c_bytes, m));
    x.pipeline->run(x.gathered.get(), nullptr, b.get(), x.c.get(), m);
    x.pipeline->finish(m);
    run_products(*x.pipeline, gathered_ref.get(), b.get(), x.c_ref.get(), dtype, s, m);
  }
  sync_bounded(m, "ag reference " + tag);
  const Bytes c_big = download(c_full.get(), c_bytes);
  std::vector<Bytes> crefs;
  for (Grouped& x : groups) {
    const std::string gtag = tag + " " + x.name;
    size_t first_bad = 0;
    const Bytes g = download(x.gathered.get(), a_bytes), cc = download(x.c.get(), c_bytes);
    crefs.push_back(download(x.c_ref.get(), c_bytes));
    const Bytes& cref = crefs.back();
    const int64_t g_bad = total("ag/g/" + gtag, static_cast<int64_t>(differing_elements(g, a_full, esize, &first_bad)));
    const int64_t c_bad = total("ag/c/" + gtag, static_cast<int64_t>(differing_elements(cc, cref, esize, &first_bad)));
    const int64_t big_bad =
        total("ag/big/" + gtag, static_cast<int64_t>(differing_elements(c_big, cref, esize, &first_bad)));
    const double err = sampled_error(dtype, a_full, hb, cc, s, seed + 5);
    const int64_t err_bad = total("ag/e/" + gtag, err > 2e-2 ? 1 : 0);
    if (g_bad != 0 || c_bad != 0 || err_bad != 0) failed_check_ = true;
    note("ag " + gtag + ": gathered A vs the shards: " + std::to_string(g_bad) + " of " +
         std::to_string(static_cast<uint64_t>(n_) * s.m * s.k) +
         " elements differ (all ranks); C pipelined vs NCCL "
         "all-gather + the same row blocks (same configurations): " +
         std::to_string(c_bad) + " of " + std::to_string(static_cast<uint64_t>(n_) * s.m * s.n) +
         " differ; one big GEMM vs these row blocks: " + std::to_string(big_bad) +
         " differ; C vs float64 (48 samples, rank " + std::to_string(rank_) + "): " + fmt("%.2e", err));
  }
  for (size_t i = 1; i < groups.size(); ++i) {
    size_t first_bad = 0;
    const int64_t differ = total("ag/x/" + tag + groups[i].name,
                                 static_cast<int64_t>(differing_elements(crefs[i], crefs[0], esize, &first_bad)));
    note("ag " + tag + ": C of " + groups[i].name + " vs C of " + groups[0].name + ": " + std::to_string(differ) +
         " elements differ (all ranks; not a check: the row count of a product may change its bits)");
  }

  // 4. Times: the full matmul on a rested GPU first; the all-gathers alone (communication only);
  //    then everything that runs products, interleaved round by round.
  const double full_fresh = time_us(
      "ag/full/" + tag, [&] { full.run(gathered_ref.get(), b.get(), c_full.get(), m); }, finish_main);
  note("ag " + tag + ": full matmul alone measured first, on a rested GPU: " + fmt("%.1f", full_fresh) + " us");
  const double ag_alone = time_us(
      "ag/ag/" + tag, [&] { first.run(groups.front().gathered.get(), nullptr, b.get(), c_scratch.get(), m, false); },
      finish_pipes);
  add("ag", dtype, shape_text(s) + " copy-engine all-gather alone", ag_alone, 0);
  const double nccl_alone = time_us(
      "ag/nccl/" + tag, [&] { comm_->allgather(first.shard(), gathered_ref.get(), shard, dtype, Algorithm::kNccl, m); },
      finish_main);
  add("ag", dtype, shape_text(s) + " NCCL all-gather alone", nccl_alone, 0);
  for (Grouped& x : groups) EXC_CUDA_CHECK(cudaMemsetAsync(x.c.get(), 0xFF, c_bytes, m));
  struct Timed {
    Variant variant;
    double comm_alone_us = 0;  // the all-gather it overlaps or runs after (0: none)
    int group = -1;            // the pipeline's index in groups (-1: not a pipeline)
  };
  std::vector<Timed> timed = {
      {{shape_text(s) + " full matmul alone", [&] { full.run(gathered_ref.get(), b.get(), c_full.get(), m); }}},
      {{shape_text(s) + " full matmul alone (heuristic's first)",
        [&] { full_heuristic.run(gathered_ref.get(), b.get(), c_full.get(), m); }}},
  };
  for (Grouped& x : groups) {
    timed.push_back({{shape_text(s) + " products alone (" + x.name + ")",
                      [&] { run_products(*x.pipeline, x.gathered.get(), b.get(), x.c_alone.get(), dtype, s, m); }}});
  }
  timed.push_back({{shape_text(s) + " NCCL all-gather + matmul",
                    [&] {
                      comm_->allgather(first.shard(), gathered_ref.get(), shard, dtype, Algorithm::kNccl, m);
                      full.run(gathered_ref.get(), b.get(), c_full.get(), m);
                    }},
                   nccl_alone});
  timed.push_back({{shape_text(s) + " copy-engine all-gather + matmul",
                    [&] {
                      first.run(groups.front().gathered.get(), nullptr, b.get(), c_scratch.get(), m, false);
                      full.run(groups.front().gathered.get(), b.get(), c_full.get(), m);
                    }},
                   ag_alone});
  for (size_t i = 0; i < groups.size(); ++i) {
    Grouped& x = groups[i];
    timed.push_back({{shape_text(s) + " pipelined AG->matmul (" + x.name + ")",
                      [&] { x.pipeline->run(x.gathered.get(), nullptr, b.get(), x.c.get(), m, true); }},
                     ag_alone,
                     static_cast<int>(i)});
  }
  std::vector<Variant> variants;
  for (const Timed& t : timed) variants.push_back(t.variant);
  const std::vector<double> t = time_interleaved("ag/all/" + tag, variants, finish_pipes);
  const double full_alone = t[0], full_heur = t[1], best_full = std::min(full_alone, full_heur);
  for (size_t v = 0; v < timed.size(); ++v) {
    std::string check_note;
    if (timed[v].group >= 0) {
      const Grouped& x = groups[static_cast<size_t>(timed[v].group)];
      size_t first_bad = 0;
      const int64_t c_after =
          total("ag/c2/" + tag + x.name,
                static_cast<int64_t>(differing_elements(
                    download(x.c.get(), c_bytes), crefs[static_cast<size_t>(timed[v].group)], esize, &first_bad)));
      if (c_after != 0) failed_check_ = true;
      check_note = "C vs unpipelined " + std::to_string(c_after);
      targets_.push_back("AG->matmul " + tag + " " + x.name + ": pipelined " + fmt("%.1f", t[v]) +
                         " us = " + fmt("%.3f", t[v] / best_full) + " x the faster full matmul alone (" +
                         fmt("%.1f", best_full) + " us, interleaved; heuristic's first " + fmt("%.1f", full_heur) +
                         " us; rested-GPU full matmul " + fmt("%.1f", full_fresh) + " us, ratio " +
                         fmt("%.3f", t[v] / full_fresh) +
                         "); target <= 1.03: " + (t[v] <= 1.03 * best_full ? "MET" : "NOT MET"));
    }
    const double comm = timed[v].comm_alone_us;
    add("ag", dtype, timed[v].variant.label, t[v], flops, comm > 0 ? std::max(full_alone, comm) / t[v] : 0, check_note);
  }
}

void Bench::report() {
  std::ostringstream t;
  t << "\n# summary (" << n_ << " ranks, " << w_.device_name() << "; max over ranks of the median of " << o_.iters
    << " iterations; eff = max(matmul alone, all-gather alone) / time)\n";
  t << "| section | dtype | variant | time (us) | TFLOP/s | eff | note |\n|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows_) {
    t << "| " << r.section << " | " << r.dtype << " | " << r.variant << " | " << fmt("%.1f", r.us) << " | "
      << (r.tflops > 0 ? fmt("%.1f", r.tflops) : "-") << " | " << (r.efficiency > 0 ? fmt("%.3f", r.efficiency) : "-")
      << " | " << r.note << " |\n";
  }
  for (const std::string& line : targets_) t << "# " << line << "\n";
  t << "# checks: " << (failed_check_ ? "SOME FAILED (see the notes above)" : "all passed") << "\n";
  print_leader(w_, t.str());
  if (w_.leader() && !o_.json_path.empty()) {
    std::ostringstream j;
    j << "{\"ranks\":" << n_ << ",\"device\":\"" << w_.device_name() << "\",\"cublaslt\":\"" << lt_version_
      << "\",\"rows\":[";
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      j << (i ? "," : "") << "{\"section\":\"" << r.section << "\",\"dtype\":\"" << r.dtype << "\",\"variant\":\""
        << r.variant << "\",\"us\":" << fmt("%.3f", r.us) << ",\"tflops\":" << fmt("%.2f", r.tflops)
        << ",\"efficiency\":" << fmt("%.4f", r.efficiency) << ",\"note\":\"" << r.note << "\"}";
    }
    j << "],\"notes\":[";
    for (size_t i = 0; i < notes_.size(); ++i) j << (i ? "," : "") << "\"" << notes_[i] << "\"";
    j << "],\"targets\":[";
    for (size_t i = 0; i < targets_.size(); ++i) j << (i ? "," : "") << "\"" << targets_[i] << "\"";
    j << "],\"checks_passed\":" << (failed_check_ ? "false" : "true") << "}\n";
    const std::string text = j.str();
    npy::write_file_atomic(cli::resolve_path(o_.json_path), text.data(), text.size());
  }
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
}  // namespace exactcoll::gpu
