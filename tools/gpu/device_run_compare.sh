#!/usr/bin/env bash
# One call on a lent multi-GPU machine (no Bazel there) for the comparison users run (issue 26, item
# 6): python/examples/compare_collectives.py under torchrun on N GPUs for each N in $NPROC: NCCL, NCCL
# as vLLM's batch-invariant mode pins it (a child process per rank), torch symm_mem one_shot and
# two_shot, exactcoll (auto with the graph in place and staged, lamport, registered), the fused op
# against NCCL + add + rms_norm, and the bits (the script exits 1 if exactcoll differs anywhere).
#   usage: tools/gpu/device_run_compare.sh [phases]   phases: compare (default: every size) or quick
#   (--quick: fewer sizes, the same bits). NPROC (default "4 2"): the GPU counts, each a torchrun job
#   on GPUs 0..N-1 (a count above the GPUs here is skipped); JOB_TIMEOUT (default 280 s) bounds each
#   job, CHILD_TIMEOUT (default 150 s) the pinned NCCL child; COMPARE_FLAGS: more flags for the
#   script (e.g. --no-pinned).
#   build first: bazel build //python:wheel; copy bazel-bin/python/exactcoll-*.whl into .gpubin/.
# Logs and each job's results.json go to $OUT/logs.tgz, the JSON also to $OUT/compare_N.json; the
# tables are printed last.
set -uo pipefail
PHASES=${1:-compare}
NPROC=${NPROC:-4 2}
OUT=${OUT:-/tmp/out}
LOGS=$(mktemp -d)
RUN_TAIL_LINES=2
source tools/gpu/device_phases.sh  # has, run, record; the environment (NCCL_NVLS_ENABLE=0) and the wheel
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast for torch either
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$LOGS/gpus.txt" 2>&1
here=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
flags=(--child-timeout "${CHILD_TIMEOUT:-150}")
has quick && flags+=(--quick)
for n in $NPROC; do
  if [ "$n" -gt "$here" ]; then
    record "compare_$n" "skipped ($here GPUs here)"
    continue
  fi
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) run "compare_$n" "${JOB_TIMEOUT:-280}" torchrun --nproc-per-node "$n" \
    python/examples/compare_collectives.py --out "$LOGS/compare_$n" "${flags[@]}" ${COMPARE_FLAGS:-}
  [ -f "$LOGS/compare_$n/results.json" ] && cp "$LOGS/compare_$n/results.json" "$OUT/compare_$n.json"
done
tar -czf "$OUT/logs.tgz" -C "$LOGS" .
echo "== device_run_compare: $(date -u +%FT%TZ), $(nvidia-smi -L | head -1 | cut -c1-40), $here GPUs"
for n in $NPROC; do
  [ -f "$LOGS/compare_$n.log" ] && sed -n '/^compare_collectives results:/,$p' "$LOGS/compare_$n.log"
done
printf '%s\n' "${rows[@]}"
