"""exactcoll on PyTorch: a communicator over a torch.distributed process group, and the ops on CUDA
tensors, with the same bits as exactcoll.sim for every algorithm, size, batch and world size.

    import torch, torch.distributed as dist
    import exactcoll.torch as xt
    dist.init_process_group("gloo")                 # or "nccl"; only its store is used
    torch.cuda.set_device(local_rank)
    comm = xt.Communicator()                        # collective; bootstraps through the group's store
    y = comm.all_reduce(x)                          # x: contiguous bf16/fp16/fp32 CUDA tensor
    out, residual_out = comm.fused_add_rms_norm(partial, residual, weight, 1e-6)

Ops run on torch's current stream and take out= (and all_reduce_ works in place). Under
torch.compile they are the torch.library custom ops exactcoll::all_reduce, exactcoll::reduce_scatter,
exactcoll::all_gather and exactcoll::fused_add_rms_norm (with fake implementations), and every op
may be captured in a CUDA graph. Errors: ValueError for a bad shape, dtype, device or layout;
exactcoll.PeerTimeoutError (a RuntimeError) when a peer never arrived, reported by check().
Ranks may share one GPU (a slow correctness mode: NCCL is left out, kernels time-slice).

Importing this module also registers the torch.distributed backend "exactcoll"
(exactcoll/distributed.py): dist.init_process_group("cuda:exactcoll,cpu:gloo") (torch >= 2) or
"exactcoll" sends SUM all_reduce / reduce_scatter_tensor / all_gather_into_tensor on bf16/fp16/fp32
tensors to exactcoll (CUDA: a Communicator per group; CPU: gloo gather + exactcoll.sim's fold, the
GPU's bits) and the rest to NCCL or gloo, counted: backend_counts(), backend_fallbacks().
"""

import contextlib
import ctypes
import datetime
import time

import torch
import torch.distributed as dist

from . import _lib
from ._store import Store

__all__ = ["Communicator", "TorchStore", "add_rms_norm", "FallbackError", "backend_counts", "backend_fallbacks",
           "configure_backend", "record_collectives", "register_graph_buffers", "reset_backend_counts"]

_DTYPE_CODES = {torch.bfloat16: _lib.DTYPES["bf16"], torch.float16: _lib.DTYPES["fp16"],
                torch.float32: _lib.DTYPES["fp32"]}
_COMMS = {}                   # communicator id -> Communicator, for the custom ops
_NAME_COUNTERS = {}           # group tag -> communicators made for it in this process
_CURRENT_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# torch.compiler.is_compiling (torch >= 2.3); dynamo folds it to True while tracing.
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


class TorchStore:
    """A torch.distributed store (c10d TCPStore, FileStore, PrefixStore, ...) as an exactcoll.Store
    backend: the communicator forms over the store the process group already uses."""

    def __init__(self, store):
        self._store = store

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key, timeout_s):
        # c10d reads a zero timeout as "no timeout": an expired deadline waits the shortest time.
        timeout_s = max(timeout_s, 0.001)
        start = time.monotonic()
        try:
            self._store.wait([key], datetime.timedelta(seconds=timeout_s))
        except Exception as e:  # c10d raises RuntimeError / DistStoreError on a timeout
            if time.monotonic() - start >= 0.9 * timeout_s:
                raise TimeoutError(f"key {key!r} never appeared within {timeout_s:.3f} s ({e})") from e
            raise
        return self._store.get(key)

    def add(self, key, delta):
        return self._store.add(key, delta)

    def delete(self, key):
        return self._store.delete_key(key)


def _tensors(**named):
    """ValueError for an argument that is not a torch.Tensor (before torch's own TypeError from
    empty_like and the like), naming it; None (an absent out=) passes."""
    for what, t in named.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise ValueError(f"{what} must be a torch.Tensor, got {type(t).__name__}")


def _group_tag(group):
    name = getattr(group, "group_name", None)
    if name:
        return str(name)
    return "ranks-" + "-".join(str(r) for r in dist.get_process_group_ranks(group))


