// Subcommands of `exactcoll sim` that live outside tools/sim (`exactcoll sim fused_rmsnorm` lives
// in tools/fused, `sim overlap` in tools/overlap, `sim <op> --nodes` in tools/multinode). Each
// registers itself here at static-initialization time (its library depends on //tools/sim:
// sim_subcommands, is alwayslink and is linked into the binary through tools/BUILD's COMMANDS;
// tools/sim depends on none of them); tools/sim's command looks its first argument up with
// find_sim_subcommand when it is none of its own operations.
//
// Example (in tools/sim):
//   if (const auto* sub = cli::find_sim_subcommand(argv[1])) return sub->run(argc - 1, argv + 1);
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace exactcoll::cli {

struct SimSubcommand {
  std::string name;     // e.g. "fused_rmsnorm"
  std::string summary;  // one line for `exactcoll sim --help`
  // argv[0] is the subcommand's name; returns the exit code (tools/cli.h).
  std::function<int(int, char**)> run;
};

struct SimSubcommandRegistrar {
  explicit SimSubcommandRegistrar(SimSubcommand subcommand);
};

// Every registered subcommand, sorted by name.
std::vector<SimSubcommand> sim_subcommands();

// Returns the subcommand called name, or nullptr.
const SimSubcommand* find_sim_subcommand(const std::string& name);

}  // namespace exactcoll::cli
