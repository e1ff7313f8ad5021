// bench-overlap's fsdp section (bench_overlap_command.cc describes it): an m=n=k product beside an
// unrelated all-gather (SM kernel, NCCL, copy engine), alone, sequential and overlapped, with the
// gathered bits and the overlapped products checked.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sim/overlap/inputs.h"
#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {

// One dtype's fsdp section on this rank: what its steps share (sizes, operands, the product, the
// copy-engine pipeline, outputs, times) and the steps, which fsdp_section calls in the order they
// are defined here, from upload_operands to time_products. The members are declared in the order
// they are made, so that they are freed in reverse (as the section's locals were).
struct Bench::FsdpSection {
  Bench& bench;
  const DType dtype;
  const size_t dim;
  const Shape s;
  const size_t esize, gather_bytes;
  const size_t count;  // per rank
  const uint64_t seed;
  const std::string dt;
  const double flops;
  const cudaStream_t m, side;
  // X, W, C of the product, and the copy-engine all-gather's output.
  DeviceBuffer x, wt, c, ce_out;
  DeviceBuffer& ag_in;                // this rank's shard for the SM and NCCL all-gathers (bench.ag_in_)
  const cuda::RegisteredBuffer& reg;  // its registration (bench.ag_reg_)
  Bytes my_shard;                     // this rank's shard on the host (upload_operands)
  cublasLtMatmulAlgo_t algo{};        // the tuned algorithm (make_product)
  std::optional<OverlapPipeline> p;   // the copy-engine all-gather's pipeline (make_product)
  Bytes expected;                     // every rank's shard: what every all-gather must produce (make_product)
  std::optional<LtMatmul> gemm;       // the product with the tuned algorithm (make_product)
  std::optional<LtMatmul> heuristic;  // the product with the heuristic's first algorithm (make_product)
  double mm_fresh = 0;                // µs, the matmul alone on a rested GPU (time_matmul_alone)
  Bytes c_alone;                      // its C, which no overlapped run may change (time_matmul_alone)
  size_t out_bytes = 0;               // an all-gather's output bytes (time_gathers_alone)
  // The SM and NCCL all-gathers' outputs, and C of the heuristic's product, of the sequential
  // runs and of each overlapped run (time_gathers_alone).
  DeviceBuffer ag_sm, ag_nccl, c_h, c_seq, c_sm, c_nccl, c_ce;
  double sm_alone = 0, nccl_alone = 0, ce_alone = 0;  // µs, each all-gather alone (time_gathers_alone)

  // Allocates X, W, C and the copy-engine output, and (on the harness's first fsdp section) the
  // registered shard buffer, the same bytes for every dtype. Enqueues nothing.
  FsdpSection(Bench& bench, DType dtype)
      : bench(bench),
        dtype(dtype),
        dim(static_cast<size_t>(bench.o_.fsdp_size)),
        s{dim, dim, dim},
        esize(static_cast<size_t>(dtype_size(dtype))),
        gather_bytes(static_cast<size_t>(bench.o_.gather_mib) << 20),
        count(gather_bytes / esize / static_cast<size_t>(bench.n_)),
        seed(static_cast<uint64_t>(bench.o_.seed) + 100),
        dt(dtype_name(dtype)),
        flops(2.0 * static_cast<double>(dim) * static_cast<double>(dim) * static_cast<double>(dim)),
        m(bench.main_.get()),
        side(bench.side_.get()),
        x(dim * dim * esize),
        wt(dim * dim * esize),
        c(dim * dim * esize),
        ce_out(count * esize * static_cast<size_t>(bench.n_)),
        ag_in(bench.ag_in_),
        reg(bench.ag_reg_) {
    if (bench.ag_in_.get() == nullptr) {  // the same bytes for every dtype: gather_bytes / ranks
      bench.ag_in_ = DeviceBuffer(count * esize);
      bench.ag_reg_ = bench.comm_->register_buffer(bench.ag_in_.get(), count * esize);
    }
  }

  // 1a. X, W (finite random), this rank's shard in the registered buffer (SM, NCCL).
  void upload_operands() {
    upload(x.get(), overlap::finite_values(dtype, dim * dim, overlap::lhs_seed(seed, bench.rank_)));
    upload(wt.get(), overlap::finite_values(dtype, dim * dim, overlap::rhs_seed(seed)));
    my_shard = overlap::finite_values(dtype, count, overlap::shard_seed(seed, bench.rank_));
    upload(ag_in.get(), my_shard);
  }

