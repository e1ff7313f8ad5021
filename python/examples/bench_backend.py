"""What the "exactcoll" torch.distributed backend costs over calling its communicator directly, and
against NCCL, in one process per rank on the same GPUs (issue 27's targets: within 3 % of the
communicator under CUDA graphs; eager host time per call no higher than NCCL's).

    torchrun --nproc-per-node 4 python/examples/bench_backend.py

Per message size (bf16, rows x 8192):
  backend_host  dist.all_reduce(x) on the exactcoll backend: wall time of 200 back-to-back eager
                calls / 200 (the GPU running behind), median of 5 rounds;
  direct_host   the group's own Communicator.all_reduce_(x), the same way;
  nccl_host     the backend's inner NCCL group, allreduce([x]).wait(), the same way (NCCL's own
                cost without torch.distributed's Python wrapper: a lower bound for the NCCL
                backend's dist.all_reduce);
  backend_graph / direct_graph  20 calls captured in a CUDA graph, replayed 25 times: median
                replay / 20, in microseconds of GPU time.
Rank 0 prints the table. Nothing is checked here: hf_llama_check.py checks bits.
"""

import datetime
import os

import torch
import torch.distributed as dist

import exactcoll.torch as xt  # noqa: F401  (registers the backend)
from timing import graph_us, host_us  # python/examples/timing.py

ROWS = (1, 16, 256)
HIDDEN = 8192


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("cuda:exactcoll,cpu:gloo", timeout=datetime.timedelta(seconds=300))
    group = dist.group.WORLD
    device = torch.device("cuda", local)
    rows_out = []
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, device=device).to(torch.bfloat16)
        dist.all_reduce(x)  # makes the group's communicator
        comm = group._comm(device)
        nccl = group._nccl_backend()
        nccl.allreduce([x]).wait()  # NCCL's communicator is made at its first call
        torch.cuda.synchronize()
        row = {"rows": rows,
               "backend_host": host_us(lambda: dist.all_reduce(x), before_round=dist.barrier),
               "direct_host": host_us(lambda: comm.all_reduce_(x.view(-1)), before_round=dist.barrier),
               "nccl_host": host_us(lambda: nccl.allreduce([x]).wait(), before_round=dist.barrier),
               "backend_graph": graph_us(lambda: dist.all_reduce(x), rounds=1, before_replay=dist.barrier),
               "direct_graph": graph_us(lambda: comm.all_reduce_(x.view(-1)), rounds=1, before_replay=dist.barrier)}
        rows_out.append(row)
    if dist.get_rank() == 0:
        print(f"\nbench_backend: {dist.get_world_size()} ranks, {torch.cuda.get_device_name(local)}, "
              f"torch {torch.__version__}, bf16 rows x {HIDDEN}, microseconds")
        print("rows  backend_host  direct_host  nccl_host  backend_graph  direct_graph  graph_ratio")
        for r in rows_out:
            print(f"{r['rows']:4d}  {r['backend_host']:12.1f}  {r['direct_host']:11.1f}  {r['nccl_host']:9.1f}  "
                  f"{r['backend_graph']:13.2f}  {r['direct_graph']:12.2f}  "
                  f"{r['backend_graph'] / r['direct_graph']:11.3f}")
        print("counts:", xt.backend_counts())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
