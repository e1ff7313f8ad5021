#!/usr/bin/env bash
# One call on a lent 4-GPU machine (no Bazel there) for the tree contract (issue 25): verify on 4
# GPUs under each contract the CLI takes, python/examples/bench_tree.py on 4 and 2 GPUs (tree vs
# canonical per algorithm, NCCL, SGLang's all_gather + tree of adds, every bit against torch's own
# tree), tp_block_check.py on 4 GPUs, and, when present, the TP-invariant Llama check at TP 1, 2, 4.
#   usage: tools/gpu/device_run_tree.sh [phases]   phases: verify,verify_tree,bench4,bench2,tp,matmul,
#   llama,llama_bench4,llama_bench2 (default verify,bench4,bench2,tp); matmul: the invariant product
#   on one GPU (python/tests/gpu_invariant_matmul_check.py; then the cuBLASLt experiment, --quick;
#   then every tile variant's and the leaf-pair product's bits: gpu_tile_variants_check.py [--mid],
#   gpu_pair_products_check.py);
#   llama: python/examples/tree_llama_check.py at TP 1, 2 and 4, then --compare; llama_benchN: its
#   --bench (tree row-parallel linear + tree all-reduce vs F.linear + NCCL) on N GPUs.
#   build first: bazel build //tools:exactcoll //python:wheel; copy bazel-bin/tools/exactcoll,
#   bazel-bin/python/exactcoll-*.whl and /usr/lib/x86_64-linux-gnu/libpng16.so.16 into .gpubin/.
# Logs go to $OUT/logs.tgz; a table is printed last.
set -uo pipefail
PHASES=${1:-verify,bench4,bench2,tp}
OUT=${OUT:-/tmp/out}
LOGS=$(mktemp -d)
RUN_TAIL_LINES=3
source tools/gpu/device_phases.sh  # has, run, record; the environment and the wheel
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$LOGS/gpus.txt" 2>&1
if has verify; then
  run verify_4 240 .gpubin/exactcoll verify --nproc 4 --max-count "${VERIFY_MAX_COUNT:-262147}"
fi
if has verify_tree; then
  run verify_4_tree 240 .gpubin/exactcoll verify --nproc 4 --contract tree --max-count "${VERIFY_MAX_COUNT:-262147}"
fi
if has bench4; then
  run bench_tree_4 420 torchrun --nproc-per-node 4 python/examples/bench_tree.py --out "$LOGS/bench4"
fi
if has bench2; then
  CUDA_VISIBLE_DEVICES=0,1 run bench_tree_2 300 torchrun --nproc-per-node 2 python/examples/bench_tree.py \
    --out "$LOGS/bench2"
fi
if has tp; then
  run tp_block_4 240 torchrun --nproc-per-node 4 python/examples/tp_block_check.py
fi
if has matmul; then
  CUDA_VISIBLE_DEVICES=0 run matmul_tiles 150 python3 python/tests/gpu_invariant_matmul_check.py --json "$LOGS/matmul.json"
  grep -E "FAIL|same|differ|==|pinned|tiles" "$LOGS/matmul_tiles.log" | head -60
  EXACTCOLL_INVARIANT_MATMUL=cublaslt CUDA_VISIBLE_DEVICES=0 run matmul_cublaslt 90 \
    python3 python/tests/gpu_invariant_matmul_check.py --quick --no-timing
  # Every tile variant against the 64-row blocks (large M, then mid M), and the leaf-pair product
  # against per-leaf products + torch's `+`, bits only.
  CUDA_VISIBLE_DEVICES=0 run tile_variants 150 python3 python/tests/gpu_tile_variants_check.py --no-timing
  CUDA_VISIBLE_DEVICES=0 run tile_variants_mid 120 python3 python/tests/gpu_tile_variants_check.py --mid --no-timing
  CUDA_VISIBLE_DEVICES=0 run pair_products 170 python3 python/tests/gpu_pair_products_check.py --no-timing
fi
if has llama; then
  for tp in 1 2 4; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((tp - 1))) run "llama_tp$tp" 200 torchrun --nproc-per-node "$tp" \
      python/examples/tree_llama_check.py --out "$LOGS/llama_tp$tp" ${LLAMA_FLAGS:-}
  done
  run llama_compare 60 python3 python/examples/tree_llama_check.py --compare "$LOGS/llama_tp1" "$LOGS/llama_tp2" \
    "$LOGS/llama_tp4"
  cat "$LOGS/llama_compare.log"
fi
for n in 4 2; do
  if has "llama_bench$n"; then
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) run "llama_bench$n" 240 torchrun --nproc-per-node "$n" \
      python/examples/tree_llama_check.py --bench --out "$LOGS/llama_bench$n"
    sed -n '/^tree_llama_check --bench/,$p' "$LOGS/llama_bench$n.log"
  fi
done
mkdir -p "$OUT"
tar -czf "$OUT/logs.tgz" -C "$LOGS" .
for name in bench_tree_4 bench_tree_2; do
  [ -f "$LOGS/$name.log" ] && sed -n '/^bench_tree:/,$p' "$LOGS/$name.log"
done
grep -hE "^verify|differing" "$LOGS"/verify_4*.log 2>/dev/null | tail -4
printf '%s\n' "${rows[@]}"
