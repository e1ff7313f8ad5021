"""A model nobody here wrote, on the "exactcoll" torch.distributed backend: Hugging Face's Llama
with tensor parallelism, and FSDP2 training steps, with every collective counted.

GPU machines (torch >= 2, transformers >= 5; nothing is downloaded: the model is a random Llama from
LlamaConfig, saved under --dump by rank 0):

    D=/tmp/xc_hf
    torchrun --nproc-per-node 2 python/examples/hf_llama_check.py --dump $D --phase nccl   # reference
    torchrun --nproc-per-node 2 python/examples/hf_llama_check.py --dump $D                # exactcoll
    torchrun --nproc-per-node 2 python/examples/hf_llama_check.py --dump $D --cpu          # CPU replay

  --phase exactcoll (the default): dist.init_process_group("cuda:exactcoll,cpu:gloo"), the model
      loaded with from_pretrained(dir, tp_plan="auto", dtype=bfloat16), one forward pass on a
      fixed-seed batch per all-reduce algorithm (one_shot, two_shot, push_one_shot, push_two_shot,
      auto, set with exactcoll.torch.configure_backend): the logits must be bit-identical across
      algorithms and ranks, and every SUM all-reduce on a float tensor must have reached exactcoll
      (backend_counts: at least one exact all_reduce per pass, no float SUM fallback). Then the
      logits with exactcoll's "nccl" algorithm (NCCL inside exactcoll) and, when --phase nccl ran
      before on the same --dump, with the NCCL backend: within --nccl-rtol (bf16 rounding). Then a
      few FSDP2 (fully_shard) training steps of a small MLP for several (all_reduce,
      reduce_scatter, all_gather) algorithm choices: the losses must be bit-identical; the ops
      FSDP2 sent elsewhere are listed. The auto pass's all-reduces (per-rank inputs and outputs) are
      saved under --dump for the CPU replay.
  --phase nccl: the same model and batch under dist.init_process_group("nccl"); saves its logits
      (and compares them with the exactcoll phase's, if that ran first).
  --cpu: no GPU needed: dist.init_process_group with cpu:exactcoll (gloo underneath) and the same
      number of ranks; replays every saved all-reduce input through the backend's CPU path and
      requires the GPU run's output bits exactly.
  Then torch's functional collectives (torch.distributed._functional_collectives, what
      torch.compile and DTensor emit), eager and under torch.compile: their bits must equal the
      dist.* calls' (the counts say which reached exactcoll).
  --device-mesh: also tries init_device_mesh + parallelize_module (ColwiseParallel,
      RowwiseParallel) on the exactcoll backend and reports it (known to fail on torch 2.11 for a
      Python process group; not counted as a failure unless --require-device-mesh).

Rank 0 prints a table; the exit status is 0 only when every check passed. Every rank prints its
own errors; a stage that runs past --stage-timeout prints every thread's stack and exits (no hang).
"""

import argparse
import datetime
import faulthandler
import hashlib
import json
import os
import struct
import sys
import time
import traceback

# Deterministic cuBLAS (set before CUDA starts): the checks compare bits across passes.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import exactcoll.torch as xt  # noqa: E402  (registers the "exactcoll" backend)
from bit_compare import bits, differing  # noqa: E402  (python/examples/bit_compare.py)
from exactcoll.distributed import ALL_REDUCE_ALGOS  # noqa: E402

ALGOS = ("one_shot", "two_shot", "push_one_shot", "push_two_shot", "auto")
# (all_reduce, reduce_scatter, all_gather) choices for the FSDP2 steps.
FSDP_ALGOS = (("auto", "auto", "auto"), ("one_shot", "direct", "direct"), ("two_shot", "direct", "copy_engine"),
              ("push_two_shot", "auto", "direct"))
TORCH2 = int(torch.__version__.split(".")[0]) >= 2

RANK = int(os.environ.get("RANK", "0"))
_stage_timeout = [600]


def say(text):
    print(f"rank {RANK}: {text}", flush=True)


def stage(name):
    """Prints the stage and re-arms the watchdog: past --stage-timeout every thread's stack is
    printed and the process exits (torchrun then stops the other ranks)."""
    say(name)
    faulthandler.cancel_dump_traceback_later()
    faulthandler.dump_traceback_later(_stage_timeout[0], exit=True)


def digest(t):
    return hashlib.sha256(bits(t).tobytes()).hexdigest()[:16]


