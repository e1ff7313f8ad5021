"""The GPU soak: a long run of mixed collectives through exactcoll.torch, spot-checked bit for bit
against exactcoll.sim, with the host's and the GPU's memory at the start and at the end.

    torchrun --nproc-per-node 4 python/examples/soak.py                       # 10^6 calls
    torchrun --nproc-per-node 4 python/examples/soak.py --calls 20000 --seed 7

Across emulated nodes (the multi-node communicator: algo auto only, no registered buffers), e.g.
2 nodes of 1 GPU, as in python/examples/multinode_check.py:

    export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
    for k in 0 1; do CUDA_VISIBLE_DEVICES=$k torchrun --nnodes 2 --node-rank $k --nproc-per-node 1 \\
      --master-addr 127.0.0.1 --master-port 29512 python/examples/soak.py --calls 100000 --max-count 4096 & done; wait

Every rank draws the same sequence of calls from one seed (printed): the op (all_reduce,
reduce_scatter, all_gather, fused_add_rms_norm), the dtype, the size (mostly small, up to
--max-count elements per rank), the algorithm, and whether the input is a registered buffer. Each
--check-every-th call (and the first and last) is a spot check: every rank's input is gathered to
the CPU and the output compared with exactcoll.sim's, bit for bit. Every 256 calls the
communicator is checked (a peer that never arrived is an error naming it). Rank 0 prints a table;
the exit status is 0 only when no bit differed and no call failed.
"""

import argparse
import os
import random
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import exactcoll.sim as xs
import exactcoll.torch as xt
from bit_compare import bits, differing, gather_bits

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ONE_NODE_ALGOS = {
    "all_reduce": ["auto", "one_shot", "two_shot", "push_one_shot", "push_two_shot", "lamport_one_shot",
                   "lamport_two_shot"],
    "reduce_scatter": ["auto", "direct"],
    "all_gather": ["auto", "direct", "copy_engine"],
    "fused_add_rms_norm": ["auto", "one_stage", "two_stage", "push_one_stage", "lamport_one_stage",
                           "lamport_two_stage", "unfused", "one_stage_reg", "gather_norm"],
}
HIDDEN = [2880, 4096, 5120, 8192]
EPS = 1e-6


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def device_used_mib():
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2 ** 20


