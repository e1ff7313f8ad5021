#!/usr/bin/env bash
# One device call for push_two_shot (2026-11-21), binaries from .gpubin/push2 (exactcoll_gpu,
# collectives_gpu_test, exactcoll_sim; bazel build //tools/gpu:exactcoll_gpu
# //tests/cuda:collectives_gpu_test //tools/sim:exactcoll_sim, copied from bazel-bin/):
#   1. GPU tests, then verify on 2, 3, 4 GPUs (every algorithm, push_two_shot included; default ops,
#      fused included), one log;
#   2. only if 1 passed: tune the all-reduce at <= 1 MiB on 2 and 4 GPUs and merge those rows into a
#      copy of cuda_backend/tuning/sm90.tsv ($OUT/sm90.tsv);
#   3. bench the all-reduce at rows 1..64 (bf16, hidden 8192: 16 KiB .. 1 MiB) with one_shot,
#      two_shot, push_one_shot, push_two_shot, auto and NCCL in the same run;
#   4. sanity checks, printed as PASS/FAIL lines: gpu fused_rmsnorm's two sha256s (4 GPUs bf16
#      7 x 4096, seed 3, specials) and device_run.sh's cli phase (gpu vs sim sha256, .npy bytes,
#      nccl label, bad input), plus gpu allreduce --algo push_two_shot against sim;
#   5. a short table of the bench medians.
# At most 6 files under $OUT (test_verify.log, tune.log, sm90.tsv, bench.log, checks.log, cli.log).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-.gpubin/push2}
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
  timeout 100 $B verify --nproc "$n" --max-count 1048579 >> "$OUT/test_verify.log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then echo "PASS verify $n GPUs (exit 0, t=$(elapsed)s)"; else echo "FAIL verify $n GPUs (exit $rc)"; status=1; verified=0; fi
done
grep -E "^verify|MISMATCH|never arrived|differ" "$OUT/test_verify.log" | tail -12
# 2. Tune (only after a clean verify).
TABLE=cuda_backend/tuning/sm90.tsv
if [ "$verified" = 1 ]; then
  cp cuda_backend/tuning/sm90.tsv "$OUT/sm90.tsv"
  for n in 2 4; do
    if [ "$(elapsed)" -gt "${TUNE_UNTIL_S:-200}" ]; then echo "tune $n skipped (time)"; continue; fi
    if timeout 90 $B tune --nproc "$n" --ops allreduce --max-bytes 1048576 --output "$WORK/tune_$n.tsv" >> "$OUT/tune.log" 2>&1; then
      python3 - "$OUT/sm90.tsv" "$WORK/tune_$n.tsv" "$n" <<'PY'
import os, sys
path, new_path, n = sys.argv[1], sys.argv[2], sys.argv[3]
def split(p):
    head, rows = [], []
    for line in open(p):
        (head if line.startswith('#') or not line.strip() else rows).append(line)
    return head, rows
head, rows = split(path)
_, new = split(new_path)
new = [r for r in new if r.split('\t')[1] == n and r.split('\t')[2] == 'allreduce']
top = max(int(r.split('\t')[3]) for r in new)
keep = [r for r in rows if not (r.split('\t')[1] == n and r.split('\t')[2] == 'allreduce' and int(r.split('\t')[3]) <= top)]
order = {'allreduce': 0, 'reduce_scatter': 1, 'allgather': 2}
allrows = sorted(keep + new, key=lambda r: (r.split('\t')[0], int(r.split('\t')[1]), order[r.split('\t')[2]], int(r.split('\t')[3])))
note = '# world size %s: allreduce rows <= %d bytes re-tuned with push_two_shot (2026-11-21, nvidia-h200-x4)\n' % (n, top)
head = [h for h in head if not h.startswith('# arch')] + [note] + [h for h in head if h.startswith('# arch')]
open(path + '.tmp', 'w').write(''.join(head + allrows))
os.replace(path + '.tmp', path)
print('merged %d rows of world size %s into %s' % (len(new), n, path))
PY
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
  timeout 90 $B bench --nproc "$n" --op allreduce --rows 1,2,4,8,16,32,64 \
    --algos one_shot,two_shot,push_one_shot,push_two_shot,auto,nccl --table "$TABLE" >> "$OUT/bench.log" 2>&1 || { status=1; echo "bench $n failed"; }
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
  same() {  # op ranks dtype gpu-only-flags -- shared flags...
    local op=$1 n=$2 d=$3 extra=$4; shift 5
    local a b
    a=$($S sim "$op" --ranks "$n" --dtype "$d" "$@" 2>&1 | grep -o 'sha256 [0-9a-f]*')
    b=$(timeout 60 $B gpu "$op" --nproc "$n" --dtype "$d" $extra "$@" 2>&1 | tee -a "$OUT/cli.log" | grep -o 'sha256 [0-9a-f]*')
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS gpu $op $n $d $extra $* ($a)"; else echo "FAIL gpu $op $n $d $extra $*: sim '$a' gpu '$b'"; status=1; fi
  }
  same allreduce 2 bf16 "" -- --count 100003 --seed 5
  same allreduce 4 fp16 "" -- --count 777 --seed 6 --algo two_shot
  same allreduce 3 fp32 "--registered --graph" -- --count 65537 --seed 11
  same allreduce 4 bf16 "" -- --count 262147 --seed 12 --algo push_two_shot
  same allreduce 3 bf16 "--registered --graph" -- --count 100003 --seed 13 --algo push_two_shot
  same reduce_scatter 3 fp32 "" -- --count 3003 --seed 7
  same allgather 4 bf16 "--registered --graph" -- --count 4097 --seed 8
  $S sim allgather --ranks 2 --dtype bf16 --count 5000 --seed 9 --output "$WORK/x.npy" > /dev/null
  $S sim allreduce --ranks 2 --dtype bf16 --input "$WORK/x.npy" --output "$WORK/s.npy" > /dev/null
  timeout 60 $B gpu allreduce --nproc 2 --dtype bf16 --input "$WORK/x.npy" --output "$WORK/g.npy" >> "$OUT/cli.log" 2>&1
  if cmp "$WORK/s.npy" "$WORK/g.npy"; then echo "PASS gpu --input/--output: the .npy equals sim's byte for byte"; else echo "FAIL npy"; status=1; fi
  timeout 60 $B gpu allreduce --nproc 4 --dtype bf16 --count 1000 --algo nccl 2>&1 | tee -a "$OUT/cli.log" | grep -q "NOT bit-exact" \
    && echo "PASS --algo nccl is labelled not bit-exact" || { echo "FAIL nccl label"; status=1; }
  timeout 60 $B gpu allreduce --nproc 3 --dtype bf16 --input "$WORK/x.npy" --output "$WORK/bad.npy" >> "$OUT/cli.log" 2>&1
  rc=$?
  if [ $rc = 2 ] && [ ! -e "$WORK/bad.npy" ]; then echo "PASS a [2, …] input on 3 ranks: exit 2, no output"; else echo "FAIL bad input rc=$rc"; status=1; fi
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
