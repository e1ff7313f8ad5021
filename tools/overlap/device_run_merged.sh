#!/usr/bin/env bash
# One device call for issue 7's product groupings (no Bazel there): `exactcoll bench-overlap` on N
# GPUs, check and ag sections only (the fsdp section does not depend on the grouping), every
# AG->matmul shape with per_shard, merged and pairs side by side in the same interleaved rounds, bf16
# and fp16. The binary is the full CLI (//tools:exactcoll links bench-overlap; exactcoll_gpu does
# not), carried in .gpubin/overlap2/ with the libpng it loads. Writes env.log, clocks.csv,
# bench_overlap.log and bench_overlap.json under $OUT; prints the AG rows and the targets last.
#   build first: bazel build //tools:exactcoll && mkdir -p .gpubin/overlap2 &&
#                cp bazel-bin/tools/exactcoll /lib/x86_64-linux-gnu/libpng16.so.16 .gpubin/overlap2/
#   usage: tools/overlap/device_run_merged.sh [nproc]   (default 4; PRODUCTS=both for per_shard,merged only)
# Wall time: the earlier full bench-overlap (with fsdp) finished within its 170 s bound; this one
# runs 3 pipelines per shape but no fsdp section, bounded at 240 s.
set -uo pipefail
NPROC=${1:-4}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
B=.gpubin/overlap2/exactcoll
LIBS=$PWD/.gpubin/overlap2
# cuBLASLt 13: the toolkit's, else the pip wheel's.
for d in /usr/local/cuda/lib64 "$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null)"; do
  if [ -n "$d" ] && [ -e "$d/libcublasLt.so.13" ]; then LIBS=$LIBS:$d; break; fi
done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{ date -u; nvidia-smi -L; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd $B | grep -i "not found"; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
# SM clocks and power every 250 ms while the benchmark runs (the power cap moves the timings).
( timeout 250 nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 250 ) > "$OUT/clocks.csv" 2>&1 &
status=0
start=$(date +%s)
timeout 240 $B bench-overlap --nproc "$NPROC" --sections check,ag --products "${PRODUCTS:-all}" \
  --json "$OUT/bench_overlap.json" > "$OUT/bench_overlap.log" 2>&1 || status=$?
echo "bench-overlap exit $status after $(( $(date +%s) - start )) s"
grep -E "FAILED|rror|never|OVER" "$OUT/bench_overlap.log" | head -20
grep -E "vs C of" "$OUT/bench_overlap.log" | head -8
awk -F', ' '{ g=$2; c=$3+0; p=$4+0; if (!(g in lo) || c < lo[g]) lo[g]=c; if (c > hi[g]) hi[g]=c; if (p > pw[g]) pw[g]=p }
  END { for (g in lo) printf "clocks gpu %s: sm %d..%d MHz, peak %.0f W\n", g, lo[g], hi[g], pw[g] }' "$OUT/clocks.csv" 2>/dev/null | head -8
# The short table: the ag rows of the summary, then the targets and the checks' verdict.
grep -E "^\| (section|ag) |^\|---" "$OUT/bench_overlap.log"
grep -E "^# (AG->matmul|checks)" "$OUT/bench_overlap.log"
exit $status
