#!/usr/bin/env bash
# One call on a lent one-GPU machine (no Bazel there) for exactcoll.linear (issue 25, items 3 and 5):
#   1. python/tests/gpu_invariant_matmul_check.py: the pinned product's bits against M, N, batch,
#      offsets and leaves; the tree layers at TP 1, 2, 4, 8 on one GPU; timings against torch;
#   2. python/examples/tree_llama_check.py at TP 1 (with the Hugging Face reference), then TP 2 and
#      TP 4 with the ranks sharing the GPU and --reduce gather (all_gather + torch tree adds: the
#      tree contract's bits, for a library whose Communicator has no tree contract yet), then
#      --compare;
#   3. if time is left, the product check with the next configuration (candidate 1, --quick).
#   usage: DIR=<folder holding the files below> $DIR/gpu_linear_device_run.sh
#   build first: bazel build //python:wheel; copy bazel-bin/python/exactcoll-*.whl,
#   python/tests/gpu_invariant_matmul_check.py, python/examples/tree_llama_check.py and this script
#   into one ignored folder of the checkout that travels (carry it).
set -uo pipefail
DIR=${DIR:-$(dirname "$0")}
OUT=${OUT:-/tmp/out}
LOGS=$(mktemp -d)  # every log, back as one $OUT/logs.tgz (the device tool returns only a few files)
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$DIR"/exactcoll-*.whl && export PYTHONPATH=/tmp/site
echo "== $(date -u +%FT%TZ) $(nvidia-smi -L | head -1) driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader)"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
declare -a rows
step() {  # step NAME LIMIT COMMAND...
  local name=$1 limit=$2
  shift 2
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local code=$?
  rows+=("$(printf '%-22s %s (%ss)' "$name" "$([ $code -eq 0 ] && echo pass || echo "FAIL (exit $code)")" "$(($(date +%s) - start))")")
}
step matmul_check 90 python3 "$DIR/gpu_invariant_matmul_check.py" --json "$OUT/matmul_check.json"
grep -E "pinned|candidate|FAIL|Error|accuracy|torch.matmul|^==|^ +[0-9]+ +[0-9]+ +[0-9]+ " "$LOGS/matmul_check.log" | head -90
D=/tmp/xc_tree
step llama_tp1 55 torchrun --nproc-per-node 1 "$DIR/tree_llama_check.py" --out $D/tp1 --hf-reference --softmax-check
step llama_tp2 45 torchrun --nproc-per-node 2 "$DIR/tree_llama_check.py" --out $D/tp2 --reduce gather
step llama_tp4 55 torchrun --nproc-per-node 4 "$DIR/tree_llama_check.py" --out $D/tp4 --reduce gather
step llama_compare 15 python3 "$DIR/tree_llama_check.py" --compare $D/tp1 $D/tp2 $D/tp4
for t in 1 2 4; do grep -h "tree_llama_check\|hf_reference\|softmax_check\|Error" "$LOGS/llama_tp$t.log" | grep -v "^\[rank[1-9]" | head -6; done
cat "$LOGS/llama_compare.log"
cp $D/tp1/summary.json "$OUT/llama_tp1_summary.json" 2>/dev/null
for t in 1 2 4; do cp $D/tp$t/summary.json "$LOGS/llama_tp${t}_summary.json" 2>/dev/null; done
if [ $(($(date +%s) - start)) -lt "${SWEEP_BEFORE_S:-200}" ]; then
  export EXACTCOLL_INVARIANT_MATMUL_CANDIDATE=1
  step matmul_candidate1 50 python3 "$DIR/gpu_invariant_matmul_check.py" --quick
  unset EXACTCOLL_INVARIANT_MATMUL_CANDIDATE
  grep -E "pinned|FAIL|Error|^==|^ +[0-9]+ +[0-9]+ +[0-9]+ " "$LOGS/matmul_candidate1.log" | head -30
fi
tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
echo "== gpu_linear_device_run: $(($(date +%s) - start)) s"
printf '%s\n' "${rows[@]}"
