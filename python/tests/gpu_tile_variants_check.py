#!/usr/bin/env python3
"""exactcoll's tile product (cuda_backend/linear/tile_matmul.h): every variant of the kernel against
the 64-row one, bit for bit, and their times beside torch.matmul. Not a CI test (it needs a GPU):

    python3 python/tests/gpu_tile_variants_check.py                 # bits, then timings; exit 1 on a difference
    python3 python/tests/gpu_tile_variants_check.py --no-timing
    python3 python/tests/gpu_tile_variants_check.py --variants large --json out.json
    python3 python/tests/gpu_tile_variants_check.py --sweep       # timings at M 256..2048 too

EXACTCOLL_TILE_MATMUL_VARIANT (read by the library on every call, tests only) forces one variant
("16", "64", "large", "large_128"; unset: chosen from the shape). Each case runs the 64-row kernel (the reference:
the kernel the product has run since it exists) and then each variant named, on the same operands,
and counts the elements whose int16 views differ. The operands: normal random values with specials
(-0.0, +-inf, NaN) at a few places, a row of A and a column of B all -0.0, A a view whose columns
past K hold NaN (lda > K), C written into a view of a wider buffer whose columns past N must stay
untouched; every (M, N, K) of the grid below, batch 1, batch 2 over one B (stride 0) and batch 2
over two, bf16 and fp16; and K or N not a multiple of 8 through the C function directly.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

import exactcoll.linear as xl

VAR = "EXACTCOLL_TILE_MATMUL_VARIANT"
MS = (256, 257, 300, 1000, 4096, 4097)
NS = (8, 72, 4096, 8200)
KS = (8, 120, 128, 136, 1000, 1024, 4096)
# int16 bits of C before the product: a NaN in bf16 and in fp16 whose payload no rounding gives (a NaN rounds to
# 0x7FFF), so an element still holding it was not written. (The run of 2026-11-27 used -12345, which is also the
# fp16 value -31.11 that products give: its "left unwritten" lines were such values, not missing writes; as bf16 it is
# -6.7e9, which no product here reaches, and every large variant, which writes each element, agreed everywhere.)
SENTINEL = 0x7F81


def with_variant(variant, fn):
    """fn() with EXACTCOLL_TILE_MATMUL_VARIANT set to variant ("auto": unset)."""
    old = os.environ.get(VAR)
    if variant == "auto":
        os.environ.pop(VAR, None)
    else:
        os.environ[VAR] = variant
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop(VAR, None)
        else:
            os.environ[VAR] = old


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
                        if m == 300 and n == 72:  # the reference is a product: against float64, where finite
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


def check_odd(variants, dtypes, stats):
    """K or N not a multiple of 8 (legal in the C API: only leading dimensions must be), through the
    C function directly: lda, ldb, ldc multiples of 8 larger than K and N."""
    matmul = xl._bound()[0]
    for dtype in dtypes:
        code = xl._DTYPE_CODES[dtype]
        for m, n, k in ((300, 4090, 1001), (4097, 77, 13), (256, 8, 1), (1000, 1001, 129), (257, 3, 4095)):
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
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(ops):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / ops)
    return statistics.median(times)


def timings(variants, shapes, dtype=torch.bfloat16):
    rows = []
    for m, n, k, batch in shapes:
        g = torch.Generator(device="cuda").manual_seed(1)
        a = torch.randn(batch, m, k, generator=g, device="cuda").to(dtype)
        b = torch.randn(batch, k, n, generator=g, device="cuda").to(dtype)
        out = torch.empty(batch, m, n, device="cuda", dtype=dtype)
        flop = 2.0 * m * n * k * batch
        row = dict(m=m, n=n, k=k, batch=batch)
        row["torch"] = graph_ms(lambda: torch.matmul(a, b, out=out))
        for v in ("64",) + tuple(variants):
            row[v] = with_variant(v, lambda: graph_ms(lambda: xl.invariant_matmul(a, b, out=out)))
        rows.append(row)
        cells = " ".join(f"{v}={row[v]:.3f}ms({flop / row[v] / 1e9:.0f}TF)" for v in ("torch", "64") + tuple(variants))
        print(f"  M={m} N={n} K={k} batch={batch}: {cells}", flush=True)
    return rows


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="large,large_128,auto",
                        help="comma-separated (auto: unset, the shape's choice)")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--no-bits", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="also time M = 256 .. 2048 (where to switch)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    print(f"== {torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
          f"variants {variants} vs the 64-row kernel", flush=True)
    stats = {"compared": {}, "differ": {}, "failures": []}
    dtypes = (torch.bfloat16, torch.float16)
    if not args.no_bits:
        start = time.time()
        check_grid(variants, dtypes, MS, NS, KS, stats)
        check_odd(variants, dtypes, stats)
        print(f"== the 64-row reference against float64 (M=300, N=72, finite elements): largest |err| / (|C| + 1) "
              f"{stats.get('max_rel_err', float('nan')):.2e}")
        print(f"== bits ({time.time() - start:.0f} s): " + ", ".join(
            f"{v}: {stats['differ'].get(v, 0)} of {stats['compared'].get(v, 0)} elements differ" for v in variants),
              flush=True)
        for f in stats["failures"][:40]:
            print(f"  FAIL {f}")
    rows = []
    if not args.no_timing:
        shapes = [(4096, 8192, 1024, 2), (4096, 4096, 512, 2), (4096, 8192, 8192, 1)]
        if args.sweep:
            shapes += [(m, n, k, 2) for m in (256, 512, 1024, 2048) for n, k in ((8192, 1024), (4096, 512))]
        print("== timing (bf16, CUDA graph of 5 calls, median of 7 replays, ms per call)", flush=True)
        rows = timings(variants, shapes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "stats": stats, "timings": rows}, f, indent=1)
    if rows:
        print(f"\n{'M':>5} {'N':>5} {'K':>5} {'b':>2} {'torch ms':>9} {'old 64 ms':>9} " +
              " ".join(f"{v:>20}" for v in variants) + "  (ms; x = speed-up over old; % of torch)")
        for r in rows:
            cells = " ".join(f"{r[v]:.3f} {r['64'] / r[v]:.2f}x {100 * r['torch'] / r[v]:.0f}%".rjust(20) for v in variants)
            print(f"{r['m']:>5} {r['n']:>5} {r['k']:>5} {r['batch']:>2} {r['torch']:>9.3f} {r['64']:>9.3f} {cells}")
    bad = bool(stats["failures"])
    print(f"== {'FAIL' if bad else 'every variant: the same bits as the 64-row kernel'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
