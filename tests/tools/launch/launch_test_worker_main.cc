// A stand-in for the exactcoll binary with only `launch` and `store_worker` linked in, so that
// launch's re-exec of /proc/self/exe finds the test worker.
#include <iostream>
#include <string>

#include "tools/cli.h"

int main(int argc, char** argv) {
  if (argc >= 2) return exactcoll::cli::run_command(argc, argv);
  std::cerr << "usage: launch_test_worker launch|store_worker …\n";
  return exactcoll::cli::kExitUsage;
}
