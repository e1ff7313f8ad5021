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

// ---- the canonical contract's all-reduce fold ------------------------------------------------------
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

// ---- the tree contract's fold ------------------------------------------------------------------
// tree(v_0 .. v_{n-1}), docs/numerics.md "The tree contract":
//   n = 1: round(float(v_0));
//   n > 1: round(float(tree(v_0 .. v_{m-1})) + float(tree(v_m .. v_{n-1}))), m the largest power
//          of two below n (so a power-of-two n gives the balanced binary tree).
// Every internal node rounds to storage. A power-of-two n of equal power-of-two groups is the tree
// over the groups' own trees: tree(v_0..v_7) = tree(tree(v_0..v_3), tree(v_4..v_7)); that is what
// makes the bits independent of the TP size (a rank's partial is the tree over its leaves).

// One internal node: round(float(left) + float(right)).
// (tree_sum is the fp32 add before that rounding, which element traces report.)
template <class T>
EXC_HD EXC_INLINE float tree_sum(T left, T right) {
  return add(to_float(left), to_float(right));
}
template <class T>
EXC_HD EXC_INLINE T tree_node(T left, T right) {
  return round_to<T>(tree_sum(left, right));
}

// A one-value tree: round(float(v)) (the value itself, a NaN made canonical).
template <class T>
EXC_HD EXC_INLINE T tree_leaf(T v) {
  return round_to<T>(to_float(v));
}

// In place over values[0..kN-1] (kN >= 1, compile time): after it, values[0] holds tree(values).
// Level by level: at stride s = 1, 2, 4, ..., values[i] = tree_node(values[i], values[i + s]) for
// i a multiple of 2s with i + s < kN. The same tree as the definition above: the left subtree of
// every node covers a power of two of values.
// The same over values[0..n-1] (n >= 1) with every internal node reported, in that order:
// on_node(left, right, left_value, right_value, sum, node), left and right being the indices of the
// first value of each subtree, sum the fp32 add before its rounding (element traces).
template <class T, class OnNode>
EXC_HD EXC_INLINE void tree_in_place_reporting(T* values, int n, OnNode on_node) {
  if (n == 1) {
    values[0] = tree_leaf(values[0]);
    return;
  }
  for (int s = 1; s < n; s *= 2) {
    for (int i = 0; i + s < n; i += 2 * s) {
      const float sum = tree_sum(values[i], values[i + s]);
      const T node = round_to<T>(sum);  // tree_node
      on_node(i, i + s, values[i], values[i + s], sum, node);
      values[i] = node;
    }
  }
}

template <class T, int kN>
EXC_HD EXC_INLINE void tree_in_place(T (&values)[kN]) {
  static_assert(kN >= 1);
  tree_in_place_reporting(values, kN, [](int, int, T, T, float, T) {});
}

// The tree of values pushed one at a time in index order, for a count known only at run time.
// Keeps at most one pending subtree per power of two (a binary counter): push(v) merges equal-size
// subtrees as soon as both exist, result() merges what is left from the right. Bounded: 32 levels
// cover every int count.
template <class T>
class TreeFold {
 public:
  EXC_HD void push(T v) {
    T node = v;
    int size_log2 = 0;
    while (depth_ > 0 && size_log2_[depth_ - 1] == size_log2) {
      node = tree_node(value_[depth_ - 1], node);
      --depth_;
      ++size_log2;
    }
    value_[depth_] = node;
    size_log2_[depth_] = size_log2;
    ++depth_;
    ++count_;
  }
  // Returns the tree of every value pushed. Preconditions: at least one push.
  EXC_HD T result() const {
    if (count_ == 1) return tree_leaf(value_[0]);
    T node = value_[depth_ - 1];
    for (int d = depth_ - 2; d >= 0; --d) node = tree_node(value_[d], node);
    return node;
  }

 private:
  static constexpr int kMaxDepth = 33;
  T value_[kMaxDepth] = {};
  int size_log2_[kMaxDepth] = {};
  int depth_ = 0;
  int count_ = 0;
};

// Returns the tree contract's all-reduce of values(0..n-1).
// Preconditions: n >= 1; values(r) returns rank r's element.
// Example: tree_fold<bf16>(4, [&](int r) { return x[r]; }) == tree_node(tree_node(x[0], x[1]),
//          tree_node(x[2], x[3]))
template <class T, class Values>
EXC_HD T tree_fold(int n, Values values) {
  TreeFold<T> tree;
  for (int r = 0; r < n; ++r) tree.push(values(r));
  return tree.result();
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
