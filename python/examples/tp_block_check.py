"""A tensor-parallel block on exactcoll.torch, checked bit for bit against exactcoll.sim.

    torchrun --nproc-per-node 2 python/examples/tp_block_check.py          # one process per rank
    torchrun --nproc-per-node 4 python/examples/tp_block_check.py --backend gloo   # ranks may share a GPU

Each rank runs a column-parallel then row-parallel MLP; the row-parallel partial sums go through
fused_add_rms_norm (all-reduce + residual + RMSNorm), all_reduce, reduce_scatter and all_gather
(+ all_reduce on a registered buffer). The block runs eagerly, under torch.compile (fullgraph: the
torch.library custom ops) and captured in a CUDA graph (replayed on new inputs). Every rank gathers
every rank's partial sums to the CPU and recomputes every output with exactcoll.sim: every bit must
match. Batch invariance: the fused op's rows alone and among 7, 64 and 256 rows give the same bits.
Exit status 0 only when every comparison had 0 differing elements; rank 0 prints a table.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import exactcoll
import exactcoll.sim as xs
import exactcoll.torch as xt
from bit_compare import bits, differing, gather_bits

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Block(torch.nn.Module):
    """One MLP block, tensor parallel: W1 split by columns, W2 by rows; the partial sums of the
    row-parallel product are what exactcoll reduces."""

    def __init__(self, comm, hidden, ffn, dtype, seed, eps):
        super().__init__()
        n, r = comm.world_size, comm.rank
        g = torch.Generator().manual_seed(seed)  # the same full weights on every rank
        w1 = torch.randn(hidden, ffn, generator=g) / hidden ** 0.5
        w2 = torch.randn(ffn, hidden, generator=g) / ffn ** 0.5
        shard = ffn // n
        self.w1 = w1[:, r * shard:(r + 1) * shard].to(dtype).cuda().contiguous()
        self.w2 = w2[r * shard:(r + 1) * shard, :].to(dtype).cuda().contiguous()
        self.norm_weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).cuda()
        self.comm, self.eps = comm, eps

    def forward(self, h, residual):
        partial = torch.relu(h @ self.w1) @ self.w2
        out, residual_out = self.comm.fused_add_rms_norm(partial, residual, self.norm_weight, self.eps)
        summed = self.comm.all_reduce(partial)
        scattered = self.comm.reduce_scatter(partial)
        gathered = self.comm.all_gather(scattered)
        return partial, out, residual_out, summed, scattered, gathered


def check_block(block, outputs, residual, fmt, eps, rank, results, mode):
    partial, out, residual_out, summed, scattered, gathered = outputs
    partials = gather_bits(partial)  # [ranks, rows, H]
    dt = None if fmt == "fp32" else fmt
    want_out, want_ro = xs.fused_add_rms_norm(partials, bits(residual), bits(block.norm_weight), eps, dtype=dt)
    want_sum = xs.all_reduce(partials, dtype=dt)
    want_rs = xs.reduce_scatter(partials, dtype=dt)
    scattered_all = gather_bits(scattered)
    want_ag = xs.all_gather(scattered_all, dtype=dt)
    for name, got, want in (("fused_add_rms_norm out", out, want_out[rank]),
                            ("fused_add_rms_norm residual_out", residual_out, want_ro[rank]),
                            ("all_reduce", summed, want_sum[rank]), ("reduce_scatter", scattered, want_rs[rank]),
                            ("all_gather", gathered, want_ag[rank])):
        results.append({"mode": mode, "op": name, "elements": int(got.numel()), "differing": differing(bits(got), want)})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="gloo", help="torch.distributed backend (only its store is used)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default="eager,compile,graph")
    parser.add_argument("--json", help="write every rank's results here (rank 0)")
    args = parser.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dtype, fmt, eps = DTYPES[args.dtype], args.dtype, 1e-6
    start = time.monotonic()
    comm = xt.Communicator()
    props = comm.properties
    results = []

    g = torch.Generator().manual_seed(args.seed + 1000)  # activations and residual: the same on every rank
    h = torch.randn(args.rows, args.hidden, generator=g).to(dtype).cuda()
    residual = torch.randn(args.rows, args.hidden, generator=g).to(dtype).cuda()
    block = Block(comm, args.hidden, args.ffn, dtype, args.seed, eps)
    modes = args.modes.split(",")

    if "eager" in modes:
        outputs = block(h, residual)
        comm.check()
        check_block(block, outputs, residual, fmt, eps, rank, results, "eager")
        # A registered input buffer: peers read it in place.
        buffer = torch.empty(args.rows * args.hidden, dtype=dtype, device="cuda")
        registered = comm.register(buffer)
        view = buffer.view(args.rows, args.hidden)
        view.copy_(outputs[0])
        summed = comm.all_reduce(view, registered=registered)
        comm.check()
        want = xs.all_reduce(gather_bits(outputs[0]), dtype=None if fmt == "fp32" else fmt)[rank]
        results.append({"mode": "eager", "op": "all_reduce (registered)", "elements": int(summed.numel()),
                        "differing": differing(bits(summed), want)})

    if "compile" in modes:
        compiled = torch.compile(block, fullgraph=True)
        outputs = compiled(h, residual)
        comm.check()
        check_block(block, outputs, residual, fmt, eps, rank, results, "compile")

    if "graph" in modes:
        static_h, static_residual = h.clone(), residual.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            block(static_h, static_residual)  # warm up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = block(static_h, static_residual)
        for replay in range(2):  # the second replay on new inputs
            if replay:
                static_h.copy_(torch.randn(args.rows, args.hidden, generator=g).to(dtype))
                static_residual.copy_(torch.randn(args.rows, args.hidden, generator=g).to(dtype))
            graph.replay()
            torch.cuda.synchronize()
            comm.check()
        check_block(block, outputs, static_residual, fmt, eps, rank, results, "graph (2nd replay)")

    # Batch invariance: row 0..k of a batch of rows gives the same bits alone or among others.
    g_rank = torch.Generator().manual_seed(args.seed + 2000 + rank)  # each rank's own partial sums
    x = torch.randn(256, args.hidden, generator=g_rank).to(dtype).cuda()
    res256 = torch.randn(256, args.hidden, generator=g).to(dtype).cuda()
    full = comm.fused_add_rms_norm(x, res256, block.norm_weight, eps)
    for rows in (1, 7, 64):
        part = comm.fused_add_rms_norm(x[:rows].contiguous(), res256[:rows].contiguous(), block.norm_weight, eps)
        d = sum(differing(bits(a), bits(b[:rows])) for a, b in zip(part, full))
        results.append({"mode": "eager", "op": f"batch invariance: rows 0..{rows - 1} of {rows} vs of 256",
                        "elements": 2 * rows * args.hidden, "differing": d})
    comm.check()

    everyone = [None] * world
    dist.all_gather_object(everyone, results)
    elapsed = time.monotonic() - start
    comm.close()
    bad = 0
    if rank == 0:
        print(f"tp_block_check: {world} ranks, {fmt}, rows {args.rows}, H {args.hidden}, ffn {args.ffn}, "
              f"torch {torch.__version__}, exactcoll {exactcoll.__version__}, shared GPU {props['shared_gpu']}, "
              f"NCCL {'ready' if props['nccl_ready'] else 'left out: ' + props['nccl_unavailable_reason']}, "
              f"{elapsed:.1f} s")
        print(f"{'mode':<20} {'op':<45} {'elements x ranks':>16} {'differing':>10}")
        for i, row in enumerate(everyone[0]):
            total = sum(everyone[r][i]["elements"] for r in range(world))
            diff = sum(everyone[r][i]["differing"] if everyone[r][i]["differing"] >= 0 else 10 ** 9 for r in range(world))
            bad += diff != 0
            print(f"{row['mode']:<20} {row['op']:<45} {total:>16} {diff:>10}")
        print("tp_block_check: " + ("PASS: every bit equals exactcoll.sim" if bad == 0 else f"FAIL: {bad} rows differ"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world": world, "props": props, "results": everyone}, f)
    flag = [bad]
    dist.broadcast_object_list(flag, src=0)
    dist.destroy_process_group()
    sys.exit(0 if flag[0] == 0 else 1)


if __name__ == "__main__":
    main()
