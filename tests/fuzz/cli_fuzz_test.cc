// Fuzzing the command line (issue 15): random argv built from the flags each command declares
// (read from its own --help), with values that are valid, at the edges, or junk, and paths to good
// and bad input files, directories, a FIFO, a device and unwritable places. Each input runs the
// command as `exactcoll` would (cli::run_command, in a forked child, so that a crash or a hang is
// seen, not suffered). Allowed: exit 0, 1, 2 or 3, within the time limit. Never a signal, a
// sanitizer report, an "internal error", a failure without a message, a temporary file left
// behind, or an output of a failed run (only its traces); the .npy outputs of a successful run
// must read back.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fuzz/fuzz_harness.h"
#include "tests/support/command_runner.h"
#include "tools/cli.h"
#include "npy/npy.h"

namespace exactcoll {
namespace {

namespace fs = std::filesystem;

// The commands fuzzed (the CPU ones; `launch` and the GPU commands start processes or need GPUs),
// each with a valid start that half of the inputs build on, so that runs, not only refusals, are
// fuzzed ("IN/" is the input directory).
struct Fuzzed {
  std::vector<std::string> words;
  std::vector<std::string> valid_start;
};
const std::vector<Fuzzed> kCommands = {
    {{"sim", "allreduce"}, {"--ranks", "4", "--count", "16"}},
    {{"sim", "reduce_scatter"}, {"--ranks", "4", "--count", "16"}},
    {{"sim", "allgather"}, {"--ranks", "3", "--count", "8"}},
    // The multi-node simulator (`--nodes`): its buffers depend on count, chunk and layout.
    {{"sim", "allreduce"}, {"--ranks", "4", "--count", "100", "--nodes", "2", "--chunk-elements", "64"}},
    {{"sim", "reduce_scatter"}, {"--ranks", "6", "--count", "12", "--nodes", "3"}},
    {{"sim", "allgather"}, {"--ranks", "4", "--count", "30", "--nodes", "2"}},
    {{"sim", "fused_rmsnorm"}, {"--ranks", "4", "--rows", "2", "--hidden", "16"}},
    {{"sim", "overlap"}, {"--ranks", "2"}},
    {{"diff"}, {"IN/x4x16.npy", "IN/x4x16.npy"}},
    {{"layers"}, {"--layers", "2", "--rows", "2", "--hidden", "16", "--ranks", "2"}}};

// Flags whose value is a file the command writes; those of traces may remain after a failed run.
const std::set<std::string> kOutputFlags = {"output", "residual-output", "trace", "chrome-trace", "plot", "csv"};
const std::set<std::string> kTraceFlags = {"trace", "chrome-trace"};
const std::set<std::string> kNpyOutputFlags = {"output", "residual-output"};

constexpr auto kRunLimit = std::chrono::seconds(60);

enum class Kind { kBool, kInt, kDouble, kString, kChoice };
struct Flag {
  std::string name;
  Kind kind = Kind::kBool;
  std::vector<std::string> choices;
};
struct CommandSpec {
  std::vector<std::string> words;  // "sim", "allreduce"
  std::vector<std::string> valid_start;
  std::vector<Flag> flags;
  size_t positionals = 0;
};

struct Outcome {
  int status = 0;  // waitpid status
  bool timed_out = false;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string quoted(const std::vector<std::string>& args) {
  std::string text = "exactcoll";
  for (const auto& a : args) text += " '" + a + "'";
  return text;
}

// EXACTCOLL_FUZZ_IN_PROCESS=1 runs each command in this process instead of a forked child: many
// times faster for the long runs by hand (most inputs are refused in microseconds, a fork costs
// milliseconds), but a crash ends the whole run and a hang is not bounded. CI forks.
bool in_process() {
  const char* text = std::getenv("EXACTCOLL_FUZZ_IN_PROCESS");
  return text != nullptr && std::string(text) == "1";
}

// In this process (test_support::run_in_process): its argv goes to `current_path` first, so that
// the input that ends the whole process is known.
Outcome run_here(const std::vector<std::string>& args, const std::string& current_path) {
  std::ofstream(current_path, std::ios::trunc) << quoted(args) << "\n";
  const test_support::CommandResult r = test_support::run_in_process(cli::run_command, "exactcoll", args);
  Outcome o;
  o.status = (r.code & 0xFF) << 8;  // as waitpid reports an exit with `code`
  o.out = r.out;
  o.err = r.err;
  return o;
}

// Every command runs with at most 8 GiB of address space, as libFuzzer bounds its targets' RSS:
// an allocation past it fails (and must be reported as such), where on a machine shared with
// other work it could otherwise wake the OOM killer, whose SIGKILL no command can answer. Not
// under AddressSanitizer, which reserves terabytes of address space.
void limit_address_space() {
#if !defined(__SANITIZE_ADDRESS__)
  const rlimit limit{rlim_t{8} << 30, rlim_t{8} << 30};
  setrlimit(RLIMIT_AS, &limit);
#endif
}

// Runs `exactcoll <args>` in a forked child (stdout and stderr to files) and waits at most
// kRunLimit. Only the child this function forked is ever signalled, by its pid.
Outcome run_child(const std::vector<std::string>& args, const std::string& log_dir) {
  const std::string out_path = log_dir + "/stdout", err_path = log_dir + "/stderr";
  if (in_process()) return run_here(args, log_dir + "/current");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    limit_address_space();
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    std::vector<std::string> strings = {"exactcoll"};
    strings.insert(strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : strings) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int code = cli::run_command(static_cast<int>(strings.size()), argv.data());
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    _exit(code);
  }
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + kRunLimit;
  for (;;) {  // bounded by the deadline
    const pid_t done = waitpid(pid, &o.status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      o.timed_out = true;
      kill(pid, SIGKILL);
      waitpid(pid, &o.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  o.out = slurp(out_path);
  o.err = slurp(err_path);
  return o;
}

// Reads a command's flags from its --help (tools/cli.cc writes "  --name CHOICES|N|X|VALUE").
CommandSpec discover(const Fuzzed& fuzzed, const std::string& in_dir, const std::string& log_dir) {
  const std::vector<std::string>& words = fuzzed.words;
  CommandSpec spec;
  spec.words = words;
  for (const std::string& arg : fuzzed.valid_start) {
    spec.valid_start.push_back(arg.rfind("IN/", 0) == 0 ? in_dir + "/" + arg.substr(3) : arg);
  }
  std::vector<std::string> args = words;
  args.push_back("--help");
  const Outcome help = run_child(args, log_dir);
  EXPECT_TRUE(WIFEXITED(help.status) && WEXITSTATUS(help.status) == 0) << "--help of " << words.back();
  std::istringstream lines(help.out);
  std::string line;
  bool in_arguments = false;
  while (std::getline(lines, line)) {
    if (line == "arguments:") in_arguments = true;
    if (line == "flags:") in_arguments = false;
    if (in_arguments && line.size() > 2 && line.rfind("  ", 0) == 0 && line[2] != ' ') ++spec.positionals;
    if (line.rfind("  --", 0) != 0) continue;
    std::istringstream words_in(line.substr(4));
    Flag f;
    std::string kind;
    words_in >> f.name >> kind;
    if (f.name == "help") continue;
    if (kind.empty()) {
      f.kind = Kind::kBool;
    } else if (kind == "N") {
      f.kind = Kind::kInt;
    } else if (kind == "X") {
      f.kind = Kind::kDouble;
    } else if (kind == "VALUE") {
      f.kind = Kind::kString;
    } else {
      f.kind = Kind::kChoice;
      std::stringstream choices(kind);
      for (std::string c; std::getline(choices, c, '|');) f.choices.push_back(c);
    }
    spec.flags.push_back(f);
  }
  EXPECT_FALSE(spec.flags.empty()) << "no flags found in the help of " << words.back();
  return spec;
}

// Input files every argv may name: good arrays of several shapes and dtypes, and bad ones.
std::vector<std::string> make_inputs(const std::string& dir) {
  fs::create_directories(dir);
  std::vector<std::string> paths;
  auto array = [&](const std::string& name, const char* dtype, std::vector<int64_t> shape) {
    size_t bytes = npy::dtype_item_size(dtype);
    for (const int64_t d : shape) bytes *= static_cast<size_t>(d);
    std::vector<uint8_t> data(bytes);
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 37 + 11);
    npy::write_npy(dir + "/" + name, dtype, shape, data.data(), data.size());
    paths.push_back(dir + "/" + name);
  };
  array("x4x16.npy", npy::kU16, {4, 16});
  array("x2x8f.npy", npy::kF32, {2, 8});
  array("x4x2x8.npy", npy::kU16, {4, 2, 8});
  array("r2x8.npy", npy::kU16, {2, 8});
  array("w8.npy", npy::kU16, {8});
  array("scalar.npy", npy::kF32, {});
  array("empty.npy", npy::kU16, {0});
  std::ofstream(dir + "/malformed.npy") << "\x93NUMPY\x01\x00garbage";
  paths.push_back(dir + "/malformed.npy");
  fs::create_directories(dir + "/a_directory.npy");
  paths.push_back(dir + "/a_directory.npy");
  mkfifo((dir + "/fifo.npy").c_str(), 0600);
  paths.push_back(dir + "/fifo.npy");
  paths.push_back("/dev/null");
  paths.push_back(dir + "/missing.npy");
  return paths;
}

// Values, by kind: valid, at the edges, or junk.
const char* const kInts[] = {"0",
                             "1",
                             "2",
                             "3",
                             "4",
                             "7",
                             "8",
                             "16",
                             "17",
                             "31",
                             "64",
                             "-1",
                             "100",
                             "-2147483648",
                             "2147483647",
                             "2147483648",
                             "9223372036854775807",
                             "-9223372036854775808",
                             "4611686018427387904",
                             "18446744073709551616",
                             "",
                             "1e3",
                             "0x10",
                             "abc",
                             " 5"};
const char* const kSmallInts[] = {"1", "2", "3", "4", "8", "16", "32", "64"};
const char* const kDoubles[] = {"1e-6", "0",    "1",      "-1",    "nan", "-nan", "inf",
                                "-inf", "1e39", "1e-320", "1e400", "abc", ""};
const char* const kJunk[] = {"", "x", "0,1", "0,5,7", "1,x", ",", "99999999999999999999", "-", "--", "a b"};
const char* const kOutputNames[] = {"out.npy", "o2.npy", "t.jsonl", "c.json", "p.svg", "p.png", "t.csv", "x.txt"};

struct Argv {
  std::vector<std::string> args;
  // Path in the output dir -> the output flags whose (last) value it is.
  std::map<std::string, std::vector<std::string>> outputs;
};

Argv make_argv(sim::Xoshiro256& rng, const CommandSpec& spec, const std::vector<std::string>& inputs,
               const std::string& out_dir) {
  Argv a;
  a.args = spec.words;
  const bool from_valid_start = rng.below(2) == 0;
  if (from_valid_start) a.args.insert(a.args.end(), spec.valid_start.begin(), spec.valid_start.end());
  auto value_for = [&](const Flag& f) -> std::string {
    switch (f.kind) {
      case Kind::kInt: return rng.below(2) ? fuzz::pick(rng, kSmallInts) : fuzz::pick(rng, kInts);
      case Kind::kDouble: return fuzz::pick(rng, kDoubles);
      case Kind::kChoice:
        return rng.below(8) ? f.choices[rng.below(f.choices.size())] : std::string(fuzz::pick(rng, kJunk));
      case Kind::kString: {
        const uint64_t what = rng.below(8);
        if (what < 3 || kOutputFlags.count(f.name)) {
          if (what < 2 && !kOutputFlags.count(f.name)) return inputs[rng.below(inputs.size())];
          if (rng.below(10) == 0) return rng.below(2) ? "/nonexistent/o.npy" : "/dev/null";
          return out_dir + "/" + fuzz::pick(rng, kOutputNames);
        }
        if (what < 6) return inputs[rng.below(inputs.size())];
        return fuzz::pick(rng, kJunk);
      }
      case Kind::kBool: break;
    }
    return "";
  };
  // Mostly the command's own flags with plausible values; now and then something it never declared.
  const uint64_t count = from_valid_start ? rng.below(5) : rng.below(9);
  for (uint64_t i = 0; i < count; ++i) {
    const Flag& f = spec.flags[rng.below(spec.flags.size())];
    if (f.kind == Kind::kBool) {
      a.args.push_back(rng.below(10) ? "--" + f.name : "--" + f.name + "=1");
      continue;
    }
    const std::string value = value_for(f);
    if (rng.below(4) == 0) {
      a.args.push_back("--" + f.name + "=" + value);
    } else {
      a.args.push_back("--" + f.name);
      if (rng.below(30)) a.args.push_back(value);  // sometimes the value is missing
    }
  }
  for (size_t p = from_valid_start ? spec.positionals : 0; p < spec.positionals + (rng.below(10) == 0 ? 1 : 0); ++p) {
    if (rng.below(10)) a.args.push_back(inputs[rng.below(inputs.size())]);
  }
  if (rng.below(20) == 0) a.args.push_back(rng.below(2) ? "--no-such-flag" : "--");
  // A repeated flag takes its last value: only that one is an output.
  std::map<std::string, std::string> last;
  for (size_t i = 0; i < a.args.size(); ++i) {
    const std::string& arg = a.args[i];
    if (arg.rfind("--", 0) != 0) continue;
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (!kOutputFlags.count(name)) continue;
    if (eq != std::string::npos) {
      last[name] = arg.substr(eq + 1);
    } else if (i + 1 < a.args.size()) {
      last[name] = a.args[i + 1];
    }
  }
  for (const auto& [name, path] : last) {
    if (path.rfind(out_dir + "/", 0) == 0) a.outputs[path].push_back(name);
  }
  return a;
}

TEST(CliFuzz, EveryArgvEndsInADocumentedExitCodeWithNoPartialOutput) {
  const std::string root = test_support::temp_path("cli_fuzz");
  const std::string out_dir = root + "/out", log_dir = root + "/log";
  fs::create_directories(out_dir);
  fs::create_directories(log_dir);
  const std::vector<std::string> inputs = make_inputs(root + "/in");
  std::vector<CommandSpec> specs;
  for (const Fuzzed& fuzzed : kCommands) specs.push_back(discover(fuzzed, root + "/in", log_dir));
  std::map<int, uint64_t> codes;
  if (in_process()) limit_address_space();
  fuzz::SeededRun run("fuzz cli", "EXACTCOLL_FUZZ", 30.0);
  run.each([&](sim::Xoshiro256& rng, uint64_t) {
    for (const auto& entry : fs::directory_iterator(out_dir)) fs::remove_all(entry.path());
    const CommandSpec& spec = specs[rng.below(specs.size())];
    const Argv argv = make_argv(rng, spec, inputs, out_dir);
    const Outcome o = run_child(argv.args, log_dir);
    const std::string what = quoted(argv.args);
    ASSERT_FALSE(o.timed_out) << what << "\nran longer than " << kRunLimit.count() << " s (a hang?)";
    ASSERT_TRUE(WIFEXITED(o.status)) << what << "\nended by signal " << WTERMSIG(o.status) << "\n" << o.err;
    const int code = WEXITSTATUS(o.status);
    ++codes[code];
    ASSERT_TRUE(code >= 0 && code <= 3) << what << "\nexit " << code << "\n" << o.err;
    for (const char* bad : {"internal error", "runtime error", "Sanitizer", "terminate called"}) {
      EXPECT_EQ(o.err.find(bad), std::string::npos) << what << "\nstderr has '" << bad << "':\n" << o.err;
    }
    if (code >= 2) {
      EXPECT_FALSE(o.err.empty()) << what << "\nexit " << code << " without a message";
    }
    // The outputs: never a temporary left; after a failure, nothing but traces.
    for (const auto& entry : fs::directory_iterator(out_dir)) {
      const std::string path = entry.path().string();
      EXPECT_EQ(path.find(".tmp."), std::string::npos) << what << "\nleft " << path;
      if (code == 0 || code == 1) continue;
      const auto given = argv.outputs.find(path);
      bool trace_only = given != argv.outputs.end();
      if (trace_only) {
        for (const std::string& flag : given->second) trace_only = trace_only && kTraceFlags.count(flag) != 0;
      }
      EXPECT_TRUE(trace_only) << what << "\nexit " << code << " left the output " << path << "\n" << o.err;
    }
    // A success wrote every output it was given, and its arrays read back.
    if (code != 0) return;
    for (const auto& [path, flags] : argv.outputs) {
      EXPECT_TRUE(fs::exists(path)) << what << "\nexit 0 without its output " << path;
      bool npy_only = true;
      for (const std::string& flag : flags) npy_only = npy_only && kNpyOutputFlags.count(flag) != 0;
      if (npy_only && fs::exists(path)) {
        try {
          npy::read_npy(path);
        } catch (const npy::NpyError& e) {
          ADD_FAILURE() << what << "\nexit 0 wrote an unreadable " << path << ": " << e.what();
        }
      }
    }
  });
  std::string tally;
  for (const auto& [code, n] : codes) tally += " exit " + std::to_string(code) + ": " + std::to_string(n) + ";";
  std::printf("fuzz cli:%s\n", tally.c_str());
  EXPECT_GT(codes[0], run.inputs() / 20) << "few argvs ran successfully: the generator makes mostly bad input";
  EXPECT_GT(codes[2], 0u);
  fs::remove_all(root);
}

}  // namespace
}  // namespace exactcoll
