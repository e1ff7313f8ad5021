"""The comparison users run (issue 26, item 6): exactcoll beside NCCL, NCCL as vLLM's batch-invariant
mode pins it, and torch symmetric memory, in one job, timed the same way, with the bits counted.

    torchrun --nproc-per-node 4 python/examples/compare_collectives.py [--out DIR] [--quick]

One process per GPU of one host, bf16. Every time is microseconds per op: 20 ops (--graph-ops) captured in one
CUDA graph, each rank's median replay / 20 (timing.graph_us: 3 rounds of 25 replays, a barrier
before each), then the maximum over ranks.

All-reduce of rows x 8192 (rows 1, 16, 64, 256, 1024, 4096: 0.016, 0.25, 1, 4, 16, 64 MiB):
  nccl              dist.all_reduce on the NCCL process group, an ordinary tensor;
  nccl_vllm_pinned  the same with NCCL configured as vLLM's batch-invariant mode configures it
                    (VLLM_BATCH_INVARIANT=1: override_envs_for_invariance in
                    vllm/model_executor/layers/batch_invariant.py, vllm-project/vllm):
                    NCCL_LAUNCH_MODE=GROUP NCCL_COLLNET_ENABLE=0 NCCL_NVLS_ENABLE=0
                    NCCL_P2P_NET_DISABLE=1 NCCL_MIN_NCHANNELS=1 NCCL_MAX_NCHANNELS=1
                    NCCL_PROTO=Simple NCCL_ALGO=allreduce:tree NCCL_NTHREADS=1
                    NCCL_SOCKET_NTHREADS=1. (NCCL_NTHREADS=1 is not a multiple of 32: NCCL's
                    getNthreads warns and uses its maximum instead.) NCCL reads its environment
                    once per process, so every rank runs a child process of this script
                    (--worker nccl_pinned) with that environment and a process group of its own on
                    a fresh port, bounded by --child-timeout; its results come back as JSON. The
                    child also times the fused op's split with the pinned NCCL (split_vllm_pinned).
  symm_one_shot, symm_two_shot
                    torch.ops.symm_mem.one_shot_all_reduce_out / two_shot_all_reduce_out with the
                    input already in a symmetric-memory buffer (symm_mem.empty + rendezvous, no
                    multicast): their best case, no copy in. "n/a" with the reason where this torch
                    has no symmetric memory;
  xc_in_place       exactcoll.torch.Communicator().all_reduce(x, out=out), algo auto, on ordinary
                    tensors, with comm.register_graph_buffers() after the capture, so that replays
                    read the peers' tensors in place; "n/a" where the library has no
                    register_graph_buffers;
  xc_staged         the same on Communicator(graph_in_place=False): the graph stages the input
                    (where the option does not exist yet, the plain communicator, which stages);
  xc_lamport        algo lamport_one_shot where the message fits one Lamport slot (1 MiB unless
                    the communicator's properties say otherwise; "–" beyond);
  xc_registered     algo auto with the input inside a buffer registered by comm.register.
Fused all-reduce + residual add + RMSNorm, H 8192, 4096 and 2880, rows 1, 16, 64, 256 and the rows of
4 MiB of x: split (dist.all_reduce + torch add + torch.nn.functional.rms_norm, in the same graph),
split_vllm_pinned (the same in the pinned child), and comm.fused_add_rms_norm: xc_in_place,
xc_staged (as above) and xc_lamport (lamport_one_stage where the rows fit one Lamport slot).

Bits, on every rank, counted as elements whose bit patterns differ:
  contract   256 x 8192 per rank against python/tests/contract_reference.py, numpy and
             independent of exactcoll: every rank's x folded in rank order in fp32, rounded once;
             the fused op's out and residual_out against its fused_add_rms_norm;
  row alone  row 0 reduced alone (1 x 8192) against the same row reduced in the batch of 256.
  Methods: NCCL (plain and pinned), symm_mem one_shot and two_shot, the split, and exactcoll eager
  (auto, registered, lamport) and replayed from a CUDA graph (in place, staged). exactcoll must
  differ in 0 elements everywhere: the script exits 1 if it differs anywhere, or if one of its bit
  checks could not run (an API that does not exist yet, like register_graph_buffers, is "n/a" and
  not a failure). A method that fails to run is reported in its table cell, and the run goes on.

Rank 0 prints the date, device and versions first and markdown tables last; --out DIR writes
DIR/results.json and keeps the child processes' logs there. --quick: rows 1, 64, 1024 of the
all-reduce and H 8192 at rows 1, 64, 256 of the fused op (the bits are the same).
"""

import argparse
import datetime
import inspect
import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))                     # timing.py
sys.path.insert(0, str(HERE.parent / "tests"))    # contract_reference.py (numpy; shares nothing with exactcoll)
import contract_reference  # noqa: E402
from timing import graph_us  # noqa: E402

