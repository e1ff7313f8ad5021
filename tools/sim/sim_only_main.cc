// `exactcoll` with only the simulator's commands linked in (sim, sim-bench, and whatever other
// `exactcoll sim` ops are registered in the deps): the simulator's CLI tests run it, so that they
// build only what they test. The full binary is //tools:exactcoll.
#include <iostream>

#include "tools/cli.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: exactcoll <command> [flags]\n";
    return exactcoll::cli::kExitUsage;
  }
  for (const auto& c : exactcoll::cli::registered_commands()) {
    if (c.name == argv[1]) return c.run(argc - 1, argv + 1);
  }
  std::cerr << "exactcoll: unknown command '" << argv[1] << "'\n";
  return exactcoll::cli::kExitUsage;
}
