#include "cuda_backend/multinode/node_env.h"

#include <charconv>
#include <optional>
#include <string>

namespace exactcoll::cuda {
namespace {

// The variable's value as a whole number >= 0; nullopt when unset; adds to *problems when malformed.
std::optional<int> read_count(const EnvLookup& lookup, const std::string& name, std::string* problems) {
  const std::optional<std::string> text = lookup(name);
  if (!text) return std::nullopt;
  int value = 0;
  const char* end = text->data() + text->size();
  const auto [stop, ec] = std::from_chars(text->data(), end, value);
  if (text->empty() || ec != std::errc() || stop != end || value < 0) {
    *problems += "\n  " + name + "='" + *text + "' is not a whole number >= 0";
    return std::nullopt;
  }
  return value;
}

// The node from the first of the launchers' node variables that is set; nullopt when none is.
std::optional<int> node_from_env(const EnvLookup& lookup, std::string* problems) {
  for (const char* name : {"GROUP_RANK", "EXACTCOLL_NODE_RANK", "NODE_RANK"}) {
    if (lookup(name)) return read_count(lookup, name, problems);
  }
  return std::nullopt;
}

bool node_given_in_env(const EnvLookup& lookup) {
  return lookup("GROUP_RANK") || lookup("EXACTCOLL_NODE_RANK") || lookup("NODE_RANK");
}

}  // namespace

multinode::RankPlace node_place(const EnvLookup& lookup, int rank, int world_size, int node, int local_world_size) {
  std::string problems;
  multinode::RankPlace place;
  const std::optional<int> env_node = node >= 0 ? std::optional<int>(node) : node_from_env(lookup, &problems);
  const std::optional<int> env_local_world =
      local_world_size > 0 ? std::optional<int>(local_world_size) : read_count(lookup, "LOCAL_WORLD_SIZE", &problems);
  place.node = env_node.value_or(0);
  place.local_world_size = env_local_world.value_or(world_size);
  if (node < 0 && node_given_in_env(lookup) && !env_local_world) {
    problems +=
        "\n  a node rank is set but LOCAL_WORLD_SIZE is not (ranks per node; torchrun and exactcoll launch set it)";
  }
  if (problems.empty() && place.local_world_size < 1) problems += "\n  a node has at least 1 rank, not 0";
  if (problems.empty() && world_size % place.local_world_size != 0) {
    problems += "\n  world_size " + std::to_string(world_size) + " is not a multiple of " +
                std::to_string(place.local_world_size) + " ranks per node (every node must have as many)";
  }
  if (problems.empty()) {
    place.local_rank = rank - place.node * place.local_world_size;
    if (place.local_rank < 0 || place.local_rank >= place.local_world_size) {
      problems += "\n  rank " + std::to_string(rank) + " is not on node " + std::to_string(place.node) + " of " +
                  std::to_string(place.local_world_size) + " ranks (ranks are numbered node-major: node k holds " +
                  "ranks k * " + std::to_string(place.local_world_size) + " and up)";
    }
  }
  if (!problems.empty()) throw BootstrapError("node layout:" + problems);
  return place;
}

multinode::RankPlace node_place_from_env(const EnvLookup& lookup, const WorkerEnv& env) {
  std::string problems;
  const std::optional<int> node = node_from_env(lookup, &problems);
  const bool node_given = node_given_in_env(lookup);
  const std::optional<int> local_world = read_count(lookup, "LOCAL_WORLD_SIZE", &problems);
  multinode::RankPlace place;
  place.node = node.value_or(0);
  place.local_rank = env.local_rank;
  place.local_world_size = local_world.value_or(env.world_size);
  if (node_given && !lookup("LOCAL_WORLD_SIZE")) {
    problems +=
        "\n  a node rank is set but LOCAL_WORLD_SIZE is not (ranks per node; torchrun and exactcoll launch set it)";
  }
  if (local_world && *local_world < 1) problems += "\n  LOCAL_WORLD_SIZE=0: a node has at least 1 rank";
  if (problems.empty() && place.local_rank >= place.local_world_size) {
    problems += "\n  LOCAL_RANK=" + std::to_string(place.local_rank) +
                " is not below LOCAL_WORLD_SIZE=" + std::to_string(place.local_world_size);
  }
  if (problems.empty() && env.world_size % place.local_world_size != 0) {
    problems += "\n  WORLD_SIZE=" + std::to_string(env.world_size) +
                " is not a multiple of LOCAL_WORLD_SIZE=" + std::to_string(place.local_world_size) +
                " (every node must have the same number of ranks)";
  }
  if (!problems.empty()) throw BootstrapError("node layout:" + problems);
  return place;
}

}  // namespace exactcoll::cuda
