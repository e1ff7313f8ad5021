"""The tree contract on GPUs: its cost beside the canonical contract (same algorithm), NCCL, and
SGLang's TP-invariant all-reduce (NCCL all_gather + a fixed tree of bf16 torch adds), with the
bits checked (issue 25's targets: tree <= 1.02 x canonical for the same algorithm, 8 B - 64 MB;
tree <= 0.40 x SGLang's way on 4 GPUs, <= 0.65 x on 2).

    torchrun --nproc-per-node 4 python/examples/bench_tree.py [--out DIR]

One process per GPU, bf16, ordinary torch tensors (staged), every time the max over ranks of each
rank's median of 20 calls captured in a CUDA graph (timing.py). Per message size:
  canonical / tree   exactcoll.torch.Communicator(contract=...).all_reduce, per algorithm, timed
                     in interleaved pairs (--pairs, medians); tree also with its input in a
                     registered buffer (read in place by the peers, no staging copy);
  nccl               dist.all_reduce on the NCCL process group;
  sglang_way         dist.all_gather_into_tensor + the tree of bf16 adds over the gathered parts
                     (level by level: parts 2i and 2i+1 added, an odd last part carried up), which
                     is the tree contract computed by torch.
Bits, every size, every rank: the tree all-reduce of every algorithm against sglang_way's output and
the canonical one against an fp32 rank-order sum rounded once (both computed by torch, independent
of exactcoll), counted by bit pattern; any difference makes the script exit 1. Rank 0 prints the
tables and, with --out, writes them as JSON.
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys

import torch
import torch.distributed as dist

import exactcoll.torch as xt
from timing import graph_us  # python/examples/timing.py

SIZES_BYTES = (8, 16 << 10, 512 << 10, 1 << 20, 16 << 20, 64 << 20)
ALGOS = ("auto", "one_shot", "two_shot", "push_one_shot", "push_two_shot", "lamport_one_shot", "lamport_two_shot")


def torch_tree(parts):
    """The tree contract over parts[0..n-1] by torch bf16 adds (each add: fp32 sum, one rounding)."""
    level = list(parts)
    while len(level) > 1:
        level = [level[i] + level[i + 1] if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0]


def differing(a, b):
    """Elements whose bit patterns differ."""
    return int((a.view(torch.int16) != b.view(torch.int16)).sum().item())


def max_over_ranks(value):
    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def sum_over_ranks(value):
    t = torch.tensor([value], dtype=torch.int64, device="cuda")
    dist.all_reduce(t)
    return int(t.item())


def timed(fn, rounds=1):
    """Max over ranks of the graph median (microseconds per call), or None when the call fails."""
    try:
        us = graph_us(fn, rounds=rounds, before_replay=dist.barrier)
    except (RuntimeError, ValueError) as e:  # an algorithm that cannot run this size on this machine
        print(f"rank {dist.get_rank()}: {e}", file=sys.stderr)
        us = float("inf")
    worst = max_over_ranks(us)
    return None if worst == float("inf") else worst


def a_b(fn_a, fn_b, pairs):
    """Medians of `pairs` interleaved timings of fn_a and fn_b (a, b, a, b, ...), so that a drift of
    the machine during the run reaches both alike."""
    times_a, times_b = [], []
    for _ in range(pairs):
        times_a.append(timed(fn_a))
        times_b.append(timed(fn_b))
    if None in times_a or None in times_b:
        return None, None
    return statistics.median(times_a), statistics.median(times_b)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, help="directory for results.json (rank 0)")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved canonical/tree timings per algorithm")
    args = parser.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=600), device_id=torch.device("cuda", local))
    n, rank = dist.get_world_size(), dist.get_rank()
    comms = {c: xt.Communicator(contract=c) for c in ("canonical", "tree")}
    # Every size's input lives at the start of one buffer registered with both communicators, so
    # the registered variant (peers read the input in place, no staging copy) runs at every size.
    space = torch.empty(max(SIZES_BYTES) // 2, dtype=torch.bfloat16, device="cuda")
    registered = {c: comm.register(space) for c, comm in comms.items()}
    generator = torch.Generator(device="cuda").manual_seed(1234 + rank)
    rows, wrong = [], 0
    for size in SIZES_BYTES:
        count = max(size // 2, 1)
        x = space[:count]
        x.copy_(torch.randn(count, device="cuda", generator=generator).to(torch.bfloat16))
        out = torch.empty_like(x)
        gathered = torch.empty(n * count, dtype=torch.bfloat16, device="cuda")
        # The references, by torch: the tree over every rank's x and the canonical fp32 rank-order sum.
        dist.all_gather_into_tensor(gathered, x)
        parts = gathered.view(n, count)
        acc = parts[0].float()
        for r in range(1, n):
            acc = acc + parts[r].float()
        want = {"tree": torch_tree(parts), "canonical": acc.to(torch.bfloat16)}  # rank order, one rounding
        row = {"bytes": size, "algos": {}}
        for algo in ALGOS:
            entry = {}
            failed = 0
            for contract, comm in comms.items():
                try:
                    bad = differing(comm.all_reduce(x, algo=algo), want[contract])
                    bad += differing(comm.all_reduce(x, algo=algo, registered=registered[contract]), want[contract])
                except (RuntimeError, ValueError) as e:
                    print(f"rank {rank}: {contract} {algo} at {size} B: {e}", file=sys.stderr)
                    bad, failed = 0, 1
                bad = sum_over_ranks(bad)  # every rank takes part
                entry[contract + "_differing"] = bad
                wrong += bad
            if max_over_ranks(failed):
                entry.update(canonical_us=None, tree_us=None, tree_registered_us=None)
            else:
                entry["canonical_us"], entry["tree_us"] = a_b(
                    lambda: comms["canonical"].all_reduce(x, out=out, algo=algo),
                    lambda: comms["tree"].all_reduce(x, out=out, algo=algo), args.pairs)
                entry["tree_registered_us"] = timed(
                    lambda: comms["tree"].all_reduce(x, out=out, algo=algo, registered=registered["tree"]), rounds=3)
            row["algos"][algo] = entry

        def sglang_way():
            dist.all_gather_into_tensor(gathered, x)
            return torch_tree(gathered.view(n, count))

        row["nccl_us"] = timed(lambda: dist.all_reduce(out), rounds=3)
        row["sglang_us"] = timed(sglang_way, rounds=3)
        wrong += sum_over_ranks(differing(sglang_way(), want["tree"]))
        rows.append(row)
    if rank == 0:
        report(rows, n, local, wrong, args.out)
    dist.barrier()
    for comm in comms.values():
        comm.close()
    dist.destroy_process_group()
    return 1 if wrong else 0


def fmt(us):
    return "   n/a" if us is None else f"{us:8.2f}"


def report(rows, n, local, wrong, out_dir):
    print(f"\nbench_tree: {n} ranks, {torch.cuda.get_device_name(local)}, torch {torch.__version__}, "
          f"bf16, CUDA graph of 20 calls, max over ranks of the median, microseconds")
    print("\ntree vs canonical, same algorithm, staged inputs, medians of interleaved timings (bits: elements")
    print("differing from torch's references over all ranks, staged and registered calls)")
    print(f"{'bytes':>9}  {'algo':<17} {'canonical':>9} {'tree':>9} {'ratio':>6}  differing(c/t)")
    ratios = []
    for row in rows:
        for algo, e in row["algos"].items():
            c, t = e["canonical_us"], e["tree_us"]
            ratio = t / c if c and t else None
            if ratio is not None:
                ratios.append(ratio)
            print(f"{row['bytes']:9d}  {algo:<17} {fmt(c)} {fmt(t)} "
                  f"{'   n/a' if ratio is None else f'{ratio:6.3f}'}  "
                  f"{e['canonical_differing']}/{e['tree_differing']}")
    if ratios:
        print(f"tree / canonical: median {statistics.median(ratios):.3f}, max {max(ratios):.3f}")
    print("\nthe tree all-reduce beside NCCL and SGLang's way (NCCL all_gather + bf16 tree adds); tree best:")
    print("the fastest algorithm, staged or registered (r: the input read in place from a registered buffer)")
    print(f"{'bytes':>9}  {'nccl':>8} {'sglang':>8} {'tree best':>9} {'algo':<19} {'vs sglang':>9}")
    for row in rows:
        timed_algos = [(e["tree_us"], a) for a, e in row["algos"].items() if e["tree_us"] is not None]
        timed_algos += [(e["tree_registered_us"], a + " r") for a, e in row["algos"].items()
                        if e["tree_registered_us"] is not None]
        best, best_algo = min(timed_algos) if timed_algos else (None, "-")
        vs = best / row["sglang_us"] if best and row["sglang_us"] else None
        row["tree_best_us"], row["tree_best_algo"], row["tree_vs_sglang"] = best, best_algo, vs
        print(f"{row['bytes']:9d}  {fmt(row['nccl_us'])} {fmt(row['sglang_us'])} {fmt(best):>9} {best_algo:<19} "
              f"{'      n/a' if vs is None else f'{vs:9.3f}'}")
    print(f"\nbits: {wrong} elements differ from torch's references ({'FAIL' if wrong else 'all equal'})")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").write_text(json.dumps(
            {"ranks": n, "device": torch.cuda.get_device_name(local), "torch": torch.__version__,
             "differing": wrong, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
