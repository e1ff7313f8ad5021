// The rounding contract as named functions. Every backend (simulator, CUDA kernels, references)
// calls these; docs/numerics.md states the same rules in words. No FMA anywhere: device code uses
// __fadd_rn / __fmul_rn (never contracted), host code is built with -ffp-contract=off.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/platform.h"
#include "core/storage.h"

namespace exactcoll::contract {

// ---- fp32 arithmetic: one IEEE operation each, NaN results canonical (0x7FFFFFFF) ----------------

EXC_HD EXC_INLINE float add(float a, float b) {
#if EXC_DEVICE_PASS
  return __fadd_rn(a, b);
#else
  return canonicalize_nan(a + b);
#endif
}

EXC_HD EXC_INLINE float mul(float a, float b) {
#if EXC_DEVICE_PASS
  return __fmul_rn(a, b);
#else
  return canonicalize_nan(a * b);
#endif
}

EXC_HD EXC_INLINE float div(float a, float b) {
#if EXC_DEVICE_PASS
  return __fdiv_rn(a, b);
#else
  return canonicalize_nan(a / b);
#endif
}

// IEEE square root (correctly rounded). Never rsqrtf: it differs from 1/sqrt in a third of inputs.
EXC_HD EXC_INLINE float sqrt(float a) {
#if EXC_DEVICE_PASS
  return __fsqrt_rn(a);
#else
  return canonicalize_nan(std::sqrt(a));
#endif
}

// ---- all-reduce fold ---------------------------------------------------------------------------
// acc = float(x_0); acc = acc + float(x_r) for r = 1..n-1 in rank order; one rounding to storage.
// The same for every algorithm, size, block count and world size.

template <class T>
EXC_HD EXC_INLINE float fold_begin(T x0) {
  return to_float(x0);
}

template <class T>
EXC_HD EXC_INLINE float fold_step(float acc, T xr) {
  return add(acc, to_float(xr));
}

template <class T>
EXC_HD EXC_INLINE T fold_end(float acc) {
  return round_to<T>(acc);
}

// Returns the contract's all-reduce of values(0..n-1).
// Preconditions: n >= 1; values(r) returns rank r's element.
// Example: fold<bf16>(3, [&](int r) { return x[r]; })
template <class T, class Values>
EXC_HD T fold(int n, Values values) {
  float acc = fold_begin<T>(values(0));
  for (int r = 1; r < n; ++r) acc = fold_step<T>(acc, values(r));
  return fold_end<T>(acc);
}

// ---- residual add --------------------------------------------------------------------------------
// residual_out = round(float(s) + float(residual)), s being the rounded all-reduce.
template <class T>
EXC_HD EXC_INLINE T residual_add(T s, T residual) {
  return round_to<T>(add(to_float(s), to_float(residual)));
}

// ---- canonical RMSNorm -----------------------------------------------------------------------------
// The sum-of-squares tree depends only on the hidden size and the storage type:
//   pack P = 16 / sizeof(T); np = H / P; lanes L = 32 * ceil(min(np, 1024) / 32);
//   lane l sums (v*v) over packs l, l+L, ... (elements of a pack in order), starting from 0.0f;
//   a 32-lane xor butterfly (off 16, 8, 4, 2, 1) within each group of 32 lanes; the group values,
//   padded with 0.0f to 32, get the same butterfly; ss = lane 0's result.
//   inv = 1 / sqrt(ss / H + eps); y_j = round((v_j * inv) * w_j).

inline constexpr int kWarp = 32;
inline constexpr int kMaxLanes = 1024;

struct RmsNormTree {
  int hidden = 0;     // H
  int pack = 0;       // P: elements per 16-byte pack
  int num_packs = 0;  // np = H / P
  int lanes = 0;      // L
  int groups = 0;     // L / 32
};

// Returns true and fills *tree when H is a positive multiple of the pack; false otherwise.
template <class T>
EXC_HD inline bool make_rmsnorm_tree(int hidden, RmsNormTree* tree) {
  const int pack = Storage<T>::kPack;
  if (hidden <= 0 || hidden % pack != 0) return false;
  tree->hidden = hidden;
  tree->pack = pack;
  tree->num_packs = hidden / pack;
  const int active = tree->num_packs < kMaxLanes ? tree->num_packs : kMaxLanes;
  tree->lanes = kWarp * ((active + kWarp - 1) / kWarp);
  tree->groups = tree->lanes / kWarp;
  return true;
}

// One lane's partial sum of squares. row(j) returns float(v_j) (of storage-rounded values).
template <class Row>
EXC_HD inline float lane_sum_squares(const RmsNormTree& tree, int lane, Row row) {
  float acc = 0.0f;
  for (int p = lane; p < tree.num_packs; p += tree.lanes) {
    for (int e = 0; e < tree.pack; ++e) {
      const float v = row(p * tree.pack + e);
      acc = add(acc, mul(v, v));
    }
  }
  return acc;
}

// In place: after it, a[0] holds the group's value (a[l] = a[l] + a[l ^ off] for off 16..1).
EXC_HD inline void butterfly32(float a[kWarp]) {
  for (int off = kWarp / 2; off >= 1; off /= 2) {
    float next[kWarp];
    for (int l = 0; l < kWarp; ++l) next[l] = add(a[l], a[l ^ off]);
    for (int l = 0; l < kWarp; ++l) a[l] = next[l];
  }
}

// Returns ss from the lanes' partials, lane(l) returning lane l's (lane_sum_squares) for
// l < tree.lanes: the butterfly within each group of 32 lanes, then over the group values padded
// with 0.0f. For contexts that compute the partials themselves (the simulator's blocks of several
// threads keep them in an array, as a GPU block in shared memory).
template <class Lane>
EXC_HD inline float combine_lane_partials(const RmsNormTree& tree, Lane lane) {
  float group_values[kWarp];
  for (int g = 0; g < kWarp; ++g) group_values[g] = 0.0f;
  for (int g = 0; g < tree.groups; ++g) {
    float lanes[kWarp];
    for (int l = 0; l < kWarp; ++l) lanes[l] = lane(g * kWarp + l);
    butterfly32(lanes);
    group_values[g] = lanes[0];
  }
  butterfly32(group_values);
  return group_values[0];
}

// Returns ss for one row, computing every lane in turn (the host form of the tree; a GPU block
// computes the same lanes in parallel and the same butterflies with warp shuffles).
template <class Row>
EXC_HD inline float sum_squares(const RmsNormTree& tree, Row row) {
  return combine_lane_partials(tree, [&](int l) { return lane_sum_squares(tree, l, row); });
}

// inv = 1 / sqrt(ss / H + eps): IEEE division and square root.
EXC_HD EXC_INLINE float rmsnorm_inverse(float ss, int hidden, float eps) {
  const float mean = div(ss, static_cast<float>(hidden));
  return div(1.0f, sqrt(add(mean, eps)));
}

// y = round((v * inv) * w).
template <class T>
EXC_HD EXC_INLINE T rmsnorm_scale(float v, float inv, T w) {
  return round_to<T>(mul(mul(v, inv), to_float(w)));
}

// The whole canonical RMSNorm of one row of storage values: out[j] for j < H.
// Preconditions: tree made by make_rmsnorm_tree<T>(H).
template <class T>
EXC_HD inline void rmsnorm_row(const RmsNormTree& tree, const T* v, const T* weight, float eps, T* out) {
  const float ss = sum_squares(tree, [&](int j) { return to_float(v[j]); });
  const float inv = rmsnorm_inverse(ss, tree.hidden, eps);
  for (int j = 0; j < tree.hidden; ++j) out[j] = rmsnorm_scale<T>(to_float(v[j]), inv, weight[j]);
}

}  // namespace exactcoll::contract