def _parse_options(*, buffer_mib=128, flag_timeout_ms=5000, store_timeout_s=120.0, use_nccl=True,
                   programmatic_launch=True, node=None, local_world_size=None, name=None, contract="canonical",
                   graph_in_place=True, eager_in_place=True):
    """The communicator's options checked and converted (ValueError naming a bad one), before anything
    else could fail or ctypes could truncate one."""
    parsed = {
        "buffer_bytes": int(_lib.real_option("buffer_mib", buffer_mib, 4096 / (1 << 20), 2 ** 43) * (1 << 20)),
        "flag_timeout_ms": _lib.int_option("flag_timeout_ms", flag_timeout_ms,
                                           _lib.field_type(_lib.CommOptions, "flag_timeout_ms"), 1),
        "store_timeout_ms": int(_lib.real_option("store_timeout_s", store_timeout_s, 0.001, 2 ** 31) * 1000),
        "use_nccl": _lib.switch_option("use_nccl", use_nccl),
        "programmatic_launch": _lib.switch_option("programmatic_launch", programmatic_launch),
        "node": None, "local_world_size": None,
        "contract": _lib.code(_lib.CONTRACTS, contract, "contract"),
        "graph_in_place": _lib.switch_option("graph_in_place", graph_in_place),
        "eager_in_place": _lib.switch_option("eager_in_place", eager_in_place),
    }
    if node is not None:
        parsed["node"] = _lib.int_option("node", node, _lib.field_type(_lib.CommOptions, "node"), 0)
    if local_world_size is not None:
        parsed["local_world_size"] = _lib.int_option("local_world_size", local_world_size,
                                                     _lib.field_type(_lib.CommOptions, "local_world_size"), 1)
    parsed["name"] = None if name is None else _lib.text_option("name", name)
    return parsed


