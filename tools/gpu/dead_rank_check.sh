#!/usr/bin/env bash
# Issue 15, item 5 on a GPU: a rank killed mid-collective. Its peers' kernels must time out (every
# in-kernel flag wait is bounded by --timeout-ms), and each peer must exit non-zero, in bounded
# time, with a message naming the dead rank ("rank 0 block 3: peer 1 never arrived at barrier
# ..."; or, when it died between collectives, the store's "rank 1 never arrived" / "(run by rank
# 0) ... rank 0 exited or died").
#
# The workers are started torchrun-style, without `exactcoll launch` (which would stop the peers
# itself within about 2.5 s of the death and hide their own timeouts), and all of them share GPU 0
# (CUDA_VISIBLE_DEVICES=0, LOCAL_RANK=0): one GPU is enough, the ranks time-slice it. This needs
# the shared-GPU support of "Use it from real programs" (part 3); until that is merged, run it on
# a machine with NPROC GPUs and SHARED_GPU=0 (each rank on its own GPU).
#
# For a GPU machine without Bazel, with carried binaries (tools/gpu/device_run.sh explains):
#   bazel build //tools/gpu:exactcoll_gpu && mkdir -p .gpubin && cp bazel-bin/tools/gpu/exactcoll_gpu .gpubin/
#   tools/gpu/dead_rank_check.sh                       # 2 ranks on GPU 0, rank 1 killed after 5 s
#   NPROC=4 KILL_RANK=0 tools/gpu/dead_rank_check.sh   # the store's host dies
# Settings (environment): NPROC (2), KILL_RANK (1), KILL_AFTER_S (5: the workers are deep in their
# collectives by then), TIMEOUT_MS (5000: the kernels' wait bound), SHARED_GPU (1), OUT (/tmp/out),
# WORKER ("$B bench --op allreduce ...": a long loop of all-reduces; any worker command fits).
# Exit 0 when every check passed; the log of each rank is in $OUT/dead_rank_<rank>.log.
set -uo pipefail
B=${B:-.gpubin/exactcoll_gpu}
NPROC=${NPROC:-2}
KILL_RANK=${KILL_RANK:-1}
KILL_AFTER_S=${KILL_AFTER_S:-5}
TIMEOUT_MS=${TIMEOUT_MS:-5000}
SHARED_GPU=${SHARED_GPU:-1}
OUT=${OUT:-/tmp/out}
# Graph replays of every size, many times over: minutes of collectives, so the kill lands in one.
WORKER=${WORKER:-"$B bench --op allreduce --replays 100000 --eager-rounds 1000 --no-check --no-bound --timeout-ms $TIMEOUT_MS"}
# The store's waits are bounded too (a peer may be in one, between collectives, when the rank
# dies): the GPU commands' worker waits at most 300 s (tools/gpu/worker.h), so a peer must be gone
# within the kernel bound + 300 s + slack. Killed inside a collective, it is gone within about the
# kernel bound; the script prints how long each peer took.
# Ranks sharing a GPU run by time slicing, so the communicator raises every flag wait's bound to at
# least 60 s there (cuda_backend/communicator.cc, kSharedGpuMinFlagTimeoutMs).
KERNEL_BOUND_MS=$TIMEOUT_MS
if [ "$SHARED_GPU" = 1 ] && [ "$KERNEL_BOUND_MS" -lt 60000 ]; then KERNEL_BOUND_MS=60000; fi
DEADLINE_S=${DEADLINE_S:-$((KERNEL_BOUND_MS / 1000 + 300 + 30))}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
pids=()
for rank in $(seq 0 $((NPROC - 1))); do
  if [ "$SHARED_GPU" = 1 ]; then gpu=0; local_rank=0; else gpu=$rank; local_rank=$rank; fi
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpu RANK=$rank WORLD_SIZE=$NPROC LOCAL_RANK=$local_rank MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port EXACTCOLL_STORE_TOKEN=$token $WORKER > "$OUT/dead_rank_$rank.log" 2>&1 &
  pids+=($!)
done
echo "dead_rank_check: $NPROC ranks (shared GPU: $SHARED_GPU), killing rank $KILL_RANK after $KILL_AFTER_S s;" \
     "kernel wait bound $KERNEL_BOUND_MS ms, every peer must be gone within $DEADLINE_S s"
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
sleep "$KILL_AFTER_S"
if ! kill -0 "${pids[$KILL_RANK]}" 2>/dev/null; then
  echo "dead_rank_check: rank $KILL_RANK had already ended before the kill (see $OUT/dead_rank_$KILL_RANK.log)"
  tail -3 "$OUT/dead_rank_$KILL_RANK.log"
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  exit 1
fi
kill -9 "${pids[$KILL_RANK]}"
killed_at=$(now_ms)
status=0
for rank in $(seq 0 $((NPROC - 1))); do
  [ "$rank" = "$KILL_RANK" ] && continue
  pid=${pids[$rank]}
  # When the peer noticed: the first line naming the dead rank in its log (a close barrier's
  # message, printed while it unwinds from the kernel's timeout); the rest until it exits is
  # teardown. Ranks are watched one after another, so a later rank's time is an upper bound.
  noticed_ms=""
  # Wait for this peer, bounded: it must end by itself; at the deadline it is killed and fails.
  while kill -0 "$pid" 2>/dev/null; do
    if [ -z "$noticed_ms" ] && grep -q -E "(peer|rank|ranks) ([0-9]+, )*$KILL_RANK(,| never)" "$OUT/dead_rank_$rank.log"; then
      noticed_ms=$(( $(now_ms) - killed_at ))
    fi
    if [ $(( $(now_ms) - killed_at )) -gt $((DEADLINE_S * 1000)) ]; then
      echo "dead_rank_check: FAIL rank $rank still running $DEADLINE_S s after the kill (a hang); its stacks, then kill"
      if command -v gdb >/dev/null; then
        timeout 30 gdb -batch -p "$pid" -ex "thread apply all bt 12" > "$OUT/dead_rank_${rank}_stacks.log" 2>&1
      else
        for t in /proc/"$pid"/task/*; do echo "$t $(cat "$t/comm") $(cat "$t/wchan" 2>/dev/null)"; done \
          > "$OUT/dead_rank_${rank}_stacks.log" 2>&1
      fi
      kill -9 "$pid" 2>/dev/null
      status=1
      break
    fi
    sleep 0.05
  done
  wait "$pid"
  code=$?
  took_ms=$(( $(now_ms) - killed_at ))
  k=$KILL_RANK
  named=$(grep -E -o "(peer|rank) $k never arrived[^;(]*|ranks ([0-9]+, )*$k(, [0-9]+)* never arrived[^;(]*|run by rank 0\) closed the connection: rank 0 exited or died" \
          "$OUT/dead_rank_$rank.log" | head -1)
  if [ "$code" = 0 ]; then
    echo "dead_rank_check: FAIL rank $rank exited 0 although rank $KILL_RANK died"
    status=1
  elif [ -z "$named" ]; then
    echo "dead_rank_check: FAIL rank $rank exited $code after $took_ms ms without naming rank $KILL_RANK:"
    tail -3 "$OUT/dead_rank_$rank.log"
    status=1
  else
    when="only at its exit"
    [ -n "$noticed_ms" ] && when="by $noticed_ms ms"
    echo "dead_rank_check: ok   rank $rank exited $code, $took_ms ms after the kill (its log named rank $k $when): $named"
  fi
done
wait 2>/dev/null
[ "$status" = 0 ] && echo "dead_rank_check: passed" || echo "dead_rank_check: FAILED"
exit "$status"
