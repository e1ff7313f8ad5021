// bench-overlap's ag section (bench_overlap_command.cc describes it): tensor-parallel AG->matmul per
// shape, one pipeline per product grouping, checked against an NCCL all-gather plus the same row
// blocks and timed beside the full matmul, the products alone and the sequential schedules.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sim/overlap/inputs.h"
#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {

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

}  // namespace exactcoll::gpu::bench_overlap
