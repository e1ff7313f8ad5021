// What the command-line tests share: a temporary directory of the test process's own, and running
// a command with its stdout, stderr and exit code captured — in this process (a command's main
// function) or as a separate binary (a runfile of the test).
//
// Example:
//   const std::string out = test_support::temp_path("y.npy");
//   const test_support::CommandResult r = test_support::run_in_process(diff::diff_main, "diff", {a, b});
//   EXPECT_EQ(r.code, 0) << r.err;
//   const test_support::CommandResult s =
//       test_support::run_binary(test_support::runfile("tools/exactcoll"), "sim allreduce --ranks 2 --count 8");
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace exactcoll::test_support {

// Returns this process's temporary directory, made on the first call: a new directory
// exactcoll_test.XXXXXX (mkdtemp) under $TEST_TMPDIR when Bazel sets it, else under /tmp. Every
// test process has its own, so tests run in parallel (or a test run by hand beside Bazel's) never
// write each other's files. It is left in place at exit, for a look after a failure; Bazel
// removes $TEST_TMPDIR itself. Aborts the test process when the directory cannot be made.
// Example: temp_dir() -> "/tmp/_bazel/.../exactcoll_test.Xk3P0a"
std::string temp_dir();

// Returns temp_dir() + "/" + name. Creates nothing (but temp_dir() on the first call); a name with
// directories ("no/such/dir.csv") names a path under directories that do not exist.
// Preconditions: name is a relative path that stays inside temp_dir() (no "..").
// Example: temp_path("out.npy") -> temp_dir() + "/out.npy"
std::string temp_path(const std::string& name);

// Returns the whole content of the file at path, or "" when it cannot be read.
std::string read_file(const std::string& path);

// Returns true when something (a file, a directory, a device) exists at path.
bool file_exists(const std::string& path);

// Returns the path of a runfile of this test, `path` relative to the workspace root:
// $TEST_SRCDIR/$TEST_WORKSPACE/path (TEST_WORKSPACE "exactcoll" when unset, "." for TEST_SRCDIR).
// Example: runfile("tools/exactcoll") for a test with data = ["//tools:exactcoll"].
std::string runfile(const std::string& path);

// What a command did.
struct CommandResult {
  int code = -1;    // its exit code (run_binary: -1 when a signal ended it)
  std::string out;  // all it wrote to stdout
  std::string err;  // all it wrote to stderr
};

// Runs main(argc, argv) in this process with argv = {argv0, args...} (argv[argc] is null) and
// returns its return value as the code, with everything written to file descriptors 1 and 2
// meanwhile (std::cout, printf, std::cerr, threads the command starts) as out and err. The
// descriptors are restored afterwards, also when main throws (the exception then goes on).
// Preconditions: one call at a time in the process (the descriptors are the process's), and not
// while gtest's own CaptureStdout/CaptureStderr is active.
// Example: run_in_process(sim_overlap_main, "overlap", {"--ranks", "2"}).code == 0
CommandResult run_in_process(const std::function<int(int, char**)>& main, const std::string& argv0,
                             const std::vector<std::string>& args);

// Runs `<shell_prefix>exec <binary> <args>` through /bin/sh (std::system; args are words as typed
// on a command line, split by the shell; binary is quoted) with stdout and stderr going to files
// of temp_dir(), waits for it and returns its exit code and both outputs. shell_prefix runs first
// in the same shell, e.g. "ulimit -v 4194304; " to run the binary under a memory limit.
// Preconditions: args needs no quoting beyond what the shell does (paths from temp_path() do not).
// Example: run_binary(runfile("tools/sim/exactcoll_sim"), "--version").out starts "exactcoll "
CommandResult run_binary(const std::string& binary, const std::string& args, const std::string& shell_prefix = "");

}  // namespace exactcoll::test_support