HIDDEN = 8192
ROWS = (1, 16, 64, 256, 1024, 4096)
QUICK_ROWS = (1, 64, 1024)
FUSED_HIDDEN = (8192, 4096, 2880)
FUSED_ROWS = (1, 16, 64, 256)
FUSED_MAX_BYTES = 4 << 20
QUICK_FUSED = ((8192, (1, 64, 256)),)
BITS_ROWS = 256
EPS = 1e-6
# lamport_one_shot / lamport_one_stage run in one launch up to one Lamport slot:
# CommunicatorOptions::lamport_message_bytes, 1 MiB by default (cuda_backend/communicator_options.h).
LAMPORT_SLOT_BYTES = 1 << 20
# vLLM's override_envs_for_invariance (vllm/model_executor/layers/batch_invariant.py), its NCCL part.
VLLM_PINNED_NCCL_ENV = {
    "NCCL_LAUNCH_MODE": "GROUP",
    "NCCL_COLLNET_ENABLE": "0",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_P2P_NET_DISABLE": "1",
    "NCCL_MIN_NCHANNELS": "1",
    "NCCL_MAX_NCHANNELS": "1",
    "NCCL_PROTO": "Simple",
    "NCCL_ALGO": "allreduce:tree",
    "NCCL_NTHREADS": "1",
    "NCCL_SOCKET_NTHREADS": "1",
}
# What torchrun gives a worker; the child gets its own values (and no agent store).
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")
ALLREDUCE_COLUMNS = (("nccl", "NCCL"), ("nccl_vllm_pinned", "NCCL vLLM-pinned"), ("symm_one_shot", "symm one_shot"),
                     ("symm_two_shot", "symm two_shot"), ("xc_in_place", "xc in place"), ("xc_staged", "xc staged"),
                     ("xc_lamport", "xc lamport"), ("xc_registered", "xc registered"))
FUSED_COLUMNS = (("split", "split"), ("split_vllm_pinned", "split vLLM-pinned"), ("xc_in_place", "xc in place"),
                 ("xc_staged", "xc staged"), ("xc_lamport", "xc lamport"))
BIT_LABELS = {
    "nccl": "NCCL",
    "nccl_vllm_pinned": "NCCL vLLM-pinned",
    "symm_one_shot": "symm_mem one_shot",
    "symm_two_shot": "symm_mem two_shot",
    "xc_auto": "exactcoll auto, eager",
    "xc_registered": "exactcoll registered, eager",
    "xc_lamport": "exactcoll lamport_one_shot, eager (chunked beyond a slot)",
    "xc_graph_in_place": "exactcoll auto, CUDA graph, in place",
    "xc_graph_staged": "exactcoll auto, CUDA graph, staged",
    "split": "NCCL + add + rms_norm",
    "split_vllm_pinned": "NCCL vLLM-pinned + add + rms_norm",
    "xc_fused": "exactcoll fused auto, eager",
    "xc_fused_lamport": "exactcoll lamport_one_stage, eager (chunked beyond a slot)",
    "xc_fused_graph_in_place": "exactcoll fused auto, CUDA graph, in place",
    "xc_fused_graph_staged": "exactcoll fused auto, CUDA graph, staged",
}


# ---- helpers shared by the job and its pinned child ------------------------------------------------

def short(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:240]


def _reduced(values, op):
    """values reduced over ranks (on the GPU under NCCL; on the CPU under gloo, for CPU checks)."""
    device = "cpu" if dist.get_backend() == "gloo" else "cuda"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def max_over_ranks(values):
    return _reduced(values, dist.ReduceOp.MAX)


def sum_over_ranks(values):
    return _reduced(values, dist.ReduceOp.SUM)


def nccl_version():
    try:
        v = torch.cuda.nccl.version()
    except Exception as e:  # noqa: BLE001  (informational only)
        return f"unknown ({short(e)})"
    return ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)


def megabytes(nbytes):
    mib = nbytes / (1 << 20)
    return f"{mib:.3f}" if mib < 0.1 else f"{mib:.3g}"


def cpu_input(shape, seed):
    """bf16 normal values, the same in every process for a seed (made on the CPU), on this GPU."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).cuda()


def gpu_input(shape, seed):
    """bf16 normal values for timing (made on the GPU: fast; values do not matter there)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)


