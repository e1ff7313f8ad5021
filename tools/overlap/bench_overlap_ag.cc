// bench-overlap's ag section (bench_overlap_command.cc describes it): tensor-parallel AG->matmul per
// shape, one pipeline per product grouping, checked against an NCCL all-gather plus the same row
// blocks and timed beside the full matmul, the products alone and the sequential schedules.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/overlap/inputs.h"
#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {

// One shape's ag section on this rank: what its steps share (sizes, operands, one pipeline per
// grouping, references, times) and the steps, which ag_section calls in the order they are defined
// here, from upload_operands to time_products. The members are declared in the order they are
// made, so that they are freed in reverse (the pipelines, whose destructors pass a store barrier,
// before the operands). Precondition: the ranks divide s.m.
struct Bench::AgSection {
  // One product grouping's pipeline (its own symmetric region and streams) and its outputs.
  struct Grouped {
    std::string name;
    std::unique_ptr<OverlapPipeline> pipeline;
    DeviceBuffer gathered, c, c_ref, c_alone;  // c: the pipeline's; c_ref: unpipelined; c_alone: products alone
  };
  // A variant of the interleaved timing, with what its efficiency and check refer to.
  struct Timed {
    Variant variant;
    double comm_alone_us = 0;  // the all-gather it overlaps or runs after (0: none)
    int group = -1;            // the pipeline's index in groups (-1: not a pipeline)
  };

  Bench& bench;
  const DType dtype;
  const Shape s;
  const size_t esize, rows, shard, a_bytes, c_bytes;
  const uint64_t seed;
  const std::string dt, tag;
  const double flops;
  const cudaStream_t m;
  // B; all of A (uploaded for tuning, then the NCCL all-gather's output); C for tuning and for the
  // all-gathers run without products; the full product's C.
  DeviceBuffer b, gathered_ref, c_scratch, c_full;
  Bytes hb, a_full;                                     // B and all of A on the host
  Algos algos;                                          // by product row count (tune_products)
  std::optional<LtMatmul> full;                         // the full product with the tuned algorithm (tune_products)
  std::optional<LtMatmul> full_heuristic;               // the full product with the heuristic's first
  std::vector<Grouped> groups;                          // one per grouping, in --groupings order (make_pipelines)
  std::vector<Bytes> crefs;                             // per grouping, its unpipelined C (check_pipelines)
  double full_fresh = 0, ag_alone = 0, nccl_alone = 0;  // µs (time_alone)

