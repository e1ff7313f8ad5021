// tools/cli.h's ArgParser: a flag error names the command as the user typed it, and the help
// command it points to is one that exists.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/cli.h"

namespace exactcoll {
namespace {

struct Parsed {
  int code = -1;
  std::string err;
};

// Parses `args` (argv[0] first, as a command receives them) with a parser of `usage` that has a
// positional op and an --algo choice; returns the exit code and what went to stderr.
Parsed parse(const std::string& usage, std::vector<std::string> args) {
  std::string op, algo = "auto";
  int64_t nproc = 0;
  cli::ArgParser parser(usage, "a test command");
  parser.add_positional("op", &op, "the op", /*required=*/false);
  parser.add_choice("algo", &algo, {"one_shot", "auto"}, "algorithm");
  parser.add_int("nproc", &nproc, "processes");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  const auto code = parser.parse(static_cast<int>(argv.size()), argv.data());
  Parsed p;
  p.err = ::testing::internal::GetCapturedStderr();
  p.code = code ? *code : 0;
  return p;
}

void expect_names(const Parsed& p, const std::string& command) {
  EXPECT_EQ(p.code, cli::kExitUsage) << p.err;
  EXPECT_EQ(p.err.rfind("exactcoll " + command + ": ", 0), 0u) << p.err;
  EXPECT_NE(p.err.find("(exactcoll " + command + " --help explains every flag)"), std::string::npos) << p.err;
}

TEST(ArgParserHint, TheOpIsArgvZero) {
  // `exactcoll sim allreduce …`: the sim dispatcher hands the op as argv[0].
  expect_names(parse("exactcoll sim allreduce|reduce_scatter|allgather --ranks N",
                     {"reduce_scatter", "--algo", "bogus"}),
               "sim reduce_scatter");
}

TEST(ArgParserHint, TheOpIsAPositional) {
  // `exactcoll gpu allreduce …`: argv[0] is "gpu" and the op a positional (once "gpu gpu").
  const std::string usage = "exactcoll gpu allreduce|reduce_scatter|allgather --nproc N [--algo A]";
  expect_names(parse(usage, {"gpu", "allgather", "--algo", "bogus"}), "gpu allgather");
  expect_names(parse(usage, {"gpu", "--algo", "bogus", "allgather"}), "gpu allgather");
  // No op given yet: the hint names the command that lists them.
  expect_names(parse(usage, {"gpu", "--algo", "bogus"}), "gpu");
}

TEST(ArgParserHint, AFlagWithAFixedValueIsPartOfTheCommand) {
  // `exactcoll bench --op fused_rmsnorm …` has flags of its own, and its own --help.
  expect_names(parse("exactcoll bench --op fused_rmsnorm --nproc N [--algo A]",
                     {"bench", "--op", "fused_rmsnorm", "--algo", "bogus"}),
               "bench --op fused_rmsnorm");
  // A placeholder value ("N") is not.
  expect_names(parse("exactcoll bench --nproc N [--op allreduce|reduce_scatter]", {"bench", "--algo", "bogus"}),
               "bench");
}

}  // namespace
}  // namespace exactcoll