def bits16(t):
    """The 16-bit patterns of a bf16 tensor, as numpy uint16 on the CPU."""
    return t.detach().contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def gathered_bits(x):
    """Every rank's x, stacked in rank order: uint16 [ranks, *x.shape] (all_gather copies bits)."""
    n = dist.get_world_size()
    g = torch.empty(n * x.numel(), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(g, x.contiguous().view(-1))
    return bits16(g).reshape((n,) + tuple(x.shape))


def fill_nan(outs):
    for t in outs:
        t.fill_(float("nan"))


class Runner:
    """Times methods and runs bit checks; a failure becomes None (n/a) with its reason kept."""

    def __init__(self, rank, graph_ops=20):
        self.rank = rank
        self.graph_ops = graph_ops
        self.errors = {}

    def fail(self, key, e):
        self.errors[key] = short(e)
        print(f"rank {self.rank}: {key}: {short(e)}", file=sys.stderr, flush=True)

    def time(self, key, fn, after_capture=None):
        """Max over ranks of graph_us, or None where any rank failed."""
        try:
            us = graph_us(fn, graph_ops=self.graph_ops, before_replay=dist.barrier, after_capture=after_capture)
        except Exception as e:  # noqa: BLE001  (report it in the table and go on)
            self.fail(key, e)
            us = math.inf
        (worst,) = max_over_ranks([us])
        return None if math.isinf(worst) else worst

    def bits(self, key, run, want):
        """Elements of this rank's outputs differing from `want` (a tuple of uint16 arrays, the batch's
        reference), and row 0 computed alone vs row 0 of the batch. run(batch) returns a tuple of
        tensors (True: the 256-row inputs, False: row 0 alone). Returns ([contract counts], [row-alone
        counts]) as the max over ranks, and the sum over ranks of every count, or (None, None, None)
        where any rank failed."""
        try:
            batch = tuple(bits16(t) for t in run(True))
            contract = [int(np.count_nonzero(b != w)) for b, w in zip(batch, want)]
            single = tuple(bits16(t) for t in run(False))
            alone = [int(np.count_nonzero(s.reshape(-1, s.shape[-1])[0] != b.reshape(-1, b.shape[-1])[0]))
                     for s, b in zip(single, batch)]
            failed = 0.0
        except Exception as e:  # noqa: BLE001
            self.fail(key, e)
            contract, alone, failed = [0] * len(want), [0] * len(want), 1.0
        worst = max_over_ranks(contract + alone + [failed])
        total = sum_over_ranks(contract + alone)
        if worst[-1]:
            return None, None, None
        k = len(want)
        return [int(v) for v in worst[:k]], [int(v) for v in worst[k:2 * k]], int(sum(total))


def in_graph(fn, after_capture=None):
    """fn's outputs as one replay of a CUDA graph that captured one call of fn (after one eager call on
    a side stream); the outputs are set to NaN before the replay, so only the replay writes them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    torch.cuda.synchronize()
    if after_capture is not None:
        after_capture()
    outs = result if isinstance(result, tuple) else (result,)
    fill_nan(outs)
    torch.cuda.synchronize()
    dist.barrier()
    graph.replay()
    torch.cuda.synchronize()
    copies = tuple(t.clone() for t in outs)
    del graph
    return copies


def split_op(hidden):
    """The split that users run today: NCCL all-reduce in place, torch add, torch rms_norm."""
    def split(x, residual, weight, residual_out=None):
        dist.all_reduce(x)
        if residual_out is None:
            residual_out = x + residual
        else:
            torch.add(x, residual, out=residual_out)
        return torch.nn.functional.rms_norm(residual_out, (hidden,), weight, EPS), residual_out
    return split


def fused_shapes(quick):
    if quick:
        return [(h, r) for h, rows in QUICK_FUSED for r in rows]
    shapes = []
    for h in FUSED_HIDDEN:
        rows = list(FUSED_ROWS)
        four_mib = FUSED_MAX_BYTES // (2 * h)
        if four_mib not in rows:
            rows.append(four_mib)
        shapes += [(h, r) for r in rows]
    return shapes


def bits_inputs(rank):
    """The bit checks' inputs: x differs per rank; residual and weight are the same on every rank."""
    x = cpu_input((BITS_ROWS, HIDDEN), 1000 + rank)
    residual = cpu_input((BITS_ROWS, HIDDEN), 77)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN, generator=torch.Generator().manual_seed(78))).to(torch.bfloat16).cuda()
    return x, residual, weight


def references(x, residual, weight):
    """The contract's bits for the 256-row batch: the all-reduce, and the fused op's (out, residual_out)."""
    xs = gathered_bits(x)
    allreduce = contract_reference.all_reduce(xs, "bf16")
    out, residual_out = contract_reference.fused_add_rms_norm(xs, bits16(residual), bits16(weight), EPS, "bf16")
    return (allreduce,), (out, residual_out)


def nccl_bits(runner, x, residual, weight, want_ar, want_fused):
    """NCCL's all-reduce and the split, bits against the contract and row alone vs batch."""
    split = split_op(HIDDEN)

    def allreduce(batch):
        y = (x if batch else x[:1]).clone()
        dist.all_reduce(y)
        return (y,)

    def fused(batch):
        y = (x if batch else x[:1]).clone()
        return split(y, residual if batch else residual[:1], weight)

    return {"nccl": runner.bits("nccl bits", allreduce, want_ar), "split": runner.bits("split bits", fused, want_fused)}


