#!/usr/bin/env bash
# Multi-GPU and multi-node on real GPUs (issue 29), one device call on a 4-GPU machine; every log
# in $OUT/logs.tgz (one file: the device tool brings back few), a short table last. Build and carry first (docs/contributing.md):
#   bazel build //tools:exactcoll //python:wheel && mkdir -p .gpubin && cp bazel-bin/tools/exactcoll \
#     bazel-bin/python/exactcoll-*.whl /usr/lib/x86_64-linux-gnu/libpng16.so.16 .gpubin/
#   usage: tools/multinode/device_run_multinode.sh [phases]   (default: all of them)
# Phases:
#   nodes    multinode verify on 2 x 1 and 2 x 2 emulated nodes (NCCL through sockets between them),
#            then multinode bench on 2 x 2 beside NCCL's all-reduce, and `exactcoll model` for the
#            same layout
#   tree     the same verify and bench under --contract tree (node subtrees, recursive doubling)
#   python   python/examples/multinode_check.py under torchrun on 2 x 2 emulated nodes (the C API's
#            and Python's multi-node communicator, every op against exactcoll.sim)
#   odd      verify --nproc 3 on the 4-GPU machine (an odd world size)
#   dead     tools/gpu/dead_rank_check.sh: 4 ranks on GPUs of their own, rank 1 SIGKILLed inside
#            its collectives (bench), then between them (tools/gpu/between_collectives_worker.py);
#            every peer must exit naming it within the kernel bound + 1 s
#   soak     python/examples/soak.py: 10^6 mixed calls on 4 GPUs, then 10^5 across 2 emulated nodes of
#            1 GPU (SOAK_CALLS, SOAK_NODE_CALLS change the counts), spot-checked against exactcoll.sim
set -uo pipefail
PHASES=${1:-nodes,tree,python,odd,dead,soak}
RESULTS=${OUT:-/tmp/out}
OUT=$(mktemp -d)/logs
mkdir -p "$OUT" "$RESULTS"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export LD_LIBRARY_PATH=$PWD/.gpubin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export EXACTCOLL=$PWD/.gpubin/exactcoll
has() { [[ ",$PHASES," == *",$1,"* ]]; }
summary=()
note() { summary+=("$1"); echo "$1"; }
if has nodes; then
  for layout in "2 1" "2 2"; do
    log="$OUT/multinode_verify_${layout// /x}.log"
    timeout 300 tools/multinode/emulate_nodes.sh $layout multinode verify > "$log" 2>&1
    note "multinode verify ${layout// / x }: exit $? | $(grep -E "differing|MISMATCH|failed" "$log" | tail -1)"
  done
  timeout 300 tools/multinode/emulate_nodes.sh 2 2 multinode bench --max-mib 256 > "$OUT/multinode_bench.log" 2>&1
  note "multinode bench 2 x 2: exit $?"
  "$EXACTCOLL" model --nodes 2 --gpus-per-node 2 > "$OUT/model.log" 2>&1
  grep -A 30 "bench multinode" "$OUT/multinode_bench.log" | head -20
  head -20 "$OUT/model.log"
fi
if has tree; then
  for layout in "2 1" "2 2"; do
    log="$OUT/multinode_verify_tree_${layout// /x}.log"
    timeout 300 tools/multinode/emulate_nodes.sh $layout multinode verify --contract tree > "$log" 2>&1
    note "multinode verify --contract tree ${layout// / x }: exit $? | $(grep -E "differing|MISMATCH|failed" "$log" | tail -1)"
  done
  timeout 300 tools/multinode/emulate_nodes.sh 2 2 multinode bench --max-mib 256 --contract tree \
    > "$OUT/multinode_bench_tree.log" 2>&1
  note "multinode bench --contract tree 2 x 2: exit $?"
  grep -A 30 "bench multinode" "$OUT/multinode_bench_tree.log" | head -20
fi
if has python; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpubin/exactcoll-*.whl && export PYTHONPATH=/tmp/site
  port=$((20000 + RANDOM % 20000))
  pids=()
  for k in 0 1; do
    CUDA_VISIBLE_DEVICES=$((2 * k)),$((2 * k + 1)) NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 PYTHONUNBUFFERED=1 \
      timeout 300 torchrun --nnodes 2 --node-rank $k --nproc-per-node 2 --master-addr 127.0.0.1 \
      --master-port $port python/examples/multinode_check.py > "$OUT/multinode_python_$k.log" 2>&1 &
    pids+=($!)
  done
  code=0
  for p in "${pids[@]}"; do wait "$p" || code=$?; done
  note "python multinode_check 2 x 2: exit $code | $(grep -h "multinode_check:" "$OUT"/multinode_python_*.log | tail -1)"
