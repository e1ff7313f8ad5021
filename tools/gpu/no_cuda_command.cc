// The GPU commands in a build without a CUDA toolkit: each says so and exits 2, so scripts and
// users get a clear answer instead of "unknown command".
#include <iostream>
#include <string>

#include "tools/cli.h"

namespace exactcoll::gpu {
namespace {

int without_cuda(const std::string& name) {
  std::cerr << "exactcoll " << name
            << ": this exactcoll was built without CUDA (no toolkit found at $CUDA_PATH or /usr/local/cuda when it was "
               "built); rebuild on a machine with the CUDA toolkit to run "
            << name << "\n";
  return cli::kExitUsage;
}

const cli::Registrar kGpu({"gpu", "one collective on the GPUs (unavailable: built without CUDA)",
                           [](int, char**) { return without_cuda("gpu"); }});
const cli::Registrar kVerify({"verify", "GPU results vs the simulator (unavailable: built without CUDA)",
                              [](int, char**) { return without_cuda("verify"); }});
const cli::Registrar kBench({"bench", "time the CUDA collectives (unavailable: built without CUDA)",
                             [](int, char**) { return without_cuda("bench"); }});
const cli::Registrar kTune({"tune", "tune auto's dispatch table (unavailable: built without CUDA)",
                            [](int, char**) { return without_cuda("tune"); }});

}  // namespace
}  // namespace exactcoll::gpu
