"""The torch.distributed backend "exactcoll": unchanged PyTorch programs get the contract's bits.

    import exactcoll.torch                                   # registers the backend
    dist.init_process_group("cuda:exactcoll,cpu:gloo")       # torch >= 2 (or backend="exactcoll")
    dist.init_process_group("exactcoll", ...)                # torch 1.13

What runs where (per tensor, counted, see backend_counts()):
  - SUM all_reduce, reduce_scatter_tensor (_reduce_scatter_base), all_gather_into_tensor
    (_allgather_base), the list form of reduce_scatter, and the coalesced forms of the first three,
    on contiguous bf16/fp16/fp32 tensors:
      CUDA tensors: an exactcoll.torch.Communicator of the group, made on first use (collective:
        every rank of the group makes the same call), on the tensor's device and current stream;
      CPU tensors: every rank's input gathered over an inner gloo group, then folded by
        exactcoll.sim (the same core fold as the GPU), so a CPU-only job gets the GPU's bits.
  - everything else (other reduce ops, dtypes or layouts, broadcast, all_to_all, send/recv,
    gather/scatter, reduce, the list form of all_gather, ...): an inner NCCL group for CUDA
    tensors, an inner gloo group for CPU tensors (both formed over the group's own store under
    the prefixes "exactcoll-nccl/" and "exactcoll-gloo/"). barrier runs on gloo after the local
    GPU finished its queued work.

Settings (process-wide; environment variables read when the first exactcoll group is made,
configure_backend() after that):
  EXACTCOLL_ALGO                   all_reduce algorithm: auto (default), one_shot, two_shot,
                                   push_one_shot, push_two_shot, lamport_one_shot, lamport_two_shot,
                                   nccl
  EXACTCOLL_REDUCE_SCATTER_ALGO    auto, direct, nccl
  EXACTCOLL_ALL_GATHER_ALGO        auto, direct, copy_engine, nccl
  EXACTCOLL_STRICT                 0 (default): fall back and count; 1: raise FallbackError
                                   instead of sending a floating-point reduction elsewhere; all:
                                   raise for every fallback, data movement too
  EXACTCOLL_BUFFER_MIB             staging buffer per communicator (default 128)
  EXACTCOLL_CONTRACT               canonical (default) or tree: the rounding contract of the exact
                                   ops (docs/numerics.md), fixed per group when the group is made
  EXACTCOLL_REGISTER_DEVICE_BACKENDS=1   experimental: also register the inner groups as the
                                   C++ per-device backends (see _register_device_backends)
The algorithms give the same bits (that is the contract); "nccl" is NCCL inside exactcoll, not
the contract, and is counted as a fallback.

torch >= 2: the group is a dist.ProcessGroup subclass written in Python (torch's C++ Backend
class cannot be subclassed from Python), so torch uses it for every device: with
"cuda:exactcoll,cpu:gloo" the CPU tensors reach it too and get the contract's bits on the CPU
path above. Not covered: DeviceMesh + parallelize_module (C++ looks up a per-device backend that
a Python group does not have; measured on torch 2.11), and any collective torch issues from C++
without going through the Python methods below (see docs in README.md).
"""

import collections
import contextlib
import datetime
import inspect
import os
import threading

import torch
import torch.distributed as dist

from . import _lib

__all__ = ["BACKEND_NAME", "ExactcollProcessGroup", "FallbackError", "backend_counts", "backend_fallbacks",
           "configure_backend", "record_collectives", "reset_backend_counts", "register_backend"]

BACKEND_NAME = "exactcoll"

_EXACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ALL_REDUCE_ALGOS = ("auto", "one_shot", "two_shot", "push_one_shot", "push_two_shot", "lamport_one_shot",
                    "lamport_two_shot", "nccl")
REDUCE_SCATTER_ALGOS = ("auto", "direct", "nccl")
ALL_GATHER_ALGOS = ("auto", "direct", "copy_engine", "nccl")
CONTRACTS = ("canonical", "tree")  # the library's contracts (the emulations are the simulator reference's only)
_SIM_MAX_RANKS = 16  # exactcoll.sim runs 1..16 ranks

# Reductions: a fallback for these changes floating-point bits (strict mode 1 refuses them).
_REDUCTIONS = {"all_reduce", "all_reduce_coalesced", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
               "reduce_scatter", "reduce"}


class FallbackError(RuntimeError):
    """Strict mode: a collective would have left exactcoll (EXACTCOLL_STRICT, configure_backend)."""


# ---- process-wide settings and counts ------------------------------------------------------------

_SETTINGS = None            # dict once read from the environment (first group, or configure_backend)
_SETTINGS_LOCK = threading.Lock()
_COUNTS = collections.Counter()      # (op, "exact" | "fallback") -> tensors
_REASONS = collections.Counter()     # (op, reason) -> tensors sent elsewhere


