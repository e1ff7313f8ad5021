// exactcoll: one binary, many subcommands (tools/cli.h). `exactcoll --help` lists them.
#include <cstring>
#include <iostream>

#include "exactcoll/exactcoll.h"
#include "tools/cli.h"

namespace {

void print_help() {
  std::cout << "usage: exactcoll <command> [flags]   (exactcoll <command> --help for its flags;"
               " exactcoll --version)\n\n"
               "Collectives whose every output bit is fixed by a written rounding contract\n"
               "(docs/numerics.md): a CPU simulator and a CUDA backend give the same bits.\n\n"
               "commands:\n";
  for (const auto& c : exactcoll::cli::registered_commands()) {
    std::cout << "  " << c.name;
    for (size_t i = c.name.size(); i < 16; ++i) std::cout << ' ';
    std::cout << c.summary << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--version") == 0 || std::strcmp(argv[1], "version") == 0)) {
    // The CLI is built from the same tree as libexactcoll: the header's version is the library's.
    std::cout << "exactcoll " << EXACTCOLL_VERSION_MAJOR << "." << EXACTCOLL_VERSION_MINOR << "."
              << EXACTCOLL_VERSION_PATCH << " (C ABI " << EXACTCOLL_ABI_VERSION << ")\n";
    return exactcoll::cli::kExitOk;
  }
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    print_help();
    return argc < 2 ? exactcoll::cli::kExitUsage : exactcoll::cli::kExitOk;
  }
  return exactcoll::cli::run_command(argc, argv);
}