fi
if has odd; then
  timeout 300 "$EXACTCOLL" verify --nproc 3 > "$OUT/verify_nproc3.log" 2>&1
  note "verify --nproc 3: exit $? | $(grep -E "^verify" "$OUT/verify_nproc3.log" | tail -1)"
fi
if has dead; then
  # Inside a collective: bench's CUDA graphs of all-reduces (NCCL created, as the baseline), killed
  # 5 s in; then the fused op's bench without NCCL (what NCCL's teardown costs).
  B=$EXACTCOLL NPROC=4 SHARED_GPU=0 KILL_RANK=1 OUT="$OUT/inside" tools/gpu/dead_rank_check.sh > "$OUT/dead_rank.log" 2>&1
  note "dead rank inside a collective (4 GPUs, NCCL too, rank 1 killed, bound 5 s): exit $?"
  grep "dead_rank_check: \(ok\|FAIL\)" "$OUT/dead_rank.log"
  WORKER="$EXACTCOLL bench --op fused_rmsnorm --algos one_stage --rows 1,16 --replays 100000 --eager-rounds 1000 \
    --no-check --no-bound --timeout-ms 5000" NPROC=4 SHARED_GPU=0 KILL_RANK=1 OUT="$OUT/inside_no_nccl" \
    tools/gpu/dead_rank_check.sh > "$OUT/dead_rank_no_nccl.log" 2>&1
  note "dead rank inside a collective (4 GPUs, no NCCL, rank 1 killed, bound 5 s): exit $?"
  grep "dead_rank_check: \(ok\|FAIL\)" "$OUT/dead_rank_no_nccl.log"
  # Between collectives: one all-reduce, a check, 200 ms of host sleep, over and over; killed 25 s
  # in, well after every rank's communicator is made.
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpubin/exactcoll-*.whl 2>/dev/null
  PYTHONPATH=/tmp/site WORKER="python3 tools/gpu/between_collectives_worker.py --timeout-ms 5000" NPROC=4 SHARED_GPU=0 \
    KILL_RANK=1 KILL_AFTER_S=25 DEADLINE_S=60 OUT="$OUT/between" tools/gpu/dead_rank_check.sh \
    > "$OUT/dead_rank_between.log" 2>&1
  note "dead rank between collectives (4 GPUs, rank 1 killed, bound 5 s): exit $?"
  grep "dead_rank_check: \(ok\|FAIL\)" "$OUT/dead_rank_between.log"
fi
if has soak; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpubin/exactcoll-*.whl 2>/dev/null
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 timeout 360 torchrun --nproc-per-node 4 python/examples/soak.py \
    --calls "${SOAK_CALLS:-1000000}" > "$OUT/soak_4gpu.log" 2>&1
  note "soak 4 GPUs: exit $? | $(grep -E "calls .* in |wrong elements|soak: (passed|FAILED)" "$OUT/soak_4gpu.log" | tr '\n' ' ')"
  grep -E "^  rank" "$OUT/soak_4gpu.log"
  port=$((20000 + RANDOM % 20000))
  pids=()
  for k in 0 1; do
    CUDA_VISIBLE_DEVICES=$k NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
      timeout 200 torchrun --nnodes 2 --node-rank $k --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $port \
      python/examples/soak.py --calls "${SOAK_NODE_CALLS:-100000}" --max-count 4096 > "$OUT/soak_nodes_$k.log" 2>&1 &
    pids+=($!)
  done
  code=0
  for p in "${pids[@]}"; do wait "$p" || code=$?; done
  note "soak 2 x 1 emulated nodes: exit $code | $(grep -h -E "calls .* in |wrong elements|soak: (passed|FAILED)" "$OUT"/soak_nodes_*.log | tr '\n' ' ')"
  grep -h -E "^  rank" "$OUT"/soak_nodes_*.log
fi
tar czf "$RESULTS/logs.tgz" -C "$(dirname "$OUT")" logs
echo "== summary"
printf '%s\n' "${summary[@]}"
