"""The simulator: exactcoll's algorithms on CPU threads, bit for bit with the GPUs.

Inputs are arrays shaped [ranks, ...]: rank r's data is x[r]. Storage types:
  - fp32: float32 arrays;
  - bf16 and fp16: uint16 arrays of bit patterns (as in exactcoll's .npy files; pass dtype=),
    or float16 arrays for fp16;
  - torch CPU tensors of bfloat16, float16 or float32 (the result is a tensor of the same dtype).
Outputs hold the contract's bits (docs/numerics.md) for every rank, shaped [ranks, ...].

Example:
    import numpy as np, exactcoll.sim as xs
    x = np.random.default_rng(0).standard_normal((4, 1024), dtype=np.float32)
    y = xs.all_reduce(x, algo="two_shot")          # y[r] is the same on every rank r
    bits = xs.all_reduce(bf16_bits, dtype="bf16")  # uint16 bit patterns in and out
"""

import ctypes

import numpy as np

from . import _lib

__all__ = ["all_reduce", "reduce_scatter", "all_gather", "fused_add_rms_norm", "add_rms_norm"]

_TORCH_TO_DTYPE = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


class _Array:
    """An input as contiguous storage bits, plus how to give results back in the caller's form."""

    def __init__(self, x, dtype, what):
        self.torch_dtype = None
        if type(x).__module__.startswith("torch") and hasattr(x, "dtype") and hasattr(x, "device"):
            self._from_torch(x, dtype, what)
        else:
            self._from_numpy(np.asarray(x), dtype, what)

    def _from_torch(self, x, dtype, what):
        import torch
        if x.device.type != "cpu":
            raise ValueError(f"{what} is on {x.device}: exactcoll.sim takes CPU tensors (exactcoll.torch runs on GPUs)")
        name = _TORCH_TO_DTYPE.get(str(x.dtype))
        if name is None:
            raise ValueError(f"{what} has dtype {x.dtype}; expected torch.bfloat16, torch.float16 or torch.float32")
        if dtype is not None and dtype != name:
            raise ValueError(f"{what} is {x.dtype} but dtype={dtype!r} was given")
        self.dtype = name
        self.torch_dtype = x.dtype
        x = x.detach().contiguous()
        if name == "fp32":
            self.bits = x.numpy().copy()
        else:
            self.bits = x.view(torch.int16).numpy().view(np.uint16).copy()
        self.float16 = False

    def _from_numpy(self, x, dtype, what):
        self.float16 = False
        if x.dtype == np.float32:
            if dtype not in (None, "fp32"):
                raise ValueError(f"{what} is float32 but dtype={dtype!r}; bf16 and fp16 come as uint16 bit patterns")
            self.dtype = "fp32"
            self.bits = np.require(x, requirements='C')
        elif x.dtype == np.float16:
            if dtype not in (None, "fp16"):
                raise ValueError(f"{what} is float16 but dtype={dtype!r}")
            self.dtype = "fp16"
            self.float16 = True
            self.bits = np.require(x, requirements='C').view(np.uint16)
        elif x.dtype == np.uint16:
            if dtype not in ("bf16", "fp16"):
                raise ValueError(f"{what} is uint16: bit patterns of bf16 or fp16, so pass dtype='bf16' or 'fp16'")
            self.dtype = dtype
            self.bits = np.require(x, requirements='C')
        else:
            raise ValueError(f"{what} has dtype {x.dtype}; expected float32, float16, or uint16 bit patterns "
                             "(with dtype='bf16' or 'fp16')")
        _lib.code(_lib.DTYPES, self.dtype, "dtype")

    def empty(self, shape):
        return np.empty(shape, dtype=np.float32 if self.dtype == "fp32" else np.uint16)

    def give_back(self, bits):
        """The caller's form of an output array of storage bits."""
        if self.torch_dtype is not None:
            import torch
            if self.dtype == "fp32":
                return torch.from_numpy(bits)
            return torch.from_numpy(bits.view(np.int16)).view(self.torch_dtype)
        if self.float16:
            return bits.view(np.float16)
        return bits


def _pointer(array):
    return array.ctypes.data_as(ctypes.c_void_p)


