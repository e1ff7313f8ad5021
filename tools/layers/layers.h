// A residual stream through L layers, run twice from the same start: once under the canonical
// contract and once under an alternative one (sim/fused/reference.h), to measure how far the
// alternative drifts. `exactcoll layers` prints and plots the result.
//
// The model (deterministic from the seed; the same numbers in both runs, except what the contract
// changes):
//   h_0 [rows, H] ~ N(0, 1) rounded to storage (the residual stream); y_0 = float(h_0).
//   Layer l = 1..L, in each run separately:
//     1. every rank r forms its partial sums from the run's previous normed output y = y_{l-1}:
//          x_r[i, j] = round(a_lr * y[i, j] + b_lr * y[i, (j + k_lr) mod H] + c * n_lr[i, j])
//        with a_lr, b_lr ~ N(0, 1/2) (so each rank's partial sums have about unit scale, like the
//        single-op AITER test's x ~ N(0, 1) per rank), k_lr uniform in [1, H), c = 0.1 and
//        n_lr[i, j] ~ N(0, 1) (a stand-in for the rest of the layer: a linear mix of the normed
//        activations plus an input-independent term), all drawn from (seed, l, r);
//     2. the fused op under the run's contract: h_l = residual_out, y_l = float(out), with weight
//        w_l[j] = round(1 + 0.1 * N(0, 1)) from (seed, l) and eps = 1e-6.
//   Row l of the result compares the two runs' h_l (and out) elementwise (tools/diff/compare.h).
//
// Captured partial sums (`layers --input`, LayersOptions::partial_sums) replace step 1: layer l's
// partial sums are the given ones, the same in both runs (captured activations cannot answer a
// run's own outputs, so the drift is the residual stream's and the norm's alone); h_0 and w_l
// still come from the seed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/storage.h"
#include "sim/fused/reference.h"

namespace exactcoll::layers {

struct LayersOptions {
  int layers = 60;
  int ranks = 4;
  int rows = 16;
  int hidden = 4096;
  DType dtype = DType::kBF16;
  fused::Contract contract = fused::Contract::kF32Residual;
  uint64_t seed = 1;
  float eps = 1e-6f;
  // Empty: the synthetic partial sums above. Else captured ones, elements of dtype (bf16 and fp16
  // as their bits) in C order: [layers, ranks, rows, hidden] (layer l's rank r at [l - 1, r]) or
  // [ranks, rows, hidden] (the same partial sums at every layer). Not owned; outlives the call.
  std::span<const uint8_t> partial_sums;
};

struct LayerRow {
  int layer = 0;
  double fraction_differing = 0;      // of residual elements, bitwise
  uint64_t max_ulp = 0;               // residual
  double within_4ulp = 0;             // of the differing residual elements, the fraction 1..4 ULP away
  double relative_l2 = 0;             // ||h_X - h_canonical|| / ||h_canonical||
  double out_fraction_differing = 0;  // of normed outputs
  uint64_t out_max_ulp = 0;
  size_t nan_mismatch = 0;  // residual elements NaN in one run only
};

// Runs both streams and returns one row per layer. Throws std::invalid_argument on bad options
// (layers, ranks, rows < 1; H not a positive multiple of the pack; partial_sums of neither size).
// Example: LayersOptions o; o.layers = 6; o.hidden = 512; simulate_layers(o)[5].relative_l2
std::vector<LayerRow> simulate_layers(const LayersOptions& options);

// The model's pieces that come from the seed whatever the partial sums, as elements of
// options.dtype (bits for bf16/fp16), for checks of simulate_layers by hand: the start of the
// residual stream h_0 [rows, hidden] and layer l's RMSNorm weight w_l [hidden] (l = 1..layers).
std::vector<uint8_t> start_residual(const LayersOptions& options);
std::vector<uint8_t> layer_weight(const LayersOptions& options, int layer);

}  // namespace exactcoll::layers
