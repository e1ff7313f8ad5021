#!/usr/bin/env python3
"""exactcoll's tile product (cuda_backend/linear/tile_matmul.h): every variant of the kernel against
the 64-row one, bit for bit, and their times beside torch.matmul. Not a CI test (it needs a GPU):

    python3 python/tests/gpu_tile_variants_check.py                 # bits, then timings; exit 1 on a difference
    python3 python/tests/gpu_tile_variants_check.py --no-timing
    python3 python/tests/gpu_tile_variants_check.py --variants large --json out.json
    python3 python/tests/gpu_tile_variants_check.py --sweep       # timings at M 256..2048 too
    python3 python/tests/gpu_tile_variants_check.py --mid         # the mid-M blocks: M 1..255, decode timings

EXACTCOLL_TILE_MATMUL_VARIANT (read by the library on every call, tests only) forces one variant
("16", "64", "large", "large_128", "mid", "mid_128", "mid_64", "mid16", "mid16_128", "mid16_64"; unset: chosen
from the shape). Each case runs the 64-row kernel (the reference:
the kernel the product has run since it exists) and then each variant named, on the same operands,
and counts the elements whose int16 views differ. The operands: normal random values with specials
(-0.0, +-inf, NaN) at a few places, a row of A and a column of B all -0.0, A a view whose columns
past K hold NaN (lda > K), C written into a view of a wider buffer whose columns past N must stay
untouched; every (M, N, K) of the grid below, batch 1, batch 2 over one B (stride 0) and batch 2
over two, bf16 and fp16; and K or N not a multiple of 8 through the C function directly.

--mid checks the mid-M variants on their own grid (M 1..255, K up to 1024) and times them where they run, at
decode: the tree row-parallel layer's batch-2 products at TP 4 (M x 8192 x 1024 and M x 4096 x 512), each call on
its own copy of the operands in turn (more bytes of B than L2 holds, as a layer's weights at decode), beside the
kernel the shape ran before the mid-M blocks existed ("old": the 16-row blocks for M <= 32, else the 64-row ones)
and torch.matmul.
"""

import argparse
import itertools
import json
import statistics
import sys
import time

import torch

import exactcoll.linear as xl
from gpu_check_util import graph_us, with_env

VAR = "EXACTCOLL_TILE_MATMUL_VARIANT"
MS = (256, 257, 300, 1000, 4096, 4097)
NS = (8, 72, 4096, 8200)
KS = (8, 120, 128, 136, 1000, 1024, 4096)
MID_MS = (1, 16, 32, 33, 63, 64, 65, 100, 128, 255)
MID_KS = (8, 120, 128, 136, 1000, 1024)
MID_VARIANTS = "mid,mid_128,mid_64,mid16,mid16_128,mid16_64,auto"
# int16 bits of C before the product: a NaN in bf16 and in fp16 whose payload no rounding gives (a NaN rounds to
# 0x7FFF), so an element still holding it was not written. (The run of 2026-11-27 used -12345, which is also the
# fp16 value -31.11 that products give: its "left unwritten" lines were such values, not missing writes; as bf16 it is
# -6.7e9, which no product here reaches, and every large variant, which writes each element, agreed everywhere.)
SENTINEL = 0x7F81


def with_variant(variant, fn):
    """fn() with EXACTCOLL_TILE_MATMUL_VARIANT set to variant ("auto": unset)."""
    return with_env(VAR, None if variant == "auto" else variant, fn)


def operands(m, n, k, batch, shared_b, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows_a = (batch, m, k + 16) if batch > 1 else (m, k + 16)
    a_full = torch.randn(*rows_a, generator=g, device="cuda").to(dtype)
    a_full[..., k:] = float("nan")  # past K: must be read as zeros (lda = k + 16)
    a = a_full[..., :k]
    b = torch.randn(*((batch, k, n) if batch > 1 and not shared_b else (k, n)), generator=g, device="cuda").to(dtype)
    for t in (a, b):  # specials at a few places
        flat = t.view(-1) if t.is_contiguous() else None
        if flat is None:
            idx = torch.randint(0, t.shape[-2], (6,), generator=g, device="cuda")
            cols = torch.randint(0, t.shape[-1], (6,), generator=g, device="cuda")
            vals = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), -0.0, -0.0], device="cuda",
                                dtype=dtype)
            t[..., idx, cols] = vals
        else:
            idx = torch.randint(0, flat.numel(), (6,), generator=g, device="cuda")
            flat[idx] = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), -0.0, -0.0], device="cuda",
                                     dtype=dtype)
    a[..., min(3, m - 1), :] = -0.0  # a row of -0.0: its products are signed zeros
    b[..., :, min(5, n - 1)] = -0.0
    return a, b


