// The fused all-reduce + residual + RMSNorm in the GPU commands. The commands' own files
// (tools/gpu/gpu_command.cc, verify_command.cc, bench_command.cc) hand these invocations over:
//   exactcoll gpu fused_rmsnorm --nproc N …        run_gpu_fused_rmsnorm (argv[0] = "gpu")
//   exactcoll verify --ops fused_rmsnorm …         run_fused_verify (argv[0] = "verify")
//   exactcoll bench --op fused_rmsnorm …           run_fused_bench (argv[0] = "bench")
#pragma once

#include <string>

namespace exactcoll::gpu {

int run_gpu_fused_rmsnorm(int argc, char** argv);
int run_fused_verify(int argc, char** argv);
int run_fused_bench(int argc, char** argv);

// Whether argv (a command's arguments) asks for the fused op: `flag` ("op" or "ops") given as
// `--flag fused_rmsnorm` or `--flag=…` with fused_rmsnorm in its comma list.
bool asks_for_fused(int argc, char** argv, const std::string& flag);

}  // namespace exactcoll::gpu
