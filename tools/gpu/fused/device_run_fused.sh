#!/usr/bin/env bash
# One device call for the fused all-reduce + residual + RMSNorm (no Bazel on the GPU machine):
# verify on 2, 3 and 4 GPUs (+ a large-rows check), then bench with a freshly measured auto table
# on 2 and 4 GPUs. Binaries built here and carried in .gpubin/fused/ (exactcoll, libpng16.so.16).
# Logs, CSVs and the measured tables go to $OUT; the bench tables and verify totals print last.
#   build: bazel build //tools:exactcoll && mkdir -p .gpubin/fused &&
#          cp bazel-bin/tools/exactcoll /lib/x86_64-linux-gnu/libpng16.so.16 .gpubin/fused/
#   usage: tools/gpu/fused/device_run_fused.sh [phases]   phases: verify,large,bench (default all)
set -uo pipefail
PHASES=${1:-verify,large,bench}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
G=$PWD/.gpubin/fused
export LD_LIBRARY_PATH=$G${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
B=$G/exactcoll
has() { [[ ",$PHASES," == *",$1,"* ]]; }
status=0
{ date -u; nvidia-smi -L; nproc; } > "$OUT/env.log" 2>&1
if has verify; then
  for n in ${VERIFY_NPROC:-2 3 4}; do
    timeout "${VERIFY_TIMEOUT:-55}" "$B" verify --ops fused_rmsnorm --nproc "$n" --seed $((20261121 + n)) \
      > "$OUT/verify_fused_$n.log" 2>&1 || { echo "verify $n: exit $?"; status=1; }
  done
fi
if has large; then
  timeout "${LARGE_TIMEOUT:-35}" "$B" verify --ops fused_rmsnorm --nproc 4 --dtypes bf16 --hidden 2880,8192 --rows 4096 \
    --max-elements 40000000 --seed 4096 > "$OUT/verify_fused_large.log" 2>&1 || { echo "verify large: exit $?"; status=1; }
fi
if has bench; then
  for n in ${BENCH_NPROC:-2 4}; do
    timeout "${BENCH_TIMEOUT:-95}" "$B" bench --op fused_rmsnorm --nproc "$n" --write-table "$OUT/fused_table_$n.tsv" \
      --no-eager --no-bound --csv "$OUT/bench_fused_$n.csv" > "$OUT/bench_fused_$n.log" 2>&1 \
      || { echo "bench $n: exit $?"; status=1; }
  done
fi
head -6 "$OUT/env.log"
for f in "$OUT"/verify_fused_*.log; do
  [ -f "$f" ] || continue
  grep -h -E "MISMATCH|never arrived|error|failed" "$f" | head -3
  grep -h "^verify fused_rmsnorm" "$f" || { echo "$f: no summary"; tail -3 "$f"; }
done
for n in ${BENCH_NPROC:-2 4}; do
  f=$OUT/bench_fused_$n.log
  [ -f "$f" ] || continue
  sed -n '/^# summary/,$p' "$f" | cut -c1-150
  grep -q "^# summary" "$f" || tail -5 "$f"
done
exit $status
