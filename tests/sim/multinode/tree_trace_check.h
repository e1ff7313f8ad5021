// Checks the element traces of the tree contract across nodes (sim/multinode under --contract tree)
// against the element's tree recomputed from its inputs by the definition (tests/sim/tree_nodes.h):
// shared by the simulator's test (tests/sim/multinode) and the CLI's (tests/tools/multinode).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/multinode_layout.h"
#include "core/op.h"
#include "core/storage.h"
#include "tests/sim/tree_nodes.h"

namespace exactcoll::simtest {

// The tree of input element i over every rank (tests/sim/tree_nodes.h: from the definition).
inline DefinitionTree element_tree(DType dtype, const std::vector<std::vector<uint8_t>>& in, size_t i) {
  return with_storage_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> v(in.size());
    for (size_t r = 0; r < in.size(); ++r) {
      std::memcpy(static_cast<void*>(&v[r]), in[r].data() + i * sizeof(T), sizeof(T));
    }
    return definition_tree(v);
  });
}

// The value of "key":... in a JSON line (a number or a string's contents), or "" when absent.
inline std::string json_field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t at = line.find(k);
  if (at == std::string::npos) return "";
  size_t begin = at + k.size();
  if (line[begin] == '"') return line.substr(begin + 1, line.find('"', begin + 1) - begin - 1);
  const size_t end = line.find_first_of(",}", begin);
  return line.substr(begin, end - begin);
}

inline uint32_t json_bits(const std::string& line, const std::string& key) {
  return static_cast<uint32_t>(std::strtoul(json_field(line, key).c_str(), nullptr, 16));
}

// Returns "" when the trace's tree_node and round events of input element i are the element's
// tree (the trace's JSON lines, a run of op under tree on layout; want: i's output bits):
//   - a rank records events of i only on rail l (the local rank of i's slice, all-reduce; of its
//     owner, reduce-scatter), and every node's rank on that rail records them;
//   - rank (k, l)'s tree_node events are, in order: its node's subtree, level by level (strides 1,
//     2, ...), then at each exchange step s the node joining the aligned groups of 2^s nodes
//     below and above bit s of k, for as long as the rank combines element i (every step of the
//     all-reduce; the reduce-scatter's steps while k agrees with the owner's node on bits 0..s);
//     each with the ranks, values, sum and stored bits of that node of the tree;
//   - one round after them exactly where the root is computed (every recording rank of the
//     all-reduce, the owner of the reduce-scatter), with the root's fp32 sum and want's bits;
//   - together the ranks record every internal node of the tree.
inline std::string check_tree_events(const std::string& json_lines, Op op, const multinode::NodeLayout& layout,
                                     size_t i, const DefinitionTree& tree, uint32_t want, size_t per) {
  const int M = layout.nodes, L = layout.local_ranks;
  std::map<std::pair<int, int>, std::vector<std::string>> events;  // per (node, local rank), in order
  const std::string index = "\"index\":" + std::to_string(i) + ",";
  for (size_t begin = 0; begin < json_lines.size();) {
    size_t end = json_lines.find('\n', begin);
    if (end == std::string::npos) end = json_lines.size();
    const std::string line = json_lines.substr(begin, end - begin);
    begin = end + 1;
    if (line.find(index) == std::string::npos) continue;
    const std::string event = json_field(line, "event");
    if (event == "fold") return "a canonical fold event under tree: " + line;
    if (event != "tree_node" && event != "round") continue;
    events[{std::stoi(json_field(line, "node")), std::stoi(json_field(line, "local_rank"))}].push_back(line);
  }
  if (events.empty()) return "no event of element " + std::to_string(i);
  const int rail = events.begin()->first.second;
  const int owner_node = op == Op::kReduceScatter ? static_cast<int>(i / per) / L : -1;
  if (op == Op::kReduceScatter && rail != static_cast<int>(i / per) % L) {
    return "local rank " + std::to_string(rail) + " recorded element " + std::to_string(i) + ", not its owner's rail";
  }
  std::map<std::pair<int, int>, int> covered;  // the tree's nodes that some rank recorded
  for (int k = 0; k < M; ++k) {
    const std::string who = "node " + std::to_string(k) + " local rank " + std::to_string(rail);
    // The expected nodes, in order.
    std::vector<std::pair<int, int>> path;
    for (int stride = 1; stride < L; stride *= 2) {
      for (int q = 0; q + stride < L; q += 2 * stride) path.push_back({k * L + q, k * L + q + stride});
    }
    bool root = true;
    for (int s = 0; (1 << s) < M; ++s) {
      const int agree = (2 << s) - 1;  // bits 0..s
      if (owner_node >= 0 && ((k ^ owner_node) & agree) != 0) {
        root = false;
        break;
      }
      const int lower = k & ~agree;
      path.push_back({lower * L, (lower + (1 << s)) * L});
    }
    const auto it = events.find({k, rail});
    const std::vector<std::string> got = it == events.end() ? std::vector<std::string>{} : it->second;
    if (got.size() != path.size() + (root ? 1 : 0)) {
      return who + " recorded " + std::to_string(got.size()) + " events, want " + std::to_string(path.size()) +
             " tree nodes" + (root ? " and the round" : "");
    }
    for (size_t e = 0; e < path.size(); ++e) {
      const std::string& line = got[e];
      if (json_field(line, "event") != "tree_node") return who + " event " + std::to_string(e) + ": " + line;
      const std::pair<int, int> ranks = {std::stoi(json_field(line, "left_rank")),
                                         std::stoi(json_field(line, "right_rank"))};
      if (ranks != path[e]) {
        return who + " node " + std::to_string(e) + " joins ranks " + std::to_string(ranks.first) + ".. and " +
               std::to_string(ranks.second) + "..; the tree's is " + std::to_string(path[e].first) + ".. and " +
               std::to_string(path[e].second) + "..";
      }
      const auto node = tree.nodes.find(ranks);
      if (node == tree.nodes.end()) return who + ": no such node in the tree: " + line;
      const TreeNodeBits bits = {canonical_fp32_bits(json_bits(line, "left")),
                                 canonical_fp32_bits(json_bits(line, "right")), json_bits(line, "sum"),
                                 json_bits(line, "stored")};
      if (!(bits == node->second))
        return who + " node " + std::to_string(e) + " has other bits than the tree's: " + line;
      ++covered[ranks];
    }
    if (root) {
      const std::string& line = got.back();
      if (json_field(line, "event") != "round" || json_bits(line, "acc") != tree.root_sum ||
          json_bits(line, "stored") != want || want != tree.root) {
        return who + "'s last event is not the root's round: " + line;
      }
    }
  }
  for (const auto& [rank, other] : events) {
    if (rank.second != rail)
      return "local rank " + std::to_string(rank.second) + " recorded element " + std::to_string(i) + " too";
  }
  if (covered.size() != tree.nodes.size()) {
    return "the ranks recorded " + std::to_string(covered.size()) + " of the tree's " +
           std::to_string(tree.nodes.size()) + " nodes";
  }
  return "";
}

}  // namespace exactcoll::simtest