def _strict_level(value, what):
    """0, 1 or 2 ("all") from an environment string or a configure_backend argument."""
    if isinstance(value, bool):
        return int(value)
    text = str(value).strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return 0
    if text in ("1", "true", "yes", "on", "reductions"):
        return 1
    if text == "all":
        return 2
    raise ValueError(f"{what} must be 0, 1 or all, got {value!r}")


def _algo(value, allowed, what):
    text = str(value).strip()
    if text not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")
    return text


def _settings():
    global _SETTINGS
    if _SETTINGS is None:
        with _SETTINGS_LOCK:
            if _SETTINGS is None:
                env = os.environ
                buffer_mib = env.get("EXACTCOLL_BUFFER_MIB", "128")
                try:
                    buffer_mib = float(buffer_mib)
                except ValueError:
                    raise ValueError(f"EXACTCOLL_BUFFER_MIB must be a number, got {buffer_mib!r}") from None
                _SETTINGS = {
                    "all_reduce": _algo(env.get("EXACTCOLL_ALGO", "auto") or "auto", ALL_REDUCE_ALGOS,
                                        "EXACTCOLL_ALGO"),
                    "reduce_scatter": _algo(env.get("EXACTCOLL_REDUCE_SCATTER_ALGO", "auto") or "auto",
                                            REDUCE_SCATTER_ALGOS, "EXACTCOLL_REDUCE_SCATTER_ALGO"),
                    "all_gather": _algo(env.get("EXACTCOLL_ALL_GATHER_ALGO", "auto") or "auto", ALL_GATHER_ALGOS,
                                        "EXACTCOLL_ALL_GATHER_ALGO"),
                    "strict": _strict_level(env.get("EXACTCOLL_STRICT", "0"), "EXACTCOLL_STRICT"),
                    "buffer_mib": buffer_mib,
                    "contract": _algo(env.get("EXACTCOLL_CONTRACT", "canonical") or "canonical", CONTRACTS,
                                      "EXACTCOLL_CONTRACT"),
                    "register_device_backends": _strict_level(env.get("EXACTCOLL_REGISTER_DEVICE_BACKENDS", "0"),
                                                              "EXACTCOLL_REGISTER_DEVICE_BACKENDS") == 1,
                }
    return _SETTINGS


def configure_backend(*, algo=None, reduce_scatter_algo=None, all_gather_algo=None, strict=None, contract=None):
    """Changes the backend's process-wide settings (every exactcoll group, from the next call on;
    contract: for the groups made after it, since a group's contract is fixed when it is made);
    None leaves a setting as it is. Returns the previous settings as a dict of these keyword
    arguments, so `configure_backend(**previous)` restores them. Every rank must choose the same
    algorithms (they give the same bits, but ranks must run the same one) and contract."""
    settings = _settings()
    previous = {"algo": settings["all_reduce"], "reduce_scatter_algo": settings["reduce_scatter"],
                "all_gather_algo": settings["all_gather"], "strict": ("all" if settings["strict"] == 2
                                                                       else bool(settings["strict"])),
                "contract": settings["contract"]}
    changes = {}
    if contract is not None:
        changes["contract"] = _algo(contract, CONTRACTS, "contract")
    if algo is not None:
        changes["all_reduce"] = _algo(algo, ALL_REDUCE_ALGOS, "algo")
    if reduce_scatter_algo is not None:
        changes["reduce_scatter"] = _algo(reduce_scatter_algo, REDUCE_SCATTER_ALGOS, "reduce_scatter_algo")
    if all_gather_algo is not None:
        changes["all_gather"] = _algo(all_gather_algo, ALL_GATHER_ALGOS, "all_gather_algo")
    if strict is not None:
        changes["strict"] = _strict_level(strict, "strict")
    settings.update(changes)
    return previous


def _nested(counter):
    out = {}
    for (op, kind), n in sorted(counter.items()):
        out.setdefault(op, {"exact": 0, "fallback": 0})[kind] += n
    return out


def backend_counts(group=None):
    """{op: {"exact": tensors, "fallback": tensors}} for every exactcoll group of this process
    (or one group). Op names are torch's: all_reduce, reduce_scatter_tensor, all_gather_into_tensor,
    their *_coalesced forms, broadcast, barrier, ..."""
    return _nested(_COUNTS if group is None else _exactcoll_group(group)._counts)


def backend_fallbacks(group=None):
    """{(op, reason): tensors} for what went to NCCL or gloo, with the reason (e.g. ("all_reduce",
    "op MAX"), ("all_reduce", "dtype torch.int64"), ("broadcast", "not an op exactcoll runs"))."""
    return dict(sorted((_REASONS if group is None else _exactcoll_group(group)._reasons).items()))


