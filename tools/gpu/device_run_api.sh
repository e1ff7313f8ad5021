#!/usr/bin/env bash
# The C, Python and PyTorch layers on a lent GPU machine (no Bazel there; binaries and the wheel are
# built here and carried in .gpubin/). Phases (comma list, default check):
#   check  the README's PyTorch quickstart and the C example (2 ranks), and the tensor-parallel
#          block check (python/examples/tp_block_check.py: eager, torch.compile, CUDA graph, batch
#          invariance, every bit against exactcoll.sim) with NPROC_LIST ranks (default "2 4");
#          torchrun starts the ranks, all on GPU 0 unless the machine has more.
#   bench  host time per call and graph time per op: the C API (api_host_bench), the Python layer
#          (python/examples/bench_overhead.py), and `exactcoll bench --nproc 1` for reference.
#   norm   the canonical residual + RMSNorm kernel: `verify --nproc 1` (bits, fused included), the
#          CLI's norm column (and .gpubin/exactcoll_gpu_old's, when carried: the kernel before a
#          change), python/examples/bench_norm.py (beside torch eager and torch.compile, the traffic
#          bound, every bit against exactcoll.sim), and an ncu profile at 4096 x 8192 bf16.
#   profile ncu of the norm kernel and of torch.compile's kernel at 256 x 8192 and 1024 x 7168 bf16.
# Build first (here):
#   bazel build //python:wheel //examples/c:gpu_allreduce //tools/api_bench:all //tools/gpu:exactcoll_gpu
#   mkdir -p .gpubin && cp -f bazel-bin/python/exactcoll-*.whl bazel-bin/examples/c/gpu_allreduce \
#     bazel-bin/tools/api_bench/libexactcoll_host_loop.so \
#     bazel-bin/tools/api_bench/api_host_bench bazel-bin/tools/gpu/exactcoll_gpu .gpubin/
# Logs go to $OUT; a short table is printed last.
set -uo pipefail
PHASES=${1:-check}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
has() { [[ ",$PHASES," == *",$1,"* ]]; }
status=0
summary=()
note() { summary+=("$1"); }

# The wheel, installed the way a user would (pip from the file), into a scratch directory.
SITE=$(mktemp -d)
if python3 -m pip install --quiet --no-deps --no-index --target "$SITE" .gpubin/exactcoll-*.whl > "$OUT/pip.log" 2>&1; then
  note "wheel: pip installed $(basename .gpubin/exactcoll-*.whl)"
else
  python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" .gpubin/exactcoll-*.whl "$SITE"
  note "wheel: pip failed (see pip.log), unzipped instead"
fi
export PYTHONPATH="$SITE"
export LD_LIBRARY_PATH="$SITE/exactcoll:${LD_LIBRARY_PATH:-}"
export EXACTCOLL_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
{ date -u; nvidia-smi -L; python3 -c "import torch, exactcoll; print('torch', torch.__version__, 'exactcoll', exactcoll.__version__, exactcoll.has_cuda())"; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
run() {  # run NAME SECONDS COMMAND...: logs to $OUT/NAME.log, records the exit status
  local name=$1 seconds=$2
  shift 2
  local start=$SECONDS
  timeout "$seconds" "$@" > "$OUT/$name.log" 2>&1
  local code=$?
  [ $code -eq 0 ] || status=1
  note "$(printf '%-28s exit %3d  %4d s' "$name" "$code" $((SECONDS - start)))"
  return $code
}
TORCHRUN="python3 -m torch.distributed.run --master-port 29600"

if has check; then
  run quickstart_2 60 $TORCHRUN --nproc-per-node 2 python/examples/quickstart.py
  grep -h "bit for bit" "$OUT/quickstart_2.log"
  run c_example_2 40 $TORCHRUN --nproc-per-node 2 --no-python .gpubin/gpu_allreduce
  grep -h "differ from the simulator" "$OUT/c_example_2.log"
  for n in ${NPROC_LIST:-2 4}; do
    run "tp_block_$n" $((60 + 30 * n)) $TORCHRUN --nproc-per-node "$n" python/examples/tp_block_check.py --json "$OUT/tp_block_$n.json"
    grep -A 40 "^tp_block_check:" "$OUT/tp_block_$n.log" | head -30
  done
fi
if has bench; then
  run api_host_bench 30 .gpubin/api_host_bench
  cat "$OUT/api_host_bench.log"
  run bench_overhead 90 $TORCHRUN --nproc-per-node 1 python/examples/bench_overhead.py .gpubin/libexactcoll_host_loop.so
  grep -v "^\[" "$OUT/bench_overhead.log" | tail -6
  run cli_bench_fused 40 .gpubin/exactcoll_gpu bench --nproc 1 --op fused_rmsnorm --hidden 8192 --rows 1,256
  tail -25 "$OUT/cli_bench_fused.log"
fi
if has norm; then
  run verify_1 120 .gpubin/exactcoll_gpu verify --nproc 1
  grep -E "^verify|differ|MISMATCH" "$OUT/verify_1.log" | tail -4
  NORM_SHAPES="--hidden 2880,4096,5120,7168,8192 --rows 1,16,256,1024,4096"
  norm_table() { grep -E "^ *[0-9]+ +[0-9]+ " "$OUT/$1.log" | awk '{printf "%s/%s:%s ", $1, $2, $(NF-2)} END {print ""}'; }
  if [ -x .gpubin/exactcoll_gpu_old ]; then
    run norm_cli_old 60 .gpubin/exactcoll_gpu_old bench --nproc 1 --op fused_rmsnorm --algos norm $NORM_SHAPES
    echo "old:           $(norm_table norm_cli_old)"
  fi
  run norm_cli 60 .gpubin/exactcoll_gpu bench --nproc 1 --op fused_rmsnorm --algos norm $NORM_SHAPES
  echo "new:           $(norm_table norm_cli)"
  run bench_norm 420 python3 python/examples/bench_norm.py --json "$OUT/bench_norm.json"
  sed -n '/^dtype/,$p' "$OUT/bench_norm.log"
  if command -v ncu >/dev/null; then
    run ncu_norm 120 ncu --clock-control none --kernel-name regex:residual_rmsnorm_kernel --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats python3 -c "
import torch, exactcoll.torch as xt
x = torch.randn(4096, 8192, device='cuda').to(torch.bfloat16); r = torch.randn_like(x); w = torch.ones(8192, device='cuda', dtype=x.dtype)
for _ in range(5): xt.add_rms_norm(x, r, w)
torch.cuda.synchronize()"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Theoretical Occupancy|One or More|No Eligible|Stall" "$OUT/ncu_norm.log" | head -30
  fi
fi
if has profile; then
  # The norm kernel beside torch.compile's at shapes where torch.compile is faster (docs/benchmarks.md).
  SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats"
  for shape in "256 8192" "1024 7168"; do
    set -- $shape
    for kernel in residual_rmsnorm_kernel triton; do
      run "ncu_${kernel}_$1x$2" 120 ncu --clock-control none --kernel-name regex:$kernel --launch-skip 3 --launch-count 1 \
        $SECTIONS python3 python/examples/profile_norm.py --rows "$1" --hidden "$2"
      echo "== $kernel $1 x $2"
      grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size|Theoretical Occupancy|Eligible|Warp Cycles Per Issued|Dynamic Shared|Static Shared" \
        "$OUT/ncu_${kernel}_$1x$2.log" | head -16
    done
  done
fi
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
