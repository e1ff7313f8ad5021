// The layout of a multi-node job: M nodes of L local ranks each, ranks numbered node-major
// (rank = node * L + local). Host-only, plain C++.
//
// Why node-major numbering is required, not a convention: the contract's all-reduce is a left fold
// in global rank order (docs/numerics.md section 4). With node-major ranks, the fold of ranks
// 0..n-1 is the fold of node 0's ranks, continued by node 1's ranks, and so on, so an unrounded
// fp32 accumulator carried from node to node keeps the bits (core/multinode.h). A job whose ranks
// interleave nodes would need the accumulator to cross the network once per rank.
#pragma once

#include <string>
#include <vector>

namespace exactcoll::multinode {

struct NodeLayout {
  int nodes = 1;        // M >= 1
  int local_ranks = 1;  // L >= 1: ranks per node, equal on every node

  int world_size() const { return nodes * local_ranks; }
  int node_of(int rank) const { return rank / local_ranks; }
  int local_of(int rank) const { return rank % local_ranks; }
  int rank_of(int node, int local) const { return node * local_ranks + local; }
};

// Where one rank says it runs: its node and its index and count on that node (what a launcher or
// torchrun tells a worker: GROUP_RANK or the node rank, LOCAL_RANK, LOCAL_WORLD_SIZE).
struct RankPlace {
  int node = 0;
  int local_rank = 0;
  int local_world_size = 1;
};

// Returns "" and fills *layout when `ranks` ranks split into `nodes` nodes of equal size; else what
// is wrong (ranks or nodes < 1, ranks not a multiple of nodes).
// Example: layout_from_counts(8, 2, &l) gives l = {2 nodes, 4 local ranks}; (6, 4) is an error.
std::string layout_from_counts(int ranks, int nodes, NodeLayout* layout);

// Returns "" and fills *layout when every rank's place (index = global rank) forms a node-major
// layout of equal nodes; else every problem found, one per line, each naming the ranks: a node
// whose ranks' LOCAL_WORLD_SIZE disagree, nodes of different sizes, a rank whose number is not
// node * L + local (not node-major), two ranks claiming the same place, node numbers that are not
// 0..M-1.
std::string layout_from_places(const std::vector<RankPlace>& places, NodeLayout* layout);

// "2 nodes x 4 local ranks".
std::string layout_text(const NodeLayout& layout);

// "rank 5 (node 1, local rank 1)": how every message of the multi-node code names a rank.
std::string rank_text(const NodeLayout& layout, int rank);

}  // namespace exactcoll::multinode
