// bench-overlap's check section (bench_overlap_command.cc describes it): per product grouping, the
// GPU pipeline's gathered A and C against the simulator's run of the same plan, against the GPU's
// unpipelined schedule (the SM all-gather, then the same row blocks) and against one big GEMM.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "sim/overlap/inputs.h"
#include "sim/overlap/matmul.h"
#include "sim/overlap/overlap_sim.h"
#include "sim/world.h"
#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {

namespace {

// The simulator's run of the check's plan (AG->matmul with `grouping`, shape s) on every rank's
// shard and the shared b: rank r's gathered A into (*sim_gathered)[r], its C into (*sim_c)[r]
// (both poisoned first, so that unwritten bytes show).
void simulate_ag_matmul(DType dtype, ProductGrouping grouping, const Shape& s, const std::vector<Bytes>& shards,
                        const Bytes& b, std::vector<Bytes>* sim_gathered, std::vector<Bytes>* sim_c) {
  const int n = static_cast<int>(shards.size());
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  const size_t shard = s.m / static_cast<size_t>(n) * s.k;
  overlap::OverlapShape shape;
  shape.pattern = Pattern::kAgMatmul;
  shape.grouping = grouping;
  shape.dtype = dtype;
  shape.m = s.m;
  shape.k = s.k;
  shape.n = s.n;
  std::vector<Bytes> rhs;
  for (int r = 0; r < n; ++r) {
    rhs.push_back(b);
    sim_gathered->emplace_back(shard * esize * static_cast<size_t>(n), 0xA5);
    sim_c->emplace_back(s.m * s.n * esize, 0xA5);
  }
  sim::WorldOptions wo;
  wo.ranks = n;
  sim::World world(wo);
  overlap::OverlapSim ov(world);
  overlap::OverlapIo io;
  for (int r = 0; r < n; ++r) {
    io.shards.push_back(shards[static_cast<size_t>(r)].data());
    io.rhs.push_back(rhs[static_cast<size_t>(r)].data());
    io.gathered.push_back((*sim_gathered)[static_cast<size_t>(r)].data());
    io.products.push_back((*sim_c)[static_cast<size_t>(r)].data());
  }
  ov.enqueue(shape, io);
  world.run();
}

// Returns the largest difference between the `count` elements of got and ref, each relative to the
// larger of |ref| and the rms of ref (infinity for a NaN).
double max_relative_difference(DType dtype, const Bytes& ref, const Bytes& got, size_t count) {
  double rms = 0, worst = 0;
  for (size_t i = 0; i < count; ++i) rms += std::pow(overlap::element_value(dtype, ref.data(), i), 2);
  rms = std::sqrt(rms / static_cast<double>(count));
  for (size_t i = 0; i < count; ++i) {
    const double x = overlap::element_value(dtype, ref.data(), i);
    const double y = overlap::element_value(dtype, got.data(), i);
    const double e = std::fabs(x - y) / std::max(std::fabs(x), rms);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

}  // namespace

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
  std::vector<Bytes> shards, sim_gathered, sim_c;
  const Bytes b = overlap::finite_values(dtype, s.k * s.n, overlap::rhs_seed(seed));
  for (int r = 0; r < n_; ++r) shards.push_back(overlap::finite_values(dtype, shard, overlap::shard_seed(seed, r)));
  simulate_ag_matmul(dtype, grouping, s, shards, b, &sim_gathered, &sim_c);

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
  // The simulator's C (Eigen, float accumulation) vs the GPU's (cuBLASLt): within tolerance.
  const double worst_vs_sim = max_relative_difference(dtype, sim_c[static_cast<size_t>(rank_)], cc, s.m * s.n);

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

}  // namespace exactcoll::gpu::bench_overlap