def draw_call(rng, n, max_count, multinode):
    """The next call of the sequence (the same on every rank): (op, dtype, size, algo, registered)."""
    op = rng.choices(list(ONE_NODE_ALGOS), weights=[4, 2, 2, 2])[0]
    dtype = rng.choice(list(DTYPES))
    algo = "auto" if multinode else rng.choice(ONE_NODE_ALGOS[op])
    registered = not multinode and rng.random() < 0.3
    if op == "fused_add_rms_norm":
        hidden = rng.choice([h for h in HIDDEN if h <= max_count] or [HIDDEN[0]])
        rows = rng.randint(1, max(1, min(64, max_count // hidden)))
        return op, dtype, (rows, hidden), algo, registered
    count = min(max_count, int(2 ** rng.uniform(0, np.log2(max_count))))  # log-uniform: mostly small
    if op == "reduce_scatter":
        count = max(n, count // n * n)
    return op, dtype, count, algo, registered


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1_000_000, help="collectives in all (1..10^8)")
    parser.add_argument("--seed", type=int, default=None, help="the call sequence's seed (default: from the time)")
    parser.add_argument("--check-every", type=int, default=997, help="spot-check every K-th call (>= 1)")
    parser.add_argument("--max-count", type=int, default=1 << 16, help="largest elements per rank, 4096..2^24 "
                        "(the fused op's rows x H too; >= 8192 for every hidden size)")
    parser.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress lines (stderr)")
    args = parser.parse_args()
    if not 1 <= args.calls <= 10 ** 8 or args.check_every < 1 or not 4096 <= args.max_count <= 1 << 24:
        parser.error("--calls must be 1..10^8, --check-every >= 1, --max-count 4096..2^24")
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    seed_box = [args.seed if args.seed is not None else int(time.time())]
    dist.broadcast_object_list(seed_box, src=0)
    seed = seed_box[0]
    comm = xt.Communicator()
    multinode = comm.properties["nodes"] > 1
    rng = random.Random(seed)
    # Inputs: one random buffer per dtype (this rank's own values), the residual and weight the
    # same on every rank (a shared generator), and a registered copy of each input buffer.
    gen = torch.Generator().manual_seed(1000 + rank)
    shared = torch.Generator().manual_seed(seed)
    inputs, registered, residual, weight = {}, {}, {}, {}
    for name, dtype in DTYPES.items():
        inputs[name] = (torch.randn(args.max_count, generator=gen) * 8).to(dtype).cuda()
        residual[name] = torch.randn(args.max_count, generator=shared).to(dtype).cuda()
        weight[name] = (1 + 0.1 * torch.randn(max(HIDDEN), generator=shared)).to(dtype).cuda()
        if not multinode:
            buffer = inputs[name].clone()
            registered[name] = comm.register(buffer)
    if rank == 0:
        print(f"soak: {n} ranks ({comm.properties['nodes']} nodes), {args.calls} calls, seed {seed} "
              f"(--seed {seed} reproduces), spot check every {args.check_every}, sizes up to {args.max_count}",
              flush=True)
    counts = {"calls": 0, "checks": 0, "compared": 0, "wrong": 0}
    memory = {}
    start = last_progress = time.monotonic()
    for call in range(args.calls):
        op, dtype, size, algo, use_registered = draw_call(rng, n, args.max_count, multinode)
        source = registered[dtype].tensor if use_registered else inputs[dtype]
        reg = registered[dtype] if use_registered else None
        if op == "fused_add_rms_norm":
            rows, hidden = size
            x = source[:rows * hidden].view(rows, hidden)
            res = residual[dtype][:rows * hidden].view(rows, hidden)
            out = comm.fused_add_rms_norm(x, res, weight[dtype][:hidden], EPS, algo=algo, registered=reg)
        else:
            x = source[:size]
            out = getattr(comm, op)(x, algo=algo, registered=reg)
        counts["calls"] += 1
        if call % 256 == 255:
            comm.check()
        if call == 1000 or (call == args.calls - 1 and "start" not in memory):
            torch.cuda.synchronize()
            memory["start"] = (resident_mib(), device_used_mib(), torch.cuda.memory_allocated() / 2 ** 20)
        if call % args.check_every == 0 or call == args.calls - 1:
            comm.check()
            every_x = gather_bits(x)
            if op == "fused_add_rms_norm":
                want_out, want_ro = xs.fused_add_rms_norm(every_x, bits(res), bits(weight[dtype][:hidden]), EPS,
                                                          dtype=dtype)
                got = [(bits(out[0]), want_out[rank]), (bits(out[1]), want_ro[rank])]
            else:
                want = getattr(xs, op)(every_x, dtype=dtype)
                got = [(bits(out), want[rank])]
            for g, w in got:
                counts["wrong"] += differing(g, w)
                counts["compared"] += w.size
            counts["checks"] += 1
        now = time.monotonic()
        if rank == 0 and now - last_progress > args.progress_s:
            last_progress = now
            print(f"soak: {call + 1} calls, {counts['checks']} checks, {counts['wrong']} wrong elements on rank 0, "
                  f"{(call + 1) / (now - start):.0f} calls/s", file=sys.stderr, flush=True)
    comm.check()
    torch.cuda.synchronize()
    wall_s = time.monotonic() - start
    end_memory = (resident_mib(), device_used_mib(), torch.cuda.memory_allocated() / 2 ** 20)
    totals = torch.tensor([counts["checks"], counts["compared"], counts["wrong"]], dtype=torch.int64)
    dist.all_reduce(totals)
    memories = gather((memory["start"], end_memory), n)
    if rank == 0:
        checks, compared, wrong = (int(v) for v in totals)
        print(f"soak: {n} ranks, {comm.properties['nodes']} nodes, seed {seed}")
        print(f"  calls {counts['calls']} in {wall_s:.1f} s ({counts['calls'] / wall_s:.0f} calls/s per rank)")
        print(f"  spot checks {checks} (all ranks), elements compared {compared}, wrong elements {wrong}")
        for r, (first, last) in enumerate(memories):
            print(f"  rank {r}: host RSS {first[0]:.1f} -> {last[0]:.1f} MiB; GPU used {first[1]:.0f} -> "
                  f"{last[1]:.0f} MiB (torch allocated {first[2]:.1f} -> {last[2]:.1f} MiB)")
        print(f"soak: {'passed' if wrong == 0 else 'FAILED'}")
    comm.close()
    dist.destroy_process_group()
    return 0 if int(totals[2]) == 0 else 1


def gather(value, n):
    parts = [None] * n
    dist.all_gather_object(parts, value)
    return parts


if __name__ == "__main__":
    sys.exit(main())
