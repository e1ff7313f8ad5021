#!/usr/bin/env bash
# One device call for the all-reduce (first used as device_run_push2.sh at commit 6e372d0), binaries
# from $BIN (default .gpubin/allreduce: exactcoll_gpu, collectives_gpu_test, exactcoll_sim; bazel
# build //tools/gpu:exactcoll_gpu //tests/cuda_backend:collectives_gpu_test //tools/sim:exactcoll_sim, copied
# from bazel-bin/):
#   1. GPU tests, then verify on 2, 3, 4 GPUs (every algorithm; default ops, fused included), and on
#      4 GPUs with 1 MiB buffers (chunked all-reduce and reduce_scatter, all-gather's NCCL fallback);
#      one log;
#   2. only if 1 passed: tune the all-reduce from TUNE_MIN_BYTES to TUNE_MAX_BYTES (default 1 KiB ..
#      1 MiB) on 2 and 4 GPUs and merge those rows into a copy of cuda_backend/tuning/sm90.tsv
#      ($OUT/sm90.tsv): rows of that world size within the tuned range are replaced;
#   3. bench the all-reduce at BENCH_ROWS (default 1..64; bf16, hidden 8192: 16 KiB .. 1 MiB) with
#      BENCH_ALGOS (default every IPC algorithm, auto and NCCL) in the same run;
#   4. sanity checks, printed as PASS/FAIL lines: gpu fused_rmsnorm's two sha256s (4 GPUs bf16
#      7 x 4096, seed 3, specials) and device_run.sh's cli phase (gpu vs sim sha256, .npy bytes,
#      nccl label, bad input), plus gpu allreduce --algo push_two_shot against sim;
#   5. a short table of the bench medians.
# VERIFY_MAX_COUNT (default 1048579) and VERIFY_TIMEOUT_S (100 s per world size) bound step 1's
# verify (4194319 adds 8 MiB of bf16 per rank, where auto runs push_two_shot on 4 GPUs).
# Time guards (seconds since the start): TUNE_UNTIL_S (200), BENCH_UNTIL_S (300). TUNE_EXTRA and
# BENCH_EXTRA are appended to the tune and bench command lines (e.g. "--buffer-mib 512"). MACHINE (e.g.
# nvidia-h100-x4) names the machine in the tuned rows' measured_on column.
# At most 6 files under $OUT (test_verify.log, tune.log, sm90.tsv, bench.log, checks.log, cli.log).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-.gpubin/allreduce}
TUNE_MIN_BYTES=${TUNE_MIN_BYTES:-1024}
TUNE_MAX_BYTES=${TUNE_MAX_BYTES:-1048576}
BENCH_ROWS=${BENCH_ROWS:-1,2,4,8,16,32,64}
BENCH_ALGOS=${BENCH_ALGOS:-one_shot,two_shot,push_one_shot,push_two_shot,auto,nccl}
B=$BIN/exactcoll_gpu
S=$BIN/exactcoll_sim
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
status=0
verified=1
nvidia-smi -L | head -4
# 1. Tests and verify.
timeout 120 $BIN/collectives_gpu_test > "$OUT/test_verify.log" 2>&1 || { status=1; verified=0; echo "collectives_gpu_test FAILED"; }
tail -3 "$OUT/test_verify.log"
for n in 2 3 4; do
  echo "== verify --nproc $n" >> "$OUT/test_verify.log"
  timeout "${VERIFY_TIMEOUT_S:-100}" $B verify --nproc "$n" --max-count "${VERIFY_MAX_COUNT:-1048579}" >> "$OUT/test_verify.log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then echo "PASS verify $n GPUs (exit 0, t=$(elapsed)s)"; else echo "FAIL verify $n GPUs (exit $rc)"; status=1; verified=0; fi
