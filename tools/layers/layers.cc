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
std::vector<T> start_stream(const LayersOptions& o) {
  fused::SplitMix64 rng(derive(o.seed, 0, 0, 1));
  std::vector<T> h(static_cast<size_t>(o.rows) * o.hidden);
  for (T& v : h) v = round_to<T>(rng.normal());
  return h;
}

template <class T>
void fill_weight(const LayersOptions& o, int layer, std::vector<T>* weight) {
  fused::SplitMix64 rng(derive(o.seed, static_cast<uint64_t>(layer), 0, 2));
  weight->resize(static_cast<size_t>(o.hidden));
  for (T& w : *weight) w = round_to<T>(1.0f + 0.1f * rng.normal());
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  return std::vector<uint8_t>(p, p + v.size() * sizeof(T));
}

template <class T>
std::vector<LayerRow> simulate(const LayersOptions& o) {
  const int n = o.ranks, H = o.hidden;
  const size_t count = static_cast<size_t>(o.rows) * H;
  // 1. The start, shared by both runs.
  Stream<T> canonical, alternative;
  canonical.h = start_stream<T>(o);
  canonical.out = canonical.h;
  alternative = canonical;
  // Captured partial sums (validated by simulate_layers): one set per layer, or one for all.
  const T* captured = o.partial_sums.empty() ? nullptr : reinterpret_cast<const T*>(o.partial_sums.data());
  const size_t captured_layer_stride =
      o.partial_sums.size() == static_cast<size_t>(o.layers) * n * count * sizeof(T) ? n * count : 0;
  // Every rank's partial sums have about unit scale (a^2 + b^2 ~ 1 on average, like x ~ N(0, 1) per
  // rank in the single-op AITER test), the residual stream starts at unit scale and grows.
  const float coefficient_scale = 0.70710678f;
  const float noise_scale = 0.1f;
  std::vector<T> x(captured == nullptr ? count * n : 0), weight(H);
  std::vector<LayerRow> rows;
  for (int layer = 1; layer <= o.layers; ++layer) {
    fill_weight(o, layer, &weight);
    // 2. Each run: partial sums from its own previous output (or the captured ones), then the
    // fused op.
    auto synthetic_partial_sums = [&](const Stream<T>& s) {
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
      return x.data();
    };
    auto step = [&](Stream<T>& s, fused::Contract contract) {
      fused::FusedProblem<T> p;
      p.ranks = n, p.rows = o.rows, p.hidden = H, p.eps = o.eps;
      p.x = captured != nullptr ? captured + static_cast<size_t>(layer - 1) * captured_layer_stride
                                : synthetic_partial_sums(s);
      p.residual = s.h.data(), p.weight = weight.data();
      std::vector<T> h(count), out(count);
      fused::fused_reference<T>(contract, p, h.data(), out.data());
      s.h.swap(h);
      s.out.swap(out);
    };
    step(canonical, fused::Contract::kCanonical);
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
  const int pack = pack_elements(o.dtype);
  if (o.hidden <= 0 || o.hidden % pack != 0) {
    throw std::invalid_argument("--hidden " + std::to_string(o.hidden) + " is not a positive multiple of the " +
                                dtype_name(o.dtype) + " pack (" + std::to_string(pack) + " elements)");
  }
  if (!o.partial_sums.empty()) {
    const uint64_t one = static_cast<uint64_t>(o.ranks) * static_cast<uint64_t>(o.rows) *
                         static_cast<uint64_t>(o.hidden) * static_cast<uint64_t>(dtype_size(o.dtype));
    if (o.partial_sums.size() != one && o.partial_sums.size() != one * static_cast<uint64_t>(o.layers)) {
      throw std::invalid_argument("the partial sums hold " + std::to_string(o.partial_sums.size()) +
                                  " bytes; [layers, ranks, rows, H] needs " + std::to_string(one * o.layers) +
                                  " and [ranks, rows, H] " + std::to_string(one));
    }
  }
  return with_storage_type(o.dtype, [&](auto t) { return simulate<decltype(t)>(o); });
}

std::vector<uint8_t> start_residual(const LayersOptions& o) {
  return with_storage_type(o.dtype, [&](auto t) { return bytes_of(start_stream<decltype(t)>(o)); });
}

std::vector<uint8_t> layer_weight(const LayersOptions& o, int layer) {
  return with_storage_type(o.dtype, [&](auto t) {
    std::vector<decltype(t)> w;
    fill_weight(o, layer, &w);
    return bytes_of(w);
  });
}

}  // namespace exactcoll::layers
