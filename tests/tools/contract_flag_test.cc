// tools/contract_flag.h: --contract's choices come from the registry (the library's contracts on
// the backends asked for), the help names each, and an emulation is not a library contract.
#include "tools/contract_flag.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace exactcoll::cli {
namespace {

TEST(ContractFlag, ChoicesAreTheLibrarysContractsOnTheBackends) {
  std::string text = "canonical";
  ArgParser parser("usage", "description");
  add_contract_flag(parser, &text, kOnGpu, "lead");
  const std::string help = parser.help();
  EXPECT_NE(help.find("--contract canonical|tree\n      lead. canonical: ranks folded in rank order in fp32"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("; tree: a balanced binary tree over the ranks (n not a power of two: the largest power of "
                      "two below n on the left), every node rounded to storage"),
            std::string::npos)
      << help;
  EXPECT_EQ(help.find("f32_residual"), std::string::npos) << help;
  // Both run across nodes too (the registry's kOnMultiNode); an emulation never does.
  EXPECT_EQ(library_contract_names(kOnMultiNode), "canonical, tree");
  EXPECT_NE(library_contract_help(kOnMultiNode).find("tree"), std::string::npos);
  EXPECT_EQ(library_contract_help(kOnMultiNode).find("f32_residual"), std::string::npos);
}

TEST(ContractFlag, ParsesTheChoicesAndRefusesAnEmulation) {
  std::string text = "canonical";
  ArgParser parser("usage", "description");
  add_contract_flag(parser, &text, kOnSimulator);
  std::vector<std::string> words = {"cmd", "--contract", "tree"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  EXPECT_FALSE(parser.parse(static_cast<int>(argv.size()), argv.data()).has_value());
  EXPECT_EQ(text, "tree");
  EXPECT_EQ(library_contract(text), Contract::kTree);
  EXPECT_EQ(library_contract("canonical"), Contract::kCanonical);
  EXPECT_THROW(library_contract("f32_residual"), std::invalid_argument);
  EXPECT_THROW(library_contract("nonsense"), std::invalid_argument);
}

}  // namespace
}  // namespace exactcoll::cli
