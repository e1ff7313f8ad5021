#!/usr/bin/env bash
# Nodes emulated on one host: M "nodes" of L GPUs each, every node its own `exactcoll launch`
# (--nnodes M --node-rank k) over its own GPUs (CUDA_VISIBLE_DEVICES = GPUs kL .. kL+L-1), with
# NCCL's peer-to-peer and shared-memory transports off, so that NCCL moves every byte between the
# emulated nodes through its network transport (sockets), as between hosts. Inside an emulated node
# exactcoll links the GPUs by CUDA IPC as on a real node.
#
#   tools/multinode/emulate_nodes.sh M L <exactcoll command and flags>
#   e.g. tools/multinode/emulate_nodes.sh 2 2 multinode verify      (a 4-GPU machine)
#        tools/multinode/emulate_nodes.sh 2 1 multinode bench       (a 2-GPU machine)
#
# EXACTCOLL names the binary (default: exactcoll on PATH); MASTER_PORT may be given (default: a
# random port in 20000..39999), and EXACTCOLL_STORE_PORT (default: the next one, where rank 0's
# store listens); EXACTCOLL_STORE_TOKEN is made when
# unset and shared by every emulated node. Exits with the first failing node's status.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 NODES GPUS_PER_NODE <exactcoll command> [flags...]" >&2
  exit 2
fi
nodes=$1
per_node=$2
shift 2
case "$nodes$per_node" in *[!0-9]*) echo "$0: NODES and GPUS_PER_NODE must be whole numbers" >&2; exit 2 ;; esac
exactcoll=${EXACTCOLL:-exactcoll}
export EXACTCOLL_STORE_TOKEN=${EXACTCOLL_STORE_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
port=${MASTER_PORT:-$((20000 + RANDOM % 20000))}
store_port=${EXACTCOLL_STORE_PORT:-$((port + 1))}
pids=()
for ((k = 0; k < nodes; k++)); do
  devices=$(seq -s, $((k * per_node)) $((k * per_node + per_node - 1)))
  CUDA_VISIBLE_DEVICES=$devices "$exactcoll" launch --nnodes "$nodes" --node-rank "$k" --nproc "$per_node" \
    --master-addr 127.0.0.1 --master-port "$port" --store-port "$store_port" -- "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || { code=$?; [ "$status" -eq 0 ] && status=$code; }
done
exit "$status"
