#include "tools/sim/sim_subcommands.h"

#include <map>

namespace exactcoll::cli {
namespace {

std::map<std::string, SimSubcommand>& registry() {
  static std::map<std::string, SimSubcommand> subcommands;
  return subcommands;
}

}  // namespace

SimSubcommandRegistrar::SimSubcommandRegistrar(SimSubcommand subcommand) {
  const std::string name = subcommand.name;
  registry()[name] = std::move(subcommand);
}

std::vector<SimSubcommand> sim_subcommands() {
  std::vector<SimSubcommand> out;
  for (const auto& [name, sub] : registry()) out.push_back(sub);
  return out;
}

const SimSubcommand* find_sim_subcommand(const std::string& name) {
  const auto it = registry().find(name);
  return it == registry().end() ? nullptr : &it->second;
}

}  // namespace exactcoll::cli
