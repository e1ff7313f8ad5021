// bench-overlap's fsdp section (bench_overlap_command.cc describes it): an m=n=k product beside an
// unrelated all-gather (SM kernel, NCCL, copy engine), alone, sequential and overlapped, with the
// gathered bits and the overlapped products checked.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "sim/overlap/inputs.h"
#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {

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

}  // namespace exactcoll::gpu::bench_overlap
