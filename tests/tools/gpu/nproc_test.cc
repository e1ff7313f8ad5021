// The GPU commands refuse an --nproc that one communicator cannot link (1..16) before starting any
// worker: `verify --nproc 17` once launched 17 workers, each of which then failed making the
// communicator. Runs without a GPU: the check comes before the GPU is looked for.
#include <gtest/gtest.h>

#include <string>

#include "tests/support/command_runner.h"

namespace {

using exactcoll::test_support::CommandResult;

CommandResult exactcoll(const std::string& args) {
  return exactcoll::test_support::run_binary(exactcoll::test_support::runfile("tools/exactcoll"), args);
}

TEST(GpuCommandsNproc, OutsideOneCommunicatorIsRefusedBeforeAnyWorker) {
  if (exactcoll("verify --nproc 2").err.find("without CUDA") != std::string::npos) {
    GTEST_SKIP() << "built without CUDA: the GPU commands only say so";
  }
  for (const std::string command : {"verify", "bench --op allreduce", "gpu allreduce --count 8", "tune"}) {
    for (const std::string nproc : {"17", "0", "1024"}) {
      const CommandResult r = exactcoll(command + " --nproc " + nproc);
      EXPECT_EQ(r.code, 2) << command << " --nproc " << nproc << "\n" << r.err;
      EXPECT_NE(r.err.find("--nproc must be 1..16 (the ranks one communicator links), got " + nproc +
                           "; no worker was started"),
                std::string::npos)
          << command << "\n"
          << r.err;
    }
  }
}

}  // namespace