# ---- the pinned child ------------------------------------------------------------------------------

def exit_with_parent():
    """Ends this child process if the rank that started it goes away (killed by a timeout, say), so no
    orphan keeps its GPU busy."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def worker_nccl_pinned(args):
    """A rank of the child job: NCCL as vLLM's batch-invariant mode pins it (the environment comes from
    the parent). Writes JSON (rank 0) with its times and bits."""
    exit_with_parent()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.child_timeout),
                            device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    runner = Runner(rank, args.graph_ops)
    result = {"nccl": nccl_version(), "env": {k: os.environ.get(k) for k in VLLM_PINNED_NCCL_ENV},
              "allreduce_us": {}, "split_us": {}, "bits": {}}
    for rows in args.rows:
        y = gpu_input((rows, HIDDEN), 1000 + rank)
        result["allreduce_us"][str(rows)] = runner.time(f"nccl_vllm_pinned {rows} rows", lambda: dist.all_reduce(y))
    for hidden, rows in args.fused:
        split = split_op(hidden)
        x = gpu_input((rows, hidden), 2000 + rank)
        residual, weight = gpu_input((rows, hidden), 3000), gpu_input((hidden,), 4000)
        residual_out = torch.empty_like(x)
        result["split_us"][f"{hidden}x{rows}"] = runner.time(
            f"split_vllm_pinned H {hidden} rows {rows}", lambda: split(x, residual, weight, residual_out))
    x, residual, weight = bits_inputs(rank)
    want_ar, want_fused = references(x, residual, weight)
    bits = nccl_bits(runner, x, residual, weight, want_ar, want_fused)
    result["bits"] = {"nccl_vllm_pinned": bits["nccl"], "split_vllm_pinned": bits["split"]}
    result["errors"] = runner.errors
    if rank == 0:
        pathlib.Path(args.worker_out).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def run_pinned_child(args, rank, world, local, workdir, rows, fused):
    """Every rank starts its child, waits for it (bounded), and rank 0 reads the child job's JSON.
    Returns (results or None, reason)."""
    holder = [free_port() if rank == 0 else 0]
    dist.broadcast_object_list(holder, src=0)
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS and not k.startswith("TORCHELASTIC_")}
    env.update(VLLM_PINNED_NCCL_ENV)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
               LOCAL_WORLD_SIZE=os.environ.get("LOCAL_WORLD_SIZE", str(world)),
               MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"), MASTER_PORT=str(holder[0]),
               NCCL_NVLS_ENABLE="0")
    out_json = workdir / "nccl_pinned.json"
    log_path = workdir / f"nccl_pinned_rank{rank}.log"
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", "nccl_pinned",
               "--worker-out", str(out_json), "--child-timeout", str(args.child_timeout),
               "--rows", ",".join(str(r) for r in rows), "--fused", ",".join(f"{h}x{r}" for h, r in fused),
               "--graph-ops", str(args.graph_ops)]
    reason = ""
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = child.wait(timeout=args.child_timeout)
            if code != 0:
                reason = f"the pinned child exited {code} (log: {log_path})"
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            reason = f"the pinned child ran past --child-timeout {args.child_timeout} s (log: {log_path})"
    if reason:
        print(f"rank {rank}: {reason}", file=sys.stderr, flush=True)
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(f"  | {line}" for line in tail), file=sys.stderr, flush=True)
    (failed,) = max_over_ranks([1.0 if reason else 0.0])
    if rank != 0:
        return None, reason
    if failed and not reason:
        reason = "the pinned child failed on another rank (see its stderr)"
    if reason:
        return None, reason
    try:
        return json.loads(out_json.read_text()), ""
    except (OSError, ValueError) as e:
        return None, f"no results from the pinned child: {short(e)}"


# ---- torch symmetric memory ------------------------------------------------------------------------

class SymmMem:
    """A symmetric-memory buffer of `count` bf16 elements and torch's all-reduce ops on its prefix."""

    def __init__(self, count, local):
        import torch.distributed._symmetric_memory as symm_mem
        self.group = dist.group.WORLD.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before torch 2.8; deprecated (a no-op or a warning) since
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    enable(self.group)
                except Exception:  # noqa: BLE001  (newer torch registers the group itself)
                    pass
        self.buffer = symm_mem.empty(count, dtype=torch.bfloat16, device=torch.device("cuda", local))
        symm_mem.rendezvous(self.buffer, self.group)
        ops = torch.ops.symm_mem
        self.one_shot_out = ops.one_shot_all_reduce_out
        self.two_shot_out = getattr(ops, "two_shot_all_reduce_out", None)
        self.two_shot_inplace = ops.two_shot_all_reduce_

    def one_shot(self, count, out):
        self.one_shot_out(self.buffer[:count], "sum", self.group, out.view(-1))

    def two_shot(self, count, out):
        """two_shot_all_reduce_out (it also writes its input); two_shot_all_reduce_ in place plus a copy
        out where this torch has no _out variant."""
        if self.two_shot_out is not None:
            self.two_shot_out(self.buffer[:count], "sum", self.group, out.view(-1))
        else:
            self.two_shot_inplace(self.buffer[:count], "sum", self.group)
            out.view(-1).copy_(self.buffer[:count])


