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

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/registry.h"
#include "core/storage.h"

namespace exactcoll::fused {

// The contracts (core/registry.h: Contract, kContracts, contract_name and their properties).
using exactcoll::Contract;
using exactcoll::contract_name;
using exactcoll::kContracts;

// Returns false when name is none of the registry's contracts.
bool parse_contract(const std::string& name, Contract* c);

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

// ---- Element traces -------------------------------------------------------------------------------
// Every step of one element's computation, recorded by fused_reference itself while it computes the
// outputs (the recording only reads the values the computation uses; untraced elements cost one
// test). The steps, in order, for element i = row * H + col (pack p = col / P, lane l = p mod L,
// group g = l / 32; docs/numerics.md sections 4-6):
//   fold             once per rank in the contract's order: input_rank; acc_before (not on the first),
//                    x, acc_after (bf16_accumulate: sum = acc_before + x in fp32, acc_after its
//                    rounding to storage, widened)
//   tree_node        under tree instead of fold, once per internal node of the ranks' tree in
//                    contract::tree_in_place_reporting's order: left_rank, right_rank (the first
//                    rank of each subtree); left, right (storage), sum (fp32), stored (the node)
//   round            the all-reduce's rounding: acc, stored (f32_residual: not rounded, stored is acc;
//                    tree: acc is the root's fp32 sum, or the one rank's value)
//   residual_add     s, residual, sum (fp32), stored (residual_out)
//   square           the element's square in its lane: lane, pack; v (the value the norm reads),
//                    square = v * v, lane_before, lane_after
//   lane_sum         lane: the lane's total over all its packs
//   group_butterfly  5 levels (off 16, 8, 4, 2, 1) of the lane's group: lane (in the group),
//                    partner = lane xor off; a, b (the partner's), sum = a + b (the lane's new value)
//   final_butterfly  5 levels over the group values: group, partner; a, b, sum
//   ss               the row's sum of squares (lane 0's value after the final butterfly)
//   inv              ss, mean = ss / H, mean_eps = mean + eps, root = sqrt(mean_eps), inv = 1 / root
//   scale            v, inv, v_inv = v * inv, weight, product = v_inv * weight, stored (out)
// Every step's last value is its result; two contracts' traces of an element have the same steps
// in the same order, so results compare step by step (compare_with_canonical).
// Every lane of a butterfly group ends with the same bits (IEEE addition commutes), so the lane
// path shown ends at the value lane 0 holds.

// One value of a step: an fp32 value (bytes 4) or a storage pattern (bytes = sizeof(T); value is
// the pattern widened to float). fp32 NaNs are shown canonical (0x7FFFFFFF), as the GPU makes them.
struct StepValue {
  const char* name = "";
  uint32_t bits = 0;
  int bytes = 4;
  float value = 0;
};

struct ElementStep {
  const char* step = "";                            // fold, round, residual_add, ... (above)
  std::vector<std::pair<const char*, int>> labels;  // input_rank, lane, off, ...
  std::vector<StepValue> values;                    // the last is the step's result
  const char* note = nullptr;                       // what the contract does differently here, if anything
  // Set by compare_with_canonical on an alternative contract's steps: whether this step's result
  // has canonical's bits (kDeparts: the first step that does not).
  enum class VsCanonical : uint8_t { kNotCompared, kSame, kDiffers, kDeparts };
  VsCanonical vs_canonical = VsCanonical::kNotCompared;
};

struct ElementTrace {
  Contract contract = Contract::kCanonical;
  uint64_t index = 0;  // row * H + col
  int row = 0, col = 0;
  std::vector<ElementStep> steps;
};

// Computes residual_out [rows, H] and out [rows, H] under contract c; with `traced` element
// indices (into [rows, H], row-major; indices past rows * H are ignored) it also appends one
// ElementTrace per traced element (in rising index order) to *traces.
// Throws std::invalid_argument when ranks < 1, rows < 0 or H is not a positive multiple of the
// pack (Storage<T>::kPack).
// Example: fused_reference<bf16>(Contract::kCanonical, problem, ro.data(), out.data());
template <class T>
void fused_reference(Contract c, const FusedProblem<T>& problem, T* residual_out, T* out,
                     const std::vector<uint64_t>& traced, std::vector<ElementTrace>* traces);

template <class T>
void fused_reference(Contract c, const FusedProblem<T>& problem, T* residual_out, T* out) {
  fused_reference<T>(c, problem, residual_out, out, {}, nullptr);
}

// Marks every step of `alternative` (vs_canonical) by whether its result has the bits of the same
// step of `canonical` (the traces of the same element under the canonical contract); the first
// differing step is kDeparts. Returns the seq of that step, or -1 when every step has canonical's
// bits (or the traces are not of the same element and steps).
int compare_with_canonical(ElementTrace* alternative, const ElementTrace& canonical);

// The JSON lines of traces: one line per step,
//   {"event":"element","contract":"canonical","index":3,"row":0,"col":3,"seq":0,"step":"fold",
//    "input_rank":0,"x":"0xbce4","x_value":"-0.027832031",...}
// labels as integers, each value as its hex bits and "<name>_value" (the shortest decimal that
// reads back to the same float), then "note" and "vs_canonical" ("same", "differs", "departs")
// where set.
std::string element_trace_json(const std::vector<ElementTrace>& traces);

// The canonical RMSNorm's sum of squares of one row of floats v[0..H), spelled out from the
// contract text (lanes, per-lane sums, two 32-lane xor butterflies). pack = elements per 16 bytes.
float reference_sum_squares(const float* v, int hidden, int pack);

}  // namespace exactcoll::fused
