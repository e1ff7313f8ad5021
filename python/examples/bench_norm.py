"""The canonical residual + RMSNorm kernel beside torch's add + rms_norm, on one GPU, in one run.

    python3 python/examples/bench_norm.py [--dtypes bf16,fp16] [--hidden 2880,4096,...] [--rows 1,16,...]

For every (dtype, H, rows), each timed as a CUDA graph of 20 ops, the median of 25 replays, the
median of 3 such rounds (us per op):
  exactcoll      exactcoll.torch.add_rms_norm (residual_out = x + r rounded, out = RMSNorm), the
                 kernel of the split paths' norm stage;
  torch eager    y = x + r; torch.nn.functional.rms_norm(y, (H,), w, eps) (both outputs kept);
  torch.compile  the same function compiled by Inductor for each shape (default mode, static
                 shapes: its best case), captured in the graph;
  bound          the traffic bound: reading x, r, w and writing residual_out and out, at the rate of
                 a device copy measured in this run (bytes read + written / time, 1 GiB). Below
                 about 32 MB the data stays in L2 across replays, so small shapes can beat it.
Every exactcoll output is compared bit for bit with exactcoll.sim (the contract); the run fails on
one differing bit. The table is printed last; --json writes every number.
"""

import argparse
import json
import time

import numpy as np
import torch

import exactcoll
import exactcoll.sim as xs
import exactcoll.torch as xt
from timing import graph_us  # python/examples/timing.py

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def graph_time_us(fn):
    """Median over rounds of the median replay of a graph of 20 calls, per call (timing.graph_us)."""
    return graph_us(fn, warmups=3)


def copy_rate_bytes_per_us():
    """Bytes read + written per microsecond by a device-to-device copy of 1 GiB."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * n / graph_time_us(lambda: dst.copy_(src))


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.numpy() if t.dtype == torch.float32 else t.view(torch.int16).numpy().view(np.uint16)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--hidden", default="2880,4096,5120,7168,8192")
    parser.add_argument("--rows", default="1,16,256,1024,4096")
    parser.add_argument("--eps", type=float, default=1e-6)
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with exactcoll.sim")
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    torch.cuda.set_device(0)
    eps = args.eps
    # One static compile per shape: lift dynamo's limit on recompiles of one function.
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 1024)
    rate = copy_rate_bytes_per_us()
    print(f"bench_norm: {torch.cuda.get_device_name()}, torch {torch.__version__}, exactcoll {exactcoll.__version__}; "
          f"device copy {rate * 1e6 / 1e9:.0f} GB/s (read + write)", flush=True)
    results, failures = [], 0
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        for hidden in [int(h) for h in args.hidden.split(",")]:
            def add_norm(x, r, w):
                y = x + r
                return y, torch.nn.functional.rms_norm(y, (hidden,), w, eps)
            for rows in [int(r) for r in args.rows.split(",")]:
                compiled = None if args.no_compile else torch.compile(add_norm, dynamic=False)
                g = torch.Generator(device="cuda").manual_seed(rows * 100003 + hidden)
                x = torch.randn(rows, hidden, generator=g, device="cuda").to(dtype)
                r = torch.randn(rows, hidden, generator=g, device="cuda").to(dtype)
                w = (1 + 0.1 * torch.randn(hidden, generator=g, device="cuda")).to(dtype)
                out, ro = torch.empty_like(x), torch.empty_like(x)
                ours = graph_time_us(lambda: xt.add_rms_norm(x, r, w, eps, out=out, residual_out=ro))
                def eager_fn():
                    y = x + r
                    return y, torch.nn.functional.rms_norm(y, (hidden,), w, eps)
                eager = graph_time_us(eager_fn)
                compile_us = float("nan")
                if compiled is not None:
                    start = time.monotonic()
                    compiled(x, r, w)
                    torch.cuda.synchronize()
                    compile_s = time.monotonic() - start
                    compile_us = graph_time_us(lambda: compiled(x, r, w))
                else:
                    compile_s = 0.0
                traffic = (4 * rows * hidden + hidden) * x.element_size()
                bound = traffic / rate
                differing = -1
                if not args.no_check:
                    torch.cuda.synchronize()
                    want_out, want_ro = xs.add_rms_norm(x.cpu(), r.cpu(), w.cpu(), eps)
                    differing = int((bits(out) != bits(want_out)).sum() + (bits(ro) != bits(want_ro)).sum())
                    failures += differing != 0
                row = {"dtype": dtype_name, "hidden": hidden, "rows": rows, "exactcoll_us": ours, "eager_us": eager,
                       "compile_us": compile_us, "bound_us": bound, "differing": differing,
                       "compile_s": compile_s}
                results.append(row)
                print(f"  {dtype_name} H {hidden} rows {rows}: exactcoll {ours:.2f} eager {eager:.2f} compile "
                      f"{compile_us:.2f} bound {bound:.2f} us; differing bits {differing}", flush=True)
    print(f"\n{'dtype':<5} {'H':>5} {'rows':>5} {'exactcoll':>10} {'eager':>8} {'compile':>8} {'bound':>7} "
          f"{'vs compile':>10} {'vs bound':>9} {'diff':>5}")
    for row in results:
        print(f"{row['dtype']:<5} {row['hidden']:>5} {row['rows']:>5} {row['exactcoll_us']:>10.2f} "
              f"{row['eager_us']:>8.2f} {row['compile_us']:>8.2f} {row['bound_us']:>7.2f} "
              f"{row['exactcoll_us'] / row['compile_us']:>9.2f}x {row['exactcoll_us'] / row['bound_us']:>8.2f}x "
              f"{row['differing']:>5}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bytes_per_us": rate, "results": results}, f, indent=1)
    print("bench_norm: " + ("every exactcoll output equals exactcoll.sim bit for bit" if failures == 0 and not
                            args.no_check else f"{failures} shapes differ from exactcoll.sim" if failures else
                            "not checked"))
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