class Table:
    def __init__(self):
        self.rows = []

    def add(self, check, ok, detail=""):
        self.rows.append((check, bool(ok), str(detail)))
        if not ok:
            say(f"FAILED: {check}: {detail}")

    def failed(self):
        return [r for r in self.rows if not r[1]]

    def print(self, title):
        if RANK != 0:
            return
        width = max([len(c) for c, _, _ in self.rows] + [10])
        print(f"\n{title}\n{'check'.ljust(width)}  result  detail")
        for check, ok, detail in self.rows:
            print(f"{check.ljust(width)}  {'ok' if ok else 'FAIL':6}  {detail}")
        print(f"rank 0: {len(self.rows) - len(self.failed())} of {len(self.rows)} checks passed", flush=True)


def all_ranks_agree(table, what, value):
    """Every rank's value (a digest) is rank 0's."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    table.add(f"{what}: the same on every rank", len(set(values)) == 1, "" if len(set(values)) == 1 else values)


def counts_delta(before_counts, before_fallbacks):
    counts, fallbacks = xt.backend_counts(), xt.backend_fallbacks()
    delta = {}
    for op, kinds in counts.items():
        for kind, n in kinds.items():
            d = n - before_counts.get(op, {}).get(kind, 0)
            if d:
                delta.setdefault(op, {})[kind] = d
    fb = {k: n - before_fallbacks.get(k, 0) for k, n in fallbacks.items() if n != before_fallbacks.get(k, 0)}
    return delta, fb


def float_sum_fallbacks(fallbacks):
    """The all-reduce fallbacks that a float SUM all-reduce could be among: every reason except
    another reduce op or an integer/bool dtype."""
    bad = {}
    for (op, reason), n in fallbacks.items():
        if not op.startswith("all_reduce"):
            continue
        if reason.startswith("op ") or (reason.startswith("dtype ") and "float" not in reason):
            continue
        bad[(op, reason)] = n
    return bad


# ---- the model ---------------------------------------------------------------------------------------

def model_config(args):
    from transformers import LlamaConfig
    heads = args.hidden // 64
    return LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                       num_hidden_layers=args.layers, num_attention_heads=heads,
                       num_key_value_heads=heads // 2, max_position_embeddings=1024,
                       rms_norm_eps=1e-5, tie_word_embeddings=False)


def ensure_model(args):
    """Rank 0 saves a random Llama (fixed seed) under --dump/model once; every phase and world size
    loads it (its key/value heads, hidden // 128, divide 2, 4 and 8 ranks)."""
    path = os.path.join(args.dump, "model")
    stamp = os.path.join(path, "exactcoll_check.json")
    want = {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab}
    if RANK == 0:
        have = json.load(open(stamp)) if os.path.exists(stamp) else None
        if have != want:
            from transformers import LlamaForCausalLM
            torch.manual_seed(1234)
            model = LlamaForCausalLM(model_config(args)).to(torch.bfloat16)
            model.save_pretrained(path)
            json.dump(want, open(stamp, "w"))
            say(f"saved a random Llama ({args.layers} layers, hidden {args.hidden}) to {path}")
    dist.barrier()
    return path


def load_tp(path, table):
    """from_pretrained with tp_plan="auto" (the documented way); transformers versions that want a
    DistributedConfig instead get one. Returns the model."""
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", dtype=torch.bfloat16)
        how = 'tp_plan="auto"'
    except Exception as first:  # noqa: BLE001 - reported, then the other documented way
        say(f'from_pretrained(tp_plan="auto") failed ({type(first).__name__}: {first}); trying DistributedConfig')
        from transformers.distributed.configuration_utils import DistributedConfig
        model = AutoModelForCausalLM.from_pretrained(
            path, distributed_config=DistributedConfig(tp_size=dist.get_world_size()), dtype=torch.bfloat16)
        how = "DistributedConfig(tp_size)"
    model.eval()
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    table.add(f"Llama loaded with {how}", dtypes == ["torch.bfloat16"], f"parameter dtypes {dtypes}")
    return model


def dump_file(args, what):
    """A file of this rank's under --dump; the world size is in the name, since the partial sums, and
    so the logits' bits, depend on it."""
    return os.path.join(args.dump, f"{what}_ws{dist.get_world_size()}_rank{RANK}.pt")


def batch(args, device):
    g = torch.Generator().manual_seed(99)
    return torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)


