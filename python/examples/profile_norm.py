"""Runs the canonical residual + RMSNorm (exactcoll) and torch.compile's add + rms_norm at one shape,
a few times each, for a profiler (ncu) to pick one launch of each:

    ncu --clock-control none --kernel-name regex:residual_rmsnorm_kernel --launch-skip 3 --launch-count 1 \\
        python3 python/examples/profile_norm.py --rows 256 --hidden 8192
    ncu --clock-control none --kernel-name regex:triton --launch-skip 3 --launch-count 1 ...
"""
import argparse

import torch

import exactcoll.torch as xt


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    x = torch.randn(args.rows, args.hidden, device="cuda").to(dtype)
    r = torch.randn_like(x)
    w = torch.ones(args.hidden, device="cuda", dtype=dtype)

    def add_norm(a, b, c):
        y = a + b
        return y, torch.nn.functional.rms_norm(y, (args.hidden,), c, 1e-6)

    compiled = torch.compile(add_norm, dynamic=False)
    for _ in range(6):
        xt.add_rms_norm(x, r, w, 1e-6)
        compiled(x, r, w)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
