#include "tools/contract_flag.h"

#include <optional>
#include <stdexcept>

namespace exactcoll::cli {

std::string library_contract_help(uint8_t runs_on) {
  std::string text;
  for (const ContractInfo& e : kContractInfos) {
    if (!e.library_contract || (e.runs_on & runs_on) != runs_on) continue;
    if (!text.empty()) text += "; ";
    text += e.name;
    switch (e.contract) {
      case Contract::kCanonical: text += ": ranks folded in rank order in fp32, rounded once to storage"; break;
      case Contract::kTree:
        text +=
            ": a balanced binary tree over the ranks (n not a power of two: the largest power of two below n on "
            "the left), every node rounded to storage; the same bits at every TP size when each rank's input is "
            "the tree over its own leaves (core/contract.h tree_fold)";
        break;
      default: text += std::string(": ") + e.summary; break;
    }
  }
  return text;
}

void add_contract_flag(ArgParser& parser, std::string* text, uint8_t runs_on, const std::string& lead) {
  parser.add_choice("contract", text, library_contract_name_list(runs_on),
                    lead + ". " + library_contract_help(runs_on));
}

Contract library_contract(const std::string& text) {
  const std::optional<Contract> c = parse_contract_name(text);
  if (!c || !info(*c).library_contract) {
    throw std::invalid_argument("library_contract: '" + text + "' is not one of the library's contracts");
  }
  return *c;
}

}  // namespace exactcoll::cli