def run_case(a, b, m, n, batch, variant):
    shape = (batch, m, n + 8) if batch > 1 else (m, n + 8)
    wide = torch.full(shape, SENTINEL, dtype=torch.int16, device="cuda").view(a.dtype)
    out = wide[..., :n]
    with_variant(variant, lambda: xl.invariant_matmul(a, b, out=out))
    return wide


def check_grid(variants, dtypes, ms, ns, ks, stats):
    for dtype in dtypes:
        for m in ms:
            for n in ns:
                for k in ks:
                    for batch, shared_b in ((1, True), (2, True), (2, False)):
                        seed = hash((m, n, k, batch, shared_b, str(dtype))) % (1 << 31)
                        a, b = operands(m, n, k, batch, shared_b, dtype, seed)
                        want = run_case(a, b, m, n, batch, "64").view(torch.int16)
                        if not bool((want[..., n:] == SENTINEL).all()):
                            stats["failures"].append(f"64-row kernel wrote past N at {m}x{n}x{k}")
                        if bool((want[..., :n] == SENTINEL).any()):
                            stats["failures"].append(f"64-row kernel left elements unwritten at {m}x{n}x{k}")
                        if m in (100, 300) and n == 72:  # the reference is a product: against float64, where finite
                            ref = a.double() @ b.double()
                            got = want[..., :n].view(dtype).double()
                            ok = torch.isfinite(ref) & torch.isfinite(got)
                            err = float(((got - ref).abs() / (ref.abs() + 1)).masked_fill(~ok, 0).max())
                            stats["max_rel_err"] = max(stats.get("max_rel_err", 0.0), err)
                            if err > 0.02:
                                stats["failures"].append(f"64-row kernel far from float64 at {m}x{n}x{k}: {err}")
                        for v in variants:
                            got = run_case(a, b, m, n, batch, v).view(torch.int16)
                            differ = int((got != want).sum())
                            stats["compared"][v] = stats["compared"].get(v, 0) + want[..., :n].numel()
                            stats["differ"][v] = stats["differ"].get(v, 0) + differ
                            if differ:
                                stats["failures"].append(f"{v} {str(dtype)[6:]} M={m} N={n} K={k} batch={batch} "
                                                         f"shared_b={shared_b}: {differ} differ")
        torch.cuda.synchronize()


ODD_SHAPES = ((300, 4090, 1001), (4097, 77, 13), (256, 8, 1), (1000, 1001, 129), (257, 3, 4095))
MID_ODD_SHAPES = ((33, 4090, 1001), (100, 77, 13), (1, 8, 1), (255, 1001, 129), (64, 3, 4095), (17, 4097, 33))


def check_odd(variants, dtypes, stats, shapes=ODD_SHAPES):
    """K or N not a multiple of 8 (legal in the C API: only leading dimensions must be), through the
    C function directly: lda, ldb, ldc multiples of 8 larger than K and N."""
    matmul = xl._bound()[0]
    for dtype in dtypes:
        code = xl._DTYPE_CODES[dtype]
        for m, n, k in shapes:
            lda, ldb, ldc = (k + 7) // 8 * 8 + 8, (n + 7) // 8 * 8 + 8, (n + 7) // 8 * 8 + 8
            g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + k)
            a = torch.randn(m, lda, generator=g, device="cuda").to(dtype)
            b = torch.randn(k, ldb, generator=g, device="cuda").to(dtype)
            a[:, k:] = float("nan")
            b[:, n:] = float("nan")
            results = {}
            for v in ("64",) + tuple(variants):
                c = torch.full((m, ldc), SENTINEL, dtype=torch.int16, device="cuda")

                def call():
                    stream = torch.cuda.current_stream().cuda_stream
                    rc = matmul(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, k, n, 1, lda, ldb, ldc, 0, 0, 0, code,
                                torch.cuda.current_device(), stream)
                    if rc:
                        raise RuntimeError(f"exactcoll_invariant_matmul returned {rc}")

                with_variant(v, call)
                results[v] = c
            want = results["64"]
            if not bool((want[:, n:] == SENTINEL).all()):
                stats["failures"].append(f"64-row kernel wrote past N at {m}x{n}x{k}")
            for v in variants:
                differ = int((results[v] != want).sum())
                stats["compared"][v] = stats["compared"].get(v, 0) + m * n
                stats["differ"][v] = stats["differ"].get(v, 0) + differ
                if differ:
                    stats["failures"].append(f"{v} {str(dtype)[6:]} odd M={m} N={n} K={k}: {differ} differ")


