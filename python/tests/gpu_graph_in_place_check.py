"""GPU check of the inputs read where they lie (issue 26, item 1): exactcoll.torch calls whose input is
never copied into the communicator's buffer give the same bits as calls that copy it.

    torchrun --nproc-per-node N python/tests/gpu_graph_in_place_check.py      # N = 2 or 4

Per rank, bf16, for every (op, algo) and message size below:
  reference   the eager call on a communicator with graph_in_place=False (staged where its peers
              read the input), and, for all_reduce up to 64 Ki elements, python/tests/contract_reference.py
              (numpy, independent of the library) on the gathered inputs;
  eager       the same call on the default communicator (push_* and lamport_one_shot read the input
              in place there, also when out is x: all_reduce_);
  captured    the call captured into a CUDA graph on the default communicator: replayed before
              register_graph_buffers() (staged: same bits), then after it (read in place from the
              graph input table), then with new values copied into the captured input tensor (the
              replay must read them, not a stale copy); and all_reduce_ captured in place (two_shot reads the
              peers in place once registered, one_shot stages).
  eager in place
              (eager_in_place, the default) one_shot, two_shot and direct of 4 MiB: a call, a
              barrier, a call, a barrier, then a call that must read every rank's input in place
              (last_call_info()["staged"] False: by then every peer has opened the allocation);
              ranks that pass a new allocation (a fresh large tensor on rank 0 only) beside ranks
              that read in place; an allocation freed (torch.cuda.empty_cache) and a new one in its
              place, with new values (the third call of each round read in place); two_shot in
              place (all_reduce_), which reads in place too; and one_shot in place, which must stage.
              Under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (no IPC handles) every eager
              call must stage instead, with the same bits.
Every output is compared by bit pattern; any difference, a registration that registered nothing
where peers read the input, or an eager call that staged where it should not (or the reverse),
makes the script exit 1. Rank 0 prints one line per case.
"""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import exactcoll.torch as xt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contract_reference as ref  # noqa: E402

CASES = [("all_reduce", "one_shot"), ("all_reduce", "two_shot"), ("all_reduce", "push_one_shot"),
         ("all_reduce", "push_two_shot"), ("all_reduce", "lamport_one_shot"), ("all_reduce", "auto"),
         ("reduce_scatter", "direct"), ("reduce_scatter", "auto"), ("all_gather", "direct"),
         ("all_gather", "auto")]
COUNTS = [4096, 65536, 1 << 20]
PEERS_READ_INPUT = {"one_shot", "two_shot", "direct"}


def bits(t):
    return t.contiguous().view(torch.int16)


def differing(a, b):
    return int((bits(a) != bits(b)).sum().item())


def call(comm, op, algo, x, out):
    if op == "all_reduce":
        return comm.all_reduce(x, out=out, algo=algo)
    if op == "reduce_scatter":
        return comm.reduce_scatter(x, out=out, algo=algo)
    return comm.all_gather(x, out=out, algo=algo)


def inputs(count, seed, rank):
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank)
    return torch.randn(count, generator=g).to(torch.bfloat16).cuda()


def tally(rank, problems, label):
    """Collective: the ranks' problem counts summed; rank 0 prints `label` with its verdict, any other
    rank its own problems. Returns the sum."""
    mine = torch.tensor([len(problems)], device="cuda")
    dist.all_reduce(mine)
    total = int(mine.item())
    if rank == 0:
        print(f"{label} -> " + ("ok" if total == 0 else "FAIL " + "; ".join(problems)), flush=True)
    elif problems:
        print(f"rank {rank}: {label}: " + "; ".join(problems), flush=True)
    return total


EAGER_CASES = [("all_reduce", "one_shot"), ("all_reduce", "two_shot"), ("reduce_scatter", "direct"),
               ("all_gather", "direct")]


def expandable_segments():
    return "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()


