// `exactcoll bench --op fused_rmsnorm`: tools/gpu/bench_command.cc hands that invocation to
// run_fused_bench (argv[0] = "bench"). (`gpu` and `verify` run the fused op through its GpuOp,
// tools/gpu/fused/fused_op.cc.)
#pragma once

#include <string>

namespace exactcoll::gpu {

int run_fused_bench(int argc, char** argv);

// Whether argv (a command's arguments) asks for the fused op: `flag` ("op") given as
// `--flag fused_rmsnorm` or `--flag=…` with fused_rmsnorm in its comma list.
bool asks_for_fused(int argc, char** argv, const std::string& flag);

}  // namespace exactcoll::gpu
