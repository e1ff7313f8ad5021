"""What the Python layer adds: host time per eager call and GPU time per CUDA-graph-captured op, on
a communicator of one rank.

    torchrun --nproc-per-node 1 python/examples/bench_overhead.py [path/to/libexactcoll_host_loop.so]

c_host: the C API's own loop of calls (tools/api_bench/host_loop.c, loaded here), in this process,
on the same communicator, tensors and stream, alternating with the Python measurement round by
round, so python_host - c_host is the Python layer's cost and nothing else. The graph column is
comparable with api_host_bench's (the same kernels captured from C).

host: wall time of 200 back-to-back eager calls (out= given, nothing allocated) / 200, the GPU
running behind. graph: 20 calls captured in a torch.cuda.CUDAGraph, replayed 25 times on a side
stream (as the C bench's own stream); the median replay / 20. Each is measured in 5 rounds and the
median round reported. Also: the raw ctypes call alone (the binding's share) and torch.ops (the custom op's
dispatch, which torch.compile uses; eager calls do not go through it).
"""

import ctypes
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import exactcoll.torch as xt
from exactcoll import _lib
from timing import graph_us, host_us  # python/examples/timing.py

CALLS, ROUNDS = 200, 5
CASES = [("all_reduce", 1, 4096), ("all_reduce", 256, 8192), ("fused_add_rms_norm", 1, 8192),
         ("fused_add_rms_norm", 256, 8192)]


def main():
    dist.init_process_group("gloo")
    torch.cuda.set_device(0)
    comm = xt.Communicator()
    # Every call on a stream of its own, as the C bench's (the legacy default stream costs the
    # driver more per launch).
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run_cases(comm)
    comm.close()
    dist.destroy_process_group()


def c_loop_library():
    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("EXACTCOLL_HOST_LOOP", "")
    if not path:
        return None
    loop = ctypes.CDLL(path)
    loop.exactcoll_bench_allreduce_us.restype = ctypes.c_double
    loop.exactcoll_bench_allreduce_us.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                  ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    loop.exactcoll_bench_fused_us.restype = ctypes.c_double
    loop.exactcoll_bench_fused_us.argtypes = [ctypes.c_uint64] + [ctypes.c_void_p] * 5 + [
        ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    return loop


def interleaved_us(c_fn, py_fn):
    """Medians over rounds of (C loop, Python loop), alternating, each CALLS calls."""
    for _ in range(20):
        py_fn()
    torch.cuda.synchronize()
    c_rounds, py_rounds = [], []
    for _ in range(ROUNDS):
        c_rounds.append(c_fn())
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(CALLS):
            py_fn()
        py_rounds.append((time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    if min(c_rounds) < 0:
        raise RuntimeError("the C loop failed: " + _lib.lib.exactcoll_last_error().decode())
    return statistics.median(c_rounds), statistics.median(py_rounds)


def run_cases(comm):
    loop = c_loop_library()
    print(f"{'op':<20} {'shape':<12} {'c_host_us':>9} {'python_host_us':>14} {'added_us':>8} {'ctypes_only_us':>14} "
          f"{'torch_ops_us':>12} {'graph_us_per_op':>16}")
    for op, rows, hidden in CASES:
        x = torch.zeros(rows, hidden, dtype=torch.bfloat16, device="cuda")
        out = torch.empty_like(x)
        if op == "all_reduce":
            eager = lambda: comm.all_reduce(x, out=out)  # noqa: E731
            custom = lambda: torch.ops.exactcoll.all_reduce_out(x, out, comm.id, "auto")  # noqa: E731
            args = (comm._handle, x.data_ptr(), out.data_ptr(), x.numel(), 0, 0, comm._stream(), -1, None)
            raw = lambda: _lib.lib.exactcoll_allreduce(*args)  # noqa: E731
        else:
            residual, weight, residual_out = torch.zeros_like(x), torch.ones(hidden, dtype=x.dtype, device="cuda"), \
                torch.empty_like(x)
            eager = lambda: comm.fused_add_rms_norm(x, residual, weight, 1e-6, out=out,  # noqa: E731
                                                    residual_out=residual_out)
            custom = lambda: torch.ops.exactcoll.fused_add_rms_norm_out(x, residual, weight, out,  # noqa: E731
                                                                        residual_out, 1e-6, comm.id, "auto")
            args = (comm._handle, x.data_ptr(), residual.data_ptr(), weight.data_ptr(), residual_out.data_ptr(),
                    out.data_ptr(), rows, hidden, ctypes.c_float(1e-6), 0, 0, comm._stream(), -1, None)
            raw = lambda: _lib.lib.exactcoll_fused_add_rmsnorm(*args)  # noqa: E731
        stream = comm._stream()
        if loop is None:
            c_host, host = float("nan"), host_us(eager)
        elif op == "all_reduce":
            c_host, host = interleaved_us(lambda: loop.exactcoll_bench_allreduce_us(
                comm.id, x.data_ptr(), out.data_ptr(), x.numel(), 0, stream, CALLS), eager)
        else:
            c_host, host = interleaved_us(lambda: loop.exactcoll_bench_fused_us(
                comm.id, x.data_ptr(), residual.data_ptr(), weight.data_ptr(), residual_out.data_ptr(),
                out.data_ptr(), rows, hidden, 1e-6, 0, stream, CALLS), eager)
        raw_host = host_us(raw)
        custom_host = host_us(custom) if xt.CUSTOM_OPS else float("nan")
        graph = graph_us(eager, rounds=ROUNDS)
        comm.check()
        print(f"{op:<20} {f'{rows}x{hidden}':<12} {c_host:>9.2f} {host:>14.2f} {host - c_host:>8.2f} "
              f"{raw_host:>14.2f} {custom_host:>12.2f} {graph:>16.2f}")


if __name__ == "__main__":
    main()
