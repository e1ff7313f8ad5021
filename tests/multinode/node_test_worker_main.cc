// A stand-in for the exactcoll binary with only `launch` and `node_worker` linked in, so that
// launch's re-exec of /proc/self/exe finds the test worker.
#include <iostream>

#include "tools/cli.h"

int main(int argc, char** argv) {
  if (argc >= 2) {
    for (const auto& command : exactcoll::cli::registered_commands()) {
      if (command.name == argv[1]) return command.run(argc - 1, argv + 1);
    }
  }
  std::cerr << "usage: node_test_worker launch|node_worker ...\n";
  return exactcoll::cli::kExitUsage;
}
