// exactcoll-gpu: the GPU commands alone (gpu, verify, bench, tune, launch), for GPU machines that
// lack the full CLI's other dependencies (the full `exactcoll` has them too). Same registry and
// flags; workers re-execute this same binary.
#include <cstring>
#include <iostream>

#include "tools/cli.h"

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << "usage: exactcoll-gpu <command> [flags]   (the GPU subset of exactcoll)\n\ncommands:\n";
    for (const auto& c : exactcoll::cli::registered_commands())
      std::cout << "  " << c.name << "  " << c.summary << "\n";
    return argc < 2 ? exactcoll::cli::kExitUsage : exactcoll::cli::kExitOk;
  }
  for (const auto& c : exactcoll::cli::registered_commands()) {
    if (c.name == argv[1]) return c.run(argc - 1, argv + 1);
  }
  std::cerr << "exactcoll-gpu: unknown command '" << argv[1] << "'\n";
  return exactcoll::cli::kExitUsage;
}