def forward(model, ids):
    with torch.no_grad():
        logits = model(ids).logits
    if hasattr(logits, "full_tensor"):  # a DTensor, if the plan left one
        logits = logits.full_tensor()
    torch.cuda.synchronize()
    return logits.detach().cpu()


# ---- phases --------------------------------------------------------------------------------------------

def init(backend, args):
    kwargs = {"timeout": datetime.timedelta(seconds=args.timeout)}
    dist.init_process_group(backend, **kwargs)
    say(f"init_process_group({backend!r}) done: rank {dist.get_rank()} of {dist.get_world_size()}, "
        f"group {type(dist.group.WORLD).__name__}")


def phase_nccl(args, table):
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    init("nccl", args)
    stage("model")
    path = ensure_model(args)
    model = load_tp(path, table)
    stage("forward under NCCL")
    logits = forward(model, batch(args, torch.device("cuda", local)))
    torch.save(logits, dump_file(args, "logits_nccl"))
    all_ranks_agree(table, "NCCL logits", digest(logits))
    other = dump_file(args, "logits_exactcoll")
    if os.path.exists(other):
        compare_to_nccl(table, "exactcoll (saved) vs NCCL backend", torch.load(other), logits, args.nccl_rtol)
    table.add("forward under NCCL ran", True, f"logits {tuple(logits.shape)}, saved for the exactcoll phase")