class Communicator:
    """exactcoll's communicator over the ranks of a torch.distributed process group.

    Collective: every rank of `group` (default: the whole job) creates it, in the same order, with
    the current CUDA device set to its GPU. It bootstraps through the group's store (no second
    port). buffer_mib: staging and scratch per rank (larger messages run in chunks, same bits).
    flag_timeout_ms: bound on every in-kernel wait for a peer (at least 60 s when ranks share a
    GPU). name: store key prefix (default: one per group and creation order).

    A job that spans nodes gets the multi-node communicator (IPC inside each node, NCCL between
    nodes, the same bits; algo auto or nccl; no registered buffers): for the whole job (the default
    group) the layout comes from torchrun's GROUP_RANK and LOCAL_WORLD_SIZE; for a subgroup, or to
    override them, pass node (this rank's node) and local_world_size (ranks per node), with the
    group's ranks numbered node-major. A subgroup without them is one node.

    contract: the rounding contract of every exact op (docs/numerics.md): "canonical" (default;
    ranks folded in rank order, one rounding) or "tree" (a balanced binary tree over ranks, every
    node rounded to the dtype: when each rank's x is the tree over its own leaves, the result is
    the tree over all leaves at every TP size; across nodes, nodes and ranks per node powers of
    two). The fused op's residual add and RMSNorm are canonical under both.

    Inputs are read where they lie whenever that is safe, with no copy: always for the algorithms
    whose peers never read a rank's input (push_one_shot, push_two_shot, lamport_one_shot,
    lamport_two_shot: what `auto` picks for all_reduce up to 32 MB on 4 GPUs with the default
    buffers), and, with
    graph_in_place (the default), for the other out-of-place ops captured into a CUDA graph (and
    two_shot in place), once every rank has called register_graph_buffers() after the capture (or
    used `with comm.cuda_graph(g):`). graph_in_place=False copies such inputs through the
    communicator's buffer instead (needed when the captured tensors come from expandable
    segments). With eager_in_place (the default), uncaptured calls of those ops from 2 MiB up to
    the buffer read their inputs in place too, once every rank has mapped the allocation behind
    them: the first call with a new allocation copies and shares it, and the calls after (torch's
    caching allocator reuses its allocations) copy nothing. last_call_info()["staged"] says which
    (for this rank's own input); a rank shares at most 64 allocations at a time (a freed one's
    place goes to a new one), and properties["eager_unavailable_reason"] says why eager calls never
    read in place.
    """

    def __init__(self, group=None, *, buffer_mib=128, flag_timeout_ms=5000, store_timeout_s=120.0, use_nccl=True,
                 programmatic_launch=True, name=None, store=None, node=None, local_world_size=None,
                 contract="canonical", graph_in_place=True, eager_in_place=True):
        # Every option first, before anything else could fail or ctypes could truncate one.
        options = _parse_options(buffer_mib=buffer_mib, flag_timeout_ms=flag_timeout_ms,
                                 store_timeout_s=store_timeout_s, use_nccl=use_nccl,
                                 programmatic_launch=programmatic_launch, node=node,
                                 local_world_size=local_world_size, name=name, contract=contract,
                                 graph_in_place=graph_in_place, eager_in_place=eager_in_place)
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("exactcoll.torch.Communicator needs torch.distributed.init_process_group first "
                               "(any backend: only its store is used)")
        if not torch.cuda.is_available():
            raise _lib.UnavailableError(_lib.ERROR_UNAVAILABLE, "exactcoll.torch.Communicator needs a CUDA device")
        group = group if group is not None else dist.group.WORLD
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise ValueError("this process is not a member of the group")
        if options["name"] is None:
            tag = _group_tag(group)
            options["name"] = f"exactcoll/{tag}/{_NAME_COUNTERS.get(tag, 0)}".encode()
            _NAME_COUNTERS[tag] = _NAME_COUNTERS.get(tag, 0) + 1
        if store is None:
            store = dist.distributed_c10d._get_default_store()
        self._open(store, rank, world_size, group is dist.group.WORLD, options)

    @classmethod
    def _over_store(cls, store, rank, world_size, *, name, whole_job, **kwargs):
        """A communicator over a torch store, with no process group (the exactcoll torch.distributed
        backend makes its communicators this way: inside its creator torch.distributed is not yet
        initialized). Collective over the world_size ranks that share `store` and `name`. whole_job:
        the ranks are the whole torchrun job (node layout from GROUP_RANK and LOCAL_WORLD_SIZE);
        otherwise one node unless node and local_world_size are given."""
        options = _parse_options(name=name, **kwargs)
        if not torch.cuda.is_available():
            raise _lib.UnavailableError(_lib.ERROR_UNAVAILABLE, "exactcoll.torch.Communicator needs a CUDA device")
        comm = cls.__new__(cls)
        comm._open(store, rank, world_size, whole_job, options)
        return comm

    def _open(self, store, rank, world_size, whole_job, parsed):
        self._store = Store(TorchStore(store), rank, world_size)
        options = _lib.CommOptions()
        _lib.lib.exactcoll_comm_options_init(ctypes.byref(options))
        self._name = parsed["name"]
        options.name = self._name
        options.buffer_bytes = parsed["buffer_bytes"]
        options.flag_timeout_ms = parsed["flag_timeout_ms"]
        options.store_timeout_ms = parsed["store_timeout_ms"]
        options.use_nccl = parsed["use_nccl"]
        options.programmatic_launch = parsed["programmatic_launch"]
        options.device = torch.cuda.current_device()
        options.contract = parsed["contract"]
        options.graph_in_place = parsed["graph_in_place"]
        options.eager_in_place = parsed["eager_in_place"]
        node, local_world_size = parsed["node"], parsed["local_world_size"]
        options.node = node if node is not None else (-1 if whole_job else 0)
        options.local_world_size = local_world_size if local_world_size is not None else (0 if whole_job else world_size)
        handle = ctypes.c_uint64()
        self._store.check(_lib.lib.exactcoll_comm_create(self._store.handle, rank, world_size, ctypes.byref(options),
                                                         ctypes.byref(handle)))
        self._handle = handle.value
        self.id = self._handle
        self.rank, self.world_size, self.device = rank, world_size, options.device
        self.contract = _lib.contract_name(parsed["contract"])
        self._info = _lib.new_call_info()
        self._info_ref = ctypes.byref(self._info)
        self._registered = []
        self._last_stream = None  # (raw handle, torch stream) of the last op's stream: _ordered_stream
        _COMMS[self.id] = self

    # ---- the ops -------------------------------------------------------------------------------------

    def all_reduce(self, x, *, out=None, algo="auto", registered=None):
        """out = the contract's sum over ranks of x (same shape and dtype).
        algo: auto, one_shot, two_shot, push_one_shot, push_two_shot, lamport_one_shot, lamport_two_shot,
        nccl (NCCL: not the contract)."""
        if _is_compiling():
            if out is None:
                return torch.ops.exactcoll.all_reduce(x, self.id, algo)
            torch.ops.exactcoll.all_reduce_out(x, out, self.id, algo)
            return out
        _tensors(x=x, out=out)
        if out is None:
            out = torch.empty_like(x)
        self._collective(_lib.lib.exactcoll_allreduce, x, out, algo, registered)
        return out

    def all_reduce_(self, x, *, algo="auto"):
        """In place: x = the all-reduce of x."""
        if _is_compiling():
            torch.ops.exactcoll.all_reduce_inplace(x, self.id, algo)
            return x
        _tensors(x=x)
        self._collective(_lib.lib.exactcoll_allreduce, x, x, algo, None)
        return x

    def reduce_scatter(self, x, *, out=None, algo="auto", registered=None):
        """x [n*k, ...] -> out [k, ...]: this rank's block of the sum (as reduce_scatter_tensor).
        algo: auto, direct, nccl."""
        _tensors(x=x, out=out)
        shape = self._scattered_shape(x)
        if _is_compiling():
            if out is None:
                return torch.ops.exactcoll.reduce_scatter(x, self.id, algo)
            torch.ops.exactcoll.reduce_scatter_out(x, out, self.id, algo)
            return out
        if out is None:
            out = x.new_empty(shape)
        self._collective(_lib.lib.exactcoll_reduce_scatter, x, out, algo, registered, shape)
        return out

    def all_gather(self, x, *, out=None, algo="auto", registered=None):
        """x [k, ...] -> out [n*k, ...]: every rank's x in rank order (as all_gather_into_tensor),
        bits unchanged. algo: auto, direct, copy_engine, nccl."""
        _tensors(x=x, out=out)
        shape = self._gathered_shape(x)
        if _is_compiling():
            if out is None:
                return torch.ops.exactcoll.all_gather(x, self.id, algo)
            torch.ops.exactcoll.all_gather_out(x, out, self.id, algo)
            return out
        if out is None:
            out = x.new_empty(shape)
        self._collective(_lib.lib.exactcoll_allgather, x, out, algo, registered, shape)
        return out

    def fused_add_rms_norm(self, x, residual, weight, eps=1e-6, *, out=None, residual_out=None, algo="auto",
                           registered=None):
        """The fused all-reduce + residual add + RMSNorm; returns (out, residual_out).

        x [..., H]: this rank's partial sums (a row-parallel layer's output); residual [..., H], the
        same on every rank; weight [H]. residual_out = round(all_reduce(x) + residual) and out =
        RMSNorm(residual_out) * weight, with the canonical reduction tree (docs/numerics.md), so a
        row's bits do not depend on the other rows in the batch. algo: auto, one_stage, two_stage,
        push_one_stage, lamport_one_stage, lamport_two_stage, one_stage_reg, gather_norm, unfused,
        nccl_split (NCCL: not the contract).
        """
        if _is_compiling():
            if out is None and residual_out is None:
                return torch.ops.exactcoll.fused_add_rms_norm(x, residual, weight, float(eps), self.id, algo)
            out = torch.empty_like(x) if out is None else out
            residual_out = torch.empty_like(x) if residual_out is None else residual_out
            torch.ops.exactcoll.fused_add_rms_norm_out(x, residual, weight, out, residual_out, float(eps), self.id,
                                                       algo)
            return out, residual_out
        _tensors(x=x, residual=residual, weight=weight, out=out, residual_out=residual_out)
        eps = _lib.eps_option(eps)
        if out is None:
            out = torch.empty_like(x)
        if residual_out is None:
            residual_out = torch.empty_like(x)
        self._fused(x, residual, weight, out, residual_out, eps, algo, registered)
        return out, residual_out

    # ---- registration, checks, state ------------------------------------------------------------

    def register(self, tensor):
        """Collective: registers tensor's memory (same size on every rank, same order) so that peers
        read inputs inside it in place; pass the result as registered= to the ops. The tensor must
        come from cudaMalloc-backed memory (not expandable segments) and stay alive."""
        self._check_tensor(tensor, "tensor")
        index = ctypes.c_int()
        _lib.check(_lib.lib.exactcoll_comm_register_buffer(self._handle, tensor.data_ptr(),
                                                           tensor.numel() * tensor.element_size(),
                                                           ctypes.byref(index)))
        self._registered.append(tensor)
        return RegisteredBuffer(self, index.value, tensor)

    def register_graph_buffers(self):
        """Collective: every rank calls it after capturing the same ops into its CUDA graph(s) and
        before the first replay. The replays then read every rank's captured input where it lies (no
        staging copy). Returns how many captured launches it registered (0 when none needed it).
        It first waits for all work on this GPU: call it with no replay in flight and nothing queued
        that waits on another rank. A failure after the ranks agreed (a peer that never came) leaves
        the communicator refusing further calls.
        Raises on every rank when some rank's inputs cannot be exported (expandable segments, async
        pools: make the communicator with graph_in_place=False) or ranks captured different ops; the
        captured calls it covered then keep copying their inputs, as every replay does until it has
        run (through the communicator's buffer: same bits)."""
        count = ctypes.c_size_t()
        _lib.check(_lib.lib.exactcoll_comm_register_graph_buffers(self._handle, ctypes.byref(count)))
        return count.value

    @contextlib.contextmanager
    def cuda_graph(self, graph, **graph_kwargs):
        """torch.cuda.graph(graph, **graph_kwargs), then register_graph_buffers() when the capture
        ends without an error (collective: every rank captures the same ops).

        Example:
            g = torch.cuda.CUDAGraph()
            with comm.cuda_graph(g):
                y = comm.all_reduce(x)
            g.replay()
        """
        with torch.cuda.graph(graph, **graph_kwargs):
            yield graph
        self.register_graph_buffers()

    def check(self):
        """Waits for the stream of this communicator's last op (else the current one), then raises
        PeerTimeoutError if a kernel's wait for a peer timed out since the last check (naming rank,
        block and peer). Not during graph capture."""
        stream = self._last_stream[0] if self._last_stream is not None else self._stream()
        _lib.check(_lib.lib.exactcoll_comm_check(self._handle, stream))

    def set_max_blocks(self, max_blocks):
        """Caps the grid of this communicator's later all_reduce, reduce_scatter and all_gather
        launches at max_blocks blocks (0: the tuned grid, the default) and returns the previous cap.
        For collectives that run beside other kernels (exactcoll.linear's prefill overlap): fewer
        blocks leave SMs to them. Never changes bits. Every rank must set the same value before the
        same calls; a CUDA-graph capture keeps the cap in force while it captured."""
        if not isinstance(max_blocks, int) or isinstance(max_blocks, bool) or not 0 <= max_blocks < 2**31:
            raise ValueError(f"max_blocks must be an int >= 0 (0: the tuned grid), got {max_blocks!r}")
        previous = ctypes.c_int(0)
        _lib.check(_lib.lib.exactcoll_comm_set_max_blocks(self._handle, max_blocks, ctypes.byref(previous)))
        return previous.value

    def last_call_info(self):
        """What the last eager op ran: algo, exact (False for an NCCL fallback), staged, launches,
        grid, note."""
        return self._info.as_dict(fused=self._last_fused)

    @property
    def properties(self):
        p = _lib.CommProperties()
        p.struct_size = ctypes.sizeof(p)
        _lib.check(_lib.lib.exactcoll_comm_properties_get(self._handle, ctypes.byref(p)))
        return {"rank": p.rank, "world_size": p.world_size, "device": p.device, "ipc_ready": bool(p.ipc_ready),
                "nccl_ready": bool(p.nccl_ready), "shared_gpu": bool(p.shared_gpu), "buffer_bytes": p.buffer_bytes,
                "flag_timeout_ms": p.flag_timeout_ms, "arch": p.arch.decode(),
                "ipc_unavailable_reason": p.ipc_unavailable_reason.decode(),
                "nccl_unavailable_reason": p.nccl_unavailable_reason.decode(), "nodes": p.nodes,
                "local_world_size": p.local_world_size, "contract": _lib.contract_name(p.contract),
                "eager_unavailable_reason": p.eager_unavailable_reason.decode()}

    def close(self):
        """Collective: frees the communicator (every rank calls it; a store barrier first)."""
        if self._handle:
            handle, self._handle = self._handle, 0
            _COMMS.pop(self.id, None)
            self._store.check(_lib.lib.exactcoll_comm_destroy(handle))
            self._store.close()
            self._registered.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals --------------------------------------------------------------------------------

    _last_fused = False

    def _stream(self):
        if _CURRENT_STREAM is not None:
            return _CURRENT_STREAM(self.device)
        return torch.cuda.current_stream(self.device).cuda_stream

    def _ordered_stream(self):
        """The current stream's handle, once that stream waits for this communicator's previous op
        if that op ran on another stream. One communicator's ops share its staging, scratch and
        signal buffers, so they must run one after another on the GPU; FSDP2, for one, issues the
        all-gathers and reduce-scatters of one group from different streams, which then overlapped
        and corrupted each other's buffers. The same stream (the common case) costs one comparison.
        Inside a CUDA-graph capture no wait is added (captured work cannot wait on uncaptured work):
        the graph's own order holds there, and the caller orders replays against eager ops."""
        raw = _CURRENT_STREAM(self.device) if _CURRENT_STREAM is not None else self._stream()
        last = self._last_stream
        if last is not None and last[0] == raw:
            return raw
        current = torch.cuda.current_stream(self.device)
        if last is not None and not torch.cuda.is_current_stream_capturing():
            done = torch.cuda.Event()
            done.record(last[1])  # after the previous op (and anything queued behind it there)
            current.wait_event(done)
        self._last_stream = (raw, current)
        return raw

    def _check_tensor(self, t, what, dtype=None):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_cuda or t.get_device() != self.device:
            raise ValueError(f"{what} is on {t.device}; this communicator runs on cuda:{self.device}")
        if not t.is_contiguous():
            raise ValueError(f"{what} must be contiguous")
        if t.dtype not in _DTYPE_CODES:
            raise ValueError(f"{what} has dtype {t.dtype}; expected torch.bfloat16, torch.float16 or torch.float32")
        if dtype is not None and t.dtype != dtype:
            raise ValueError(f"{what} has dtype {t.dtype}, x {dtype}")

    def _scattered_shape(self, x):
        if x.dim() == 0 or x.shape[0] % self.world_size != 0:
            raise ValueError(f"reduce_scatter splits x's first dimension over {self.world_size} ranks: got shape "
                             f"{tuple(x.shape)}")
        return (x.shape[0] // self.world_size,) + tuple(x.shape[1:])

    def _gathered_shape(self, x):
        if x.dim() == 0:
            raise ValueError("all_gather needs x with at least one dimension")
        return (x.shape[0] * self.world_size,) + tuple(x.shape[1:])

    def _registered_index(self, registered):
        if registered is None:
            return -1
        if not isinstance(registered, RegisteredBuffer) or registered.comm is not self:
            raise ValueError("registered must be a RegisteredBuffer of this communicator (Communicator.register)")
        return registered.index

    # The eager path is written for host time (python/examples/bench_overhead.py): one combined
    # check per tensor on the fast path, and the explanation only when it fails.

    def _collective(self, function, x, out, algo, registered, out_shape=None):
        handle = self._handle
        device = self.device
        try:
            dtype = x.dtype
            ok = (x.get_device() == device and out.get_device() == device and out.dtype is dtype
                  and x.is_contiguous() and out.is_contiguous()
                  and (out.shape == x.shape if out_shape is None else tuple(out.shape) == out_shape))
            dtype_code = _DTYPE_CODES[dtype]
            algo_code = _lib.ALGOS[algo]
        except (AttributeError, KeyError, TypeError):
            ok = False
        if not ok or not handle:
            self._explain((x, "x", None), (out, "out", out_shape if out_shape is not None else x.shape), algo=algo,
                          algos=_lib.ALGOS)
        status = function(handle, x.data_ptr(), out.data_ptr(), x.numel(), dtype_code, algo_code, self._ordered_stream(),
                          -1 if registered is None else self._registered_index(registered), self._info_ref)
        self._last_fused = False
        if status:
            _lib.check(status)

    def _fused(self, x, residual, weight, out, residual_out, eps, algo, registered):
        handle = self._handle
        device = self.device
        try:
            dtype, shape = x.dtype, x.shape
            hidden = shape[-1]
            ok = (x.get_device() == device and residual.get_device() == device and weight.get_device() == device
                  and out.get_device() == device and residual_out.get_device() == device
                  and residual.dtype is dtype and weight.dtype is dtype and out.dtype is dtype
                  and residual_out.dtype is dtype
                  and x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()
                  and out.is_contiguous() and residual_out.is_contiguous()
                  and residual.shape == shape and out.shape == shape and residual_out.shape == shape
                  and weight.shape == (hidden,))
            dtype_code = _DTYPE_CODES[dtype]
            algo_code = _lib.FUSED_ALGOS[algo]
        except (AttributeError, KeyError, TypeError, IndexError):
            ok = False
        if not ok or not handle:
            size = tuple(x.shape) if isinstance(x, torch.Tensor) else None
            hidden_size = (size[-1],) if size else None
            self._explain((x, "x", None), (residual, "residual", size), (weight, "weight", hidden_size),
                          (out, "out", size), (residual_out, "residual_out", size), algo=algo,
                          algos=_lib.FUSED_ALGOS)
        status = _lib.lib.exactcoll_fused_add_rmsnorm(
            handle, x.data_ptr(), residual.data_ptr(), weight.data_ptr(), residual_out.data_ptr(), out.data_ptr(),
            x.numel() // hidden if hidden else 0, hidden, eps, dtype_code, algo_code, self._ordered_stream(),
            -1 if registered is None else self._registered_index(registered), self._info_ref)
        self._last_fused = True
        if status:
            _lib.check(status)

    def _explain(self, *tensors, algo, algos):
        """Raises the ValueError that says what is wrong with the arguments (the slow path)."""
        if not self._handle:
            raise ValueError("the communicator is closed")
        dtype = None
        for t, what, shape in tensors:
            self._check_tensor(t, what, dtype)
            if dtype is None:
                dtype = t.dtype
            if shape is not None and tuple(t.shape) != tuple(shape):
                raise ValueError(f"{what} must have shape {tuple(shape)}, got {tuple(t.shape)}")
        if tensors[0][0].dim() == 0:
            raise ValueError("x must have at least one dimension")
        _lib.code(algos, algo, "algo")
        raise ValueError("invalid arguments")  # not reached: one of the checks above names the problem


def add_rms_norm(x, residual, weight, eps=1e-6, *, out=None, residual_out=None):
    """The canonical residual add + RMSNorm on one GPU, no communicator: returns (out, residual_out)
    with residual_out = round(x + residual) and out = RMSNorm(residual_out) * weight, the bits of
    the fused op on one rank (and of exactcoll.sim.add_rms_norm). x, residual [..., H], weight [H]:
    contiguous CUDA tensors of one dtype on one device; runs on that device's current stream."""
    if _is_compiling():
        if out is None and residual_out is None:
            return torch.ops.exactcoll.add_rms_norm(x, residual, weight, float(eps))
        out = torch.empty_like(x) if out is None else out
        residual_out = torch.empty_like(x) if residual_out is None else residual_out
        torch.ops.exactcoll.add_rms_norm_out(x, residual, weight, out, residual_out, float(eps))
        return out, residual_out
    _tensors(x=x, residual=residual, weight=weight, out=out, residual_out=residual_out)
    eps = _lib.eps_option(eps)
    if out is None:
        out = torch.empty_like(x)
    if residual_out is None:
        residual_out = torch.empty_like(x)
    _add_rms_norm(x, residual, weight, out, residual_out, eps)
    return out, residual_out


def _add_rms_norm(x, residual, weight, out, residual_out, eps):
    try:
        dtype, shape, device = x.dtype, x.shape, x.get_device()
        hidden = shape[-1]
        ok = (device >= 0 and residual.get_device() == device and weight.get_device() == device
              and out.get_device() == device and residual_out.get_device() == device
              and residual.dtype is dtype and weight.dtype is dtype and out.dtype is dtype
              and residual_out.dtype is dtype and x.is_contiguous() and residual.is_contiguous()
              and weight.is_contiguous() and out.is_contiguous() and residual_out.is_contiguous()
              and residual.shape == shape and out.shape == shape and residual_out.shape == shape
              and weight.shape == (hidden,))
        dtype_code = _DTYPE_CODES[dtype]
    except (AttributeError, KeyError, TypeError, IndexError):
        ok = False
    if not ok:
        _explain_local((x, "x"), (residual, "residual"), (weight, "weight"), (out, "out"),
                       (residual_out, "residual_out"))
    status = _lib.lib.exactcoll_add_rmsnorm(
        x.data_ptr(), residual.data_ptr(), weight.data_ptr(), residual_out.data_ptr(), out.data_ptr(),
        x.numel() // hidden if hidden else 0, hidden, eps, dtype_code, device,
        _CURRENT_STREAM(device) if _CURRENT_STREAM else torch.cuda.current_stream(device).cuda_stream)
    if status:
        _lib.check(status)


def _explain_local(*tensors):
    """Raises the ValueError that says what is wrong with add_rms_norm's tensors (the slow path)."""
    x = tensors[0][0]
    for t, what in tensors:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_cuda:
            raise ValueError(f"{what} is on {t.device}: add_rms_norm runs on CUDA tensors")
        if t.device != x.device:
            raise ValueError(f"{what} is on {t.device}, x on {x.device}")
        if not t.is_contiguous():
            raise ValueError(f"{what} must be contiguous")
        if t.dtype not in _DTYPE_CODES:
            raise ValueError(f"{what} has dtype {t.dtype}; expected torch.bfloat16, torch.float16 or torch.float32")
        if t.dtype != x.dtype:
            raise ValueError(f"{what} has dtype {t.dtype}, x {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension")
    for t, what in tensors[1:]:
        want = (x.shape[-1],) if what == "weight" else tuple(x.shape)
        if tuple(t.shape) != want:
            raise ValueError(f"{what} must have shape {want}, got {tuple(t.shape)}")
    raise ValueError("invalid arguments")  # not reached


class RegisteredBuffer:
    """A tensor registered on a communicator (Communicator.register)."""

    def __init__(self, comm, index, tensor):
        self.comm, self.index, self.tensor = comm, index, tensor


# ---- torch.library custom ops (torch.compile, CUDA graphs) ----------------------------------------

def _comm(comm_id):
    try:
        return _COMMS[comm_id]
    except KeyError:
        raise ValueError(f"exactcoll communicator {comm_id} does not exist (closed, or made in another process)") \
            from None


def _define_ops():
    lib = torch.library

    @lib.custom_op("exactcoll::all_reduce", mutates_args=())
    def all_reduce(x: torch.Tensor, comm: int, algo: str) -> torch.Tensor:
        out = torch.empty_like(x)
        _comm(comm)._collective(_lib.lib.exactcoll_allreduce, x, out, algo, None)
        return out

    @all_reduce.register_fake
    def _(x, comm, algo):
        return torch.empty_like(x)

    @lib.custom_op("exactcoll::all_reduce_out", mutates_args=("out",))
    def all_reduce_out(x: torch.Tensor, out: torch.Tensor, comm: int, algo: str) -> None:
        _comm(comm)._collective(_lib.lib.exactcoll_allreduce, x, out, algo, None)

    @all_reduce_out.register_fake
    def _(x, out, comm, algo):
        return None

    @lib.custom_op("exactcoll::all_reduce_inplace", mutates_args=("x",))
    def all_reduce_inplace(x: torch.Tensor, comm: int, algo: str) -> None:
        _comm(comm)._collective(_lib.lib.exactcoll_allreduce, x, x, algo, None)

    @all_reduce_inplace.register_fake
    def _(x, comm, algo):
        return None

    @lib.custom_op("exactcoll::reduce_scatter", mutates_args=())
    def reduce_scatter(x: torch.Tensor, comm: int, algo: str) -> torch.Tensor:
        c = _comm(comm)
        shape = c._scattered_shape(x)
        out = x.new_empty(shape)
        c._collective(_lib.lib.exactcoll_reduce_scatter, x, out, algo, None, shape)
        return out

    @reduce_scatter.register_fake
    def _(x, comm, algo):
        return x.new_empty(_comm(comm)._scattered_shape(x))

    @lib.custom_op("exactcoll::reduce_scatter_out", mutates_args=("out",))
    def reduce_scatter_out(x: torch.Tensor, out: torch.Tensor, comm: int, algo: str) -> None:
        c = _comm(comm)
        c._collective(_lib.lib.exactcoll_reduce_scatter, x, out, algo, None, c._scattered_shape(x))

    @reduce_scatter_out.register_fake
    def _(x, out, comm, algo):
        return None

    @lib.custom_op("exactcoll::all_gather", mutates_args=())
    def all_gather(x: torch.Tensor, comm: int, algo: str) -> torch.Tensor:
        c = _comm(comm)
        shape = c._gathered_shape(x)
        out = x.new_empty(shape)
        c._collective(_lib.lib.exactcoll_allgather, x, out, algo, None, shape)
        return out

    @all_gather.register_fake
    def _(x, comm, algo):
        return x.new_empty(_comm(comm)._gathered_shape(x))

    @lib.custom_op("exactcoll::all_gather_out", mutates_args=("out",))
    def all_gather_out(x: torch.Tensor, out: torch.Tensor, comm: int, algo: str) -> None:
        c = _comm(comm)
        c._collective(_lib.lib.exactcoll_allgather, x, out, algo, None, c._gathered_shape(x))

    @all_gather_out.register_fake
    def _(x, out, comm, algo):
        return None

    @lib.custom_op("exactcoll::fused_add_rms_norm", mutates_args=())
    def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, comm: int,
                           algo: str) -> tuple[torch.Tensor, torch.Tensor]:
        out, residual_out = torch.empty_like(x), torch.empty_like(x)
        _comm(comm)._fused(x, residual, weight, out, residual_out, eps, algo, None)
        return out, residual_out

    @fused_add_rms_norm.register_fake
    def _(x, residual, weight, eps, comm, algo):
        return torch.empty_like(x), torch.empty_like(x)

    @lib.custom_op("exactcoll::fused_add_rms_norm_out", mutates_args=("out", "residual_out"))
    def fused_add_rms_norm_out(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                               residual_out: torch.Tensor, eps: float, comm: int, algo: str) -> None:
        _comm(comm)._fused(x, residual, weight, out, residual_out, eps, algo, None)

    @fused_add_rms_norm_out.register_fake
    def _(x, residual, weight, out, residual_out, eps, comm, algo):
        return None

    @lib.custom_op("exactcoll::add_rms_norm", mutates_args=())
    def add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, residual_out = torch.empty_like(x), torch.empty_like(x)
        _add_rms_norm(x, residual, weight, out, residual_out, eps)
        return out, residual_out

    @add_rms_norm_op.register_fake
    def _(x, residual, weight, eps):
        return torch.empty_like(x), torch.empty_like(x)

    @lib.custom_op("exactcoll::add_rms_norm_out", mutates_args=("out", "residual_out"))
    def add_rms_norm_out(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                         residual_out: torch.Tensor, eps: float) -> None:
        _add_rms_norm(x, residual, weight, out, residual_out, eps)

    @add_rms_norm_out.register_fake
    def _(x, residual, weight, out, residual_out, eps):
        return None


CUSTOM_OPS = hasattr(torch.library, "custom_op")  # torch >= 2.4: torch.compile support
if CUSTOM_OPS:
    _define_ops()


# ---- the torch.distributed backend "exactcoll" (exactcoll/distributed.py) -------------------------
# Imported last: it makes its communicators with Communicator above. A torch built without
# torch.distributed has no backend to register (nor process groups for Communicator).
if dist.is_available():
    from .distributed import (FallbackError, backend_counts, backend_fallbacks, configure_backend,  # noqa: E402
                              record_collectives, register_backend as _register_backend, register_graph_buffers,
                              reset_backend_counts)

    _register_backend()
