// The harness of the self-relaunching GPU tests (tests/cuda_backend:collectives_gpu_test,
// tests/cuda_backend/fused:fused_gpu_test): the test binary, run by gtest in the parent process, starts N
// copies of itself as workers through the launcher (tools/launch); a copy with RANK set runs one
// named worker scenario and exits with its code.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>

namespace exactcoll::gpu::test {

// Returns the number of GPUs the CUDA runtime sees (0 when it reports an error).
int visible_gpus();

// Runs worker scenario `scenario` of this binary on `nproc` workers and returns the launcher's
// exit code (0 when every worker returned 0). `name` is argv[0] of the workers (what their logs
// show); `timeout` bounds the whole launch.
int launch_scenario(const std::string& name, const std::string& scenario, int nproc, std::chrono::minutes timeout);

// The test binary's main: with RANK set, runs the scenario that --scenario=NAME names (2 for an
// unknown name, 3 when it throws, printing why); otherwise gtest's tests.
int gpu_test_main(int argc, char** argv, const std::map<std::string, std::function<int()>>& scenarios);

}  // namespace exactcoll::gpu::test
