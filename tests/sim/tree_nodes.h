// The tree contract's internal nodes for one element, recomputed from the definition
// (docs/numerics.md section 10: the largest power of two below n on the left, every node
// round(float(left) + float(right))), by recursion rather than with core/contract.h's loops: the
// expected values of element traces, whose tree_node events name each node by the first ranks of
// its two subtrees.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "core/storage.h"

namespace exactcoll::simtest {

// fp32 bits with every NaN made the canonical 0x7FFFFFFF. A leaf's NaN may reach a trace with its
// input payload (one node's tree reads the inputs) or rounded (a multi-node combine reads a node
// fold's tree_leaf): the same value of the tree.
inline uint32_t canonical_fp32_bits(uint32_t bits) { return float_to_bits(canonicalize_nan(bits_to_float(bits))); }

// One internal node as a trace shows it: both children widened to fp32 (NaNs canonical), the fp32
// sum and the stored node, as bits.
struct TreeNodeBits {
  uint32_t left = 0, right = 0, sum = 0, stored = 0;
  bool operator==(const TreeNodeBits&) const = default;
};

struct DefinitionTree {
  std::map<std::pair<int, int>, TreeNodeBits> nodes;  // keyed by (left subtree's first rank, right's)
  uint32_t root_sum = 0;                              // the root's fp32 sum (n = 1: the value widened)
  uint32_t root = 0;                                  // the stored result
};

namespace detail {

// The tree of v[lo..hi) and its fp32 sum in *sum (a single value: its rounding, tree(v) =
// round(float(v)), and *sum its widening).
template <class T>
T definition_subtree(const std::vector<T>& v, int lo, int hi, DefinitionTree* tree, float* sum) {
  if (hi - lo == 1) {
    *sum = to_float(v[static_cast<size_t>(lo)]);
    return round_to<T>(*sum);
  }
  int m = 1;
  while (2 * m < hi - lo) m *= 2;
  float unused = 0;
  const T left = definition_subtree(v, lo, lo + m, tree, &unused);
  const T right = definition_subtree(v, lo + m, hi, tree, &unused);
  *sum = canonicalize_nan(to_float(left) + to_float(right));
  const T node = round_to<T>(*sum);
  tree->nodes[{lo, lo + m}] = {canonical_fp32_bits(float_to_bits(to_float(left))),
                               canonical_fp32_bits(float_to_bits(to_float(right))), float_to_bits(*sum),
                               Storage<T>::bits(node)};
  return node;
}

}  // namespace detail

// Returns the tree over v[0..n) (rank r's value v[r]), n >= 1: its n - 1 internal nodes, the root's
// fp32 sum and the result.
// Example: bf16 {1, 2^-8, 2^-8, 2^-8}: nodes (0, 1), (2, 3) and (0, 2); root 0x3F81.
template <class T>
DefinitionTree definition_tree(const std::vector<T>& v) {
  DefinitionTree tree;
  float sum = 0;
  const T root = detail::definition_subtree(v, 0, static_cast<int>(v.size()), &tree, &sum);
  tree.root_sum = float_to_bits(sum);
  tree.root = Storage<T>::bits(root);
  return tree;
}

}  // namespace exactcoll::simtest