def register_graph_buffers(group=None):
    """Collective over the group (default: every exactcoll group of this process, in the order
    they were made; pass group= when the ranks belong to different subgroups): after capturing collectives of the exactcoll
    backend into a CUDA graph and before its first replay, lets the replays read every rank's
    captured tensors in place (Communicator.register_graph_buffers). Returns the number of captured
    launches registered."""
    from .torch import Communicator  # exactcoll.torch imports this module at its end
    groups = list(_GROUPS) if group is None else [_exactcoll_group(group)]
    registered = 0
    for g in groups:
        for index in sorted(g._comms):
            comm = g._comms[index]
            if isinstance(comm, Communicator):
                registered += comm.register_graph_buffers()
    return registered


def _exactcoll_group(group):
    if not isinstance(group, ExactcollProcessGroup):
        raise ValueError(f"{group!r} is not a group of the exactcoll backend (its counts are exactcoll's only)")
    return group


def reset_backend_counts():
    """Zeroes the counts of every group of this process."""
    _COUNTS.clear()
    _REASONS.clear()
    for group in list(_GROUPS):
        group._counts.clear()
        group._reasons.clear()


_GROUPS = []  # every ExactcollProcessGroup made in this process (groups live as long as the job)
_RECORDING = []  # the lists of the open record_collectives() blocks


@contextlib.contextmanager
def record_collectives():
    """Records every exact collective this process runs inside the block: yields a list that gets
    one dict per call, {"op", "group", "group_size", "rank", "input", "output"}, with CPU copies of
    this rank's input (before) and output (after). For replaying a GPU run's collectives through
    the CPU path (python/examples/hf_llama_check.py --cpu). Slow: every copy waits for the GPU."""
    records = []
    _RECORDING.append(records)
    try:
        yield records
    finally:
        # By identity: list.remove compares by value, and a nested block's list may equal this one.
        del _RECORDING[next(i for i, r in enumerate(_RECORDING) if r is records)]


# ---- work objects ----------------------------------------------------------------------------------

class _Work(dist.Work):
    """What every work of this backend shares: it holds its result, and its op cannot fail after it
    was issued (errors raise at the call, from the library's checks)."""

    def __init__(self, result):
        super().__init__()
        self._result = result

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def synchronize(self):
        self.wait()


class _CudaWork(_Work):
    """Work of an asynchronous op (opts.asyncOp, torch >= 2.7; every op on older torch) that ran on
    the CUDA stream that was current when it was issued, with an event recorded after it.

    wait() makes the caller's current stream wait for that event (as NCCL's work does), and does
    not block the host. A synchronous op returns _SYNC_WORK instead: it is ordered on the stream
    it was issued on, where its caller goes on."""

    def __init__(self, result, device, stream, event):
        super().__init__(result)
        self._device, self._stream, self._event = device, stream, event

    def wait(self, timeout=None):
        current = torch.cuda.current_stream(self._device)
        if current != self._stream:
            current.wait_event(self._event)
        return True

    def is_completed(self):
        return self._event.query()

    def get_future(self):
        # A CUDA-aware future: set_result records events on the issuing stream, and its value()/wait()
        # make the caller's stream wait for them (what DDP communication hooks expect).
        future = torch.futures.Future(devices=[self._device])
        with torch.cuda.stream(self._stream):
            future.set_result(self._result)
        return future


