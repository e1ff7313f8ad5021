// bench-overlap's harness (Bench, bench_overlap.h): set-up and tear-down of one rank's cuBLASLt
// handle, workspace and communicator; the pipelines' options; the unpipelined products and their
// algorithms' description.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_backend/overlap/cublaslt_api.h"
#include "core/overlap_plan.h"
#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {

Bench::Bench(Worker& w, const Options& o) : w_(w), o_(o), rank_(w.rank()), n_(w.world_size()) {
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

Bench::~Bench() {
  (void)cudaEventDestroy(fork_);
  (void)cudaEventDestroy(join_);
  comm_.reset();  // closes the peers' mappings before ag_in_ (a later member) is freed
  if (lt_ != nullptr) (void)cuda::CublasLtApi::get().Destroy(lt_);
}

cuda::OverlapPipelineOptions Bench::pipeline_options(const std::string& name, Pattern pattern, DType dtype,
                                                     const Shape& s, size_t gather_count, ProductGrouping grouping,
                                                     Algos algos) const {
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

std::vector<size_t> Bench::product_row_counts(size_t shard_rows) const {
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

void Bench::run_products(const OverlapPipeline& p, const void* gathered, const void* b, void* c, DType dtype,
                         const Shape& s, cudaStream_t stream) {
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  for (const overlap::ShardRange& range : p.product_ranges()) {
    const size_t first_row = p.shard_rows() * static_cast<size_t>(range.first);
    p.gemm(p.shard_rows() * static_cast<size_t>(range.count))
        .run(static_cast<const char*>(gathered) + first_row * s.k * esize, b,
             static_cast<char*>(c) + first_row * s.n * esize, stream);
  }
}

std::string Bench::algos_text(const OverlapPipeline& p) {
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

}  // namespace exactcoll::gpu::bench_overlap
