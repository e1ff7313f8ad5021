"""Eager calls whose peers read the input, with and without the copy into the communicator's buffer
(issue 26, item 1: zero-copy for eager torch tensors), beside NCCL.

    torchrun --nproc-per-node N python/examples/bench_eager.py [--sizes-mib 0.25,1,2,4,16,64] [--calls 50]

One process per GPU, bf16, ordinary torch tensors (the caching allocator's), no CUDA graph. For
each op and algorithm whose peers read the input (all_reduce one_shot and two_shot, reduce_scatter
and all_gather direct) and each message size (the input per rank for all_reduce and all_gather; the
output per rank for reduce_scatter):
  in_place  exactcoll.torch.Communicator() (eager_in_place, the default): after the first calls
            every peer has opened the input's allocation and reads it where it lies, from the
            communicator's threshold of input bytes up (2 MiB; on 4 or more ranks 512 KiB for
            two_shot and 1 MiB for reduce_scatter; EXACTCOLL_EAGER_MIN_BYTES on rank 0 sets one for
            all) ("read in place": whether the last timed call did);
  staged    Communicator(eager_in_place=False): the input is copied into the communicator's buffer
            by the kernel before its first barrier (what every eager call did before);
  nccl      the same op on the NCCL process group (dist.all_reduce, reduce_scatter_tensor,
            all_gather_into_tensor).
Time: microseconds per call, CUDA events around --calls back-to-back calls on the current stream,
median of 5 rounds (a barrier before each), then the maximum over ranks. The script also checks
that the in_place calls from the threshold up (by input bytes) read in place (last_call_info()["staged"] False) and
that every in_place call gives the staged calls' bits, and exits 1 otherwise. Rank 0 prints a markdown table last.
"""

import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist

import exactcoll.torch as xt

CASES = [("all_reduce", "one_shot"), ("all_reduce", "two_shot"), ("reduce_scatter", "direct"),
         ("all_gather", "direct")]


def run(comm, op, algo, x, out):
    if op == "all_reduce":
        return comm.all_reduce(x, out=out, algo=algo)
    if op == "reduce_scatter":
        return comm.reduce_scatter(x, out=out, algo=algo)
    return comm.all_gather(x, out=out, algo=algo)


def run_nccl(op, x, out):
    if op == "all_reduce":
        out.copy_(x)
        dist.all_reduce(out)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, x)
    else:
        dist.all_gather_into_tensor(out, x)


def device_us(fn, calls):
    """GPU microseconds per call: events around `calls` calls, median of 5 rounds after 5 warm-ups."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def max_over_ranks(value):
    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", default="0.25,1,2,4,16,64",
                        help="message sizes in MiB, comma-separated (default 0.25,1,2,4,16,64)")
    parser.add_argument("--calls", type=int, default=50, help="calls per timed round (default 50)")
    args = parser.parse_args()
    sizes = [float(v) for v in args.sizes_mib.split(",") if v]
    if not sizes or any(s <= 0 for s in sizes) or args.calls < 1:
        parser.error("--sizes-mib needs positive sizes and --calls at least 1")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    comm = xt.Communicator()
    staged = xt.Communicator(eager_in_place=False)
    # The threshold every rank uses is rank 0's; torchrun gives every rank the same environment.
    # Without EXACTCOLL_EAGER_MIN_BYTES: cuda_backend/communicator_options.h's per-algorithm defaults.
    # (A value that is not a byte count is ignored there too, with a warning.)
    override = os.environ.get("EXACTCOLL_EAGER_MIN_BYTES", "")
    override = int(override) if override.isdigit() else None

    def threshold(op, algo):
        if override is not None:
            return override
        if world >= 4 and op == "reduce_scatter":
            return 1 << 20
        if world >= 4 and op == "all_reduce" and algo == "two_shot":
            return 512 << 10
        return 2 << 20
    if comm.properties["eager_unavailable_reason"]:
        problems_off = f"eager in place is off: {comm.properties['eager_unavailable_reason']}"
        print(f"rank {rank}: {problems_off}", flush=True)
        return 1
    rows, problems = [], []
    for op, algo in CASES:
        for mib in sizes:
            count = int(mib * (1 << 20)) // 2 // 64 * 64 * (world if op == "reduce_scatter" else 1)
            if count * 2 > staged.properties["buffer_bytes"]:
                continue
            g = torch.Generator(device="cpu").manual_seed(rank + 1)
            x = torch.randn(count, generator=g).to(torch.bfloat16).cuda()
            out_count = count // world if op == "reduce_scatter" else count * (world if op == "all_gather" else 1)
            out = torch.empty(out_count, dtype=x.dtype, device="cuda")
            want = run(staged, op, algo, x, None)
            t_in = device_us(lambda: run(comm, op, algo, x, out), args.calls)
            info = comm.last_call_info()
            in_place = not info.get("staged")
            if not in_place and count * 2 >= threshold(op, algo):
                problems.append(f"{op} {algo} {mib} MiB: in_place staged ({info.get('note')})")
            if int((out.view(torch.int16) != want.view(torch.int16)).sum().item()):
                problems.append(f"{op} {algo} {mib} MiB: in_place bits differ from staged")
            t_staged = device_us(lambda: run(staged, op, algo, x, out), args.calls)
            t_nccl = device_us(lambda: run_nccl(op, x, out), args.calls)
            rows.append((op, algo, mib, in_place, max_over_ranks(t_in), max_over_ranks(t_staged),
                         max_over_ranks(t_nccl)))
    bad = torch.tensor([len(problems)], device="cuda")
    dist.all_reduce(bad)
    for p in problems:
        print(f"rank {rank}: {p}", flush=True)
    if rank == 0:
        print(f"\n{world} x {torch.cuda.get_device_name()}, torch {torch.__version__}, NCCL "
              f"{'.'.join(map(str, torch.cuda.nccl.version()))}; us per eager call (max over ranks)\n")
        print("| op | algo | MiB | read in place | in_place | staged | in_place / staged | nccl | in_place / nccl |")
        print("|---|---|---:|---|---:|---:|---:|---:|---:|")
        for op, algo, mib, read, t_in, t_st, t_nc in rows:
            print(f"| {op} | {algo} | {mib:g} | {'yes' if read else 'no'} | {t_in:.2f} | {t_st:.2f} | "
                  f"{t_in / t_st:.3f} | {t_nc:.2f} | {t_in / t_nc:.3f} |")
        print(f"\nbench_eager: {'FAILED' if int(bad.item()) else 'in place and bit-equal everywhere'}", flush=True)
    comm.close()
    staged.close()
    dist.destroy_process_group()
    return 1 if int(bad.item()) else 0


if __name__ == "__main__":
    sys.exit(main())
