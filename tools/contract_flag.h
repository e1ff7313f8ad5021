// --contract canonical|tree: the library's own rounding contracts (core/registry.h) as the
// commands offer them (`sim <op>`, `sim fused_rmsnorm`, `sim <op> --nodes`, `gpu`, `verify`,
// `bench`), with one help text, so that every command explains them the same way.
#pragma once

#include <cstdint>
#include <string>

#include "core/registry.h"
#include "tools/cli.h"

namespace exactcoll::cli {

// Returns what the library's contracts that run on every backend in runs_on mean, for --help:
// "canonical: ranks folded in rank order in fp32, rounded once; tree: ...".
std::string library_contract_help(uint8_t runs_on);

// Adds --contract to parser, its choices the library's contracts that run on every backend in
// runs_on (the registry's order: canonical, tree), bound to *text (its initial value is the
// default, normally "canonical"); `lead` starts the help ("rounding contract of ...").
void add_contract_flag(ArgParser& parser, std::string* text, uint8_t runs_on,
                       const std::string& lead = "the rounding contract every fold follows");

// Returns the library contract named `text`, a choice add_contract_flag offered.
// Precondition: text names a library contract (the parser admitted only those).
Contract library_contract(const std::string& text);

}  // namespace exactcoll::cli