def compare_to_nccl(table, what, exact, nccl, rtol):
    a, b = exact.float(), nccl.float()
    if a.shape != b.shape:
        table.add(what, False, f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
        return
    scale = max(a.abs().max().item(), 1e-6)
    worst = (a - b).abs().max().item()
    table.add(f"{what}: max |diff| <= {rtol} x max |logit|", worst <= rtol * scale,
              f"max |diff| {worst:.3g}, max |logit| {scale:.3g}, mean |diff| {(a - b).abs().mean().item():.3g}, "
              f"{differing(bits(exact), bits(nccl))} of {a.numel()} elements differ in bits")


def phase_exactcoll(args, table):
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    init("cuda:exactcoll,cpu:gloo" if TORCH2 else "exactcoll", args)
    table.add("the default group is the exactcoll backend's", type(dist.group.WORLD).__name__ ==
              "ExactcollProcessGroup", type(dist.group.WORLD).__name__)
    stage("model")
    path = ensure_model(args)
    model = load_tp(path, table)
    ids = batch(args, torch.device("cuda", local))

    logits = {}
    for algo in args.algos:
        stage(f"forward, all_reduce algo {algo}")
        xt.configure_backend(algo=algo)
        before = xt.backend_counts(), xt.backend_fallbacks()
        if algo == "auto":
            with xt.record_collectives() as records:
                logits[algo] = forward(model, ids)
            torch.save({"world_size": dist.get_world_size(), "records": records}, dump_file(args, "collectives"))
            say(f"saved {len(records)} collectives for the CPU replay")
        else:
            logits[algo] = forward(model, ids)
        delta, fallbacks = counts_delta(*before)
        exact = delta.get("all_reduce", {}).get("exact", 0) + delta.get("all_reduce_coalesced", {}).get("exact", 0)
        bad = float_sum_fallbacks(fallbacks)
        table.add(f"{algo}: every float SUM all-reduce reached exactcoll", exact > 0 and not bad,
                  f"exact all-reduces {exact}; counts {delta}; fallbacks {fallbacks}")
    first = args.algos[0]
    for algo in args.algos[1:]:
        n = differing(bits(logits[algo]), bits(logits[first]))
        table.add(f"logits {algo} == {first}, bit for bit", n == 0, f"{n} of {logits[algo].numel()} elements differ")
    all_ranks_agree(table, "logits", digest(logits[first]))
    torch.save(logits[first], dump_file(args, "logits_exactcoll"))

    stage("forward, algo nccl (NCCL inside exactcoll)")
    xt.configure_backend(algo="nccl")
    before = xt.backend_counts(), xt.backend_fallbacks()
    try:
        nccl_inside = forward(model, ids)
        compare_to_nccl(table, "exactcoll vs its nccl algo", logits[first], nccl_inside, args.nccl_rtol)
    except Exception as e:  # noqa: BLE001 - e.g. a build without NCCL: reported as a failed check
        table.add("exactcoll vs its nccl algo", False, f"{type(e).__name__}: {e}")
    finally:
        xt.configure_backend(algo="auto")
    reference = dump_file(args, "logits_nccl")
    if os.path.exists(reference):
        compare_to_nccl(table, "exactcoll vs NCCL backend (--phase nccl)", logits[first], torch.load(reference),
                        args.nccl_rtol)
    else:
        say(f"no {reference}: run --phase nccl first on the same --dump to compare with the NCCL backend")
        table.add("NCCL backend reference present", not args.require_nccl_reference,
                  "not run (run --phase nccl first)")
    del model
    torch.cuda.empty_cache()

    if not args.skip_fsdp:
        fsdp_steps(args, table, local)
    if args.device_mesh:
        device_mesh_check(args, table, local)
    functional_check(table, local)


# ---- torch.compile's functional collectives --------------------------------------------------------

def functional_check(table, local):
    """torch.distributed._functional_collectives (what torch.compile and DTensor emit), eager and
    compiled: their outputs must equal dist.all_reduce / reduce_scatter_tensor /
    all_gather_into_tensor on the same inputs bit for bit (the exact path), and the counts say which
    reached exactcoll."""
    stage("functional collectives")
    import torch.distributed._functional_collectives as fc
    group = dist.group.WORLD
    n = dist.get_world_size()
    g = torch.Generator().manual_seed(11 + RANK)
    x = torch.randn(4, 1024, generator=g).to(torch.bfloat16).cuda(local)
    want_ar = x.clone()
    dist.all_reduce(want_ar)
    want_rs = torch.empty(4 // n if 4 % n == 0 else 1, 1024, dtype=x.dtype, device=x.device)
    rs_ok = 4 % n == 0
    if rs_ok:
        dist.reduce_scatter_tensor(want_rs, x)
    want_ag = torch.empty(4 * n, 1024, dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(want_ag, x)

    def run(name, fn):
        before = xt.backend_counts(), xt.backend_fallbacks()
        try:
            got = fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported: which forms reach the backend is measured here
            table.add(f"functional {name}", False, f"{type(e).__name__}: {str(e)[:300]}")
            return
        delta, fallbacks = counts_delta(*before)
        want = {"all_reduce": want_ar, "reduce_scatter": want_rs, "all_gather": want_ag}[name.split()[-1]]
        diff = differing(bits(got), bits(want))
        table.add(f"functional {name}: the exact path's bits", diff == 0,
                  f"{diff} elements differ; counts {delta}; sent elsewhere {fallbacks or 'nothing'}")

    def wait(t):
        return fc.wait_tensor(t) if hasattr(fc, "wait_tensor") else t

    run("eager all_reduce", lambda: wait(fc.all_reduce(x, "sum", group)))
    if rs_ok:
        run("eager reduce_scatter", lambda: wait(fc.reduce_scatter_tensor(x, "sum", 0, group)))
    run("eager all_gather", lambda: wait(fc.all_gather_tensor(x, 0, group)))
    compiled_ar = torch.compile(lambda t: fc.all_reduce(t, "sum", group) * 1, fullgraph=True)
    run("compiled all_reduce", lambda: compiled_ar(x))
    compiled_ag = torch.compile(lambda t: fc.all_gather_tensor(t, 0, group) * 1, fullgraph=True)
    run("compiled all_gather", lambda: compiled_ag(x))


# ---- FSDP2 ---------------------------------------------------------------------------------------------

class Block(torch.nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, f)
        self.down = torch.nn.Linear(f, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, d, f, depth):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d, f) for _ in range(depth))
        self.head = torch.nn.Linear(d, d)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def fsdp_run(args, local, mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.manual_seed(7)  # the same initial weights on every rank and for every algorithm
    model = Net(args.fsdp_dim, args.fsdp_dim * 4, 3).cuda(local)
    # bf16 compute and parameter all-gathers, fp32 gradient reduce-scatters.
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    # FSDP2 otherwise reduce-scatters gradients with ReduceOp.AVG, which exactcoll does not run:
    # SUM, then FSDP2's own division by the world size. Set on every fully_shard module (each
    # block's gradients are reduce-scattered by its own module's state).
    for module in model.modules():
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(args.fsdp_steps):
        g = torch.Generator().manual_seed(1000 * step + RANK)  # each rank its own data
        x = torch.randn(args.fsdp_batch, args.fsdp_dim, generator=g).cuda(local)
        y = torch.randn(args.fsdp_batch, args.fsdp_dim, generator=g).cuda(local)
        loss = torch.nn.functional.mse_loss(model(x).float(), y)  # the bf16 output against fp32 targets
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the job's loss, through the exact path too
        losses.append((loss.item(), total.item()))
    return losses


def fsdp_steps(args, table, local):
    from torch.distributed.device_mesh import init_device_mesh
    stage("FSDP2: device mesh")
    try:
        mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    except Exception as e:  # noqa: BLE001 - reported: FSDP2 needs the mesh
        table.add("FSDP2: init_device_mesh on the exactcoll group", False, f"{type(e).__name__}: {e}")
        return
    runs = {}
    for ar, rs, ag in FSDP_ALGOS:
        stage(f"FSDP2 steps, algos all_reduce={ar} reduce_scatter={rs} all_gather={ag}")
        xt.configure_backend(algo=ar, reduce_scatter_algo=rs, all_gather_algo=ag)
        before = xt.backend_counts(), xt.backend_fallbacks()
        try:
            losses = fsdp_run(args, local, mesh)
        except Exception as e:  # noqa: BLE001 - every rank reports it; the table says which combination
            table.add(f"FSDP2 steps ({ar}, {rs}, {ag})", False, f"{type(e).__name__}: {e}")
            traceback.print_exc()
            return
        finally:
            xt.configure_backend(algo="auto", reduce_scatter_algo="auto", all_gather_algo="auto")
        delta, fallbacks = counts_delta(*before)
        runs[(ar, rs, ag)] = losses
        exact_rs = delta.get("reduce_scatter_tensor", {}).get("exact", 0)
        exact_ag = delta.get("all_gather_into_tensor", {}).get("exact", 0)
        fell_back = sum(op.get("fallback", 0) for name, op in delta.items()
                        if name in ("reduce_scatter_tensor", "all_gather_into_tensor", "all_reduce"))
        table.add(f"FSDP2 ({ar}, {rs}, {ag}): every reduce-scatter, all-gather and all-reduce ran on exactcoll",
                  exact_rs > 0 and exact_ag > 0 and fell_back == 0,
                  f"counts {delta}; sent elsewhere {fallbacks or 'nothing'}")
    first = FSDP_ALGOS[0]
    for combo in FSDP_ALGOS[1:]:
        same = [struct.pack("<d", a) == struct.pack("<d", b) for pa, pb in zip(runs[combo], runs[first])
                for a, b in zip(pa, pb)]
        table.add(f"FSDP2 losses {combo} == {first}, bit for bit", all(same) and len(runs[combo]) == len(runs[first]),
                  f"losses {runs[combo]} vs {runs[first]}")
    all_ranks_agree(table, "FSDP2 job losses", str([total for _, total in runs[first]]))


# ---- DeviceMesh + parallelize_module (reported) -------------------------------------------------------

def device_mesh_check(args, table, local):
    stage("DeviceMesh + parallelize_module")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    try:
        mesh = init_device_mesh("cuda", (dist.get_world_size(),))
        torch.manual_seed(5)
        mlp = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
        mlp = mlp.to(torch.bfloat16).cuda(local)
        before = xt.backend_counts(), xt.backend_fallbacks()
        parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        out = mlp(torch.ones(8, 256, dtype=torch.bfloat16, device=f"cuda:{local}"))
        if hasattr(out, "full_tensor"):
            out = out.full_tensor()
        torch.cuda.synchronize()
        delta, fallbacks = counts_delta(*before)
        table.add("DeviceMesh + parallelize_module forward", True, f"counts {delta}; sent elsewhere {fallbacks}")
    except Exception as e:  # noqa: BLE001 - the known gap: reported
        table.add("DeviceMesh + parallelize_module forward", not args.require_device_mesh,
                  f"failed ({'required' if args.require_device_mesh else 'known gap, reported only'}): "
                  f"{type(e).__name__}: {str(e)[:300]}")


# ---- the CPU replay -----------------------------------------------------------------------------------

def phase_cpu(args, table):
    init("cpu:exactcoll" if TORCH2 else "exactcoll", args)
    path = dump_file(args, "collectives")
    if not os.path.exists(path):
        table.add("the GPU run's collectives are saved", False,
                  f"no {path}: run the exactcoll phase first, with as many ranks")
        return
    saved = torch.load(path)
    n = dist.get_world_size()
    table.add("same number of ranks as the GPU run", saved["world_size"] == n,
              f"GPU run {saved['world_size']}, here {n}")
    if saved["world_size"] != n:
        return
    records = [r for r in saved["records"] if r["group_size"] == n]
    stage(f"replaying {len(records)} collectives on the CPU")
    before = xt.backend_counts(), xt.backend_fallbacks()
    worst = 0
    elements = 0
    for i, record in enumerate(records):
        x = record["input"].clone()
        if record["op"] == "all_reduce":
            dist.all_reduce(x)
            got = x
        elif record["op"] == "reduce_scatter_tensor":
            got = torch.empty(record["output"].shape, dtype=x.dtype)
            dist.reduce_scatter_tensor(got, x)
        else:
            got = torch.empty(record["output"].shape, dtype=x.dtype)
            dist.all_gather_into_tensor(got, x)
        bad = differing(bits(got), bits(record["output"]))
        elements += got.numel()
        if bad:
            say(f"collective {i} ({record['op']}, {tuple(x.shape)} {x.dtype}): {bad} elements differ from the GPU")
        worst += bad
    delta, fallbacks = counts_delta(*before)
    table.add(f"{len(records)} GPU collectives replayed on the CPU path: the same bits", worst == 0 and bool(records),
              f"{worst} of {elements} elements differ; counts {delta}; fallbacks {fallbacks or 'none'}")


# ---- main -------------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dump", required=True, help="folder shared by the phases (model, logits, collectives)")
    parser.add_argument("--phase", choices=("exactcoll", "nccl"), default="exactcoll")
    parser.add_argument("--cpu", action="store_true", help="replay the saved collectives on the CPU path")
    parser.add_argument("--algos", default=",".join(ALGOS),
                        help="all-reduce algorithms to compare (comma list; the first is the reference)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--nccl-rtol", type=float, default=0.05,
                        help="max |exactcoll - NCCL| logit difference, as a fraction of max |logit|")
    parser.add_argument("--require-nccl-reference", action="store_true",
                        help="fail when --phase nccl did not run before on this --dump")
    parser.add_argument("--skip-fsdp", action="store_true")
    parser.add_argument("--fsdp-steps", type=int, default=3)
    parser.add_argument("--fsdp-dim", type=int, default=512)
    parser.add_argument("--fsdp-batch", type=int, default=32)
    parser.add_argument("--device-mesh", action="store_true", help="also try DeviceMesh + parallelize_module")
    parser.add_argument("--require-device-mesh", action="store_true")
    parser.add_argument("--timeout", type=float, default=300, help="process-group timeout, seconds")
    parser.add_argument("--stage-timeout", type=float, default=600, help="watchdog per stage, seconds")
    args = parser.parse_args()
    args.algos = [a for a in args.algos.split(",") if a]
    unknown = [a for a in args.algos if a not in ALL_REDUCE_ALGOS or a == "nccl"]
    if unknown or not args.algos:
        parser.error(f"unknown all-reduce algorithms {unknown}")
    if "WORLD_SIZE" not in os.environ:
        parser.error("run it under torchrun (see the commands above)")
    os.makedirs(args.dump, exist_ok=True)
    _stage_timeout[0] = args.stage_timeout
    table = Table()
    title = "hf_llama_check: " + ("CPU replay" if args.cpu else f"phase {args.phase}") + \
        f", {os.environ['WORLD_SIZE']} ranks, torch {torch.__version__}"
    start = time.monotonic()
    if not args.cpu:
        # The same kernels in every pass and phase, so differences come from the collectives only.
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        stage("start")
        if args.cpu:
            phase_cpu(args, table)
        elif args.phase == "nccl":
            phase_nccl(args, table)
        else:
            phase_exactcoll(args, table)
        stage("done")
    except Exception as e:  # noqa: BLE001 - any failure: this rank says where, the job stops
        say(f"FAILED: {type(e).__name__}: {e}")
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # not a teardown that could wait for ranks that are gone; torchrun stops the others
    faulthandler.cancel_dump_traceback_later()
    # Every rank's failures, so rank 0's table covers the job.
    failures = [None] * dist.get_world_size()
    dist.all_gather_object(failures, table.failed())
    table.print(title + f" ({time.monotonic() - start:.0f} s)")
    ok = not any(failures)
    if RANK == 0:
        for rank, failed in enumerate(failures):
            for check, _, detail in failed:
                print(f"rank {rank} FAILED: {check}: {detail}")
        print(f"RESULT: {'PASS' if ok else 'FAIL'} ({sum(len(f) for f in failures)} failed checks over "
              f"{len(failures)} ranks)", flush=True)
    stage("teardown")
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
