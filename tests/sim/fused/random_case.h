// A seeded fused-op problem for the simulator's tests: every rank's x, the residual and the weight
// drawn from one SplitMix64 stream (normal values rounded to T; weights near 1), and its view as a
// FusedProblem. Shared by fused_sim_test and element_trace_test.
// Example: Case<bf16> c(4, 3, 64, /*seed=*/7); const FusedProblem<bf16> p = c.problem();
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/storage.h"
#include "sim/fused/random.h"
#include "sim/fused/reference.h"

namespace exactcoll::fused {

template <class T>
struct Case {
  int ranks, rows, hidden;
  std::vector<T> x, residual, weight;  // x: [ranks, rows, hidden], residual: [rows, hidden]
  Case(int ranks_, int rows_, int hidden_, uint64_t seed) : ranks(ranks_), rows(rows_), hidden(hidden_) {
    SplitMix64 rng(seed);
    x.resize(static_cast<size_t>(ranks) * rows * hidden);
    residual.resize(static_cast<size_t>(rows) * hidden);
    weight.resize(hidden);
    for (auto& v : x) v = round_to<T>(rng.normal());
    for (auto& v : residual) v = round_to<T>(rng.normal());
    for (auto& v : weight) v = round_to<T>(1.0f + 0.1f * rng.normal());
  }
  size_t count() const { return static_cast<size_t>(rows) * hidden; }
  // The problem over this case's arrays (eps 1e-6), valid while the case lives.
  FusedProblem<T> problem() const {
    FusedProblem<T> p;
    p.ranks = ranks, p.rows = rows, p.hidden = hidden, p.eps = 1e-6f;
    p.x = x.data(), p.residual = residual.data(), p.weight = weight.data();
    return p;
  }
};

// The DType of a storage type.
template <class T>
DType dtype_of() {
  return sizeof(T) == 4 ? DType::kFP32 : std::is_same_v<T, bf16> ? DType::kBF16 : DType::kFP16;
}

}  // namespace exactcoll::fused
