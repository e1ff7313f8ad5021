#!/usr/bin/env bash
# One call on a lent 4-GPU machine (no Bazel there) for the registry refactor and the torch
# backend (issues 27 and 28): verify (the same bits as before the registry), then the Hugging Face
# Llama check on the "exactcoll" torch.distributed backend on 2 and 4 GPUs (NCCL reference, the
# exactcoll phase, the CPU replay), then the backend's cost against its communicator and NCCL.
#   usage: tools/gpu/device_run_backend.sh [phases]   phases: verify,hf2,hf4,tp,bench (default all;
#   tp = python/examples/tp_block_check.py on 4 GPUs: eager, torch.compile and CUDA graph)
#   build first: bazel build //tools:exactcoll //python:wheel; copy bazel-bin/tools/exactcoll,
#   bazel-bin/python/exactcoll-*.whl and /usr/lib/x86_64-linux-gnu/libpng16.so.16 into .gpubin/.
# Logs go to $OUT/logs.tgz (one file: the device tool returns only a few); a table is printed last.
set -uo pipefail
PHASES=${1:-verify,hf2,hf4,tp,bench}
OUT=${OUT:-/tmp/out}
LOGS=$(mktemp -d)
RUN_TAIL_LINES=4
source tools/gpu/device_phases.sh  # has, run, record; the environment and the wheel
if has verify; then
  run verify_4 300 .gpubin/exactcoll verify --nproc 4 --max-count "${VERIFY_MAX_COUNT:-262147}"
  grep -E "^verify|differing" "$LOGS/verify_4.log" | tail -2
fi
hf() {  # hf N: the three phases on N GPUs
  local n=$1 d=/tmp/xc_hf
  local gpus
  gpus=$(seq -s, 0 $((n - 1)))
  CUDA_VISIBLE_DEVICES=$gpus run "hf${n}_nccl" 300 torchrun --nproc-per-node "$n" python/examples/hf_llama_check.py \
    --dump $d --phase nccl --stage-timeout 240
  CUDA_VISIBLE_DEVICES=$gpus run "hf${n}_exactcoll" 420 torchrun --nproc-per-node "$n" \
    python/examples/hf_llama_check.py --dump $d --stage-timeout 240 ${HF_FLAGS:-}
  CUDA_VISIBLE_DEVICES=$gpus run "hf${n}_cpu" 300 torchrun --nproc-per-node "$n" python/examples/hf_llama_check.py \
    --dump $d --cpu --stage-timeout 240
}
has hf2 && hf 2
has hf4 && hf 4
has tp && run tp_block_4 300 torchrun --nproc-per-node 4 python/examples/tp_block_check.py
if has bench; then
  run bench_backend_4 300 torchrun --nproc-per-node 4 python/examples/bench_backend.py
  tail -n 20 "$LOGS/bench_backend_4.log"
fi
mkdir -p "$OUT" && tar -czf "$OUT/logs.tgz" -C "$LOGS" .
echo "== device_run_backend: $(date -u +%FT%TZ), $(nvidia-smi -L | head -1 | cut -c1-40), $(nproc) cores"
printf '%s\n' "${rows[@]}"
