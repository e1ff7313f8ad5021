// tests/support/command_runner.h: what the command tests rely on — a temporary directory of the
// process's own, every output of an in-process command captured and the descriptors restored
// (also after an exception), and a binary's exit code, outputs and death by a signal.
#include "tests/support/command_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace exactcoll::test_support {
namespace {

TEST(TempPath, OneDirectoryOfThisProcessUnderTheTestTmpdir) {
  const std::string dir = temp_dir();
  EXPECT_EQ(dir, temp_dir());
  EXPECT_TRUE(file_exists(dir));
  const char* base = std::getenv("TEST_TMPDIR");
  EXPECT_EQ(dir.rfind(std::string(base != nullptr ? base : "/tmp") + "/exactcoll_test.", 0), 0u) << dir;
  EXPECT_EQ(temp_path("a.npy"), dir + "/a.npy");
  EXPECT_FALSE(file_exists(temp_path("a.npy")));
  std::ofstream(temp_path("a.npy")) << "bytes";
  EXPECT_TRUE(file_exists(temp_path("a.npy")));
  EXPECT_EQ(read_file(temp_path("a.npy")), "bytes");
  EXPECT_EQ(read_file(temp_path("no/such/file")), "");
}

int noisy_main(int argc, char** argv) {
  std::cout << "argv:";
  for (int i = 0; i < argc; ++i) std::cout << " " << argv[i];
  std::cout << (argv[argc] == nullptr ? " (null-terminated)" : " (not terminated)") << "\n";
  std::printf("printf line\n");
  std::cerr << "to stderr\n";
  std::thread([] { std::cout << "from a thread\n"; }).join();
  return 7;
}

TEST(RunInProcess, CapturesEveryOutputAndTheCode) {
  const CommandResult r = run_in_process(noisy_main, "noisy", {"--a", "b c"});
  EXPECT_EQ(r.code, 7);
  EXPECT_EQ(r.out, "argv: noisy --a b c (null-terminated)\nprintf line\nfrom a thread\n");
  EXPECT_EQ(r.err, "to stderr\n");
  // Twice in a row: nothing of the first call is left in the second.
  const CommandResult again = run_in_process([](int, char**) { return 0; }, "quiet", {});
  EXPECT_EQ(again.code, 0);
  EXPECT_EQ(again.out, "");
  EXPECT_EQ(again.err, "");
}

TEST(RunInProcess, RestoresTheDescriptorsWhenTheCommandThrows) {
  const auto throwing = [](int, char**) -> int {
    std::cout << "before the throw\n";
    throw std::runtime_error("thrown");
  };
  EXPECT_THROW(run_in_process(throwing, "throwing", {}), std::runtime_error);
  // Descriptor 1 is this process's stdout again: a capture now sees only its own command's output.
  const CommandResult r = run_in_process(noisy_main, "noisy", {});
  EXPECT_EQ(r.out.find("before the throw"), std::string::npos) << r.out;
  EXPECT_EQ(r.code, 7);
}

TEST(RunBinary, ExitCodeOutputsPrefixAndSignals) {
  CommandResult r = run_binary("/bin/sh", "-c 'echo out; echo err >&2; exit 3'");
  EXPECT_EQ(r.code, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  r = run_binary("/bin/sh", "-c 'echo $EXACTCOLL_RUNNER_TEST'",
                 "EXACTCOLL_RUNNER_TEST=prefixed; export EXACTCOLL_RUNNER_TEST; ");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "prefixed\n");
  r = run_binary("/bin/sh", "-c 'kill -9 $$'");
  EXPECT_EQ(r.code, -1) << "a signal that ends the binary is no exit code";
  r = run_binary(temp_path("no such binary"), "");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err, "");
}

TEST(Runfile, UnderTheRunfilesTree) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir == nullptr) GTEST_SKIP() << "not under bazel test";
  EXPECT_TRUE(file_exists(runfile("tests/support/command_runner.h"))) << runfile("tests/support/command_runner.h");
}

}  // namespace
}  // namespace exactcoll::test_support