done
# Messages beyond the buffers: 1 MiB buffers make the larger all-reduces run in chunks, the larger
# reduce_scatters in staged chunks, and the larger all-gathers fall back to NCCL (a copy: exact).
echo "== verify --nproc 4 --buffer-mib 1" >> "$OUT/test_verify.log"
timeout 120 $B verify --nproc 4 --buffer-mib 1 --ops allreduce,reduce_scatter,allgather --max-count 1048579 >> "$OUT/test_verify.log" 2>&1
rc=$?
if [ $rc = 0 ]; then echo "PASS verify 4 GPUs, 1 MiB buffers (exit 0, t=$(elapsed)s)"; else echo "FAIL verify 4 GPUs, 1 MiB buffers (exit $rc)"; status=1; verified=0; fi
grep -E "^verify|MISMATCH|never arrived|differ" "$OUT/test_verify.log" | tail -12
# 2. Tune (only after a clean verify).
TABLE=cuda_backend/tuning/sm90.tsv
if [ "$verified" = 1 ]; then
  cp cuda_backend/tuning/sm90.tsv "$OUT/sm90.tsv"
  for n in 2 4; do
    if [ "$(elapsed)" -gt "${TUNE_UNTIL_S:-200}" ]; then echo "tune $n skipped (time)"; continue; fi
    # tune merges into the copy itself: it replaces only the rows of its world size, op and size
    # range, keeps the header comments, and labels each row measured_on (MACHINE, e.g. the lent
    # kind's name; default: the GPU's name and world size) and the date.
    if timeout 150 $B tune --nproc "$n" --ops allreduce --min-bytes "$TUNE_MIN_BYTES" --max-bytes "$TUNE_MAX_BYTES" \
        --output "$OUT/sm90.tsv" ${MACHINE:+--machine "$MACHINE"} ${TUNE_EXTRA:-} >> "$OUT/tune.log" 2>&1; then
      TABLE=$OUT/sm90.tsv
    else
      status=1; echo "tune $n failed"; tail -3 "$OUT/tune.log"
    fi
  done
fi
# 3. Bench, NCCL in the same run.
for n in 2 4; do
  if [ "$(elapsed)" -gt "${BENCH_UNTIL_S:-300}" ]; then echo "bench $n skipped (time)"; status=1; continue; fi
  echo "== bench --nproc $n" >> "$OUT/bench.log"
  timeout 150 $B bench --nproc "$n" --op allreduce --rows "$BENCH_ROWS" \
    --algos "$BENCH_ALGOS" --table "$TABLE" ${BENCH_EXTRA:-} >> "$OUT/bench.log" 2>&1 || { status=1; echo "bench $n failed"; }
done
echo "== table used by auto: $TABLE (t=$(elapsed)s); verified=$verified"
# 4. Sanity checks.
{
  line=$(timeout 60 $B gpu fused_rmsnorm --nproc 4 --dtype bf16 --rows 7 --hidden 4096 --seed 3 --specials \
    --output "$WORK/fo.npy" --residual-output "$WORK/fro.npy" 2>&1 | tee -a "$OUT/cli.log" | tail -1)
  if [[ "$line" == *"9e298aef1d11c6881da2dec1848ced13465900a4ddcd94037a9cf65e39f8c095"* &&
        "$line" == *"827af3bea99c6fba1067d289de2362eae05ab67bff71622a0526a9b3a266d2d1"* ]]; then
    echo "PASS gpu fused_rmsnorm 4 bf16 7x4096 seed 3 --specials: out and residual_out sha256 as expected"
  else
    echo "FAIL gpu fused_rmsnorm 4 bf16: $line"; status=1
  fi
  . tools/gpu/cli_checks.sh
  cli_checks "$WORK"
  same allreduce 4 bf16 "" -- --count 262147 --seed 12 --algo push_two_shot
  same allreduce 3 bf16 "--registered --graph" -- --count 100003 --seed 13 --algo push_two_shot
  echo "status after checks: $status"
} 2>&1 | tee "$OUT/checks.log"
grep -q "^FAIL" "$OUT/checks.log" && status=1
# 5. Short table: the CUDA-graph sections and summaries of the bench.
echo "== t=$(elapsed)s"
for n in 2 4; do
  echo "== bench $n GPUs (CUDA graph)"
  sed -n "/^== bench --nproc $n/,/^== bench --nproc/p" "$OUT/bench.log" | sed -n '/^# CUDA graph/,/^$/p'
  sed -n "/^== bench --nproc $n/,/^== bench --nproc/p" "$OUT/bench.log" | grep -A 9 "summary"
done
rm -rf "$WORK"
echo "final status $status"
exit $status
