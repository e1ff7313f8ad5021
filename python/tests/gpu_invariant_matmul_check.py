#!/usr/bin/env python3
"""exactcoll.linear on one GPU: the pinned cuBLASLt product's bits against M, N, the batch, the
operands' place in memory and the leaf count, bit for bit, and the tree layers at TP = 1, 2, 4, 8
(each rank's shard computed on this GPU, the ranks' all-reduce replaced by the tree of their
partials, which is what the tree contract's all-reduce computes). Not a CI test (it needs a GPU):

    python3 python/tests/gpu_invariant_matmul_check.py            # checks + timings, exit 1 on a difference
    python3 python/tests/gpu_invariant_matmul_check.py --quick    # fewer shapes (for --candidate sweeps)
    EXACTCOLL_INVARIANT_MATMUL_CANDIDATE=1 python3 ... --quick    # another pinned configuration

Prints one line per check ("same" or the count of differing elements and the largest |diff|), the
configuration pinned for each K, the product's error against a float64 reference, whether torch's
own matmul (cuBLAS's heuristic) changes bits with M, and timings (CUDA graphs) against torch.
"""

import argparse
import json
import os
import sys

import torch

import exactcoll.linear as xl
from gpu_check_util import graph_us

FAILURES = []


def bits(t):
    return t.detach().contiguous().view(torch.int16)


def compare(name, got, want):
    """Prints and records whether got and want have the same bits."""
    got, want = got.detach().contiguous(), want.detach().contiguous()
    if got.shape != want.shape:
        FAILURES.append(name)
        print(f"  FAIL {name}: shape {tuple(got.shape)} vs {tuple(want.shape)}")
        return False
    differ = (bits(got) != bits(want))
    count = int(differ.sum())
    if count:
        FAILURES.append(name)
        diff = (got.float() - want.float()).abs().max().item()
        print(f"  FAIL {name}: {count} of {got.numel()} elements differ, max |diff| {diff:.3g}")
        return False
    print(f"  same {name} ({got.numel()} elements)")
    return True


def rand(*shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)


def check_m(k, n, ms, full_m=4096):
    a, b = rand(full_m + 64, k, seed=k), rand(k, n, seed=k + 1)
    full = xl.invariant_matmul(a[:full_m], b)
    ok = True
    for m in ms:
        for offset in (0, 40) if m < full_m else (0,):
            got = xl.invariant_matmul(a[offset:offset + m], b)
            ok &= compare(f"K={k} N={n}: M={m} rows at row {offset} vs the same rows of M={full_m}", got,
                          full[offset:offset + m] if offset + m <= full_m else xl.invariant_matmul(a, b)[offset:offset + m])
    return ok