  // 1b. Tunes the product (noted), makes the copy-engine pipeline and puts the shard in its
  //     symmetric buffer, makes the product (tuned, heuristic's first); the leader prints the set-up.
  void make_product() {
    std::string tuned;
    algo = bench.tune(dtype, s, x.get(), wt.get(), c.get(), "fsdp " + dt + " " + shape_text(s), &tuned);
    bench.note(tuned);
    p.emplace(bench.w_.store(), bench.rank_, bench.n_,
              bench.pipeline_options("fsdp/" + dt, Pattern::kPrefetch, dtype, s, count, ProductGrouping::kPerShard,
                                     Algos{{dim, algo}}),
              bench.lt_, bench.workspace_.get(), kWorkspaceBytes);
    upload(p->shard(), my_shard);
    expected = all_shards(dtype, count, bench.n_, seed);
    gemm.emplace(bench.lt_, dtype, dim, dim, dim, bench.workspace_.get(), kWorkspaceBytes, algo);
    heuristic.emplace(bench.lt_, dtype, dim, dim, dim, bench.workspace_.get(), kWorkspaceBytes);
    print_leader(bench.w_, "  # fsdp " + dt + ": " + std::to_string(dim) + "^3 product (" + gemm->algo_text() +
                               "), all-gather of " + std::to_string(bench.o_.gather_mib) + " MiB output (" +
                               std::to_string(count) + " elements per rank); " +
                               "copy-engine signals: " + p->signal_mechanism() + "\n");
  }

  // Waits for main_ (bounded), then raises a communicator error if there was one.
  void finish_main() {
    bench.sync_bounded(m, "fsdp " + dt);
    bench.comm_->check(m);
  }
  // Finishes the pipeline's calls on main_.
  void finish_pipe() { p->finish(m); }

  // Enqueues the SM (direct) all-gather of ag_in into ag_sm on st.
  void sm_gather(cudaStream_t st) {
    bench.comm_->allgather(ag_in.get(), ag_sm.get(), count, dtype, Algorithm::kDirect, st, &reg);
  }
  // Enqueues the NCCL all-gather of ag_in into ag_nccl on st.
  void nccl_gather(cudaStream_t st) {
    bench.comm_->allgather(ag_in.get(), ag_nccl.get(), count, dtype, Algorithm::kNccl, st);
  }
  // Returns how many elements of the all-gather output `out` differ from expected, over all ranks
  // (any fails the run). Synchronous (downloads out).
  int64_t check_gather(const std::string& what, void* out) {
    size_t first = 0;
    const int64_t bad =
        bench.total("fsdp/g/" + dt + what,
                    static_cast<int64_t>(differing_elements(download(out, out_bytes), expected, esize, &first)));
    if (bad != 0) bench.failed_check_ = true;
    return bad;
  }
  // Returns how many elements of C `product` differ from the matmul alone's, over all ranks (any
  // fails the run). Synchronous (downloads product).
  int64_t check_product(const std::string& what, void* product) {
    size_t first = 0;
    const int64_t bad = bench.total(
        "fsdp/c/" + dt + what,
        static_cast<int64_t>(differing_elements(download(product, dim * dim * esize), c_alone, esize, &first)));
    if (bad != 0) bench.failed_check_ = true;
    return bad;
  }
  // Enqueues gather on side_ and the product into `product` on main_, side_ forked from and
  // joined back into main_.
  void overlapped(const std::function<void(cudaStream_t)>& gather, void* product) {
    bench.fork_side();
    gather(side);
    gemm->run(x.get(), wt.get(), product, m);
    bench.join_side();
  }

  // 2. The matmul alone on a rested GPU (measured first), and its bits (no overlapped run may
  //    change them).
  void time_matmul_alone() {
    mm_fresh = bench.time_us(
        "fsdp/mm/" + dt, [&] { gemm->run(x.get(), wt.get(), c.get(), m); }, [this] { finish_main(); });
    c_alone = download(c.get(), dim * dim * esize);
    bench.note("fsdp " + dt + ": matmul alone measured first, on a rested GPU: " + fmt("%.1f", mm_fresh) + " us (" +
               fmt("%.1f", flops / (mm_fresh * 1e6)) + " TFLOP/s)");
  }

  // 3. Allocates the remaining outputs; each all-gather alone (communication only), and its bits.
  void time_gathers_alone() {
    out_bytes = expected.size();
    ag_sm = DeviceBuffer(out_bytes);
    ag_nccl = DeviceBuffer(out_bytes);
    c_h = DeviceBuffer(dim * dim * esize);
    c_seq = DeviceBuffer(dim * dim * esize);
    c_sm = DeviceBuffer(dim * dim * esize);
    c_nccl = DeviceBuffer(dim * dim * esize);
    c_ce = DeviceBuffer(dim * dim * esize);
    for (void* out : {ag_sm.get(), ag_nccl.get(), ce_out.get()}) EXC_CUDA_CHECK(cudaMemset(out, 0xFF, out_bytes));
    sm_alone = bench.time_us(
        "fsdp/ag/" + dt + "sm", [&] { sm_gather(m); }, [this] { finish_main(); });
    bench.add("fsdp", dtype, "SM all-gather alone", sm_alone, 0, 0,
              "#wrong " + std::to_string(check_gather("sm", ag_sm.get())));
    nccl_alone = bench.time_us(
        "fsdp/ag/" + dt + "nccl", [&] { nccl_gather(m); }, [this] { finish_main(); });
    bench.add("fsdp", dtype, "NCCL all-gather alone", nccl_alone, 0, 0,
              "#wrong " + std::to_string(check_gather("nccl", ag_nccl.get())));
    ce_alone = bench.time_us(
        "fsdp/ag/" + dt + "ce", [&] { p->run(ce_out.get(), x.get(), wt.get(), c.get(), m, false); },
        [this] { finish_pipe(); });
    bench.add("fsdp", dtype, "copy-engine all-gather alone", ce_alone, 0, 0,
              "#wrong " + std::to_string(check_gather("ce", ce_out.get())));
  }

