#!/usr/bin/env bash
# One device call for the all-gather + matmul overlap work (no Bazel there): environment check,
# `exactcoll bench-overlap` on N GPUs (checks, then times), and torch's baselines in the same
# call. Binaries built here and carried in .gpubin/ (exactcoll plus the shared libraries it loads
# that the machine may lack). Logs and JSON go to $OUT; the short tables are printed last.
#   build first: bazel build //tools:exactcoll && mkdir -p .gpubin/overlap && cp bazel-bin/tools/exactcoll .gpubin/overlap/ &&
#                cp /lib/x86_64-linux-gnu/libpng16.so.16 .gpubin/overlap/
#   usage: tools/overlap/device_run.sh [nproc]   (default 4)
set -uo pipefail
NPROC=${1:-4}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
LIBS=$PWD/.gpubin/overlap
# cuBLASLt 13: the toolkit's, else the pip wheel's.
for d in /usr/local/cuda/lib64 "$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)"; do
  if [ -n "$d" ] && [ -e "$d/libcublasLt.so.13" ]; then LIBS=$LIBS:$d; break; fi
done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{ date -u; nvidia-smi -L; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ls /usr/local/cuda/lib64 2>/dev/null | grep -i cublas;
  ldd .gpubin/overlap/exactcoll | grep -i "not found"; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
# SM clocks, power and clock-event reasons every 250 ms while the benchmarks run (a GPU under
# sustained product load clocks down; this shows by how much).
( timeout 280 nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 250 ||
  timeout 280 nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 250 ) \
  > "$OUT/clocks.csv" 2>&1 &
status=0
timeout 170 .gpubin/overlap/exactcoll bench-overlap --nproc "$NPROC" --json "$OUT/bench_overlap.json" > "$OUT/bench_overlap.log" 2>&1 || status=$?
echo "bench-overlap exit $status"
if [ "${TORCH_BASELINE:-1}" = 1 ]; then
  timeout 90 torchrun --nproc-per-node "$NPROC" tools/overlap/torch_baseline.py > "$OUT/torch_baseline.log" 2>&1 ||
    echo "torch baseline exit $?"
fi
grep -E "^  # |FAILED|error|never" "$OUT/bench_overlap.log" | head -40
# Per GPU: SM clock range (MHz), peak power (W), clock-event reasons seen.
awk -F', ' '{ g=$2; c=$3+0; p=$4+0; if (!(g in lo) || c < lo[g]) lo[g]=c; if (c > hi[g]) hi[g]=c; if (p > pw[g]) pw[g]=p; r[g]=r[g] " " $6 }
  END { for (g in lo) { split(r[g], a, " "); delete seen; s=""; for (i in a) if (!(a[i] in seen)) { seen[a[i]]=1; s=s " " a[i] }
        printf "clocks gpu %s: sm %d..%d MHz, peak %.0f W, reasons%s\n", g, lo[g], hi[g], pw[g], s } }' "$OUT/clocks.csv" 2>/dev/null | head -8
sed -n '/^# summary/,$p' "$OUT/bench_overlap.log"
sed -n '/^# torch/,$p' "$OUT/torch_baseline.log" 2>/dev/null
grep -E "FAILED" "$OUT/torch_baseline.log" 2>/dev/null | head -5
exit $status
