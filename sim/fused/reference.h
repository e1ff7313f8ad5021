// A plain scalar reference of the fused all-reduce + residual add + RMSNorm, under the canonical
// contract and under the alternative contracts that reproduce what other systems do (simulator
// only; never a default). Written straight from the issue and docs/numerics.md, without the core
// templates, so that tests can hold the templates against it; the sum-of-squares tree is spelled
// out here again rather than taken from contract::sum_squares.
//
// The contracts, for element i of a row, x_r = rank r's partial sum, res = the residual:
//   canonical        s = round(fold_{r=0..n-1} x_r); ro = round(float(s) + float(res));
//                    out = RMSNorm(ro) with the canonical tree.
//   f32_residual     t = fold_{r=0..n-1} x_r in fp32, NOT rounded; rf = t + float(res);
//                    ro = round(rf); out = RMSNorm computed from the unrounded rf values (the
//                    1-stage bug class that AITER PR 2586 fixed).
//   bf16_accumulate  acc = float(x_0); acc = float(round(acc + float(x_r))) for r = 1..n-1 (the
//                    running sum is rounded to storage after every peer's add), then as canonical.
//                    For fp32 storage it equals canonical.
//   rotated_two_shot the owner p of element i's two-shot slice (two_shot_slice over the flat
//                    [rows*H] buffer) folds in order p, p+1, ..., p-1; then as canonical. The
//                    result depends on rows*H through the slice boundaries (vLLM's 2-stage kernel).
// Every rank gets the same bits under each contract, so the outputs are one [rows, H] each.
#pragma once

#include <string>
#include <vector>

#include "core/storage.h"

namespace exactcoll::fused {

enum class FusedContract { kCanonical, kF32Residual, kBf16Accumulate, kRotatedTwoShot };

inline constexpr FusedContract kAllContracts[] = {FusedContract::kCanonical, FusedContract::kF32Residual,
                                                  FusedContract::kBf16Accumulate, FusedContract::kRotatedTwoShot};

// "canonical", "f32_residual", "bf16_accumulate", "rotated_two_shot".
const char* contract_name(FusedContract c);
// Returns false when name is none of the above.
bool parse_contract(const std::string& name, FusedContract* c);
// The names, for flag help and --contract choices.
std::vector<std::string> contract_names();

// Returns "" when eps is a usable RMSNorm epsilon — a finite number >= 0 that stays finite as a
// float — else what is wrong, naming the --eps flag. NaN, a negative or an infinite eps would make
// outputs NaN (or undefined) while the run reports success.
// Example: check_eps(1e-6) == ""; check_eps(NAN) == "--eps must be a finite number >= 0 (...), got nan".
std::string check_eps(double eps);

// One problem: n ranks' partial sums x [n, rows, H], the residual [rows, H], weight [H], eps.
template <class T>
struct FusedProblem {
  int ranks = 0;
  int rows = 0;
  int hidden = 0;
  float eps = 0.0f;
  const T* x = nullptr;
  const T* residual = nullptr;
  const T* weight = nullptr;
};

// Computes residual_out [rows, H] and out [rows, H] under contract c.
// Throws std::invalid_argument when ranks < 1, rows < 0 or H is not a positive multiple of the
// pack (Storage<T>::kPack).
// Example: fused_reference<bf16>(FusedContract::kCanonical, problem, ro.data(), out.data());
template <class T>
void fused_reference(FusedContract c, const FusedProblem<T>& problem, T* residual_out, T* out);

// The canonical RMSNorm's sum of squares of one row of floats v[0..H), spelled out from the
// contract text (lanes, per-lane sums, two 32-lane xor butterflies). pack = elements per 16 bytes.
float reference_sum_squares(const float* v, int hidden, int pack);

}  // namespace exactcoll::fused