def graph_ms(fn, ops=5, replays=7):
    """Median ms per call of fn(i), i counting the calls from 0 (the warm-up, then the captured ones),
    captured in one CUDA graph and replayed (gpu_check_util.graph_us)."""
    counter = itertools.count()
    return graph_us(lambda: fn(next(counter)), ops=ops, replays=replays) / 1000.0


def timings(variants, shapes, dtype=torch.bfloat16):
    rows = []
    for m, n, k, batch in shapes:
        g = torch.Generator(device="cuda").manual_seed(1)
        a = torch.randn(batch, m, k, generator=g, device="cuda").to(dtype)
        b = torch.randn(batch, k, n, generator=g, device="cuda").to(dtype)
        out = torch.empty(batch, m, n, device="cuda", dtype=dtype)
        flop = 2.0 * m * n * k * batch
        row = dict(m=m, n=n, k=k, batch=batch)
        row["torch"] = graph_ms(lambda i: torch.matmul(a, b, out=out))
        for v in ("64",) + tuple(variants):
            row[v] = with_variant(v, lambda: graph_ms(lambda i: xl.invariant_matmul(a, b, out=out)))
        rows.append(row)
        cells = " ".join(f"{v}={row[v]:.3f}ms({flop / row[v] / 1e9:.0f}TF)" for v in ("torch", "64") + tuple(variants))
        print(f"  M={m} N={n} K={k} batch={batch}: {cells}", flush=True)
    return rows


def old_variant(m):
    """The variant the shape ran before the mid-M blocks (commit 03a29da)."""
    return "16" if m <= 32 else "64" if m < 256 else "auto"