def _ranks_of(array, what, nodes=1):
    if array.bits.ndim < 2:
        raise ValueError(f"{what} must be shaped [ranks, ...], got shape {array.bits.shape}")
    ranks = array.bits.shape[0]
    if ranks % nodes != 0 or not 1 <= ranks // nodes <= 16:
        raise ValueError(f"{what} has {ranks} ranks in its first dimension; the simulator runs 1..16 per node"
                         + (f" ({nodes} nodes: a multiple of {nodes})" if nodes > 1 else ""))
    return ranks


def _nodes_option(options, algo):
    """nodes= and chunk_elements= taken out of the options: (nodes or None, a SimMultiNodeOptions)."""
    nodes = options.pop("nodes", None)
    chunk_elements = options.pop("chunk_elements", None)
    if nodes is None:
        if chunk_elements is not None:
            raise ValueError("chunk_elements goes with nodes= (the multi-node exchange's chunk)")
        return None, None
    nodes = _lib.int_option("nodes", nodes, ctypes.c_int, 1, 1024)
    if algo != "auto":
        raise ValueError(f"across nodes the exchange follows the contract (algo 'auto'), got algo={algo!r}")
    multinode = _lib.SimMultiNodeOptions()
    _lib.lib.exactcoll_sim_multinode_options_init(ctypes.byref(multinode))
    if chunk_elements is not None:
        multinode.chunk_elements = _lib.int_option("chunk_elements", chunk_elements, ctypes.c_size_t, 64)
    return nodes, multinode


