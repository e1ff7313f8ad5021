"""A worker for tools/gpu/dead_rank_check.sh that spends most of its time BETWEEN collectives: a
loop of one exactcoll.torch all-reduce, a check (which waits for the stream), then 200 ms of host
sleep. A rank killed during the sleep leaves its peers in their next all-reduce, whose in-kernel
wait for it must time out after flag_timeout_ms and name it. Started torchrun-style (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), with the wheel's exactcoll on PYTHONPATH:

    WORKER="python3 tools/gpu/between_collectives_worker.py --timeout-ms 5000" SHARED_GPU=0 NPROC=4 \
      tools/gpu/dead_rank_check.sh

Exit 3 with the library's message when a peer never arrived; 0 after --seconds without one.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import exactcoll
import exactcoll.torch as xt


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout-ms", type=int, default=5000, help="flag_timeout_ms: the in-kernel wait bound")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to loop without a failure")
    parser.add_argument("--sleep-ms", type=int, default=200, help="host sleep between collectives")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    comm = xt.Communicator(flag_timeout_ms=args.timeout_ms, use_nccl=False)  # the IPC path alone
    print(f"between_collectives_worker: rank {dist.get_rank()} ready", flush=True)
    x = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    end = time.monotonic() + args.seconds
    calls = 0
    try:
        while time.monotonic() < end:
            comm.all_reduce(x)
            comm.check()
            calls += 1
            time.sleep(args.sleep_ms / 1000)
    except exactcoll.PeerTimeoutError as e:
        print(f"between_collectives_worker: rank {dist.get_rank()} after {calls} calls: {e}", file=sys.stderr, flush=True)
        os._exit(3)  # a dead peer: no collective teardown (close is a barrier it would never pass)
    print(f"between_collectives_worker: rank {dist.get_rank()}: {calls} calls, no failure", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
