#!/usr/bin/env bash
# One device call for push_one_shot (2026-11-21): GPU tests, verify on 2/3/4 GPUs (every algorithm,
# push_one_shot included), tune the all-reduce at <= 1 MiB on 2 and 4 GPUs into separate files,
# merge those rows into a copy of cuda_backend/tuning/sm90.tsv (the all-reduce rows <= 1 MiB of that
# world size replaced; larger sizes and other ops kept), then bench the all-reduce at rows 1..64
# (bf16, hidden 8192: 16 KiB .. 1 MiB) with one_shot, two_shot, push_one_shot, auto and NCCL in the
# same run, auto reading the merged table. The merged table is written only if verify passed.
# Binaries: .gpubin/push/exactcoll_gpu and .gpubin/push/collectives_gpu_test (bazel build
# //tools/gpu:exactcoll_gpu //tests/cuda:collectives_gpu_test, copied from bazel-bin/).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
BIN=${BIN:-.gpubin/push}
B=$BIN/exactcoll_gpu
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
status=0
verified=1
timeout 150 $BIN/collectives_gpu_test > "$OUT/test.log" 2>&1 || { status=1; verified=0; }
tail -3 "$OUT/test.log"
for n in 2 3 4; do
  timeout 150 $B verify --nproc "$n" --max-count 1048579 > "$OUT/verify_$n.log" 2>&1 || { status=1; verified=0; }
  echo "== verify $n GPUs (t=$(elapsed)s)"; tail -6 "$OUT/verify_$n.log"
done
TABLE=cuda_backend/tuning/sm90.tsv
if [ "$verified" = 1 ]; then
  cp cuda_backend/tuning/sm90.tsv "$OUT/sm90.tsv"
  for n in 2 4; do
    if [ "$(elapsed)" -gt "${TUNE_UNTIL_S:-220}" ]; then echo "tune $n skipped (time)"; continue; fi
    if timeout 120 $B tune --nproc "$n" --ops allreduce --max-bytes 1048576 --output "$OUT/tune_$n.tsv" >> "$OUT/tune.log" 2>&1; then
      python3 - "$OUT/sm90.tsv" "$OUT/tune_$n.tsv" "$n" <<'PY'
import sys
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
note = '# world size %s: allreduce rows <= %d bytes re-tuned with push_one_shot (2026-11-21, nvidia-h200-x4)\n' % (n, top)
head = [h for h in head if not h.startswith('# arch')] + [note] + [h for h in head if h.startswith('# arch')]
open(path + '.tmp', 'w').write(''.join(head + allrows))
import os; os.replace(path + '.tmp', path)
print('merged %d rows of world size %s into %s' % (len(new), n, path))
PY
      TABLE=$OUT/sm90.tsv
    else
      status=1; echo "tune $n failed"; tail -3 "$OUT/tune.log"
    fi
  done
  grep -E "push_one_shot|one_shot|two_shot" "$OUT/tune.log" | tail -40
fi
for n in 2 4; do
  timeout 150 $B bench --nproc "$n" --op allreduce --rows 1,2,4,8,16,32,64 \
    --algos one_shot,two_shot,push_one_shot,auto,nccl --table "$TABLE" --json "$OUT/bench_$n.json" \
    > "$OUT/bench_$n.log" 2>&1 || status=1
done
echo "== table used by auto: $TABLE (t=$(elapsed)s); verified=$verified"
for n in 2 4; do echo "== bench $n GPUs"; sed -n '/^# CUDA graph/,/^$/p' "$OUT/bench_$n.log"; grep -A 9 "summary" "$OUT/bench_$n.log"; done
exit $status