def eager_checks(comm, staged, rank, world):
    """The eager-in-place cases of the docstring. Returns the number of failing ranks summed over cases."""
    failures = 0
    expect_in_place = not expandable_segments()
    reason = comm.properties["eager_unavailable_reason"]
    if reason:
        failures += tally(rank, [f"eager in place is off: {reason}"], "eager in place available")
        return failures
    count = 1 << 21  # 4 MiB of bf16: above the 2 MiB threshold, inside the default buffer
    for op, algo in EAGER_CASES:
        problems = []
        x = inputs(count, 5, rank)
        want = call(staged, op, algo, x, None)
        infos = []
        for k in range(3):
            got = call(comm, op, algo, x, None)
            infos.append(comm.last_call_info())
            if differing(got, want):
                problems.append(f"call {k}: {differing(got, want)} differ")
            torch.cuda.synchronize()
            dist.barrier()
        if infos[-1].get("staged") == expect_in_place:
            problems.append(f"third call staged={infos[-1].get('staged')} ({infos[-1].get('note', '')})")
        # Mixed: rank 0 passes a new allocation (staged, exported), the others read in place.
        fresh = torch.empty(64 << 20, dtype=torch.bfloat16, device="cuda")[:count] if rank == 0 else x
        fresh.copy_(x)
        got = call(comm, op, algo, fresh, None)
        info = comm.last_call_info()
        if differing(got, want):
            problems.append(f"mixed staged / in place: {differing(got, want)} differ")
        if rank != 0 and info.get("staged") == expect_in_place:
            problems.append(f"mixed: staged={info.get('staged')} on a rank with a known allocation")
        # Freed and reallocated: new memory (likely at the same addresses), new values.
        torch.cuda.synchronize()
        dist.barrier()
        del got, fresh
        x = None
        torch.cuda.empty_cache()
        for round_ in range(3):
            y = inputs(count, 6 + round_, rank)
            want_y = call(staged, op, algo, y, None)
            for k in range(3):
                got = call(comm, op, algo, y, None)
                if differing(got, want_y):
                    problems.append(f"reallocated round {round_} call {k}: {differing(got, want_y)} differ")
                torch.cuda.synchronize()
                dist.barrier()
            if comm.last_call_info().get("staged") == expect_in_place:
                problems.append(f"reallocated round {round_}: third call staged={comm.last_call_info().get('staged')}")
            del y, got
            torch.cuda.empty_cache()
        comm.check()
        failures += tally(rank, problems, f"eager {op:15s} {algo:9s} count {count}: staged per call "
                                          f"{[i.get('staged') for i in infos]}")
    # two_shot in place reads in place (its output is written after every peer's reads).
    x = inputs(count, 10, rank)
    want = call(staged, "all_reduce", "two_shot", x, None)
    problems = []
    y = x.clone()
    for k in range(3):
        y.copy_(x)
        comm.all_reduce_(y, algo="two_shot")
        if differing(y, want):
            problems.append(f"call {k}: {differing(y, want)} differ")
        torch.cuda.synchronize()
        dist.barrier()
    if comm.last_call_info().get("staged") == expect_in_place:
        problems.append(f"third call staged={comm.last_call_info().get('staged')}")
    failures += tally(rank, problems, "eager all_reduce_ two_shot in place reads in place")
    # one_shot in place: peers would read its result, so it stages (and stays exact).
    x = inputs(count, 9, rank)
    want = call(staged, "all_reduce", "one_shot", x, None)
    problems = []
    for k in range(3):
        y = x.clone()
        comm.all_reduce_(y, algo="one_shot")
        if differing(y, want):
            problems.append(f"call {k}: {differing(y, want)} differ")
        if not comm.last_call_info().get("staged"):
            problems.append(f"call {k} read in place")
        torch.cuda.synchronize()
        dist.barrier()
    failures += tally(rank, problems, "eager all_reduce_ one_shot in place stages")
    return failures


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    comm = xt.Communicator()
    staged = xt.Communicator(graph_in_place=False, eager_in_place=False)
    failures = 0
    # Expandable segments have no IPC handles: graphs must be captured with graph_in_place off
    # (register_graph_buffers refuses them), so only the eager cases run.
    graph_cases = [] if expandable_segments() else CASES
    if rank == 0 and not graph_cases:
        print("expandable segments: the graph cases are left out, the eager cases run", flush=True)
    for op, algo in graph_cases:
        for count in COUNTS:
            if algo == "lamport_one_shot" and count * 2 > (1 << 20):
                continue
            x = inputs(count, 1, rank)
            expected = call(staged, op, algo, x, None)
            torch.cuda.synchronize()
            problems = []
            if op == "all_reduce" and count <= 65536:
                gathered = [torch.empty_like(x) for _ in range(world)]
                dist.all_gather(gathered, x)
                stacked = np.stack([bits(t).cpu().numpy().view(np.uint16) for t in gathered])
                want = ref.all_reduce(stacked, "bf16")
                got = bits(expected).cpu().numpy().view(np.uint16)
                if not np.array_equal(got, want):
                    problems.append(f"staged vs numpy contract: {int((got != want).sum())} differ")
            eager = call(comm, op, algo, x, None)
            eager_info = comm.last_call_info()
            if differing(eager, expected):
                problems.append(f"eager: {differing(eager, expected)} differ")
            if op == "all_reduce":
                y = x.clone()
                comm.all_reduce_(y, algo=algo)
                if differing(y, expected):
                    problems.append(f"in place (all_reduce_): {differing(y, expected)} differ")
            # Captured: replays before and after the registration, then with new input values.
            static_in = x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                static_out = call(comm, op, algo, static_in, None)  # warm-up (eager)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call(comm, op, algo, static_in, static_out)
            static_out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            if differing(static_out, expected):
                problems.append(f"replay before registration: {differing(static_out, expected)} differ")
            registered = comm.register_graph_buffers()
            if algo in PEERS_READ_INPUT and registered < 1:
                problems.append("register_graph_buffers registered nothing")
            static_out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            if differing(static_out, expected):
                problems.append(f"replay after registration: {differing(static_out, expected)} differ")
            x2 = inputs(count, 2, rank)
            expected2 = call(staged, op, algo, x2, None)
            static_in.copy_(x2)
            graph.replay()
            torch.cuda.synchronize()
            if differing(static_out, expected2):
                problems.append(f"replay with new input values: {differing(static_out, expected2)} differ")
            comm.check()
            del graph
            failures += tally(rank, problems, f"{op:15s} {algo:17s} count {count:8d}: eager staged="
                                              f"{eager_info.get('staged')} registered {registered}")
    # In place (all_reduce_) inside a graph: two_shot reads its peers' tensors in place once
    # registered (its output is written after every peer's reads); one_shot stages (its peers
    # would read its result), so it registers nothing.
    for algo, want_rows in (("two_shot", True), ("one_shot", False)) if graph_cases else ():
        count = 65536
        x = inputs(count, 3, rank)
        expected = call(staged, "all_reduce", algo, x, None)
        y = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            comm.all_reduce_(y.clone(), algo=algo)  # warm-up (eager)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            comm.all_reduce_(y, algo=algo)
        registered = comm.register_graph_buffers()
        y.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        problems = []
        if differing(y, expected):
            problems.append(f"{differing(y, expected)} differ")
        if (registered > 0) != want_rows:
            problems.append(f"registered {registered}")
        comm.check()
        del graph
        failures += tally(rank, problems, f"all_reduce_ in a graph {algo:9s} count {count:8d}: registered {registered}")
    # The in-place forms of reduce_scatter (output = this rank's block of the input) and all_gather
    # (input = this rank's block of the output), eager, and a partial overlap, which is refused.
    count = 65536
    x = inputs(count, 4, rank)
    problems = []
    want_rs = call(staged, "reduce_scatter", "auto", x, None)
    buf = x.clone()
    comm.reduce_scatter(buf, out=buf.view(world, -1)[rank], algo="auto")
    if differing(buf.view(world, -1)[rank], want_rs):
        problems.append(f"reduce_scatter in place: {differing(buf.view(world, -1)[rank], want_rs)} differ")
    want_ag = call(staged, "all_gather", "auto", x, None)
    out = torch.empty(world * count, dtype=x.dtype, device=x.device)
    out.view(world, -1)[rank].copy_(x)
    comm.all_gather(out.view(world, -1)[rank], out=out, algo="auto")
    if differing(out, want_ag):
        problems.append(f"all_gather in place: {differing(out, want_ag)} differ")
    try:
        comm.all_reduce(buf[:-64], out=buf[64:], algo="two_shot")
        problems.append("a partial overlap was not refused")
    except Exception as e:  # noqa: BLE001  (the library's error type for INVALID_ARGUMENT)
        if "overlap" not in str(e):
            problems.append(f"a partial overlap failed without naming it: {e}")
    torch.cuda.synchronize()
    failures += tally(rank, problems, "reduce_scatter / all_gather in place, partial overlap refused")
    failures += eager_checks(comm, staged, rank, world)
    comm.close()
    staged.close()
    if rank == 0:
        print(f"gpu_graph_in_place_check: {world} ranks, {'FAILED' if failures else 'all equal'}", flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
