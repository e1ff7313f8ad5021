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

}  // namespace

multinode::RankPlace node_place_from_env(const EnvLookup& lookup, const WorkerEnv& env) {
  std::string problems;
  std::optional<int> node;
  for (const char* name : {"GROUP_RANK", "EXACTCOLL_NODE_RANK", "NODE_RANK"}) {
    if (!lookup(name)) continue;
    node = read_count(lookup, name, &problems);
    break;
  }
  const bool node_given = lookup("GROUP_RANK") || lookup("EXACTCOLL_NODE_RANK") || lookup("NODE_RANK");
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