  // The variants that run the product, in the order they are timed and reported (report_products
  // relies on it): the matmul alone (tuned, heuristic's first), then per all-gather (SM, NCCL,
  // copy engine) sequential and overlapped.
  std::vector<Variant> product_variants() {
    return {
        {"matmul alone", [&] { gemm->run(x.get(), wt.get(), c.get(), m); }},
        {"matmul alone (heuristic's first algorithm)", [&] { heuristic->run(x.get(), wt.get(), c_h.get(), m); }},
        {"sequential, SM all-gather",
         [&] {
           sm_gather(m);
           gemm->run(x.get(), wt.get(), c_seq.get(), m);
         }},
        {"overlapped, SM all-gather", [&] { overlapped([&](cudaStream_t st) { sm_gather(st); }, c_sm.get()); }},
        {"sequential, NCCL all-gather",
         [&] {
           nccl_gather(m);
           gemm->run(x.get(), wt.get(), c_seq.get(), m);
         }},
        {"overlapped, NCCL all-gather", [&] { overlapped([&](cudaStream_t st) { nccl_gather(st); }, c_nccl.get()); }},
        {"sequential, copy-engine all-gather",
         [&] {
           p->run(ce_out.get(), x.get(), wt.get(), c.get(), m, false);
           gemm->run(x.get(), wt.get(), c_seq.get(), m);
         }},
        {"overlapped, copy-engine all-gather", [&] { p->run(ce_out.get(), x.get(), wt.get(), c_ce.get(), m, true); }},
    };
  }

  // 4. Poisons the all-gather outputs and the overlapped C's, then times product_variants()
  //    interleaved round by round and reports them (report_products).
  void time_products() {
    for (void* out : {ag_sm.get(), ag_nccl.get(), ce_out.get()}) EXC_CUDA_CHECK(cudaMemset(out, 0xFF, out_bytes));
    for (void* out : {c_sm.get(), c_nccl.get(), c_ce.get()}) EXC_CUDA_CHECK(cudaMemset(out, 0xFF, dim * dim * esize));
    const std::vector<Variant> variants = product_variants();
    const std::vector<double> t = bench.time_interleaved("fsdp/all/" + dt, variants, [&] {
      p->finish(m);
      bench.comm_->check(m);
    });
    report_products(variants, t);
  }

  // Adds a row per variant (t: its µs, in product_variants' order), an overlapped one with its
  // gathered bits and C checked, and records the copy-engine overlap's target line.
  void report_products(const std::vector<Variant>& variants, const std::vector<double>& t) {
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
      bench.add("fsdp", dtype, variants[v].label, t[v], flops, alone_of[v] > 0 ? std::max(mm, alone_of[v]) / t[v] : 0,
                note_text);
    }
    const double ce_ov = t[7];
    bench.targets_.push_back("FSDP " + dt + ": copy-engine overlapped " + fmt("%.1f", ce_ov) + " us = " +
                             fmt("%.3f", ce_ov / mm) + " x matmul alone (" + fmt("%.1f", mm) + " us, interleaved; " +
                             fmt("%.3f", ce_ov / mm_fresh) + " x the rested-GPU " + fmt("%.1f", mm_fresh) +
                             " us); target <= 1.04: " + (ce_ov <= 1.04 * mm ? "MET" : "NOT MET"));
  }
};

void Bench::fsdp_section(DType dtype) {
  FsdpSection section(*this, dtype);
  // 1. Operands: X, W (finite random), this rank's shard in a registered buffer (SM, NCCL) and in
  //    the pipeline's symmetric buffer (copy engine).
  section.upload_operands();
  section.make_product();
  // 2. The matmul alone on a rested GPU (measured first), and its bits.
  section.time_matmul_alone();
  // 3. Each all-gather alone (communication only), and its bits.
  section.time_gathers_alone();
  // 4. Everything that runs the product, interleaved round by round.
  section.time_products();
}

}  // namespace exactcoll::gpu::bench_overlap
