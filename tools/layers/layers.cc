#include "tools/layers/layers.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "sim/fused/random.h"
#include "tools/diff/compare.h"

namespace exactcoll::layers {
namespace {

// A seed for the numbers of (layer, rank, purpose), decorrelated from the user's seed.
uint64_t derive(uint64_t seed, uint64_t layer, uint64_t rank, uint64_t purpose) {
  fused::SplitMix64 mix(seed ^ (layer * 0x9E3779B97F4A7C15ull) ^ (rank * 0xC2B2AE3D27D4EB4Full) ^ (purpose << 56));
  mix.next();
  return mix.next();
}

// One run's state: the residual stream and the last normed output.
template <class T>
struct Stream {
  std::vector<T> h, out;
};

template <class T>
std::vector<LayerRow> simulate(const LayersOptions& o) {
  const int n = o.ranks, H = o.hidden;
  const size_t count = static_cast<size_t>(o.rows) * H;
  // 1. The start, shared by both runs.
  Stream<T> canonical, alternative;
  {
    fused::SplitMix64 rng(derive(o.seed, 0, 0, 1));
    canonical.h.resize(count);
    for (T& v : canonical.h) v = round_to<T>(rng.normal());
    canonical.out = canonical.h;
    alternative = canonical;
  }
  // Every rank's partial sums have about unit scale (a^2 + b^2 ~ 1 on average, like x ~ N(0, 1) per
  // rank in the single-op AITER test), the residual stream starts at unit scale and grows.
  const float coefficient_scale = 0.70710678f;
  const float noise_scale = 0.1f;
  std::vector<T> x(count * n), weight(H);
  std::vector<LayerRow> rows;
  for (int layer = 1; layer <= o.layers; ++layer) {
    {
      fused::SplitMix64 rng(derive(o.seed, layer, 0, 2));
      for (T& w : weight) w = round_to<T>(1.0f + 0.1f * rng.normal());
    }
    // 2. Each run: partial sums from its own previous output, then the fused op.
    auto step = [&](Stream<T>& s, fused::FusedContract contract) {
      for (int r = 0; r < n; ++r) {
        fused::SplitMix64 rng(derive(o.seed, layer, r + 1, 3));
        const float a = rng.normal() * coefficient_scale, b = rng.normal() * coefficient_scale;
        const int k = 1 + static_cast<int>(rng.next() % static_cast<uint64_t>(H > 1 ? H - 1 : 1));
        T* xr = x.data() + static_cast<size_t>(r) * count;
        for (int i = 0; i < o.rows; ++i) {
          const T* y = s.out.data() + static_cast<size_t>(i) * H;
          for (int j = 0; j < H; ++j) {
            const float mixed = a * to_float(y[j]) + b * to_float(y[(j + k) % H]);
            xr[static_cast<size_t>(i) * H + j] = round_to<T>(mixed + noise_scale * rng.normal());
          }
        }
      }
      fused::FusedProblem<T> p;
      p.ranks = n, p.rows = o.rows, p.hidden = H, p.eps = o.eps;
      p.x = x.data(), p.residual = s.h.data(), p.weight = weight.data();
      std::vector<T> h(count), out(count);
      fused::fused_reference<T>(contract, p, h.data(), out.data());
      s.h.swap(h);
      s.out.swap(out);
    };
    step(canonical, fused::FusedContract::kCanonical);
    step(alternative, o.contract);
    // 3. Compare.
    const diff::CompareResult res = diff::compare(o.dtype, alternative.h.data(), canonical.h.data(), count);
    const diff::CompareResult out = diff::compare(o.dtype, alternative.out.data(), canonical.out.data(), count);
    LayerRow row;
    row.layer = layer;
    row.fraction_differing = res.fraction_differing();
    row.max_ulp = res.max_ulp;
    const size_t small = res.ulp_histogram[1] + res.ulp_histogram[2] + res.ulp_histogram[3];
    row.within_4ulp = res.differing() == 0 ? 0.0 : static_cast<double>(small) / res.differing();
    row.relative_l2 = res.relative_l2();
    row.out_fraction_differing = out.fraction_differing();
    row.out_max_ulp = out.max_ulp;
    row.nan_mismatch = res.nan_mismatch;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace

std::vector<LayerRow> simulate_layers(const LayersOptions& o) {
  if (o.layers < 1) throw std::invalid_argument("--layers must be >= 1");
  if (o.ranks < 1) throw std::invalid_argument("--ranks must be >= 1");
  if (o.rows < 1) throw std::invalid_argument("--rows must be >= 1");
  const int pack = o.dtype == DType::kFP32 ? 4 : 8;
  if (o.hidden <= 0 || o.hidden % pack != 0) {
    throw std::invalid_argument("--hidden " + std::to_string(o.hidden) + " is not a positive multiple of the " +
                                dtype_name(o.dtype) + " pack (" + std::to_string(pack) + " elements)");
  }
  switch (o.dtype) {
    case DType::kBF16: return simulate<bf16>(o);
    case DType::kFP16: return simulate<fp16>(o);
    case DType::kFP32: return simulate<float>(o);
  }
  return {};
}

}  // namespace exactcoll::layers
