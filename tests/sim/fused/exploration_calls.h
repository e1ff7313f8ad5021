// One call's data for the fused seeded-exploration tests (push_exploration_test,
// lamport_fused_exploration_test): every rank's inputs and outputs, and the contract's outputs,
// for a fused call of `rows` rows of kHidden or an all-reduce of `count` elements. Written once
// here; each test fills x its own way (the Lamport test plants the sentinel's pattern and -0.0).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/contract.h"
#include "core/fused_rmsnorm.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"
#include "tests/core/thread_world.h"

namespace exactcoll::fused_exploration {

constexpr int kHidden = 16;  // bf16: 2 packs a row
constexpr float kEps = 1e-6f;

struct CallData {
  std::vector<bf16> x;  // [ranks, size]: rank r's x (or all-reduce input) at r * size
  std::vector<testing_world::AlignedBuffer<bf16>> residual, weight, residual_out, out;  // per rank (fused)
  std::vector<std::vector<bf16>> ar_out;                                                // per rank (all-reduce)
  std::vector<bf16> want_ro, want_out;                                                  // [size]
  std::vector<FusedRmsNormArgs<bf16>> args;                                             // per rank (fused)
};

// Given d->x ([ranks, count], filled by the caller), makes the outputs and the contract's results:
// an all-reduce's fold when !fused, else random residual and weight (from rng), every rank's
// FusedRmsNormArgs over `count / kHidden` rows and the canonical fused reference.
inline void complete_call(bool fused, int ranks, size_t count, fused::SplitMix64& rng, CallData* out) {
  CallData& d = *out;
  if (!fused) {
    d.ar_out.assign(ranks, std::vector<bf16>(count));
    d.want_out.resize(count);
    for (size_t i = 0; i < count; ++i)
      d.want_out[i] = contract::fold<bf16>(ranks, [&](int r) { return d.x[r * count + i]; });
    return;
  }
  std::vector<bf16> residual(count), weight(kHidden);
  for (auto& v : residual) v = round_to<bf16>(rng.normal());
  for (auto& v : weight) v = round_to<bf16>(1.0f + 0.1f * rng.normal());
  for (int r = 0; r < ranks; ++r) {
    d.residual.emplace_back(count);
    d.weight.emplace_back(kHidden);
    d.residual_out.emplace_back(count);
    d.out.emplace_back(count);
    std::memcpy(d.residual[r].data(), residual.data(), count * sizeof(bf16));
    std::memcpy(d.weight[r].data(), weight.data(), kHidden * sizeof(bf16));
  }
  for (int r = 0; r < ranks; ++r) {
    FusedRmsNormArgs<bf16> a;
    a.residual = d.residual[r].data();
    a.weight = d.weight[r].data();
    a.residual_out = d.residual_out[r].data();
    a.out = d.out[r].data();
    a.rows = static_cast<int>(count / kHidden);
    a.hidden = kHidden;
    a.eps = kEps;
    d.args.push_back(a);
  }
  fused::FusedProblem<bf16> p;
  p.ranks = ranks, p.rows = static_cast<int>(count / kHidden), p.hidden = kHidden, p.eps = kEps;
  p.x = d.x.data(), p.residual = residual.data(), p.weight = weight.data();
  d.want_ro.resize(count);
  d.want_out.resize(count);
  fused::fused_reference<bf16>(fused::Contract::kCanonical, p, d.want_ro.data(), d.want_out.data());
}

// Returns "" when got equals want bit for bit, else where it first differs; with hidden > 0 also
// its row, and "(never written)" where got holds the `unwritten` pattern a test pre-filled.
inline std::string first_difference(const bf16* got, const std::vector<bf16>& want, int hidden = 0,
                                    int unwritten = -1) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i].bits != want[i].bits) {
      char row[48] = "";
      if (hidden > 0) std::snprintf(row, sizeof row, " (row %zu)", i / static_cast<size_t>(hidden));
      char b[160];
      std::snprintf(b, sizeof b, "element %zu%s: got 0x%04x, want 0x%04x%s", i, row, got[i].bits, want[i].bits,
                    static_cast<int>(got[i].bits) == unwritten ? " (never written)" : "");
      return b;
    }
  }
  return "";
}

}  // namespace exactcoll::fused_exploration
