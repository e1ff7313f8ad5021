#include "tests/cuda_backend/gpu_test_harness.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>

#include "tools/launch/launcher.h"

namespace exactcoll::gpu::test {

int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

int launch_scenario(const std::string& name, const std::string& scenario, int nproc, std::chrono::minutes timeout) {
  launch::LaunchOptions options;
  options.executable = "/proc/self/exe";
  options.argv = {name, "--scenario=" + scenario};
  options.nproc = nproc;
  options.timeout = timeout;
  return launch::run_workers(options);
}

int gpu_test_main(int argc, char** argv, const std::map<std::string, std::function<int()>>& scenarios) {
  if (const char* rank = std::getenv("RANK"); rank != nullptr && *rank != '\0') {
    std::string scenario;
    for (int i = 1; i < argc; ++i) {
      if (std::strncmp(argv[i], "--scenario=", 11) == 0) scenario = argv[i] + 11;
    }
    const auto it = scenarios.find(scenario);
    if (it == scenarios.end()) {
      std::cerr << "unknown scenario '" << scenario << "'\n";
      return 2;
    }
    try {
      return it->second();
    } catch (const std::exception& e) {
      std::cerr << "worker failed: " << e.what() << "\n";
      return 3;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace exactcoll::gpu::test
