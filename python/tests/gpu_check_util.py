"""What the one-GPU product checks share (gpu_tile_variants_check.py, gpu_pair_products_check.py,
gpu_invariant_matmul_check.py): an environment variable set around one call, and their CUDA-graph
timer, which is python/examples/timing.py's (one round)."""

import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
from timing import graph_us as _graph_us  # noqa: E402


def with_env(name, value, fn):
    """fn() with the environment variable `name` set to value (None: unset), restored after."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        return fn()
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def graph_us(fn, ops=5, replays=9):
    """Median µs per call of fn: ops calls captured in one CUDA graph after a warm-up call, the
    median of `replays` timed replays (timing.graph_us with one round)."""
    return _graph_us(fn, graph_ops=ops, replays=replays, rounds=1)
