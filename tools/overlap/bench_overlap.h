// The pieces of `exactcoll bench-overlap` (bench_overlap_command.cc: its flags, sections and
// output) that its files share: the options, shapes and result rows, the byte and text helpers
// (bench_overlap_util.cc), and Bench, one rank's harness. Bench's members are defined by topic:
// bench_overlap_harness.cc (set-up, pipeline options, the unpipelined products), bench_overlap_timing.cc
// (tuning, bounded waits, timing), one file per section (bench_overlap_check.cc, bench_overlap_fsdp.cc,
// bench_overlap_ag.cc) and bench_overlap_report.cc (rows, notes, the summary table and JSON).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/storage.h"
#include "cuda_backend/communicator.h"
#include "cuda_backend/cuda_check.h"
#include "cuda_backend/overlap/lt_matmul.h"
#include "cuda_backend/overlap/pipeline.h"
#include "tools/gpu/device_util.h"
#include "tools/gpu/worker.h"

namespace exactcoll::gpu::bench_overlap {

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

// One number printf-formatted (format takes one double).
std::string fmt(const char* format, double v);

// A store key from a label (letters, digits, '/', '_', '.', '-' kept; anything else becomes '_').
std::string key_of(const std::string& label);

// "MxKxN".
std::string shape_text(const Shape& s);

// Counts elements (esize bytes each) whose bytes differ; *first: the first such index.
size_t differing_elements(const Bytes& a, const Bytes& b, size_t esize, size_t* first);

// Copies `bytes` bytes from the device to a new host vector.
Bytes download(const void* device, size_t bytes);
// Copies host to the device (host.size() bytes).
void upload(void* device, const Bytes& host);

// Every rank's shard, concatenated (what every rank's gathered A must hold).
Bytes all_shards(DType dtype, size_t shard_elements, int ranks, uint64_t seed);

// Max over sampled (i, j) of |C - ref| / max(|ref|, rms of the sampled refs), ref in float64.
double sampled_error(DType dtype, const Bytes& a, const Bytes& b, const Bytes& c, const Shape& s, uint64_t seed);

class Bench {
 public:
  Bench(Worker& w, const Options& o);
  ~Bench();

  void check_section(DType dtype);
  void check_grouping(DType dtype, ProductGrouping grouping);
  void fsdp_section(DType dtype);
  void ag_section(DType dtype, const Shape& shape);
  void report();

 private:
  static constexpr size_t kWorkspaceBytes = size_t{64} << 20;

  // The options of a pipeline `name` of this harness (the bounds and streams from the flags).
  cuda::OverlapPipelineOptions pipeline_options(const std::string& name, Pattern pattern, DType dtype, const Shape& s,
                                                size_t gather_count,
                                                ProductGrouping grouping = ProductGrouping::kPerShard,
                                                Algos algos = {}) const;
  // Returns every row count that a product of the chosen groupings has on any rank (shard_rows
  // times the shards it covers), ascending: what the ag section tunes, so that every rank tunes
  // the same shapes in the same order.
  std::vector<size_t> product_row_counts(size_t shard_rows) const;
  // Enqueues on `stream` the unpipelined products of p's plan: C's row blocks of this rank's
  // product_ranges() from `gathered` (all of A) and b, each with the pipeline's configuration for
  // its row count (the reference the pipelined C must equal bit for bit).
  static void run_products(const OverlapPipeline& p, const void* gathered, const void* b, void* c, DType dtype,
                           const Shape& s, cudaStream_t stream);
  // "512 rows: algo 21 tile ...; 1024 rows: ..." for the row counts p multiplies.
  static std::string algos_text(const OverlapPipeline& p);
  // Returns the fastest of the heuristic's first kCandidates algorithms for C = A @ B of shape s
  // (row-major), timed on main_: per candidate each rank's median of 5 runs, summed over ranks, so
  // every rank picks the same one. *report says which and how fast against the heuristic's first.
  cublasLtMatmulAlgo_t tune(DType dtype, const Shape& s, const void* a, const void* b, void* c,
                            const std::string& label, std::string* report);
  // Waits for stream with a deadline (NCCL and cuBLAS have no bound of their own).
  void sync_bounded(cudaStream_t stream, const std::string& what);
  // Max over ranks of this rank's median per-iteration time (µs) of body() on main_.
  double time_us(const std::string& label, const std::function<void()>& body, const std::function<void()>& finish);
  struct Variant {
    std::string label;
    std::function<void()> body;  // enqueues one iteration on main_
  };
  // Runs the variants round-robin on main_ (round i runs each once, in order; --warmup rounds
  // first), every iteration between two events, so that every variant sees the same clock and power
  // state (a GPU under sustained product load clocks down; timing variants one after another lets
  // the first one run on a rested GPU). Returns per variant the max over ranks of its median (µs).
  std::vector<double> time_interleaved(const std::string& label, const std::vector<Variant>& variants,
                                       const std::function<void()>& finish);
  // Records a row (TFLOP/s from flops, when positive) and prints it on the leader.
  void add(const std::string& section, DType dtype, const std::string& variant, double us, double flops,
           double efficiency = 0, const std::string& note = "");
  // Sums a count over ranks.
  int64_t total(const std::string& label, int64_t value) { return w_.sum(key_of(label), value); }
  // Records a note and prints it on the leader.
  void note(const std::string& text);
  void fork_side() {
    EXC_CUDA_CHECK(cudaEventRecord(fork_, main_.get()));
    EXC_CUDA_CHECK(cudaStreamWaitEvent(side_.get(), fork_, 0));
  }
  void join_side() {
    EXC_CUDA_CHECK(cudaEventRecord(join_, side_.get()));
    EXC_CUDA_CHECK(cudaStreamWaitEvent(main_.get(), join_, 0));
  }
  // One call of fsdp_section / ag_section: its operands, pipelines and results, and its steps as
  // methods (defined in bench_overlap_fsdp.cc / bench_overlap_ag.cc; members of Bench, so that
  // they use its harness).
  struct FsdpSection;
  struct AgSection;

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

}  // namespace exactcoll::gpu::bench_overlap
