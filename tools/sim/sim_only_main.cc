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
  return exactcoll::cli::run_command(argc, argv);
}