class _DoneWork(_Work):
    """Work of an op that finished before it returned (the CPU path)."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(self._result)
        return future


# The work every synchronous CUDA call returns (_cuda_work): done as far as the caller's stream is
# concerned. Its result() is None: a synchronous caller has its tensors already.
_SYNC_WORK = _DoneWork(None)


class _Works(_Work):
    """Several works as one (a coalesced call split by tensor, or a coalescing block)."""

    def __init__(self, works, result):
        super().__init__(result)
        self._works = [w for w in works if w is not None]

    def wait(self, timeout=None):
        for work in self._works:
            work.wait() if timeout is None else work.wait(timeout)
        return True

    def is_completed(self):
        return all(work.is_completed() for work in self._works)

    def get_future(self):
        futures = [work.get_future() for work in self._works]
        if not futures:
            return _DoneWork(self._result).get_future()
        result = self._result
        return torch.futures.collect_all(futures).then(lambda _: result)


# ---- the process group -----------------------------------------------------------------------------

def _tensors_in(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors_in(a)


def _op_name(reduce_op):
    op = getattr(reduce_op, "op", reduce_op)
    return str(op).rsplit(".", 1)[-1]


def _is_sum(opts):
    return opts is None or opts.reduceOp == dist.ReduceOp.SUM


class _Failed:
    """A communicator whose creation raised: every later call on that device raises again."""

    def __init__(self, error):
        self.error = error


class _Unavailable:
    """A device on which this group could not make a communicator, and why."""

    def __init__(self, reason):
        self.reason = reason


class ExactcollProcessGroup(dist.ProcessGroup):
    """One torch.distributed group of the exactcoll backend (made by torch through the registered
    creator; see the module's docstring). Its counts: backend_counts(group)."""

    def __init__(self, store, rank, size, timeout, group_id, global_ranks=None):
        super().__init__(rank, size)
        settings = _settings()  # reads the environment at the first group: a bad value fails here
        self._store = store
        self._timeout = timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=1800)
        self._group_id = str(group_id)
        self._global_ranks = list(global_ranks or [])
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("exactcoll-gloo/", store), rank, size, self._timeout)
        self._nccl = None
        self._nccl_lock = threading.Lock()
        self._comms = {}               # CUDA device index -> Communicator or _Unavailable
        self._comms_made = 0           # names the next communicator (the same on every rank)
        self._counts = collections.Counter()
        self._reasons = collections.Counter()
        self._coalesced = None         # works issued inside _start_coalescing .. _end_coalescing
        self._nccl_coalescing = None   # the device whose NCCL coalescing this block started
        self._buffer_mib = settings["buffer_mib"]
        self.contract = settings["contract"]  # fixed for the group: its communicators and CPU path
        self.registered_device_backends = []
        if settings["register_device_backends"]:
            self._register_device_backends()
        _GROUPS.append(self)

    def _register_device_backends(self):
        """EXACTCOLL_REGISTER_DEVICE_BACKENDS=1 (experimental, torch >= 2, untested on GPUs):
        registers the inner gloo and NCCL groups as this group's C++ per-device backends, so that
        torch's C++ code that looks a backend up by device type (what made DeviceMesh +
        parallelize_module fail with "No backend type associated with device type cuda") finds
        one. Every op torch issues from Python, and those its C++ sends through the Python
        methods, still come here; whatever C++ sends straight to a device backend does not: it
        runs on NCCL or gloo, not exact and not counted."""
        register = getattr(self, "_register_backend", None)
        kinds = getattr(dist.ProcessGroup, "BackendType", None)
        if register is None or kinds is None:
            raise RuntimeError("EXACTCOLL_REGISTER_DEVICE_BACKENDS=1 needs torch >= 2 "
                               "(ProcessGroup._register_backend)")
        register(torch.device("cpu"), kinds.GLOO, self._gloo)
        self.registered_device_backends.append("cpu:gloo")
        if torch.cuda.is_available() and dist.is_nccl_available():
            register(torch.device("cuda"), kinds.NCCL, self._nccl_backend())
            self.registered_device_backends.append("cuda:nccl")

    # ---- identity --------------------------------------------------------------------------------

    @property
    def group_name(self):
        # torch >= 2 reads the name from a group's C++ device backends, which a Python group has
        # none of ("ProcessGroup name not set"); the functional collectives find the group by it.
        return self._group_id

    def getBackendName(self):
        return BACKEND_NAME

    def __repr__(self):
        return f"ExactcollProcessGroup(group {self._group_id!r}, rank {self.rank()} of {self.size()})"

    # ---- the exact ops ---------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if len(tensors) != 1:
            return self._fallback("all_reduce", "several tensors in one call (multi-GPU form)", "allreduce",
                                  (tensors, opts), tensors)
        t = tensors[0]
        reason = self._reason(opts, t)
        if reason is not None:
            return self._fallback("all_reduce", reason, "allreduce", (tensors, opts), tensors)
        return self._track(self._exact_all_reduce("all_reduce", t, opts))

    def allreduce_coalesced(self, tensors, opts=None):
        return self._run_coalesced("all_reduce_coalesced", [(t, t) for t in tensors], opts,
                               lambda op, output, input: self._exact_all_reduce(op, input, opts), "allreduce",
                               dist.AllreduceOptions)

    def _allgather_base(self, output, input, opts=None):
        reason = self._reason(None, input, output)
        if reason is not None:
            args = (output, input) if opts is None else (output, input, opts)
            return self._fallback("all_gather_into_tensor", reason, "_allgather_base", args, [output, input])
        return self._track(self._exact_all_gather("all_gather_into_tensor", output, input, opts))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._run_coalesced("all_gather_into_tensor_coalesced", list(zip(outputs, inputs)), opts,
                               lambda op, output, input: self._exact_all_gather(op, output, input, opts),
                               "_allgather_base", None)

    def _reduce_scatter_base(self, output, input, opts=None):
        reason = self._reason(opts, input, output)
        if reason is not None:
            args = (output, input) if opts is None else (output, input, opts)
            return self._fallback("reduce_scatter_tensor", reason, "_reduce_scatter_base", args, [output, input])
        return self._track(self._exact_reduce_scatter("reduce_scatter_tensor", output, input, opts))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._run_coalesced("reduce_scatter_tensor_coalesced", list(zip(outputs, inputs)), opts,
                               lambda op, output, input: self._exact_reduce_scatter(op, output, input, opts),
                               "_reduce_scatter_base", dist.ReduceScatterOptions)

    def _run_coalesced(self, op, pairs, opts, exact, fallback_method, options_type):
        """One work for a coalesced call: each (output, input) pair (an all-reduce's: the tensor twice)
        runs exactly, or alone through the inner group's `fallback_method`. options_type: the
        reduction's options class, which carries the reduce op to that call; None for a copy
        (all-gather: no reduce op, and opts is not checked)."""
        works = []
        for output, input in pairs:
            reason = self._reason(opts if options_type is not None else None, input, output)
            if reason is None:
                works.append(exact(op, output, input))
                continue
            if options_type is None:
                args = (output, input)
            else:
                single = options_type()
                if opts is not None:
                    single.reduceOp = opts.reduceOp
                args = ([input], single) if output is input else (output, input, single)
            works.append(self._fallback(op, reason, fallback_method, args,
                                        [input] if output is input else [output, input], track=False))
        return self._track(_Works(works, [output for output, _ in pairs]))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        """The list form: SUM on one eligible tensor per rank runs as reduce_scatter_tensor on the
        concatenated inputs (the same bits: block r of the sum is rank r's output)."""
        if len(outputs) != 1 or len(input_lists) != 1 or len(input_lists[0]) != self.size():
            reason = "several tensors in one call (multi-GPU form)"
        else:
            output, inputs = outputs[0], input_lists[0]
            reason = self._reason(opts, output, *inputs)
            if reason is None and any(t.shape != output.shape for t in inputs):
                reason = "inputs shaped unlike the output"
        if reason is not None:
            return self._fallback("reduce_scatter", reason, "reduce_scatter", (outputs, input_lists, opts),
                                  [outputs, input_lists])
        return self._track(self._exact_reduce_scatter("reduce_scatter", output, torch.cat([t.reshape(-1)
                                                                                           for t in inputs]), opts))

    # Newer torch names for the same C++ virtual methods (its trampoline looks these up first).
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # ---- everything else: the inner groups ---------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        return self._data_movement("broadcast", "broadcast", tensors, opts)

    def allgather(self, output_lists, inputs, opts=None):
        return self._data_movement("all_gather", "allgather", output_lists, inputs, opts)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self._data_movement("all_gather_coalesced", "allgather_coalesced", output_lists, inputs, opts)

    def gather(self, output_lists, inputs, opts=None):
        return self._data_movement("gather", "gather", output_lists, inputs, opts)

    def scatter(self, outputs, input_lists, opts=None):
        return self._data_movement("scatter", "scatter", outputs, input_lists, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._data_movement("all_to_all_single", "alltoall_base", output, input, output_split_sizes,
                                   input_split_sizes, opts)

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        return self._data_movement("all_to_all", "alltoall", outputs, inputs, opts)

    def send(self, tensors, dst, tag=0):
        return self._data_movement("send", "send", tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        return self._data_movement("recv", "recv", tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._data_movement("recv", "recv_anysource", tensors, tag)

    def reduce(self, tensors, opts=None):
        reason = "reduce to one rank is not an op exactcoll runs"
        if opts is not None and not _is_sum(opts):
            reason = f"op {_op_name(opts.reduceOp)}"
        return self._fallback("reduce", reason, "reduce", (tensors, opts), tensors)

    def barrier(self, opts=None):
        # Always on gloo (no CUDA device to guess, and NCCL's barrier is an all-reduce). Like NCCL's
        # barrier it also means "this rank's GPU finished what it was given": sync first.
        self._refuse("barrier", "runs on gloo", [])
        self._count("barrier", False, "runs on gloo")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        gloo_opts = dist.BarrierOptions()
        if opts is not None:
            gloo_opts.timeout = opts.timeout
        return self._track(self._gloo.barrier(gloo_opts))

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self._refuse("monitored_barrier", "runs on gloo", [])
        self._count("monitored_barrier", False, "runs on gloo")
        if timeout is None:
            return self._gloo.monitored_barrier(wait_all_ranks=wait_all_ranks)
        return self._gloo.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    # ---- coalescing blocks (dist._coalescing_manager, batch_isend_irecv) ---------------------------

    def _start_coalescing(self, device=None):
        # torch >= 2: _start_coalescing(device); torch 1.13: _start_coalescing().
        self._coalesced = []
        self._nccl_coalescing = None

    def _end_coalescing(self, device=None):
        """One work for every op issued since _start_coalescing (torch >= 2 waits on it instead of
        the fast path's own work). torch 1.13 passes its request list, which holds the works."""
        works, self._coalesced = self._coalesced or [], None
        nccl_device, self._nccl_coalescing = self._nccl_coalescing, None
        if nccl_device is not None:
            works.append(self._nccl._end_coalescing(nccl_device))
        if isinstance(device, list):
            return None
        return _Works(works, [])

    start_coalescing = _start_coalescing
    end_coalescing = _end_coalescing

    # ---- shutdown --------------------------------------------------------------------------------

    def shutdown(self):
        """Local: lets go of the inner NCCL group (the communicators are freed at exit)."""
        nccl, self._nccl = self._nccl, None
        for name in ("shutdown", "_shutdown"):
            if nccl is not None and hasattr(nccl, name):
                getattr(nccl, name)()
                break

    # ---- internals -------------------------------------------------------------------------------

    def _reason(self, opts, *tensors):
        """Why these tensors cannot run exactly (None: they can)."""
        if opts is not None and not _is_sum(opts):
            return f"op {_op_name(opts.reduceOp)}"
        first = tensors[0]
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                return f"not a tensor ({type(t).__name__})"
            if t.dtype not in _EXACT_DTYPES:
                return f"dtype {t.dtype}"
            if t.dtype != first.dtype:
                return f"dtypes differ ({first.dtype}, {t.dtype})"
            if t.layout != torch.strided:
                return f"layout {t.layout}"
            if not t.is_contiguous():
                return "non-contiguous"
            if t.device != first.device:
                return f"devices differ ({first.device}, {t.device})"
        kind = first.device.type
        if kind == "cpu":
            if self.size() > _SIM_MAX_RANKS:
                return f"{self.size()} ranks (the CPU path simulates at most {_SIM_MAX_RANKS})"
        elif kind == "cuda":
            comm = self._comm(first.device)
            if isinstance(comm, _Unavailable):
                return comm.reason
        else:
            return f"device {first.device}"
        return None

    def _count(self, op, exact, reason=None, n=1):
        key = (op, "exact" if exact else "fallback")
        self._counts[key] += n
        _COUNTS[key] += n
        if reason is not None:
            self._reasons[(op, reason)] += n
            _REASONS[(op, reason)] += n

    def _refuse(self, op, reason, tensors):
        strict = _settings()["strict"]
        if strict == 0:
            return
        floating = any(t.is_floating_point() or t.is_complex() for t in _tensors_in(tensors))
        if strict == 2 or (op in _REDUCTIONS and floating):
            raise FallbackError(
                f"exactcoll backend, strict mode (EXACTCOLL_STRICT={'all' if strict == 2 else 1}): {op} would "
                f"leave exactcoll ({reason}). exactcoll runs SUM all_reduce, reduce_scatter_tensor and "
                "all_gather_into_tensor on contiguous bf16/fp16/fp32 tensors"
                + ("" if strict == 2 else "; other floating-point reductions are refused in strict mode"))

    def _track(self, work):
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _fallback(self, op, reason, method, args, tensors, track=True):
        """Runs the call on the inner NCCL (CUDA tensors) or gloo group; counted once per call (once
        per tensor for the coalesced forms, which come here tensor by tensor)."""
        self._refuse(op, reason, tensors)
        self._count(op, False, reason)
        if args and args[-1] is None:  # no options given: the inner group's defaults
            args = args[:-1]
        inner = self._inner(tensors)
        if inner is not self._gloo and self._coalesced is not None and not self._nccl_coalescing:
            # Inside a coalescing block (batch_isend_irecv): NCCL must see the block, or a rank's
            # sends and receives to one peer could wait on each other. Started at the first NCCL op
            # only, so exact ops before it never run inside an NCCL group.
            device = next(t.device for t in _tensors_in(tensors) if t.is_cuda)
            if hasattr(inner, "_start_coalescing"):
                inner._start_coalescing(device)
                self._nccl_coalescing = device
        work = getattr(inner, method)(*args)
        return self._track(work) if track else work

    def _data_movement(self, op, method, *args):
        return self._fallback(op, "not an op exactcoll runs", method, args, list(_tensors_in(args)))

    def _inner(self, tensors):
        if any(t.is_cuda for t in _tensors_in(tensors)):
            return self._nccl_backend()
        return self._gloo

    def _nccl_backend(self):
        with self._nccl_lock:
            if self._nccl is None:
                if not dist.is_nccl_available():
                    raise RuntimeError("exactcoll backend: this torch has no NCCL, so CUDA collectives that "
                                       "exactcoll does not run cannot fall back")
                options = dist.ProcessGroupNCCL.Options()
                options.is_high_priority_stream = False
                if hasattr(options, "_timeout"):
                    options._timeout = self._timeout
                if hasattr(options, "group_name"):
                    options.group_name = f"{self._group_id}:exactcoll-nccl"
                if hasattr(options, "global_ranks_in_group") and self._global_ranks:
                    options.global_ranks_in_group = self._global_ranks
                self._nccl = dist.ProcessGroupNCCL(dist.PrefixStore("exactcoll-nccl/", self._store), self.rank(),
                                                   self.size(), options)
            return self._nccl

    def _layout(self):
        """(whole_job, node, local_world_size) for this group's communicators, or a reason string."""
        if not self._global_ranks:
            return True, None, None  # the default group: the torchrun layout (GROUP_RANK, LOCAL_WORLD_SIZE)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        if local <= 0:
            return False, None, None  # one node
        nodes = [g // local for g in self._global_ranks]
        distinct = sorted(set(nodes))
        if len(distinct) == 1:
            return False, None, None
        per_node = collections.Counter(nodes)
        if len(set(per_node.values())) != 1 or nodes != sorted(nodes):
            return f"the group's ranks {self._global_ranks} are not node-major with as many ranks on each node"
        return False, distinct.index(nodes[self.rank()]), per_node[nodes[0]]

    def _comm(self, device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        comm = self._comms.get(index)
        if comm is None:
            try:
                comm = self._comms[index] = self._make_comm(index)
            except Exception as e:
                # Kept: a retry would make a communicator under a new name that the ranks which
                # succeeded never join, and wait out the store timeout.
                self._comms[index] = _Failed(e)
                raise
        if isinstance(comm, _Failed):
            raise RuntimeError(f"exactcoll backend: this group's communicator on cuda:{index} could not be made "
                               f"({type(comm.error).__name__}: {comm.error}); no exact collective runs there") \
                from comm.error
        return comm

    def _make_comm(self, index):
        from .torch import Communicator  # exactcoll.torch imports this module at its end
        layout = self._layout()
        if isinstance(layout, str):
            return _Unavailable(layout)
        whole_job, node, local_world_size = layout
        capturing = getattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        if capturing():
            # Making a communicator allocates and maps memory, which a CUDA-graph capture forbids.
            raise RuntimeError(f"exactcoll backend: the first exact collective of group {self._group_id!r} on "
                               f"cuda:{index} ran inside a CUDA-graph capture; run one collective of this group "
                               "eagerly before capturing (it makes the group's communicator)")
        name = f"exactcoll-backend/{self._comms_made}"
        self._comms_made += 1
        try:
            with torch.cuda.device(index):
                return Communicator._over_store(
                    dist.PrefixStore("exactcoll-comm/", self._store), self.rank(), self.size(), name=name,
                    whole_job=whole_job, node=node, local_world_size=local_world_size,
                    buffer_mib=self._buffer_mib, store_timeout_s=min(max(self._timeout.total_seconds(), 1.0), 600.0),
                    contract=self.contract)
        except _lib.UnavailableError as e:
            # Uniform on every rank (no CUDA IPC, an unsupported GPU, ...): the group falls back.
            return _Unavailable(f"no exactcoll communicator on cuda:{index}: {e}")

    def _cuda_work(self, result, device, opts):
        if not getattr(opts, "asyncOp", True):
            # A synchronous call (torch >= 2.7 says so): the op is already ordered on the caller's
            # stream, so its work has nothing to wait for; one shared object saves making a
            # dist.Work (and reading the current stream) per call, the larger part of the
            # backend's own host cost.
            return _SYNC_WORK
        stream = torch.cuda.current_stream(device)
        event = torch.cuda.Event()
        event.record(stream)
        return _CudaWork(result, device, stream, event)

    def _refuse_nccl(self, op, algo, tensors):
        """Strict mode refuses a configured algo nccl (not the contract) before anything runs, as the
        CPU path's fallback does."""
        if algo == "nccl":
            self._refuse(op, "algo nccl (not the contract)", tensors)

    def _counted_exact(self, op, comm, tensors):
        if comm._info.exact:
            self._count(op, True)
            return
        # algo "nccl", or the library fell back to NCCL (known only once the call ran): not the
        # contract. Strict mode raises here, the result not being the contract's.
        reason = f"ran NCCL inside exactcoll ({comm._info.note.decode(errors='replace')})"
        self._refuse(op, reason, tensors)
        self._count(op, False, reason)

    def _exact_all_reduce(self, op, t, opts):
        settings = _settings()
        if t.numel() == 0:
            self._count(op, True)
            return _DoneWork([t])
        if not t.is_cuda and settings["all_reduce"] == "nccl":  # before recording: no exact output comes
            return self._fallback(op, "algo nccl (not the contract)", "allreduce", ([t], dist.AllreduceOptions()),
                                  [t], track=False)
        record = self._record("all_reduce", t) if _RECORDING else None
        if t.is_cuda:
            comm = self._comm(t.device)
            self._refuse_nccl(op, settings["all_reduce"], [t])
            comm.all_reduce_(t.view(-1), algo=settings["all_reduce"])  # 1-D: a 0-d loss is fine too
            self._counted_exact(op, comm, [t])
            self._recorded(record, t)
            return self._cuda_work([t], t.device, opts)
        algo = settings["all_reduce"]
        from . import sim
        everyone = self._gather_cpu(t)
        t.view(-1).copy_(sim.all_reduce(everyone, algo=algo, contract=self.contract)[self.rank()])
        self._count(op, True)
        self._recorded(record, t)
        return _DoneWork([t])

    def _check_sizes(self, op, output, input, output_is_larger):
        n = self.size()
        big, small = (output, input) if output_is_larger else (input, output)
        if big.numel() != n * small.numel():
            raise ValueError(f"exactcoll backend: {op} needs the {'output' if output_is_larger else 'input'} to "
                             f"hold {n} x the other's elements; got output {tuple(output.shape)}, input "
                             f"{tuple(input.shape)}")

    def _exact_reduce_scatter(self, op, output, input, opts):
        self._check_sizes(op, output, input, output_is_larger=False)
        settings = _settings()
        if output.numel() == 0:
            self._count(op, True)
            return _DoneWork([output])
        if not output.is_cuda and settings["reduce_scatter"] == "nccl":  # before recording
            return self._fallback(op, "algo nccl (not the contract)", "_reduce_scatter_base", (output, input),
                                  [output, input], track=False)
        record = self._record("reduce_scatter_tensor", input) if _RECORDING else None
        if output.is_cuda:
            comm = self._comm(output.device)
            self._refuse_nccl(op, settings["reduce_scatter"], [output, input])
            comm.reduce_scatter(input.view(-1), out=output.view(-1), algo=settings["reduce_scatter"])
            self._counted_exact(op, comm, [output, input])
            self._recorded(record, output)
            return self._cuda_work([output], output.device, opts)
        algo = settings["reduce_scatter"]
        from . import sim
        everyone = self._gather_cpu(input)
        output.view(-1).copy_(sim.reduce_scatter(everyone, algo=algo, contract=self.contract)[self.rank()])
        self._count(op, True)
        self._recorded(record, output)
        return _DoneWork([output])

    def _exact_all_gather(self, op, output, input, opts):
        self._check_sizes(op, output, input, output_is_larger=True)
        settings = _settings()
        if input.numel() == 0:
            self._count(op, True)
            return _DoneWork([output])
        if not output.is_cuda and settings["all_gather"] == "nccl":  # before recording
            return self._fallback(op, "algo nccl (not the contract)", "allgather",
                                  ([list(output.view(-1).chunk(self.size()))], [input.view(-1)]), [output, input],
                                  track=False)
        record = self._record("all_gather_into_tensor", input) if _RECORDING else None
        if output.is_cuda:
            comm = self._comm(output.device)
            self._refuse_nccl(op, settings["all_gather"], [output, input])
            comm.all_gather(input.view(-1), out=output.view(-1), algo=settings["all_gather"])
            self._counted_exact(op, comm, [output, input])
            self._recorded(record, output)
            return self._cuda_work([output], output.device, opts)
        # The all-gather contract: every rank's bits, unchanged, in rank order. The gather is that.
        output.view(-1).copy_(self._gather_cpu(input).view(-1))
        self._count(op, True)
        self._recorded(record, output)
        return _DoneWork([output])

    def _record(self, op, input):
        record = {"op": op, "group": self._group_id, "group_size": self.size(), "rank": self.rank(),
                  "input": input.detach().to("cpu", copy=True), "output": None}
        for records in _RECORDING:
            records.append(record)
        return record

    @staticmethod
    def _recorded(record, output):
        if record is not None:
            record["output"] = output.detach().to("cpu", copy=True)

    def _gather_cpu(self, t):
        """Every rank's t (contiguous, on the CPU) as one tensor [ranks, t.numel()], bits unchanged:
        gathered as bytes over the inner gloo group (gloo need not know bf16)."""
        mine = t.reshape(-1).view(torch.uint8)
        everyone = [torch.empty_like(mine) for _ in range(self.size())]
        self._gloo.allgather([everyone], [mine]).wait()
        return torch.stack(everyone).view(t.dtype)


# ---- registration ----------------------------------------------------------------------------------

_UNNAMED_GROUPS = [0]


def _create(*args):
    """The creator torch calls for every group of the backend: (opts, backend_options) with the
    extended API (torch >= 1.13), else (store, rank, size, timeout)."""
    if len(args) == 2:
        opts, _backend_options = args
        return ExactcollProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout, opts.group_id,
                                     getattr(opts, "global_ranks_in_group", None))
    store, rank, size, timeout = args
    _UNNAMED_GROUPS[0] += 1
    return ExactcollProcessGroup(store, rank, size, timeout, f"exactcoll-{_UNNAMED_GROUPS[0] - 1}")


def register_backend():
    """Registers the "exactcoll" backend with torch.distributed (import exactcoll.torch does it).
    Returns True when it is registered (now or before)."""
    if not dist.is_available():
        return False
    plugins = getattr(dist.Backend, "_plugins", {})
    if BACKEND_NAME.upper() in plugins:
        return True
    parameters = inspect.signature(dist.Backend.register_backend).parameters
    kwargs = {}
    if "extended_api" in parameters:
        kwargs["extended_api"] = True
    if "devices" in parameters:
        kwargs["devices"] = ["cpu", "cuda"]
    dist.Backend.register_backend(BACKEND_NAME, _create, **kwargs)
    return True
