"""exactcoll.torch across nodes: the multi-node communicator formed from torchrun's variables,
every op checked bit for bit against exactcoll.sim (the one-node simulator: the bits do not depend
on the number of nodes).

Two emulated nodes of 2 GPUs on one 4-GPU machine (NCCL between them through sockets, as between
hosts; CUDA IPC inside each):

    export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 PORT=29511
    for k in 0 1; do CUDA_VISIBLE_DEVICES=$((2*k)),$((2*k+1)) torchrun --nnodes 2 --node-rank $k \\
      --nproc-per-node 2 --master-addr 127.0.0.1 --master-port $PORT python/examples/multinode_check.py & done; wait

On real hosts, the same torchrun line on each with the first host's address. Rank 0 prints one line
per case and a summary; the exit status is 0 only when every output bit matched on every rank and
the communicator really spans the nodes (properties()["nodes"] == the launcher's node count).
"""

import os
import sys

import torch
import torch.distributed as dist

import exactcoll.sim as xs
import exactcoll.torch as xt
from bit_compare import bits, differing, gather_bits

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def main():
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    nodes = n // int(os.environ.get("LOCAL_WORLD_SIZE", str(n)))
    comm = xt.Communicator()
    props = comm.properties
    results = []  # (case, differing elements summed over ranks, what ran)
    torch.manual_seed(1000 + rank)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for count in (8, 1000, 4099, 3 * n * 1024, 1 << 20):
            x = (torch.randn(count, device="cuda") * 4).to(dtype)
            xs_all = gather_bits(x)
            y = comm.all_reduce(x)
            info = comm.last_call_info()
            results.append((f"all_reduce {DTYPES[dtype]} {count}", differing(gather_bits(y), xs.all_reduce(
                xs_all, dtype=DTYPES[dtype])), info["note"] or info["algo"]))
            g = comm.all_gather(x)
            results.append((f"all_gather {DTYPES[dtype]} {count}", differing(gather_bits(g), xs.all_gather(
                xs_all, dtype=DTYPES[dtype])), comm.last_call_info()["note"]))
            if count % n == 0:
                s = comm.reduce_scatter(x)
                results.append((f"reduce_scatter {DTYPES[dtype]} {count}", differing(gather_bits(s), xs.reduce_scatter(
                    xs_all, dtype=DTYPES[dtype])), comm.last_call_info()["note"]))
        for rows, hidden in ((1, 4096), (7, 2880), (64, 8192)):
            x = torch.randn(rows, hidden, device="cuda").to(dtype)
            g = torch.Generator().manual_seed(rows)  # the same residual and weight on every rank
            residual = torch.randn(rows, hidden, generator=g).to(dtype).cuda()
            weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).cuda()
            out, residual_out = comm.fused_add_rms_norm(x, residual, weight, 1e-6)
            want_out, want_ro = xs.fused_add_rms_norm(gather_bits(x), bits(residual), bits(weight), 1e-6,
                                                      dtype=DTYPES[dtype])
            d = differing(gather_bits(out), want_out) + differing(gather_bits(residual_out), want_ro)
            results.append((f"fused_add_rms_norm {DTYPES[dtype]} {rows}x{hidden}", d, comm.last_call_info()["note"]))
    comm.check()
    # Every rank's count of differing elements, summed (a -1 shape mismatch counts as a failure).
    failures = torch.tensor([sum(1 for _, d, _ in results if d != 0)], dtype=torch.int64)
    dist.all_reduce(failures)
    spans = props["nodes"] == nodes
    if rank == 0:
        print(f"multinode_check: {n} ranks, {props['nodes']} nodes of {props['local_world_size']} "
              f"(launcher: {nodes}), NCCL between nodes: {props['nccl_ready']}")
        for case, d, ran in results:
            print(f"  {case:<36} {'ok' if d == 0 else f'DIFFERS ({d})':<14} {ran}")
        verdict = "passed" if failures.item() == 0 and spans else "FAILED"
        print(f"multinode_check: {len(results)} cases on every rank, {failures.item()} rank-cases differing; {verdict}")
    comm.close()
    dist.destroy_process_group()
    return 0 if failures.item() == 0 and spans else 1


if __name__ == "__main__":
    sys.exit(main())
