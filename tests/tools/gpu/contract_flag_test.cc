// The GPU commands' --contract (gpu, verify, bench), checked where it runs without a GPU: its
// choices are the library's contracts on GPUs, --help says what tree is, and a contract they do not
// run is refused (exit 2, the choices named) before any worker starts.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/command_runner.h"

namespace {

using exactcoll::test_support::CommandResult;

CommandResult exactcoll(const std::string& args) {
  return exactcoll::test_support::run_binary(exactcoll::test_support::runfile("tools/exactcoll"), args);
}

bool built_without_cuda() { return exactcoll("verify --nproc 2").err.find("without CUDA") != std::string::npos; }

const char* const kCommands[] = {"gpu allreduce --count 8",
                                 "gpu reduce_scatter --count 8",
                                 "gpu allgather --count 8",
                                 "gpu fused_rmsnorm --rows 2 --hidden 64",
                                 "verify",
                                 "bench --op allreduce",
                                 "bench --op fused_rmsnorm"};

TEST(GpuCommandsContract, HelpOffersCanonicalAndTreeAndSaysWhatTreeIs) {
  if (built_without_cuda()) GTEST_SKIP() << "built without CUDA: the GPU commands only say so";
  for (const std::string command : kCommands) {
    const CommandResult help = exactcoll(command + " --help");
    EXPECT_EQ(help.code, 0) << command << "\n" << help.err;
    EXPECT_NE(help.out.find("[--contract canonical|tree]"), std::string::npos) << command << "\n" << help.out;
    EXPECT_NE(help.out.find("\n  --contract canonical|tree\n"), std::string::npos) << command << "\n" << help.out;
    EXPECT_NE(help.out.find("tree: a balanced binary tree over the ranks"), std::string::npos) << command << "\n"
                                                                                               << help.out;
    EXPECT_NE(help.out.find("(default: canonical)"), std::string::npos) << command << "\n" << help.out;
  }
}

TEST(GpuCommandsContract, AContractTheGpusDoNotRunIsRefusedBeforeAnyWorker) {
  if (built_without_cuda()) GTEST_SKIP() << "built without CUDA: the GPU commands only say so";
  for (const std::string command : kCommands) {
    for (const std::string contract : {"f32_residual", "rotated_two_shot", "fast"}) {
      const CommandResult r = exactcoll(command + " --nproc 2 --contract " + contract);
      EXPECT_EQ(r.code, 2) << command << " --contract " << contract << "\n" << r.err;
      EXPECT_NE(r.err.find("--contract must be one of canonical|tree, got '" + contract + "'"), std::string::npos)
          << command << "\n"
          << r.err;
      EXPECT_EQ(r.out, "") << command << ": nothing ran";
    }
  }
}

}  // namespace