def _collective(op, x, dtype, algo, options):
    options = dict(options)
    nodes, multinode = _nodes_option(options, algo)
    array = _Array(x, dtype, "x")
    ranks = _ranks_of(array, "x", nodes or 1)
    per_rank = array.bits.shape[1:]
    count = int(np.prod(per_rank, dtype=np.int64))
    if op == "allreduce":
        out_shape = (ranks,) + per_rank
    elif op == "reduce_scatter":
        if per_rank[0] % ranks != 0:
            raise ValueError(f"reduce_scatter splits each rank's first dimension ({per_rank[0]}) over {ranks} ranks: "
                             "it must be a multiple of the ranks")
        out_shape = (ranks, per_rank[0] // ranks) + per_rank[1:]
    else:
        out_shape = (ranks, per_rank[0] * ranks) + per_rank[1:]
    out = array.empty(out_shape)
    sim_options, keep = _lib.sim_options(**options)
    info = _lib.new_call_info()
    if nodes is None:
        _lib.check(_lib.lib.exactcoll_sim_collective(
            _lib.OPS[op], _lib.code(_lib.ALGOS, algo, "algo"), _lib.DTYPES[array.dtype], ranks, count,
            _pointer(array.bits), _pointer(out), ctypes.byref(sim_options), ctypes.byref(info)))
    else:
        _lib.check(_lib.lib.exactcoll_sim_multinode_collective(
            _lib.OPS[op], _lib.DTYPES[array.dtype], nodes, ranks // nodes, count, _pointer(array.bits), _pointer(out),
            ctypes.byref(sim_options), ctypes.byref(multinode), None, ctypes.byref(info)))
    del keep
    return array.give_back(out)


def all_reduce(x, *, dtype=None, algo="auto", **options):
    """Every rank's result of the all-reduce of x [ranks, ...]: out[r] = fold over ranks of x.

    algo: auto, one_shot, two_shot, push_one_shot, push_two_shot, lamport_one_shot, lamport_two_shot
    (the bits are the same).
    options: blocks (1..128), schedule ('threads' or 'seeded'), schedule_seed (0..2**64 - 1),
    timeout_ms (1..2**31 - 1), trace (JSON-lines file), chrome_trace (Perfetto file), trace_elements
    (at most 4096 indices to trace: fold events, or under tree a tree_node event per node), contract
    ('canonical' or 'tree': a balanced binary tree over ranks, every node rounded, docs/numerics.md).
    Every op takes them; a value out of range, of the wrong type, or a path with a NUL is a
    ValueError naming the option, before anything runs.
    nodes (1..1024, with algo 'auto'): the ranks are nodes x ranks/nodes, emulated nodes whose
    exchange goes over a simulated network (the multi-node path: a carry chain across nodes under
    canonical, recursive doubling / halving under tree), with the same bits as one node of as many
    ranks; chunk_elements (>= 64, a multiple of 64) sets that exchange's chunk. reduce_scatter and
    all_gather take them too.
    """
    return _collective("allreduce", x, dtype, algo, options)


def reduce_scatter(x, *, dtype=None, algo="auto", **options):
    """x [ranks, n*k, ...] -> out [ranks, k, ...]: rank r gets the fold of every rank's r-th block
    of its first dimension (as torch.distributed.reduce_scatter_tensor). algo: auto or direct."""
    return _collective("reduce_scatter", x, dtype, algo, options)


def all_gather(x, *, dtype=None, algo="auto", **options):
    """x [ranks, k, ...] -> out [ranks, ranks*k, ...]: every rank's inputs concatenated along the
    first dimension, bits unchanged (as all_gather_into_tensor). algo: auto or direct."""
    return _collective("allgather", x, dtype, algo, options)


def fused_add_rms_norm(x, residual, weight, eps=1e-6, *, dtype=None, algo="auto", contract="canonical", **options):
    """The fused all-reduce + residual add + RMSNorm: returns (out, residual_out), each [ranks, ..., H].

    x [ranks, ..., H]: every rank's partial sums; residual [..., H] (the same on every rank);
    weight [H]. residual_out = round(allreduce(x) + residual); out = RMSNorm(residual_out).
    algo: auto, one_stage, two_stage, push_one_stage, lamport_one_stage, lamport_two_stage, unfused,
    one_stage_reg, gather_norm, push_one_stage_reg (the same bits).
    contract: canonical or tree (the library's: the algorithms run on the simulated ranks), or
    f32_residual / bf16_accumulate / rotated_two_shot, which reproduce other systems' rounding
    (docs/numerics.md).
    """
    xs = _Array(x, dtype, "x")
    ranks = _ranks_of(xs, "x")
    rs = _Array(residual, xs.dtype, "residual")
    ws = _Array(weight, xs.dtype, "weight")
    if xs.bits.ndim < 2 or xs.bits.shape[1:] != rs.bits.shape:
        raise ValueError(f"residual must be shaped like one rank's x {xs.bits.shape[1:]}, got {rs.bits.shape}")
    hidden = xs.bits.shape[-1]
    if ws.bits.shape != (hidden,):
        raise ValueError(f"weight must be shaped [H] = ({hidden},), got {ws.bits.shape}")
    rows = int(np.prod(xs.bits.shape[1:-1], dtype=np.int64))
    eps = _lib.eps_option(eps)
    out = xs.empty(xs.bits.shape)
    residual_out = xs.empty(xs.bits.shape)
    sim_options, keep = _lib.sim_options(**options)
    info = _lib.new_call_info()
    _lib.check(_lib.lib.exactcoll_sim_fused_add_rmsnorm(
        _lib.code(_lib.FUSED_ALGOS, algo, "algo"), _lib.code(_lib.CONTRACTS, contract, "contract"),
        _lib.DTYPES[xs.dtype], ranks, rows, hidden, eps, _pointer(xs.bits), _pointer(rs.bits), _pointer(ws.bits),
        _pointer(residual_out), _pointer(out), ctypes.byref(sim_options), ctypes.byref(info)))
    del keep
    return xs.give_back(out), xs.give_back(residual_out)


def add_rms_norm(x, residual, weight, eps=1e-6, *, dtype=None, **options):
    """The canonical residual add + RMSNorm of one rank's x [..., H] (no all-reduce): returns (out,
    residual_out), each [..., H]: the bits of exactcoll.torch.add_rms_norm and of the fused op on
    one rank (which is what computes them here)."""
    xs = _Array(x, dtype, "x")
    if xs.bits.ndim < 1:
        raise ValueError("x must have at least one dimension [..., H]")
    out, residual_out = fused_add_rms_norm(xs.give_back(xs.bits[None]), residual, weight, eps, dtype=dtype, **options)
    return out[0], residual_out[0]