# ---- the job ---------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--out", type=pathlib.Path, help="directory for results.json and the child logs (rank 0)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes (the bits are the same)")
    parser.add_argument("--child-timeout", type=int, default=300,
                        help="seconds the pinned NCCL child process may run (default 300)")
    parser.add_argument("--graph-ops", type=int, default=20,
                        help="ops per CUDA graph (default 20, the baselines' method; a model's decode graph holds "
                             "one or two all-reduces per layer, so more ops per graph shows the per-op time there, "
                             "with the ranks' skew at each replay's start spread over more ops)")
    parser.add_argument("--no-pinned", action="store_true", help="leave out NCCL as vLLM pins it (no child process)")
    parser.add_argument("--worker", choices=["nccl_pinned"], help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",") if v], help=argparse.SUPPRESS)
    parser.add_argument("--fused", type=lambda s: [tuple(int(p) for p in v.split("x")) for v in s.split(",") if v],
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.graph_ops < 1:
        parser.error(f"--graph-ops must be at least 1, got {args.graph_ops}")
    if args.child_timeout < 1:
        parser.error(f"--child-timeout must be at least 1 second, got {args.child_timeout}")
    if args.worker == "nccl_pinned":
        return worker_nccl_pinned(args)
    return run_job(args)


def run_job(args):
    # Never NVLink multicast: NCCL reads this at its init (below), torch's symmetric memory at its first
    # allocation, NVSHMEM at its init.
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=600), device_id=torch.device("cuda", local))
    world, rank = dist.get_world_size(), dist.get_rank()
    rows_list = QUICK_ROWS if args.quick else ROWS
    fused = fused_shapes(args.quick)
    if args.out is not None and rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
    workdir = args.out if args.out is not None else pathlib.Path(tempfile.mkdtemp(prefix="compare_collectives."))
    workdir.mkdir(parents=True, exist_ok=True)

    import exactcoll
    import exactcoll.torch as xt
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "ranks": world,
            "device": torch.cuda.get_device_name(local), "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": nccl_version(), "exactcoll": exactcoll.__version__, "python": sys.version.split()[0],
            "command": f"torchrun --nproc-per-node {os.environ.get('LOCAL_WORLD_SIZE', world)} " + " ".join(sys.argv),
            "quick": args.quick, "graph_ops": args.graph_ops,
            "env": {k: v for k, v in sorted(os.environ.items())
                    if k.startswith(("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "EXACTCOLL"))}}
    if rank == 0:
        print(f"compare_collectives: {meta['date']}, {world} x {meta['device']}, torch {meta['torch']} (CUDA "
              f"{meta['cuda']}), NCCL {meta['nccl']}, exactcoll {meta['exactcoll']}, python {meta['python']}",
              flush=True)
    runner = Runner(rank, args.graph_ops)
    results = {"meta": meta, "allreduce": [], "fused": [], "bits": {"allreduce": {}, "fused": {}}, "notes": []}

    # 1. NCCL as vLLM pins it: first, while this job holds nothing but its NCCL communicator.
    pinned, pinned_reason = (None, "--no-pinned") if args.no_pinned else \
        run_pinned_child(args, rank, world, local, workdir, rows_list, fused)
    if rank == 0 and pinned is not None:
        runner.errors.update({f"[pinned child] {k}": v for k, v in pinned.get("errors", {}).items()})
        meta["nccl_pinned_env"] = pinned["env"]
    if rank == 0 and pinned_reason:
        results["notes"].append(f"NCCL as vLLM pins it: n/a ({pinned_reason})")

    # 2. The communicators: the default one (graph in place where the library has it) and a staging one.
    comm = xt.Communicator()
    in_place_api = hasattr(comm, "register_graph_buffers")
    after_capture = comm.register_graph_buffers if in_place_api else None
    if "graph_in_place" in inspect.signature(xt.Communicator.__init__).parameters:
        staged = xt.Communicator(graph_in_place=False)
    else:
        staged = comm  # before graph_in_place existed every graph staged
        results["notes"].append("this exactcoll has no graph_in_place option: 'staged' is its plain communicator")
    if not in_place_api:
        results["notes"].append("this exactcoll has no register_graph_buffers: 'graph in place' is n/a")
    props = comm.properties
    slot = int(props.get("lamport_slot_bytes", props.get("lamport_message_bytes", LAMPORT_SLOT_BYTES)))
    max_count = max(max(rows_list), BITS_ROWS) * HIDDEN
    space = torch.empty(max_count, dtype=torch.bfloat16, device="cuda")
    registered = comm.register(space)
    meta.update(graph_in_place_api=in_place_api, lamport_slot_bytes=slot)

    # 3. torch symmetric memory (n/a, with the reason, where this torch cannot).
    symm, symm_reason = None, ""
    try:
        symm = SymmMem(max_count, local)
    except Exception as e:  # noqa: BLE001
        symm_reason = short(e)
        runner.fail("symm_mem setup", e)
    (symm_failed,) = max_over_ranks([0.0 if symm is not None else 1.0])
    if symm_failed:
        symm = None
        if rank == 0:
            results["notes"].append(f"torch symmetric memory: n/a ({symm_reason or 'failed on another rank'})")

    # 4. The all-reduce.
    for rows in rows_list:
        count, nbytes = rows * HIDDEN, rows * HIDDEN * 2
        x = gpu_input((rows, HIDDEN), 1000 + rank)
        y = x.clone()
        out = torch.empty_like(x)
        xr = space[:count].view(rows, HIDDEN)
        xr.copy_(x)
        us, skipped = {}, {}
        us["nccl"] = runner.time(f"nccl {rows} rows", lambda: dist.all_reduce(y))
        us["nccl_vllm_pinned"] = (pinned or {}).get("allreduce_us", {}).get(str(rows))
        if symm is not None:
            symm.buffer[:count].copy_(x.view(-1))
            us["symm_one_shot"] = runner.time(f"symm_one_shot {rows} rows", lambda: symm.one_shot(count, out))
            us["symm_two_shot"] = runner.time(f"symm_two_shot {rows} rows", lambda: symm.two_shot(count, out))
        us["xc_in_place"] = runner.time(f"xc_in_place {rows} rows", lambda: comm.all_reduce(x, out=out),
                                        after_capture) if in_place_api else None
        us["xc_staged"] = runner.time(f"xc_staged {rows} rows", lambda: staged.all_reduce(x, out=out))
        if nbytes <= slot:
            us["xc_lamport"] = runner.time(f"xc_lamport {rows} rows",
                                           lambda: comm.all_reduce(x, out=out, algo="lamport_one_shot"), after_capture)
        else:
            us["xc_lamport"], skipped["xc_lamport"] = None, f"{nbytes} B > one Lamport slot ({slot} B)"
        us["xc_registered"] = runner.time(f"xc_registered {rows} rows",
                                          lambda: comm.all_reduce(xr, out=out, registered=registered), after_capture)
        results["allreduce"].append({"rows": rows, "bytes": nbytes, "us": us, "skipped": skipped})

    # 5. The fused op against the split.
    split_cache = {}
    for hidden, rows in fused:
        split = split_cache.setdefault(hidden, split_op(hidden))
        nbytes = rows * hidden * 2
        x = gpu_input((rows, hidden), 2000 + rank)
        y = x.clone()
        residual, weight = gpu_input((rows, hidden), 3000), gpu_input((hidden,), 4000)
        out, residual_out = torch.empty_like(x), torch.empty_like(x)
        us, skipped = {}, {}
        name = f"H {hidden} rows {rows}"
        us["split"] = runner.time(f"split {name}", lambda: split(y, residual, weight, residual_out))
        us["split_vllm_pinned"] = (pinned or {}).get("split_us", {}).get(f"{hidden}x{rows}")
        us["xc_in_place"] = runner.time(
            f"fused xc_in_place {name}",
            lambda: comm.fused_add_rms_norm(x, residual, weight, EPS, out=out, residual_out=residual_out),
            after_capture) if in_place_api else None
        us["xc_staged"] = runner.time(
            f"fused xc_staged {name}",
            lambda: staged.fused_add_rms_norm(x, residual, weight, EPS, out=out, residual_out=residual_out))
        if nbytes <= slot:
            us["xc_lamport"] = runner.time(
                f"fused xc_lamport {name}",
                lambda: comm.fused_add_rms_norm(x, residual, weight, EPS, out=out, residual_out=residual_out,
                                                algo="lamport_one_stage"), after_capture)
        else:
            skipped["xc_lamport"] = f"{rows} rows of {hidden * 2} B > one Lamport slot ({slot} B)"
            us["xc_lamport"] = None
        results["fused"].append({"hidden": hidden, "rows": rows, "bytes": nbytes, "us": us,
                                 "skipped": skipped})

    # 6. The bits.
    x, residual, weight = bits_inputs(rank)
    want_ar, want_fused = references(x, residual, weight)
    bits_ar, bits_fused = results["bits"]["allreduce"], results["bits"]["fused"]
    nccl = nccl_bits(runner, x, residual, weight, want_ar, want_fused)
    bits_ar["nccl"], bits_fused["split"] = nccl["nccl"], nccl["split"]
    for key, target in (("nccl_vllm_pinned", bits_ar), ("split_vllm_pinned", bits_fused)):
        target[key] = (pinned or {}).get("bits", {}).get(key)
    rows_of = {True: x, False: x[:1]}
    res_of = {True: residual, False: residual[:1]}

    def staged_in_symm(op):
        def run(batch):
            src = rows_of[batch]
            symm.buffer[:src.numel()].copy_(src.reshape(-1))
            o = torch.empty_like(src)
            op(src.numel(), o)
            return (o,)
        return run

    if symm is not None:
        bits_ar["symm_one_shot"] = runner.bits("symm_one_shot bits", staged_in_symm(symm.one_shot), want_ar)
        bits_ar["symm_two_shot"] = runner.bits("symm_two_shot bits", staged_in_symm(symm.two_shot), want_ar)

    def in_registered(batch):
        src = rows_of[batch]
        view = space[:src.numel()].view(src.shape)
        view.copy_(src)
        return (comm.all_reduce(view, registered=registered),)

    exact = {  # the exactcoll checks: key -> (table, run, reference)
        "xc_auto": (bits_ar, lambda b: (comm.all_reduce(rows_of[b]),), want_ar),
        "xc_registered": (bits_ar, in_registered, want_ar),
        "xc_lamport": (bits_ar, lambda b: (comm.all_reduce(rows_of[b], algo="lamport_one_shot"),), want_ar),
        "xc_graph_staged": (bits_ar, lambda b: in_graph(lambda: staged.all_reduce(rows_of[b])), want_ar),
        "xc_fused": (bits_fused, lambda b: comm.fused_add_rms_norm(rows_of[b], res_of[b], weight, EPS), want_fused),
        "xc_fused_lamport": (bits_fused, lambda b: comm.fused_add_rms_norm(rows_of[b], res_of[b], weight, EPS,
                                                                            algo="lamport_one_stage"), want_fused),
        "xc_fused_graph_staged": (bits_fused, lambda b: in_graph(
            lambda: staged.fused_add_rms_norm(rows_of[b], res_of[b], weight, EPS)), want_fused),
    }
    if in_place_api:
        exact["xc_graph_in_place"] = (bits_ar, lambda b: in_graph(lambda: comm.all_reduce(rows_of[b]), after_capture),
                                      want_ar)
        exact["xc_fused_graph_in_place"] = (bits_fused, lambda b: in_graph(
            lambda: comm.fused_add_rms_norm(rows_of[b], res_of[b], weight, EPS), after_capture), want_fused)
    exact_differing, exact_failed = 0, []
    for key, (table, run, want) in exact.items():
        contract, alone, total = runner.bits(f"{key} bits", run, want)
        table[key] = (contract, alone, total)
        if total is None:
            exact_failed.append(key)
        else:
            exact_differing += total
    for key in ("xc_graph_in_place", "xc_fused_graph_in_place"):
        if key not in exact:
            (bits_fused if "fused" in key else bits_ar)[key] = "n/a: no register_graph_buffers"
    code = 1 if exact_differing or exact_failed else 0
    results.update(exactcoll_differing=exact_differing, exactcoll_bit_checks_failed=exact_failed, exit_code=code)

    if rank == 0:
        results["errors"] = runner.errors
        print(report(results), flush=True)
        if args.out is not None:
            (args.out / "results.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    if staged is not comm:
        staged.close()
    comm.close()
    dist.destroy_process_group()
    return code


# ---- the tables ------------------------------------------------------------------------------------

def cell(us, key, skipped):
    if us.get(key) is not None:
        return f"{us[key]:.2f}"
    return "–" if key in skipped else "n/a"


def ratio(a, b, times=False):
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.1f}×" if times else f"{a / b:.2f}"


def best(*values):
    present = [v for v in values if v is not None]
    return min(present) if present else None


def bits_cell(entry, which):
    if entry is None:
        return "n/a"
    if isinstance(entry, str):
        return entry
    contract, alone, _ = entry
    counts = contract if which == "contract" else alone
    if counts is None:
        return "failed"
    return " / ".join(f"{c:,}".replace(",", " ") for c in counts)


def report(results):
    meta = results["meta"]
    n, device = meta["ranks"], meta["device"]
    lines = [f"\ncompare_collectives results: {meta['date']}, {n} x {device}, torch {meta['torch']}, "
             f"NCCL {meta['nccl']}, exactcoll {meta['exactcoll']}", f"command: {meta['command']}",
             f"µs per op: CUDA graph of {meta.get('graph_ops', 20)} ops, each rank's median replay / "
             f"{meta.get('graph_ops', 20)}, max over ranks; bf16; "
             "'–': not run at this size (does not fit a Lamport slot); 'n/a': unavailable or failed (below)"]

    lines += ["", f"### All-reduce, rows x {HIDDEN}, {n} GPUs",
              "NCCL vLLM-pinned: NCCL as vLLM's batch-invariant mode pins it; symm: torch symmetric memory, input in "
              "its buffer; xc: exactcoll, algo auto on ordinary tensors, the graph reading peers' tensors in place "
              "(register_graph_buffers) or staged (graph_in_place=False); xc lamport: lamport_one_shot; "
              "xc registered: the input in a comm.register buffer; peer = min(NCCL, symm two_shot); "
              "auto = xc in place where measured, else xc staged", "",
              "| rows | MiB | " + " | ".join(label for _, label in ALLREDUCE_COLUMNS)
              + " | in place / peer | staged / peer | registered / peer | vLLM pins / auto |",
              "|---:|---:|" + "---:|" * (len(ALLREDUCE_COLUMNS) + 4)]
    for row in results["allreduce"]:
        us, skipped = row["us"], row["skipped"]
        peer = best(us.get("nccl"), us.get("symm_two_shot"))
        auto = us.get("xc_in_place") if us.get("xc_in_place") is not None else us.get("xc_staged")
        lines.append(f"| {row['rows']} | {megabytes(row['bytes'])} | "
                     + " | ".join(cell(us, key, skipped) for key, _ in ALLREDUCE_COLUMNS)
                     + f" | {ratio(us.get('xc_in_place'), peer)} | {ratio(us.get('xc_staged'), peer)}"
                     f" | {ratio(us.get('xc_registered'), peer)} | {ratio(us.get('nccl_vllm_pinned'), auto, True)} |")

    lines += ["", f"### Fused all-reduce + residual add + RMSNorm, {n} GPUs",
              "split: dist.all_reduce + torch add + torch.nn.functional.rms_norm in the same graph (vLLM-pinned: "
              "NCCL as vLLM pins it); xc: exactcoll fused_add_rms_norm, auto, in place or staged as above; "
              "xc lamport: lamport_one_stage; auto = xc in place where measured, else xc staged", "",
              "| H | rows | MiB of x | " + " | ".join(label for _, label in FUSED_COLUMNS)
              + " | auto / split | lamport / split |",
              "|---:|---:|---:|" + "---:|" * (len(FUSED_COLUMNS) + 2)]
    for row in results["fused"]:
        us, skipped = row["us"], row["skipped"]
        auto = us.get("xc_in_place") if us.get("xc_in_place") is not None else us.get("xc_staged")
        lines.append(f"| {row['hidden']} | {row['rows']} | {megabytes(row['bytes'])} | "
                     + " | ".join(cell(us, key, skipped) for key, _ in FUSED_COLUMNS)
                     + f" | {ratio(auto, us.get('split'))} | {ratio(us.get('xc_lamport'), us.get('split'))} |")

    per_rank = BITS_ROWS * HIDDEN
    lines += ["", f"### Bits, {n} GPUs: elements whose bit patterns differ (max over ranks)",
              f"contract: {BITS_ROWS} x {HIDDEN} per rank (of {per_rank:,}) against "
              "python/tests/contract_reference.py; "
              f"row alone: row 0 reduced alone vs in the batch of {BITS_ROWS} (of {HIDDEN:,})".replace(",", " "), "",
              "| all-reduce | vs the contract | row alone vs in the batch |",
              "|---|---:|---:|"]
    for key, entry in results["bits"]["allreduce"].items():
        lines.append(f"| {BIT_LABELS.get(key, key)} | {bits_cell(entry, 'contract')} | {bits_cell(entry, 'alone')} |")
    lines += ["", "| fused op (out / residual_out) | vs the contract | row alone vs in the batch |", "|---|---:|---:|"]
    for key, entry in results["bits"]["fused"].items():
        lines.append(f"| {BIT_LABELS.get(key, key)} | {bits_cell(entry, 'contract')} | {bits_cell(entry, 'alone')} |")

    notes = list(results.get("notes", []))
    notes += [f"{key}: {reason}" for key, reason in results.get("errors", {}).items()]
    if notes:
        lines += ["", "notes and failures (rank 0's; other ranks print theirs to stderr):"]
        lines += [f"- {note}" for note in notes]
    failed = results.get("exactcoll_bit_checks_failed", [])
    differing = results.get("exactcoll_differing", 0)
    if not differing and not failed:
        verdict = "PASS: exactcoll differs from the contract and between batch sizes in 0 elements"
    else:
        verdict = f"FAIL: exactcoll differs in {differing} elements (summed over ranks)"
        if failed:
            verdict += f"; exactcoll bit checks that could not run: {', '.join(failed)}"
    lines += ["", f"bits: {verdict}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
