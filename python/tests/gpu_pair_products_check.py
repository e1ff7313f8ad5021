#!/usr/bin/env python3
"""exactcoll_invariant_matmul_pairs (the tree's first level fused into the product) on one GPU: its
bits against the unfused path, and its time. Not a CI test (it needs a GPU):

    python3 python/tests/gpu_pair_products_check.py                 # everything; exit 1 on a difference
    python3 python/tests/gpu_pair_products_check.py --no-timing --json out.json

Checks, each bit for bit (int16 views):
1. The pair product (exactcoll.linear._pair_products_into: C[p] = node(P[2p], P[2p+1])) against the
   unfused path: each leaf's product by exactcoll.linear.invariant_matmul, then torch's `+` of each
   pair on the GPU; M in (1, 16, 64, 255, 256, 300, 4096), N in (8, 72, 4096, 8200), K_leaf in
   (8, 120, 128, 1024), 1 and 2 pairs, bf16 and fp16. The operands: normal random values with
   -0.0, +-inf and NaN at a few places, a row of A and a column of B all -0.0, a row whose even
   leaves are huge and odd leaves minus that (leaf products +-inf, nodes inf + -inf = NaN);
   A a view whose columns past the leaves hold NaN (lda > 2 pairs K_leaf), B a view whose columns
   past N hold NaN (ldb > N), C written into a view of a wider buffer whose columns past N must stay
   untouched. The kernel variant the shape chooses; then (in a child process, so that a fault there
   cannot take the rest down) every variant forced (EXACTCOLL_TILE_MATMUL_VARIANT = 16, 64, large,
   large_128) on the same grid.
2. TreeRowParallelLinear (8 leaves) at TP 1, 2, 4, 8, every rank's shard on this GPU, the partials
   combined by exactcoll.linear.tree_sum in rank order, against the same layer the old way
   (leaf_products, then tree_sum), at M = 4096 and M = 7: each rank's partial, the combined sum,
   TP invariance; the prefill overlap path (_overlapped, with a stand-in communicator whose
   all-reduce is the identity, chunk_rows 1024 and 1000) and the autograd path's forward.
3. EXACTCOLL_INVARIANT_MATMUL=cublaslt: the pair product (two cuBLASLt leaf products and the pair
   add kernel) against that mode's per-leaf products + torch `+`, on a few shapes.
4. With --old-lib PATH (a libexactcoll.so built from the commit before the pair mode, loaded beside
   the wheel's): the pair product against that library's per-leaf products + torch `+`, and the
   new library's plain batched leaf products against the old one's (the plain kernels unchanged).
Timing at M = 4096 (bf16, CUDA graphs): (a) the old path, batched leaf products + tree_sum;
(b) the pair product (+ tree_sum where there are more than 2 leaves); (c) torch.matmul of the
whole [M, Lr Kl] x [Lr Kl, N]. A short table is printed last.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import exactcoll.linear as xl
from gpu_check_util import graph_us, with_env

VAR = "EXACTCOLL_TILE_MATMUL_VARIANT"
KERNEL = "EXACTCOLL_INVARIANT_MATMUL"
MS = (1, 16, 64, 255, 256, 300, 4096)
NS = (8, 72, 4096, 8200)
KS = (8, 120, 128, 1024)
PAIRS = (1, 2)
FORCED = ("16", "64", "large", "large_128", "mid", "mid16", "mid_64", "mid16_64")  # mid*: the split path
OLD = None  # the old library's exactcoll_invariant_matmul (--old-lib)
SENTINEL = 0x7F81  # a NaN payload no rounding gives (a NaN rounds to 0x7FFF): still there means not written


def operands(m, n, kl, pairs, dtype, seed):
    """x [m, 2 pairs kl] (a view, lda = 2 pairs kl + 8), w [2 pairs kl, n] (a view, ldb = n + 8)."""
    leaves = 2 * pairs
    g = torch.Generator(device="cuda").manual_seed(seed)
    x_full = torch.randn(m, leaves * kl + 8, generator=g, device="cuda").to(dtype)
    x_full[:, leaves * kl:] = float("nan")
    w_full = torch.randn(leaves * kl, n + 8, generator=g, device="cuda").to(dtype)
    w_full[:, n:] = float("nan")
    x, w = x_full[:, :leaves * kl], w_full[:, :n]
    specials = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), -0.0, -0.0], device="cuda", dtype=dtype)
    for t in (x, w):
        rows = torch.randint(0, t.shape[0], (6,), generator=g, device="cuda")
        cols = torch.randint(0, t.shape[1], (6,), generator=g, device="cuda")
        t[rows, cols] = specials
    x[min(3, m - 1), :] = -0.0
    w[:, min(5, n - 1)] = -0.0
    big = 60000.0 if dtype == torch.float16 else 3e38
    r = min(6, m - 1)
    for leaf in range(leaves):  # even leaves +big, odd -big: leaf products overflow with opposite signs
        x[r, leaf * kl:(leaf + 1) * kl] = big if leaf % 2 == 0 else -big
    w[:, min(9, n - 1)] = 1.0
    return x, w


def unfused(x, w, pairs):
    """[pairs, m, n]: each leaf by invariant_matmul (its own call), then torch `+` of each pair."""
    kl = x.shape[1] // (2 * pairs)
    leaf = [xl.invariant_matmul(x[:, l * kl:(l + 1) * kl], w[l * kl:(l + 1) * kl]) for l in range(2 * pairs)]
    return torch.stack([leaf[2 * p] + leaf[2 * p + 1] for p in range(pairs)])


def old_leaves(x, w, pairs):
    """[2 pairs, m, n]: the leaves as one batched product by the old library (as _leaf_products_into)."""
    leaves, m, n = 2 * pairs, x.shape[0], w.shape[1]
    kl = x.shape[1] // leaves
    out = torch.empty(leaves, m, n, dtype=x.dtype, device="cuda")
    rc = OLD(x.data_ptr(), w.data_ptr(), out.data_ptr(), m, kl, n, leaves, xl._ld(x), w.stride(0), n, kl,
             kl * w.stride(0), m * n, xl._DTYPE_CODES[x.dtype], torch.cuda.current_device(),
             torch.cuda.current_stream().cuda_stream)
    if rc:
        raise RuntimeError(f"the old library's exactcoll_invariant_matmul returned {rc}")
    return out


def fused(x, w, pairs):
    """The pair product into a view of a wider sentinel-filled buffer; returns the whole buffer."""
    m, n = x.shape[0], w.shape[1]
    wide = torch.full((pairs, m, n + 8), SENTINEL, dtype=torch.int16, device="cuda").view(x.dtype)
    xl._pair_products_into(x, w, pairs, wide[..., :n])
    return wide


def count(stats, key, got, want, what):
    differ = int((got.contiguous().view(torch.int16) != want.contiguous().view(torch.int16)).sum())
    stats["compared"][key] = stats["compared"].get(key, 0) + want.numel()
    stats["differ"][key] = stats["differ"].get(key, 0) + differ
    if differ:
        stats["failures"].append(f"{key}: {what}: {differ} of {want.numel()} differ")
    return differ


def check_grid(variants, stats, ms=MS, ns=NS, ks=KS, dtypes=(torch.bfloat16, torch.float16)):
    for dtype in dtypes:
        for m in ms:
            for n in ns:
                for kl in ks:
                    for pairs in PAIRS:
                        what = f"{str(dtype)[6:]} M={m} N={n} K_leaf={kl} pairs={pairs}"
                        x, w = operands(m, n, kl, pairs, dtype, hash((m, n, kl, pairs, str(dtype))) % (1 << 31))
                        want = unfused(x, w, pairs)
                        if OLD is not None and variants == ("auto",):
                            old = old_leaves(x, w, pairs)
                            new = torch.empty_like(old)
                            xl._leaf_products_into(x, w, 2 * pairs, new)
                            count(stats, "plain leaves: new vs old library", new, old, what)
                            want_old = torch.stack([old[2 * p] + old[2 * p + 1] for p in range(pairs)])
                            count(stats, "pairs[auto] vs old library unfused", fused(x, w, pairs)[..., :n], want_old,
                                  what)
                        for v in variants:
                            wide = with_env(VAR, None if v == "auto" else v, lambda: fused(x, w, pairs))
                            count(stats, f"pairs[{v}]", wide[..., :n], want, what)
                            if not bool((wide[..., n:].view(torch.int16) == SENTINEL).all()):
                                stats["failures"].append(f"pairs[{v}] {what}: wrote past N")
                            if v != "auto":  # also against the forced variant's own unfused path
                                own = with_env(VAR, v, lambda: unfused(x, w, pairs))
                                count(stats, f"pairs[{v}] vs unfused[{v}]", wide[..., :n], own, what)
        torch.cuda.synchronize()


class IdentityComm:
    """A stand-in tree communicator on one GPU: all_reduce copies (so the overlap path's result is
    this rank's partial), set_max_blocks remembers the cap."""

    def __init__(self, world_size):
        self.world_size, self.cap = world_size, 0

    def set_max_blocks(self, blocks):
        previous, self.cap = self.cap, blocks
        return previous

    def all_reduce(self, x, *, out=None):
        return x.clone() if out is None else out.copy_(x)


def check_layers(stats, hidden=8192, out=4096, leaves=8, ms=(4096, 300, 7), dtypes=(torch.bfloat16, torch.float16)):
    for dtype in dtypes:
        g = torch.Generator(device="cuda").manual_seed(7)
        w = (torch.randn(out, hidden, generator=g, device="cuda") * 0.02).to(dtype)
        x_all = torch.randn(max(ms), hidden, generator=g, device="cuda").to(dtype)
        x_all[5, :100] = float("nan")
        x_all[6, ::3] = -0.0
        for m in ms:
            x = x_all[:m]
            tp1 = None
            for tp in (1, 2, 4, 8):
                local = hidden // tp
                new_parts, old_parts = [], []
                for r in range(tp):
                    module = xl.TreeRowParallelLinear.from_full(w, r, tp, leaves, IdentityComm(tp))
                    xr = x[:, r * local:(r + 1) * local]
                    what = f"{str(dtype)[6:]} M={m} TP={tp} rank {r}"
                    new = module(xr, reduce=False)
                    old = xl.tree_sum(module.leaf_products(xr))
                    count(stats, "layer partial", new, old, what)
                    new_parts.append(new)
                    old_parts.append(old)
                    if tp > 1 and m > 1024 and r in (0, tp - 1):  # the prefill overlap, chunks of 1024 and 1000
                        for rows in (1024, 1000):
                            module.chunk_rows = rows
                            count(stats, "layer overlap path", module(xr), old, f"{what} chunk_rows={rows}")
                    if r == tp - 1:  # the autograd path's forward
                        with torch.enable_grad():
                            xg = xr.clone().requires_grad_(True)
                            count(stats, "layer autograd forward", module(xg, reduce=False).detach(), old, what)
                total = xl.tree_sum(torch.stack(new_parts))
                count(stats, "layer TP sum", total, xl.tree_sum(torch.stack(old_parts)), f"{str(dtype)[6:]} M={m} TP={tp}")
                tp1 = total if tp1 is None else tp1
                count(stats, "layer TP invariance", total, tp1, f"{str(dtype)[6:]} M={m} TP={tp} vs TP=1")
        torch.cuda.synchronize()


def check_cublaslt(stats):
    shapes = [(1, 72, 128, 1), (300, 4096, 1024, 2), (4096, 4096, 1024, 1), (4096, 8200, 128, 2), (255, 8, 120, 1)]
    notes = []

    def run():
        for m, n, kl, pairs in shapes:
            x, w = operands(m, n, kl, pairs, torch.bfloat16, m + n + kl)
            what = f"bf16 M={m} N={n} K_leaf={kl} pairs={pairs}"
            try:
                want = unfused(x, w, pairs)
            except Exception as e:  # noqa: BLE001 - the pinned configuration may refuse a shape
                try:
                    fused(x, w, pairs)
                    stats["failures"].append(f"cublaslt {what}: leaves refused ({e}) but the pair product ran")
                except Exception:  # noqa: BLE001
                    notes.append(f"{what}: refused by both ({str(e)[:80]})")
                continue
            wide = fused(x, w, pairs)
            count(stats, "pairs[cublaslt]", wide[..., :n], want, what)
            if not bool((wide[..., n:].view(torch.int16) == SENTINEL).all()):
                stats["failures"].append(f"pairs[cublaslt] {what}: wrote past N")
        torch.cuda.synchronize()

    try:
        with_env(KERNEL, "cublaslt", run)
    except Exception as e:  # noqa: BLE001
        notes.append(f"cuBLASLt mode unavailable: {type(e).__name__}: {e}")
    for n in notes:
        print(f"  cublaslt: {n}")
    return notes


def timings(shapes, m=4096, dtype=torch.bfloat16):
    rows = []
    for n, kl, lr in shapes:
        g = torch.Generator(device="cuda").manual_seed(3)
        x = torch.randn(m, lr * kl, generator=g, device="cuda").to(dtype)
        w = (torch.randn(n, lr * kl, generator=g, device="cuda") * 0.02).to(dtype)
        module = xl.TreeRowParallelLinear.from_full(w, 0, 1, lr)  # Lr leaves of Kl on this "rank"
        wt = module.weight_t.detach()
        leaves = torch.empty(lr, m, n, dtype=dtype, device="cuda")
        pairs = torch.empty(lr // 2, m, n, dtype=dtype, device="cuda")
        out = torch.empty(m, n, dtype=dtype, device="cuda")
        row = dict(m=m, n=n, kl=kl, lr=lr)
        row["old_us"] = graph_us(lambda: xl.tree_sum(xl._leaf_products_into(x, wt, lr, leaves), out=out))
        row["leaves_only_us"] = graph_us(lambda: xl._leaf_products_into(x, wt, lr, leaves))
        if lr == 2:
            row["pairs_us"] = graph_us(lambda: xl._pair_products_into(x, wt, 1, out.unsqueeze(0)))
        else:
            row["pairs_us"] = graph_us(lambda: xl.tree_sum(xl._pair_products_into(x, wt, lr // 2, pairs), out=out))
        row["pairs_only_us"] = graph_us(lambda: xl._pair_products_into(x, wt, lr // 2, pairs))
        row["module_us"] = graph_us(lambda: module(x, reduce=False))
        row["torch_us"] = graph_us(lambda: torch.matmul(x, wt, out=out))
        same = torch.equal(module(x, reduce=False).view(torch.int16), xl.tree_sum(module.leaf_products(x)).view(torch.int16))
        row["same_bits"] = same
        rows.append(row)
        print(f"  M={m} N={n} Kl={kl} Lr={lr}: old {row['old_us']:.1f} us (leaf products alone {row['leaves_only_us']:.1f}), "
              f"pairs {row['pairs_us']:.1f} us (pair product alone {row['pairs_only_us']:.1f}; module forward "
              f"{row['module_us']:.1f}), torch.matmul {row['torch_us']:.1f} us; same bits: {same}", flush=True)
    return rows


def summary(stats):
    keys = sorted(stats["compared"])
    return ", ".join(f"{k}: {stats['differ'][k]} of {stats['compared'][k]} differ" for k in keys)


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--no-forced", action="store_true", help="skip the forced-variant grid (child process)")
    parser.add_argument("--forced-only", help=argparse.SUPPRESS)  # the child: a JSON path for its stats
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--old-lib", help="a libexactcoll.so from before the pair mode, to compare with")
    args = parser.parse_args()
    if args.old_lib:
        import ctypes
        global OLD
        OLD = ctypes.PyDLL(os.path.abspath(args.old_lib)).exactcoll_invariant_matmul
        OLD.argtypes, OLD.restype = xl._MATMUL_ARGTYPES, ctypes.c_int
    if args.forced_only:
        stats = {"compared": {}, "differ": {}, "failures": []}
        start = time.time()
        check_grid(FORCED, stats)
        print(f"== forced variants ({time.time() - start:.0f} s): {summary(stats)}", flush=True)
        with open(args.forced_only, "w") as f:
            json.dump(stats, f)
        return 0
    print(f"== {torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; "
          f"exactcoll.linear.config: {xl.config(1024)}", flush=True)
    stats = {"compared": {}, "differ": {}, "failures": []}

    def guarded(name, fn, *fn_args):  # one section's exception is a failure; the others still run
        start = time.time()
        try:
            return fn(*fn_args)
        except Exception as e:  # noqa: BLE001
            stats["failures"].append(f"{name}: {type(e).__name__}: {e}")
            print(f"  FAIL {name}: {type(e).__name__}: {e}", flush=True)
        finally:
            print(f"== {name} ({time.time() - start:.0f} s): {summary(stats)}", flush=True)
        return None

    guarded("1. pair product vs per-leaf products + torch +", check_grid, ("auto",), stats)
    guarded("2. layers", check_layers, stats)
    notes = guarded("3. cublaslt", check_cublaslt, stats) or []
    rows = []
    if not args.no_timing:
        print("== timing (bf16, M = 4096, CUDA graph of 5 calls, median of 9 replays, us per call)", flush=True)
        rows = guarded("timing", timings, [(8192, 1024, 2), (4096, 512, 2), (8192, 1024, 4)]) or []
    if not args.no_forced:
        path = (args.json or "/tmp/pairs_check.json") + ".forced.json"
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--forced-only", path])
        if child.returncode != 0:
            stats["failures"].append(f"forced-variant child exited {child.returncode}")
        else:
            with open(path) as f:
                forced = json.load(f)
            for key in forced["compared"]:
                stats["compared"][key] = forced["compared"][key]
                stats["differ"][key] = forced["differ"][key]
            stats["failures"] += forced["failures"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "stats": stats, "cublaslt_notes": notes,
                       "timings": rows}, f, indent=1)
    print("\n== bits (elements compared, differing):")
    for key in sorted(stats["compared"]):
        print(f"  {key:<36} {stats['compared'][key]:>14} {stats['differ'][key]:>8}")
    for f in stats["failures"][:40]:
        print(f"  FAIL {f}")
    if rows:
        print(f"\n{'M':>5} {'N':>5} {'Kl':>5} {'Lr':>3} {'(a) old us':>11} {'(b) pairs us':>13} {'b/a':>5} "
              f"{'(c) torch us':>13} {'b/c':>5}  (a) leaves+tree_sum, (b) pair product(+tree_sum), (c) torch.matmul")
        for r in rows:
            print(f"{r['m']:>5} {r['n']:>5} {r['kl']:>5} {r['lr']:>3} {r['old_us']:>11.1f} {r['pairs_us']:>13.1f} "
                  f"{r['pairs_us'] / r['old_us']:>5.2f} {r['torch_us']:>13.1f} {r['pairs_us'] / r['torch_us']:>5.2f}")
    bad = bool(stats["failures"]) or any(not r["same_bits"] for r in rows)
    print(f"== {'FAIL' if bad else 'every check: the same bits as the unfused path'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
