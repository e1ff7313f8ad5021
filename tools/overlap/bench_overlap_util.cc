// bench-overlap's byte and text helpers (declared in bench_overlap.h): number formatting, store
// keys and shape labels; device transfers, the seeded shards, element-wise bit comparison and the
// float64 sampled error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_backend/cuda_check.h"
#include "sim/overlap/inputs.h"
#include "sim/overlap/matmul.h"
#include "sim/prng.h"
#include "tools/overlap/bench_overlap.h"

namespace exactcoll::gpu::bench_overlap {

std::string fmt(const char* format, double v) {
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

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

Bytes all_shards(DType dtype, size_t shard_elements, int ranks, uint64_t seed) {
  const size_t esize = static_cast<size_t>(dtype_size(dtype));
  Bytes out(shard_elements * esize * static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    overlap::fill_finite(dtype, out.data() + static_cast<size_t>(r) * shard_elements * esize, shard_elements,
                         overlap::shard_seed(seed, r));
  }
  return out;
}

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

}  // namespace exactcoll::gpu::bench_overlap
