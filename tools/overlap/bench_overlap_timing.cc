// bench-overlap's measurements (Bench, bench_overlap.h): the cuBLASLt algorithm tuning, the bounded
// stream wait, and the per-variant and interleaved timings (max over ranks of each rank's median).
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {

cublasLtMatmulAlgo_t Bench::tune(DType dtype, const Shape& s, const void* a, const void* b, void* c,
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

void Bench::sync_bounded(cudaStream_t stream, const std::string& what) {
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

double Bench::time_us(const std::string& label, const std::function<void()>& body,
                      const std::function<void()>& finish) {
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

std::vector<double> Bench::time_interleaved(const std::string& label, const std::vector<Variant>& variants,
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

}  // namespace exactcoll::gpu::bench_overlap
