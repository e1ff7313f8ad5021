#!/usr/bin/env bash
# One device call (4 GPUs, at most 350 s of commands: each step has a timeout, the benches start
# only before t = 260 s) for the fused op's push_one_stage: tests, verify, then the
# fused table re-measured with push_one_stage in it. No Bazel on the GPU machine: the binaries are
# built here and carried in .gpubin/fusedpush/ (ignored by git):
#   build: B=$(bazel info bazel-bin)  # or the --output_base's bazel-out/k8-opt/bin
#          bazel build //tools/gpu:exactcoll_gpu //tests/cuda_backend/fused:fused_gpu_test && mkdir -p .gpubin/fusedpush &&
#          cp $B/tools/gpu/exactcoll_gpu $B/tests/cuda_backend/fused/fused_gpu_test .gpubin/fusedpush/
#   usage: OUT=... tools/gpu/fused/device_run_push_fused.sh   (carry .gpubin/fusedpush)
# Steps:
#   1. fused_gpu_test (2..4 GPUs: every fused algorithm against the contract; push calls back to back
#      with drifting ranks, eager and CUDA graph);
#   2. verify --ops fused_rmsnorm on 2, 3 and 4 GPUs (default sizes, dtypes and algorithms,
#      push_one_stage included);
#   3. bench --op fused_rmsnorm --write-table on 2 and 4 GPUs, bf16, H 4096 and 8192, rows 1..1024,
#      every column (push_one_stage, the split paths, NCCL); then, only if 1-3 were clean, the two
#      measured tables merged into a copy of cuda_backend/fused/tuning/fused_sm90.tsv (the rows of
#      those world sizes, row sizes and row counts replaced; the provisional note dropped);
#   4. a short table of the bench, last.
# Files in $OUT (7): test.log, verify.log, bench_2.log, bench_4.log, fused_table_2.tsv,
# fused_table_4.tsv, fused_sm90.tsv (the merged table; absent when something failed).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-.gpubin/fusedpush}
B=$BIN/exactcoll_gpu
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
status=0
clean=1
nvidia-smi -L | head -4
# 1. The fused GPU test.
{ date -u; nvidia-smi -L; } > "$OUT/test.log" 2>&1
if timeout 100 "$BIN/fused_gpu_test" >> "$OUT/test.log" 2>&1; then
  echo "PASS fused_gpu_test (t=$(elapsed)s)"
else
  echo "FAIL fused_gpu_test (exit $?)"; status=1; clean=0
fi
grep -E "^\[ +(OK|FAILED) +\]|elements differ" "$OUT/test.log" | head -12
# 2. verify on 2, 3, 4 GPUs.
for n in 2 3 4; do
  echo "== verify --nproc $n" >> "$OUT/verify.log"
  if timeout 60 "$B" verify --ops fused_rmsnorm --nproc "$n" --seed $((20261121 + n)) >> "$OUT/verify.log" 2>&1; then
    echo "PASS verify fused_rmsnorm $n GPUs (t=$(elapsed)s)"
  else
    echo "FAIL verify fused_rmsnorm $n GPUs (exit $?)"; status=1; clean=0
  fi
done
grep -E "^verify fused_rmsnorm|MISMATCH|never arrived" "$OUT/verify.log" | head -8
grep -E "push_one_stage" "$OUT/verify.log" | head -4
# 3. Bench with a freshly measured table.
for n in 2 4; do
  if [ "$(elapsed)" -gt "${BENCH_UNTIL_S:-260}" ]; then echo "bench $n skipped (t=$(elapsed)s)"; status=1; clean=0; continue; fi
  if timeout 90 "$B" bench --op fused_rmsnorm --nproc "$n" --hidden 4096,8192 --rows 1,2,4,8,16,32,64,128,256,512,1024 \
      --no-eager --no-bound --write-table "$OUT/fused_table_$n.tsv" > "$OUT/bench_$n.log" 2>&1; then
    echo "PASS bench $n GPUs (#wrong 0, t=$(elapsed)s)"
  else
    echo "FAIL bench $n GPUs (exit $?)"; status=1; clean=0; tail -3 "$OUT/bench_$n.log"
  fi
done
if [ "$clean" = 1 ]; then
  python3 - cuda_backend/fused/tuning/fused_sm90.tsv "$OUT/fused_sm90.tsv" "$OUT/fused_table_2.tsv" "$OUT/fused_table_4.tsv" <<'PY'
import sys
base, out, news = sys.argv[1], sys.argv[2], sys.argv[3:]
def split(path):
    head, rows = [], []
    for line in open(path):
        (head if line.startswith('#') or not line.strip() else rows).append(line)
    return head, rows
head, rows = split(base)
key = lambda r: tuple(r.split('\t')[1:4])  # world_size, row_bytes, rows
new_rows = [r for p in news for r in split(p)[1]]
measured = {key(r) for r in new_rows}
rows = [r for r in rows if key(r) not in measured] + new_rows
rows.sort(key=lambda r: (r.split('\t')[0], int(r.split('\t')[1]), int(r.split('\t')[2]), int(r.split('\t')[3]), r.split('\t')[4]))
head = [h for h in head if not any(w in h for w in ('PROVISIONAL', 'at their point minus', 'this file (2026-11-21', 're-measured with push_one_stage'))]
note = '# World sizes %s, bf16 H 4096 and 8192, rows 1..1024: re-measured with push_one_stage and programmatic dependent launch by tools/gpu/fused/device_run_push_fused.sh.\n' % ' and '.join(sorted({k[0] for k in measured}))
head = [h for h in head if not h.startswith('# arch')] + [note] + [h for h in head if h.startswith('# arch')]
open(out, 'w').write(''.join(head + rows))
print('merged %d measured rows into %s' % (len(new_rows), out))
PY
else
  echo "no merged table: something above failed"
fi
# 4. The short table: what auto ran against the best split, per point.
echo "== t=$(elapsed)s; status $status"
for n in 2 4; do
  f=$OUT/bench_$n.log
  [ -f "$f" ] || continue
  echo "== $n GPUs, bf16, CUDA graph: auto (measured with the new table) against the splits"
  sed -n '/^# summary/,$p' "$f"
done
exit $status
