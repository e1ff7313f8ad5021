#include "core/multinode_layout.h"

#include <map>
#include <set>

namespace exactcoll::multinode {

std::string layout_from_counts(int ranks, int nodes, NodeLayout* layout) {
  if (ranks < 1) return "the job needs at least 1 rank, not " + std::to_string(ranks);
  if (nodes < 1) return "the job needs at least 1 node, not " + std::to_string(nodes);
  if (ranks % nodes != 0) {
    return std::to_string(ranks) + " ranks do not split into " + std::to_string(nodes) +
           " nodes of equal size (every node must have the same number of ranks)";
  }
  layout->nodes = nodes;
  layout->local_ranks = ranks / nodes;
  return "";
}

std::string layout_from_places(const std::vector<RankPlace>& places, NodeLayout* layout) {
  const int n = static_cast<int>(places.size());
  if (n == 0) return "no ranks";
  std::string problems;
  auto add = [&](const std::string& line) { problems += (problems.empty() ? "" : "\n") + line; };
  // 1. Per node: its ranks and the sizes they report.
  std::map<int, std::vector<int>> ranks_of_node;
  for (int r = 0; r < n; ++r) {
    const RankPlace& p = places[static_cast<size_t>(r)];
    if (p.node < 0) add("rank " + std::to_string(r) + " reports node " + std::to_string(p.node));
    if (p.local_world_size < 1 || p.local_rank < 0 || p.local_rank >= p.local_world_size) {
      add("rank " + std::to_string(r) + " reports local rank " + std::to_string(p.local_rank) + " of " +
          std::to_string(p.local_world_size));
    }
    ranks_of_node[p.node].push_back(r);
  }
  if (!problems.empty()) return problems;
  const int nodes = static_cast<int>(ranks_of_node.size());
  if (ranks_of_node.begin()->first != 0 || ranks_of_node.rbegin()->first != nodes - 1) {
    add("node numbers must be 0.." + std::to_string(nodes - 1) + " (" + std::to_string(nodes) + " nodes), found " +
        std::to_string(ranks_of_node.begin()->first) + ".." + std::to_string(ranks_of_node.rbegin()->first));
  }
  // 2. Equal sizes, agreed within each node and across nodes.
  const int local = static_cast<int>(ranks_of_node.begin()->second.size());
  for (const auto& [node, ranks] : ranks_of_node) {
    for (int r : ranks) {
      const int reported = places[static_cast<size_t>(r)].local_world_size;
      if (reported != static_cast<int>(ranks.size())) {
        add("rank " + std::to_string(r) + " says node " + std::to_string(node) + " has " + std::to_string(reported) +
            " ranks (LOCAL_WORLD_SIZE) but " + std::to_string(ranks.size()) + " ranks report node " +
            std::to_string(node));
        break;
      }
    }
    if (static_cast<int>(ranks.size()) != local) {
      add("mismatched node sizes: node " + std::to_string(ranks_of_node.begin()->first) + " has " +
          std::to_string(local) + " ranks, node " + std::to_string(node) + " has " + std::to_string(ranks.size()) +
          " (every node must have the same number of ranks)");
    }
  }
  // 3. Node-major numbering: rank = node * L + local, each place taken once.
  std::set<std::pair<int, int>> taken;
  for (int r = 0; r < n && problems.empty(); ++r) {
    const RankPlace& p = places[static_cast<size_t>(r)];
    if (!taken.insert({p.node, p.local_rank}).second) {
      add("two ranks claim node " + std::to_string(p.node) + " local rank " + std::to_string(p.local_rank) + " (rank " +
          std::to_string(r) + " is the second)");
    } else if (r != p.node * local + p.local_rank) {
      add("rank " + std::to_string(r) + " is node " + std::to_string(p.node) + " local rank " +
          std::to_string(p.local_rank) + ": ranks must be numbered node-major (rank = node * " + std::to_string(local) +
          " + local rank = " + std::to_string(p.node * local + p.local_rank) +
          "), as torchrun and exactcoll launch number them");
    }
  }
  if (!problems.empty()) return problems;
  layout->nodes = nodes;
  layout->local_ranks = local;
  return "";
}

std::string layout_text(const NodeLayout& layout) {
  return std::to_string(layout.nodes) + (layout.nodes == 1 ? " node x " : " nodes x ") +
         std::to_string(layout.local_ranks) + (layout.local_ranks == 1 ? " local rank" : " local ranks");
}

std::string rank_text(const NodeLayout& layout, int rank) {
  return "rank " + std::to_string(rank) + " (node " + std::to_string(layout.node_of(rank)) + ", local rank " +
         std::to_string(layout.local_of(rank)) + ")";
}

}  // namespace exactcoll::multinode