def check_n(k, n, m=64):
    a, b = rand(m, k, seed=3 * k), rand(k, n, seed=3 * k + 1)
    full = xl.invariant_matmul(a, b)
    for width in (8, 16, 24, 128, 1000, n // 8, n // 4, n // 2):
        for start in (0, 8, n - width):
            start = start // 8 * 8
            got = xl.invariant_matmul(a, b[:, start:start + width])  # a view: ldb = n, pointer offset
            compare(f"K={k} M={m}: N={width} columns from {start} (view) vs N={n}", got, full[:, start:start + width])
    got = xl.invariant_matmul(a, b[:, 8:8 + n // 4].contiguous())
    compare(f"K={k} M={m}: N={n // 4} columns copied contiguous vs N={n}", got, full[:, 8:8 + n // 4])


def check_batch(k, n, m=16):
    a, b = rand(64, m, k, seed=5 * k), rand(64, k, n, seed=5 * k + 1)
    alone = torch.stack([xl.invariant_matmul(a[i], b[i]) for i in range(64)])
    for batch in (1, 2, 3, 8, 64):
        compare(f"K={k} M={m} N={n}: batch {batch} vs each alone", xl.invariant_matmul(a[:batch], b[:batch]),
                alone[:batch])
    shared = torch.stack([xl.invariant_matmul(a[i], b[0]) for i in range(8)])
    compare(f"K={k} M={m} N={n}: batch 8 over one B (stride 0) vs each alone", xl.invariant_matmul(a[:8], b[0]), shared)
    compare(f"K={k} M={m} N={n}: batch 8 from entry 5 (offset) vs each alone", xl.invariant_matmul(a[5:13], b[5:13]),
            alone[5:13])


def check_leaves(hidden, out, leaves=8, ms=(1, 7, 64, 1000)):
    """The row-parallel layer at every TP size: each rank's partial from its module, the all-reduce
    replaced by the tree of the partials; and every leaf's product alone vs in the batched call."""
    w = rand(out, hidden, seed=hidden + out) * 0.05
    x_all = rand(max(ms) + 8, hidden, seed=hidden)
    ref_module = xl.TreeRowParallelLinear.from_full(w, 0, 1, leaves)
    kl = hidden // leaves
    for m in ms:
        x = x_all[3:3 + m]
        whole = ref_module(x)
        products = ref_module.leaf_products(x)
        single = torch.stack([xl.invariant_matmul(x[:, l * kl:(l + 1) * kl], w[:, l * kl:(l + 1) * kl].t().contiguous())
                              for l in range(leaves)])
        compare(f"H={hidden} out={out} M={m}: {leaves} leaves in one batched call vs each leaf alone", products, single)
        for tp in (2, 4, 8):
            local = hidden // tp
            partials = [xl.TreeRowParallelLinear.from_full(w, r, tp, leaves)(x[:, r * local:(r + 1) * local],
                                                                             reduce=False) for r in range(tp)]
            compare(f"H={hidden} out={out} M={m}: TP={tp} (tree of rank partials) vs TP=1", xl.tree_sum(
                torch.stack(partials)), whole)
        if m > 1:
            compare(f"H={hidden} out={out}: row 0 alone vs row 0 of M={m}", ref_module(x[:1]), whole[:1])


def check_columns(hidden, out, m=64):
    ws = [rand(out, hidden, seed=11), rand(out // 4, hidden, seed=12), rand(out // 4, hidden, seed=13)]
    x = rand(m, hidden, seed=14)
    whole = xl.TreeColumnParallelLinear.from_full(ws, 0, 1)(x)
    parts_whole = torch.split(whole, [out, out // 4, out // 4], dim=1)
    for tp in (2, 4, 8):
        outs = [xl.TreeColumnParallelLinear.from_full(ws, r, tp)(x) for r in range(tp)]
        for p, (full_part, size) in enumerate(zip(parts_whole, (out, out // 4, out // 4))):
            got = torch.cat([torch.split(o, [out // tp, out // 4 // tp, out // 4 // tp], dim=1)[p] for o in outs], 1)
            compare(f"column-parallel H={hidden} part {p} ({size} columns): TP={tp} concatenated vs TP=1", got,
                    full_part)
    compare(f"column-parallel H={hidden}: one row alone vs in M={m}", xl.TreeColumnParallelLinear.from_full(ws, 0, 1)(
        x[5:6]), whole[5:6])


def check_large(k, m, n):
    """A product the pinned configuration may run only in blocks (an LM head: m = 2048 tokens,
    n = 32000 vocabulary): rows alone and a TP-4 column shard against the whole product."""
    a, b = rand(m + 8, k, seed=51), rand(k, n, seed=52)
    full = xl.invariant_matmul(a[:m], b)
    compare(f"large K={k} M={m} N={n}: row 5 alone", xl.invariant_matmul(a[5:6], b), full[5:6])
    compare(f"large K={k} M={m} N={n}: rows 1000..1063 alone", xl.invariant_matmul(a[1000:1064], b), full[1000:1064])
    shard = n // 4 // 8 * 8
    compare(f"large K={k} M={m} N={n}: columns {shard}..{2 * shard} (a TP-4 shard, view)",
            xl.invariant_matmul(a[:m], b[:, shard:2 * shard]), full[:, shard:2 * shard])
    compare(f"large K={k} M={m + 8} N={n}: the first {m} rows", xl.invariant_matmul(a, b)[:m], full)


def accuracy(k, n, m=256):
    a, b = rand(m, k, seed=21), rand(k, n, seed=22)
    got = xl.invariant_matmul(a, b).double()
    want = a.double() @ b.double()
    rel = ((got - want).abs().max() / want.abs().max()).item()
    ulp = ((got - want).abs() / want.abs().clamp_min(1e-3)).median().item()
    print(f"  accuracy K={k} N={n}: max |err| / max |C| = {rel:.2e}, median relative error {ulp:.2e} "
          f"(one bf16 rounding: at most 2^-8 = 3.9e-03 relative)")
    if rel > 1e-2:
        FAILURES.append(f"accuracy K={k}")


def torch_varies(k, n):
    a, b = rand(4096, k, seed=31), rand(k, n, seed=32)
    full = a @ b
    counts = {}
    for m in (1, 16, 64, 1000):
        counts[m] = int((bits(a[:m] @ b) != bits(full[:m])).sum())
    print(f"  torch.matmul (cuBLAS heuristic) K={k} N={n}: elements differing from M=4096's rows: {counts}")


def timings(sizes, leaves=8):
    """Per rank of a row-parallel layer at TP = T: x [M, H/T] @ W^T [H/T, H] as torch F.linear, vs the
    tree layer's batched leaf products + the local tree (no all-reduce here)."""
    print(f"  {'H':>5} {'T':>2} {'M':>5} {'F.linear us':>11} {'tree linear us':>14} {'ratio':>6} {'leaf products us':>16}")
    rows = []
    for hidden in sizes:
        w_full = rand(hidden, hidden, seed=41) * 0.02
        for tp in (1, 2, 4):
            local = hidden // tp
            w = w_full[:, :local].contiguous()
            module = xl.TreeRowParallelLinear.from_full(w_full, 0, tp, leaves)
            for m in (1, 16, 64, 4096):
                x = rand(m, local, seed=m)
                with torch.no_grad():
                    base = graph_us(lambda: torch.nn.functional.linear(x, w), ops=20, replays=20)
                    tree = graph_us(lambda: module(x, reduce=False), ops=20, replays=20)
                    prods = graph_us(lambda: module.leaf_products(x), ops=20, replays=20)
                rows.append(dict(hidden=hidden, tp=tp, m=m, torch_us=base, tree_us=tree, products_us=prods))
                print(f"  {hidden:>5} {tp:>2} {m:>5} {base:>11.2f} {tree:>14.2f} {tree / base:>6.2f} {prods:>16.2f}")
    return rows


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer shapes, H 4096 timings only")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    print(f"== {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"candidate {os.environ.get('EXACTCOLL_INVARIANT_MATMUL_CANDIDATE', '0')}, "
          f"reference {os.environ.get('EXACTCOLL_INVARIANT_MATMUL_REFERENCE', 'default')}")
    ks = (512, 1024, 128) if args.quick else (512, 1024, 2048, 4096, 128, 64, 1792)
    configs = {}
    for k in ks:
        try:
            configs[k] = xl.config(k)
        except Exception as e:  # noqa: BLE001 - reported, then the checks fail
            configs[k] = f"refused: {e}"
        print(f"  pinned {configs[k]}")
    ms = (1, 2, 3, 8, 16, 17, 64, 127, 128, 129, 1000, 4095) if not args.quick else (1, 16, 129, 1000)

    def guarded(name, fn, *fn_args):  # one group's exception is a failure; the other groups still run
        try:
            fn(*fn_args)
        except Exception as e:  # noqa: BLE001
            FAILURES.append(name)
            print(f"  FAIL {name}: {type(e).__name__}: {e}")

    print("== M (rows of A), pointer offsets")
    for k in ks:
        guarded(f"M K={k}", check_m, k, 4096 if k >= 256 else 256, ms)
    print("== N (columns of B: views with ldb = N, and copies)")
    for k in ks[:2] if args.quick else ks:
        guarded(f"N K={k}", check_n, k, 4096)
    print("== batch")
    for k in (512, 128):
        guarded(f"batch K={k}", check_batch, k, 1024 if k >= 256 else 128)
    print("== leaves: the row-parallel layer at TP = 1, 2, 4, 8 (the all-reduce as the tree of partials)")
    guarded("leaves 4096", check_leaves, 4096, 4096, 8, (1, 64) if args.quick else (1, 7, 64, 1000))
    if not args.quick:
        guarded("leaves 14336", check_leaves, 14336, 4096, 8, (1, 64))
    print("== columns: the column-parallel layer (fused Q/K/V-like parts) at TP = 1, 2, 4, 8")
    guarded("columns", check_columns, 4096, 4096)
    print("== large products (possibly run in blocks)")
    guarded("large 2048", check_large, 2048, 2048, 32000)
    if not args.quick:
        guarded("large 4096", check_large, 4096, 4096, 16384)
    print("== accuracy against float64, and torch's own matmul")
    guarded("accuracy 4096", accuracy, 4096, 4096)
    guarded("accuracy 512", accuracy, 512, 4096)
    guarded("torch", torch_varies, 4096, 4096)
    rows = []
    if not args.no_timing:
        print("== timing (CUDA graph, us per call; one GPU, no all-reduce)")
        try:
            rows = timings((4096,) if args.quick else (4096, 8192))
        except Exception as e:  # noqa: BLE001
            FAILURES.append("timing")
            print(f"  FAIL timing: {type(e).__name__}: {e}")
    print(f"== {'FAIL: ' + str(len(FAILURES)) + ' checks differ' if FAILURES else 'every check: same bits'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "configs": {str(k): v for k, v in configs.items()},
                       "failures": FAILURES, "timings": rows}, f, indent=1)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
