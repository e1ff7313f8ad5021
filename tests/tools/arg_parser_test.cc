// tools/cli.h's ArgParser: a flag error names the command as the user typed it, and the help
// command it points to is one that exists.
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/command_runner.h"
#include "tools/cli.h"

namespace exactcoll {
namespace {

struct Parsed {
  int code = -1;
  std::string err;
};

// Parses `args` (argv[0] first, as a command receives them) with a parser of `usage` that has a
// positional op and an --algo choice; returns the exit code and what went to stderr.
Parsed parse(const std::string& usage, const std::vector<std::string>& args) {
  std::string op, algo = "auto";
  int64_t nproc = 0;
  cli::ArgParser parser(usage, "a test command");
  parser.add_positional("op", &op, "the op", /*required=*/false);
  parser.add_choice("algo", &algo, {"one_shot", "auto"}, "algorithm");
  parser.add_int("nproc", &nproc, "processes");
  const test_support::CommandResult r =
      test_support::run_in_process([&parser](int argc, char** argv) { return parser.parse(argc, argv).value_or(0); },
                                   args[0], std::vector<std::string>(args.begin() + 1, args.end()));
  return {r.code, r.err};
}

void expect_names(const Parsed& p, const std::string& command) {
  EXPECT_EQ(p.code, cli::kExitUsage) << p.err;
  EXPECT_EQ(p.err.rfind("exactcoll " + command + ": ", 0), 0u) << p.err;
  EXPECT_NE(p.err.find("(exactcoll " + command + " --help explains every flag)"), std::string::npos) << p.err;
}

TEST(ArgParserHint, TheOpIsArgvZero) {
  // `exactcoll sim allreduce …`: the sim dispatcher hands the op as argv[0].
  expect_names(
      parse("exactcoll sim allreduce|reduce_scatter|allgather --ranks N", {"reduce_scatter", "--algo", "bogus"}),
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

TEST(ArgParserShort, ALetterIsItsFlag) {
  std::string min_bytes;
  int64_t factor = 2;
  cli::ArgParser parser("exactcoll bench [-b BYTES] [-f F]", "a test command");
  parser.add_string("minbytes", &min_bytes, "-b: bytes");
  parser.add_int("stepfactor", &factor, "-f: factor");
  parser.add_short('b', "minbytes");
  parser.add_short('f', "stepfactor");
  std::vector<std::string> args = {"bench", "-b", "8K", "-f", "4"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  EXPECT_FALSE(parser.parse(static_cast<int>(argv.size()), argv.data()).has_value());
  EXPECT_EQ(min_bytes, "8K");
  EXPECT_EQ(factor, 4);
  EXPECT_TRUE(parser.given("minbytes"));
  // An unregistered letter is not a flag of the command.
  cli::ArgParser other("exactcoll bench [-b BYTES]", "a test command");
  std::string unused;
  other.add_string("minbytes", &unused, "-b: bytes");
  other.add_short('b', "minbytes");
  std::optional<int> code;
  const test_support::CommandResult r = test_support::run_in_process(
      [&](int argc, char** argv) {
        code = other.parse(argc, argv);
        return code.value_or(0);
      },
      "bench", {"-x", "1"});
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, cli::kExitUsage) << r.err;
  EXPECT_THROW(other.add_short('z', "no-such-flag"), std::logic_error);
}

TEST(ParseByteSize, NcclTestsSizesAndNothingElse) {
  uint64_t b = 0;
  EXPECT_TRUE(cli::parse_byte_size("8", &b));
  EXPECT_EQ(b, 8u);
  EXPECT_TRUE(cli::parse_byte_size("256K", &b));
  EXPECT_EQ(b, 256u << 10);
  EXPECT_TRUE(cli::parse_byte_size("128m", &b));
  EXPECT_EQ(b, 128u << 20);
  EXPECT_TRUE(cli::parse_byte_size("1024G", &b));
  EXPECT_EQ(b, uint64_t{1} << 40);
  b = 7;
  for (const char* bad : {"", "0", "0K", "K", "1T", "1KB", "-1", "1.5M", " 8", "1025G", "1099511627777",
                          "9999999999999G",  // 10^13 << 30 wraps past 2^64: refused before the shift
                          "99999999999999"}) {
    EXPECT_FALSE(cli::parse_byte_size(bad, &b)) << "'" << bad << "'";
  }
  EXPECT_EQ(b, 7u) << "a refused size leaves the output alone";
}

}  // namespace
}  // namespace exactcoll