  // Allocates the operands' device buffers (nothing enqueued).
  AgSection(Bench& bench, DType dtype, const Shape& shape)
      : bench(bench),
        dtype(dtype),
        s(shape),
        esize(static_cast<size_t>(dtype_size(dtype))),
        rows(s.m / static_cast<size_t>(bench.n_)),
        shard(rows * s.k),
        a_bytes(s.m * s.k * esize),
        c_bytes(s.m * s.n * esize),
        seed(static_cast<uint64_t>(bench.o_.seed) + 200 + s.m + s.k),
        dt(dtype_name(dtype)),
        tag(dt + "/" + shape_text(s)),
        flops(2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) * static_cast<double>(s.n)),
        m(bench.main_.get()),
        b(s.k * s.n * esize),
        gathered_ref(a_bytes),
        c_scratch(c_bytes),
        c_full(c_bytes) {}

  // The first grouping's pipeline: the one whose copy-engine all-gather is timed alone and
  // whose shard the NCCL all-gathers read.
  OverlapPipeline& first() { return *groups.front().pipeline; }

  // Waits for main_ (bounded), then raises a communicator error if there was one.
  void finish_main() {
    bench.sync_bounded(m, "ag " + tag);
    bench.comm_->check(m);
  }
  // Finishes every pipeline's calls on main_, then raises a communicator error if there was one.
  void finish_pipes() {
    for (Grouped& x : groups) x.pipeline->finish(m);
    bench.comm_->check(m);
  }

  // 1a. B and all of A (every rank's shard) on the host and the device.
  void upload_operands() {
    hb = overlap::finite_values(dtype, s.k * s.n, overlap::rhs_seed(seed));
    upload(b.get(), hb);
    a_full = all_shards(dtype, shard, bench.n_, seed);
    upload(gathered_ref.get(), a_full);  // operands for tuning (the pipelines fill their gathered A themselves)
  }

  // 1b. The algorithms: the fastest of the heuristic's first candidates for every product row
  //     count of the groupings and for the full product (each tuning noted); then the full product
  //     with it and with the heuristic's first.
  void tune_products() {
    for (size_t product_rows : bench.product_row_counts(rows)) {
      std::string tuned;
      algos[product_rows] =
          bench.tune(dtype, Shape{product_rows, s.k, s.n}, gathered_ref.get(), b.get(), c_scratch.get(),
                     "ag " + tag + " " + std::to_string(product_rows) + "-row product", &tuned);
      bench.note(tuned);
    }
    std::string tuned_full;
    const cublasLtMatmulAlgo_t full_algo =
        bench.tune(dtype, s, gathered_ref.get(), b.get(), c_full.get(), "ag " + tag + " full product", &tuned_full);
    bench.note(tuned_full);
    full.emplace(bench.lt_, dtype, s.m, s.k, s.n, bench.workspace_.get(), kWorkspaceBytes, full_algo);
    full_heuristic.emplace(bench.lt_, dtype, s.m, s.k, s.n, bench.workspace_.get(), kWorkspaceBytes);
  }

  // 2. One pipeline per grouping (its own symmetric region and streams), all on the same shard;
  //    the leader prints each one's products and the full product's configuration.
  void make_pipelines() {
    const Bytes my_shard = overlap::finite_values(dtype, shard, overlap::shard_seed(seed, bench.rank_));
    for (ProductGrouping g : bench.o_.groupings) {
      Grouped x;
      x.name = overlap::grouping_name(g);
      x.pipeline = std::make_unique<OverlapPipeline>(
          bench.w_.store(), bench.rank_, bench.n_,
          bench.pipeline_options("ag/" + tag + "/" + x.name, Pattern::kAgMatmul, dtype, s, 0, g, algos), bench.lt_,
          bench.workspace_.get(), kWorkspaceBytes);
      upload(x.pipeline->shard(), my_shard);
      x.gathered = DeviceBuffer(a_bytes);
      x.c = DeviceBuffer(c_bytes);
      x.c_ref = DeviceBuffer(c_bytes);
      x.c_alone = DeviceBuffer(c_bytes);
      print_leader(bench.w_, "  # ag " + tag + " " + x.name + ": rank " + std::to_string(bench.rank_) + "'s products " +
                                 algos_text(*x.pipeline) + "\n");
      groups.push_back(std::move(x));
    }
    print_leader(bench.w_, "  # ag " + tag + ": full product " + full->algo_text() + "\n");
  }

  // 3a. Enqueues the unpipelined reference (NCCL all-gather into gathered_ref, then one big GEMM
  //     into c_full) and per grouping its pipelined run (gathered A and C poisoned first) and the
  //     grouping's row blocks with the pipeline's configurations (into c_ref); waits for them.
  void run_references() {
    bench.comm_->allgather(first().shard(), gathered_ref.get(), shard, dtype, Algorithm::kNccl, m);
    full->run(gathered_ref.get(), b.get(), c_full.get(), m);
    for (Grouped& x : groups) {
      EXC_CUDA_CHECK(cudaMemsetAsync(x.gathered.get(), 0xFF, a_bytes, m));
      EXC_CUDA_CHECK(cudaMemsetAsync(x.c.get(), 0xFF, c_bytes, m));
      x.pipeline->run(x.gathered.get(), nullptr, b.get(), x.c.get(), m);
      x.pipeline->finish(m);
      run_products(*x.pipeline, gathered_ref.get(), b.get(), x.c_ref.get(), dtype, s, m);
    }
    bench.sync_bounded(m, "ag reference " + tag);
  }

  // 3b. Checks per grouping (counts over all ranks; any difference fails the run): the pipeline's
  //     gathered A against the shards, its C against the unpipelined C (kept in crefs), the big
  //     GEMM against the same row blocks (reported, not a check) and float64 samples of C.
  void check_pipelines() {
    const Bytes c_big = download(c_full.get(), c_bytes);
    for (Grouped& x : groups) {
      const std::string gtag = tag + " " + x.name;
      size_t first_bad = 0;
      const Bytes g = download(x.gathered.get(), a_bytes), cc = download(x.c.get(), c_bytes);
      crefs.push_back(download(x.c_ref.get(), c_bytes));
      const Bytes& cref = crefs.back();
      const int64_t g_bad =
          bench.total("ag/g/" + gtag, static_cast<int64_t>(differing_elements(g, a_full, esize, &first_bad)));
      const int64_t c_bad =
          bench.total("ag/c/" + gtag, static_cast<int64_t>(differing_elements(cc, cref, esize, &first_bad)));
      const int64_t big_bad =
          bench.total("ag/big/" + gtag, static_cast<int64_t>(differing_elements(c_big, cref, esize, &first_bad)));
      const double err = sampled_error(dtype, a_full, hb, cc, s, seed + 5);
      const int64_t err_bad = bench.total("ag/e/" + gtag, err > 2e-2 ? 1 : 0);
      if (g_bad != 0 || c_bad != 0 || err_bad != 0) bench.failed_check_ = true;
      bench.note("ag " + gtag + ": gathered A vs the shards: " + std::to_string(g_bad) + " of " +
                 std::to_string(static_cast<uint64_t>(bench.n_) * s.m * s.k) +
                 " elements differ (all ranks); C pipelined vs NCCL "
                 "all-gather + the same row blocks (same configurations): " +
                 std::to_string(c_bad) + " of " + std::to_string(static_cast<uint64_t>(bench.n_) * s.m * s.n) +
                 " differ; one big GEMM vs these row blocks: " + std::to_string(big_bad) +
                 " differ; C vs float64 (48 samples, rank " + std::to_string(bench.rank_) + "): " + fmt("%.2e", err));
    }
  }

  // 3c. Notes how many elements of each grouping's unpipelined C differ from the first grouping's.
  void compare_groupings() {
    for (size_t i = 1; i < groups.size(); ++i) {
      size_t first_bad = 0;
      const int64_t differ =
          bench.total("ag/x/" + tag + groups[i].name,
                      static_cast<int64_t>(differing_elements(crefs[i], crefs[0], esize, &first_bad)));
      bench.note("ag " + tag + ": C of " + groups[i].name + " vs C of " + groups[0].name + ": " +
                 std::to_string(differ) +
                 " elements differ (all ranks; not a check: the row count of a product may change its bits)");
    }
  }

  // 4a. Times the full matmul on a rested GPU first (noted), then the all-gathers alone
  //     (communication only: the first pipeline's copy engines, NCCL), each added as a row.
  void time_alone() {
    full_fresh = bench.time_us(
        "ag/full/" + tag, [&] { full->run(gathered_ref.get(), b.get(), c_full.get(), m); }, [this] { finish_main(); });
    bench.note("ag " + tag + ": full matmul alone measured first, on a rested GPU: " + fmt("%.1f", full_fresh) + " us");
    ag_alone = bench.time_us(
        "ag/ag/" + tag,
        [&] { first().run(groups.front().gathered.get(), nullptr, b.get(), c_scratch.get(), m, false); },
        [this] { finish_pipes(); });
    bench.add("ag", dtype, shape_text(s) + " copy-engine all-gather alone", ag_alone, 0);
    nccl_alone = bench.time_us(
        "ag/nccl/" + tag,
        [&] { bench.comm_->allgather(first().shard(), gathered_ref.get(), shard, dtype, Algorithm::kNccl, m); },
        [this] { finish_main(); });
    bench.add("ag", dtype, shape_text(s) + " NCCL all-gather alone", nccl_alone, 0);
  }

  // The variants that run products, in the order they are timed and reported: the full matmul
  // (tuned, heuristic's first), per grouping its products alone, the sequential schedules (NCCL,
  // copy engine), per grouping the pipeline. Their bodies capture this section.
  std::vector<Timed> product_variants() {
    std::vector<Timed> timed = {
        {{shape_text(s) + " full matmul alone", [&] { full->run(gathered_ref.get(), b.get(), c_full.get(), m); }}},
        {{shape_text(s) + " full matmul alone (heuristic's first)",
          [&] { full_heuristic->run(gathered_ref.get(), b.get(), c_full.get(), m); }}},
    };
    for (Grouped& x : groups) {
      timed.push_back({{shape_text(s) + " products alone (" + x.name + ")",
                        [&] { run_products(*x.pipeline, x.gathered.get(), b.get(), x.c_alone.get(), dtype, s, m); }}});
    }
    timed.push_back({{shape_text(s) + " NCCL all-gather + matmul",
                      [&] {
                        bench.comm_->allgather(first().shard(), gathered_ref.get(), shard, dtype, Algorithm::kNccl, m);
                        full->run(gathered_ref.get(), b.get(), c_full.get(), m);
                      }},
                     nccl_alone});
    timed.push_back({{shape_text(s) + " copy-engine all-gather + matmul",
                      [&] {
                        first().run(groups.front().gathered.get(), nullptr, b.get(), c_scratch.get(), m, false);
                        full->run(groups.front().gathered.get(), b.get(), c_full.get(), m);
                      }},
                     ag_alone});
    for (size_t i = 0; i < groups.size(); ++i) {
      Grouped& x = groups[i];
      timed.push_back({{shape_text(s) + " pipelined AG->matmul (" + x.name + ")",
                        [&] { x.pipeline->run(x.gathered.get(), nullptr, b.get(), x.c.get(), m, true); }},
                       ag_alone,
                       static_cast<int>(i)});
    }
    return timed;
  }

  // 4b. Poisons every pipeline's C, then times product_variants() interleaved round by round and
  //     reports them (report_products).
  void time_products() {
    for (Grouped& x : groups) EXC_CUDA_CHECK(cudaMemsetAsync(x.c.get(), 0xFF, c_bytes, m));
    const std::vector<Timed> timed = product_variants();
    std::vector<Variant> variants;
    for (const Timed& t : timed) variants.push_back(t.variant);
    const std::vector<double> t = bench.time_interleaved("ag/all/" + tag, variants, [this] { finish_pipes(); });
    report_products(timed, t);
  }

  // Adds a row per timed variant (t: its µs, in timed's order); for a pipeline, first checks its
  // last C against the unpipelined C (a difference fails the run) and records its target line
  // against the faster full matmul alone.
  void report_products(const std::vector<Timed>& timed, const std::vector<double>& t) {
    const double full_alone = t[0], full_heur = t[1], best_full = std::min(full_alone, full_heur);
    for (size_t v = 0; v < timed.size(); ++v) {
      std::string check_note;
      if (timed[v].group >= 0) {
        const Grouped& x = groups[static_cast<size_t>(timed[v].group)];
        size_t first_bad = 0;
        const int64_t c_after = bench.total(
            "ag/c2/" + tag + x.name,
            static_cast<int64_t>(differing_elements(download(x.c.get(), c_bytes),
                                                    crefs[static_cast<size_t>(timed[v].group)], esize, &first_bad)));
        if (c_after != 0) bench.failed_check_ = true;
        check_note = "C vs unpipelined " + std::to_string(c_after);
        bench.targets_.push_back("AG->matmul " + tag + " " + x.name + ": pipelined " + fmt("%.1f", t[v]) +
                                 " us = " + fmt("%.3f", t[v] / best_full) + " x the faster full matmul alone (" +
                                 fmt("%.1f", best_full) + " us, interleaved; heuristic's first " +
                                 fmt("%.1f", full_heur) + " us; rested-GPU full matmul " + fmt("%.1f", full_fresh) +
                                 " us, ratio " + fmt("%.3f", t[v] / full_fresh) +
                                 "); target <= 1.03: " + (t[v] <= 1.03 * best_full ? "MET" : "NOT MET"));
      }
      const double comm = timed[v].comm_alone_us;
      bench.add("ag", dtype, timed[v].variant.label, t[v], flops, comm > 0 ? std::max(full_alone, comm) / t[v] : 0,
                check_note);
    }
  }
};

void Bench::ag_section(DType dtype, const Shape& s) {
  if (s.m % static_cast<size_t>(n_) != 0) {
    note("ag " + shape_text(s) + ": m is not a multiple of " + std::to_string(n_) + " ranks; skipped");
    return;
  }
  AgSection section(*this, dtype, s);
  // 1. Operands, and the algorithms.
  section.upload_operands();
  section.tune_products();
  // 2. One pipeline per grouping.
  section.make_pipelines();
  // 3. Checks per grouping: the pipeline's gathered A and C; the unpipelined reference (NCCL
  //    all-gather, then the grouping's row blocks with the pipeline's configurations); one big
  //    GEMM; float64 samples.
  section.run_references();
  section.check_pipelines();
  section.compare_groupings();
  // 4. Times: the full matmul on a rested GPU first; the all-gathers alone (communication only);
  //    then everything that runs products, interleaved round by round.
  section.time_alone();
  section.time_products();
}

}  // namespace exactcoll::gpu::bench_overlap