def timings_mid(variants, shapes, dtype=torch.bfloat16, repeats=2, cold=True):
    """Decode shapes, each call on its own operands in turn (at least 160 MB of B in all, so that B comes from
    device memory as a layer's weights do; cold=False: 5 calls on one set, B partly in L2 from the call before);
    ms per call, the median of `repeats` graph timings (each the median of its replays), old / variants / torch
    interleaved."""
    rows = []
    for m, n, k, batch in shapes:
        bytes_b = batch * k * n * 2
        sets = max(5, min(32, -(-160 * 2**20 // bytes_b))) if cold else 1
        ops = max(sets, 5)
        g = torch.Generator(device="cuda").manual_seed(1)
        a = [torch.randn(batch, m, k, generator=g, device="cuda").to(dtype) for _ in range(sets)]
        b = [torch.randn(batch, k, n, generator=g, device="cuda").to(dtype) for _ in range(sets)]
        out = torch.empty(batch, m, n, device="cuda", dtype=dtype)
        names = ["torch", "old"] + list(variants)
        got = {v: [] for v in names}
        for _ in range(repeats):
            for v in names:
                if v == "torch":
                    got[v].append(graph_ms(lambda i: torch.matmul(a[i % sets], b[i % sets], out=out), ops=ops))
                else:
                    name = old_variant(m) if v == "old" else v
                    got[v].append(with_variant(name, lambda: graph_ms(
                        lambda i: xl.invariant_matmul(a[i % sets], b[i % sets], out=out), ops=ops)))
        row = dict(m=m, n=n, k=k, batch=batch, sets=sets, old_name=old_variant(m))
        row.update({v: statistics.median(t) for v, t in got.items()})
        row["spread"] = {v: (min(t), max(t)) for v, t in got.items()}
        rows.append(row)
        cells = " ".join(f"{v}={row[v] * 1e3:.1f}us({bytes_b / row[v] / 1e9:.2f}TB/s)" for v in names)
        print(f"  M={m} N={n} K={k} batch={batch} ({sets} operand sets): {cells}", flush=True)
    return rows


def print_mid_table(rows, variants):
    print(f"\n{'M':>4} {'N':>5} {'K':>5} {'b':>2} {'torch us':>9} {'old us':>11} " +
          " ".join(f"{v:>17}" for v in variants) + "  (us per call; x = speed-up over old)")
    for r in rows:
        cells = " ".join(f"{r[v] * 1e3:.2f} {r['old'] / r[v]:.2f}x".rjust(17) for v in variants)
        old = f"{r['old'] * 1e3:.2f} ({r['old_name']})"
        print(f"{r['m']:>4} {r['n']:>5} {r['k']:>5} {r['batch']:>2} {r['torch'] * 1e3:>9.2f} {old:>11} {cells}")


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=None,
                        help="comma-separated (auto: unset, the shape's choice); default large,large_128,auto, with "
                        f"--mid {MID_VARIANTS}")
    parser.add_argument("--mid", action="store_true", help="the mid-M variants: their grid, decode timings")
    parser.add_argument("--time-variants", default="mid_128,mid_64,mid16_128,mid16_64,large_128,large,auto",
                        help="with --mid: the variants timed beside old and torch")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--no-bits", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="also time M = 256 .. 2048 (where to switch)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.variants is None:
        args.variants = MID_VARIANTS if args.mid else "large,large_128,auto"
    variants = [v for v in args.variants.split(",") if v]
    print(f"== {torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
          f"variants {variants} vs the 64-row kernel", flush=True)
    stats = {"compared": {}, "differ": {}, "failures": []}
    dtypes = (torch.bfloat16, torch.float16)
    if not args.no_bits:
        start = time.time()
        if args.mid:
            check_grid(variants, dtypes, MID_MS, NS, MID_KS, stats)
            check_odd(variants, dtypes, stats, MID_ODD_SHAPES)
        else:
            check_grid(variants, dtypes, MS, NS, KS, stats)
            check_odd(variants, dtypes, stats)
        print(f"== the 64-row reference against float64 (M=100 or 300, N=72, finite): largest |err| / (|C| + 1) "
              f"{stats.get('max_rel_err', float('nan')):.2e}")
        print(f"== bits ({time.time() - start:.0f} s): " + ", ".join(
            f"{v}: {stats['differ'].get(v, 0)} of {stats['compared'].get(v, 0)} elements differ" for v in variants),
              flush=True)
        for f in stats["failures"][:40]:
            print(f"  FAIL {f}")
    rows, mid_rows, warm_rows = [], [], []
    time_variants = [v for v in args.time_variants.split(",") if v]
    if args.mid and not args.no_timing:
        shapes = [(m, n, k, 2) for n, k in ((8192, 1024), (4096, 512)) for m in (1, 16, 33, 64, 65, 100, 128, 255)]
        print("== timing (bf16, CUDA graph of one call per operand set, median of 7 replays, twice: the median; us "
              "per call)", flush=True)
        mid_rows = timings_mid(time_variants, shapes)
        print("== the same, warm: 5 calls on one operand set (B partly in L2, as in a benchmark that replays one "
              "layer)", flush=True)
        warm_rows = timings_mid(["auto"], [(m, n, k, 2) for n, k in ((8192, 1024), (4096, 512)) for m in (1, 16, 64)],
                                cold=False)
    elif not args.no_timing:
        shapes = [(4096, 8192, 1024, 2), (4096, 4096, 512, 2), (4096, 8192, 8192, 1)]
        if args.sweep:
            shapes += [(m, n, k, 2) for m in (256, 512, 1024, 2048) for n, k in ((8192, 1024), (4096, 512))]
        print("== timing (bf16, CUDA graph of 5 calls, median of 7 replays, ms per call)", flush=True)
        rows = timings(variants, shapes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "stats": stats, "timings": rows, "mid_timings": mid_rows,
                       "warm_timings": warm_rows},
                      f, indent=1)
    if warm_rows:
        print("\nwarm (one operand set):")
        print_mid_table(warm_rows, ["auto"])
    if mid_rows:
        print("\ncold (B from device memory):")
        print_mid_table(mid_rows, time_variants)
    if rows:
        print(f"\n{'M':>5} {'N':>5} {'K':>5} {'b':>2} {'torch ms':>9} {'old 64 ms':>9} " +
              " ".join(f"{v:>20}" for v in variants) + "  (ms; x = speed-up over old; % of torch)")
        for r in rows:
            cells = " ".join(f"{r[v]:.3f} {r['64'] / r[v]:.2f}x {100 * r['torch'] / r[v]:.0f}%".rjust(20) for v in variants)
            print(f"{r['m']:>5} {r['n']:>5} {r['k']:>5} {r['batch']:>2} {r['torch']:>9.3f} {r['64']:>9.3f} {cells}")
    if not args.no_bits:
        print("== bits: " + ", ".join(f"{v} {stats['compared'].get(v, 0)} compared, {stats['differ'].get(v, 0)} differ"
                                       for v in variants))
    bad = bool(stats["failures"])
    print(f"== {'FAIL' if bad else 'every variant: the same bits as the 64-row kernel'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
