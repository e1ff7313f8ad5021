"""ctypes bindings of libexactcoll.so (the C API of include/exactcoll/exactcoll.h).

Loaded once, from the package's own directory (or from $EXACTCOLL_LIBRARY). Every C struct is
mirrored here and its size checked against the library's (exactcoll_struct_size) at load time, so
a wheel whose Python side and library disagree fails at import, not with corrupted memory.
Handles (exactcoll_store, exactcoll_comm: a struct holding one uint64) are passed as c_uint64,
which the x86-64 and AArch64 C ABIs pass exactly like such a struct.
"""

import ctypes
import itertools
import numbers
import os
import pathlib

# ---- enum values (exactcoll.h) --------------------------------------------------------------------

OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_TIMEOUT = 2
ERROR_STORE = 3
ERROR_CUDA = 4
ERROR_UNAVAILABLE = 5
ERROR_UNUSABLE = 6
ERROR_OUT_OF_MEMORY = 7
ERROR_SIMULATION = 8
ERROR_INTERNAL = 9

# DTYPES, OPS, ALGOS, FUSED_ALGOS and CONTRACTS ({name: C value}) are read from the library once
# it is loaded (below): its registry (core/registry.h) is the one list of them.


class Error(RuntimeError):
    """A failure reported by libexactcoll (the message is the library's)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class PeerTimeoutError(Error):
    """A peer never arrived: a flag wait, a simulated wait or a store wait ran out of time."""


class UnavailableError(Error):
    """What was asked for is not there: no CUDA in this build, no NCCL, no IPC path."""


# ---- structs ---------------------------------------------------------------------------------------

class CallInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("algo", ctypes.c_int), ("allreduce_algo", ctypes.c_int),
                ("exact", ctypes.c_int), ("staged", ctypes.c_int), ("launches", ctypes.c_int),
                ("blocks", ctypes.c_int), ("threads", ctypes.c_int), ("note", ctypes.c_char * 256)]

    def as_dict(self, fused=False):
        names = _FUSED_ALGO_NAMES if fused else _ALGO_NAMES
        return {"algo": names.get(self.algo, str(self.algo)),
                "allreduce_algo": _ALGO_NAMES.get(self.allreduce_algo),
                "exact": bool(self.exact), "staged": bool(self.staged), "launches": self.launches,
                "blocks": self.blocks, "threads": self.threads, "note": self.note.decode(errors="replace")}


SET_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
GET_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p,
                          ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t))
ADD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64,
                          ctypes.POINTER(ctypes.c_int64))
ERASE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))


class StoreCallbacks(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("user_data", ctypes.c_void_p), ("set", SET_FN),
                ("get", GET_FN), ("add", ADD_FN), ("erase", ERASE_FN)]


class CommOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p), ("buffer_bytes", ctypes.c_size_t),
                ("flag_timeout_ms", ctypes.c_uint64), ("store_timeout_ms", ctypes.c_int64),
                ("use_nccl", ctypes.c_int), ("programmatic_launch", ctypes.c_int), ("device", ctypes.c_int),
                ("node", ctypes.c_int), ("local_world_size", ctypes.c_int), ("contract", ctypes.c_int),
                ("reserved", ctypes.c_int), ("graph_in_place", ctypes.c_int), ("reserved2", ctypes.c_int),
                ("eager_in_place", ctypes.c_int), ("reserved3", ctypes.c_int)]


class CommProperties(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int), ("world_size", ctypes.c_int),
                ("device", ctypes.c_int), ("ipc_ready", ctypes.c_int), ("nccl_ready", ctypes.c_int),
                ("shared_gpu", ctypes.c_int), ("buffer_bytes", ctypes.c_size_t),
                ("flag_timeout_ms", ctypes.c_uint64), ("arch", ctypes.c_char * 16),
                ("ipc_unavailable_reason", ctypes.c_char * 256), ("nccl_unavailable_reason", ctypes.c_char * 256),
                ("nodes", ctypes.c_int), ("local_world_size", ctypes.c_int), ("contract", ctypes.c_int),
                ("reserved", ctypes.c_int), ("eager_unavailable_reason", ctypes.c_char * 256)]


class SimOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("blocks", ctypes.c_int), ("seeded_schedule", ctypes.c_int),
                ("schedule_seed", ctypes.c_uint64), ("timeout_ms", ctypes.c_int64),
                ("trace_path", ctypes.c_char_p), ("chrome_trace_path", ctypes.c_char_p),
                ("trace_elements", ctypes.POINTER(ctypes.c_uint64)), ("num_trace_elements", ctypes.c_size_t),
                ("contract", ctypes.c_int), ("max_steps", ctypes.c_uint64), ("fail_rank", ctypes.c_int),
                ("fail_at_step", ctypes.c_uint64),
                ("progress", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)),
                ("progress_user_data", ctypes.c_void_p), ("threads", ctypes.c_int), ("reserved", ctypes.c_int)]


class SimMultiNodeOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("chunk_elements", ctypes.c_size_t)]


class SimMultiNodeStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("messages", ctypes.c_uint64),
                ("cross_node_bytes", ctypes.c_uint64)]


class LinkRates(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("nvlink_gbps", ctypes.c_double), ("network_gbps", ctypes.c_double),
                ("network_latency_us", ctypes.c_double), ("kernel_latency_us", ctypes.c_double),
                ("nvlink_step_us", ctypes.c_double)]


class ModelPrediction(ctypes.Structure):
    _fields_ = [("algorithm", ctypes.c_char * 32), ("time_us", ctypes.c_double), ("nic_bytes", ctypes.c_double),
                ("chunk_elements", ctypes.c_uint64)]


MODEL_MAX_PREDICTIONS = 8  # EXACTCOLL_MODEL_MAX_PREDICTIONS

_STRUCTS = {"exactcoll_call_info": CallInfo, "exactcoll_store_callbacks": StoreCallbacks,
            "exactcoll_comm_options": CommOptions, "exactcoll_comm_properties": CommProperties,
            "exactcoll_sim_options": SimOptions, "exactcoll_sim_multinode_options": SimMultiNodeOptions,
            "exactcoll_sim_multinode_stats": SimMultiNodeStats, "exactcoll_link_rates": LinkRates,
            "exactcoll_model_prediction": ModelPrediction}

# ---- the library -----------------------------------------------------------------------------------

_c_int, _c_size, _c_u64, _c_i64, _vp = ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_int64, ctypes.c_void_p
_HANDLE = ctypes.c_uint64
_SIGNATURES = {
    "exactcoll_version": ([], _c_int),
    "exactcoll_abi_version": ([], _c_int),
    "exactcoll_version_string": ([], ctypes.c_char_p),
    "exactcoll_has_cuda": ([], _c_int),
    "exactcoll_struct_size": ([ctypes.c_char_p], _c_size),
    "exactcoll_last_error": ([], ctypes.c_char_p),
    "exactcoll_status_name": ([_c_int], ctypes.c_char_p),
    "exactcoll_dtype_name": ([_c_int], ctypes.c_char_p),
    "exactcoll_op_name": ([_c_int], ctypes.c_char_p),
    "exactcoll_algo_name": ([_c_int], ctypes.c_char_p),
    "exactcoll_fused_algo_name": ([_c_int], ctypes.c_char_p),
    "exactcoll_contract_name": ([_c_int], ctypes.c_char_p),
    "exactcoll_op_from_name": ([ctypes.c_char_p, ctypes.POINTER(_c_int)], _c_int),
    "exactcoll_set_store_error": ([ctypes.c_char_p], None),
    "exactcoll_call_info_init": ([ctypes.POINTER(CallInfo)], None),
    "exactcoll_sim_options_init": ([ctypes.POINTER(SimOptions)], None),
    "exactcoll_comm_options_init": ([ctypes.POINTER(CommOptions)], None),
    "exactcoll_store_create": ([ctypes.POINTER(StoreCallbacks), _c_int, _c_int, ctypes.POINTER(_HANDLE)], _c_int),
    "exactcoll_store_create_tcp": ([ctypes.c_char_p, _c_int, ctypes.c_char_p, ctypes.c_char_p, _c_int, _c_int, _c_i64,
                                    ctypes.POINTER(_HANDLE)], _c_int),
    "exactcoll_store_barrier": ([_HANDLE, ctypes.c_char_p, _c_i64], _c_int),
    "exactcoll_store_destroy": ([_HANDLE], _c_int),
    "exactcoll_comm_create": ([_HANDLE, _c_int, _c_int, ctypes.POINTER(CommOptions), ctypes.POINTER(_HANDLE)], _c_int),
    "exactcoll_comm_destroy": ([_HANDLE], _c_int),
    "exactcoll_comm_properties_get": ([_HANDLE, ctypes.POINTER(CommProperties)], _c_int),
    "exactcoll_comm_register_buffer": ([_HANDLE, _vp, _c_size, ctypes.POINTER(_c_int)], _c_int),
    "exactcoll_comm_register_graph_buffers": ([_HANDLE, ctypes.POINTER(_c_size)], _c_int),
    "exactcoll_allreduce": ([_HANDLE, _vp, _vp, _c_size, _c_int, _c_int, _vp, _c_int, ctypes.POINTER(CallInfo)], _c_int),
    "exactcoll_reduce_scatter": ([_HANDLE, _vp, _vp, _c_size, _c_int, _c_int, _vp, _c_int, ctypes.POINTER(CallInfo)],
                                 _c_int),
    "exactcoll_allgather": ([_HANDLE, _vp, _vp, _c_size, _c_int, _c_int, _vp, _c_int, ctypes.POINTER(CallInfo)], _c_int),
    "exactcoll_fused_add_rmsnorm": ([_HANDLE, _vp, _vp, _vp, _vp, _vp, _c_i64, _c_i64, ctypes.c_float, _c_int, _c_int,
                                     _vp, _c_int, ctypes.POINTER(CallInfo)], _c_int),
    "exactcoll_add_rmsnorm": ([_vp, _vp, _vp, _vp, _vp, _c_i64, _c_i64, ctypes.c_float, _c_int, _c_int, _vp], _c_int),
    "exactcoll_comm_check": ([_HANDLE, _vp], _c_int),
    "exactcoll_comm_set_max_blocks": ([_HANDLE, _c_int, ctypes.POINTER(_c_int)], _c_int),
    "exactcoll_sim_collective": ([_c_int, _c_int, _c_int, _c_int, _c_size, _vp, _vp, ctypes.POINTER(SimOptions),
                                  ctypes.POINTER(CallInfo)], _c_int),
    "exactcoll_sim_fused_add_rmsnorm": ([_c_int, _c_int, _c_int, _c_int, _c_i64, _c_i64, ctypes.c_float, _vp, _vp, _vp,
                                         _vp, _vp, ctypes.POINTER(SimOptions), ctypes.POINTER(CallInfo)], _c_int),
    "exactcoll_sim_multinode_options_init": ([ctypes.POINTER(SimMultiNodeOptions)], None),
    "exactcoll_sim_multinode_stats_init": ([ctypes.POINTER(SimMultiNodeStats)], None),
    "exactcoll_sim_multinode_collective": ([_c_int, _c_int, _c_int, _c_int, _c_size, _vp, _vp,
                                            ctypes.POINTER(SimOptions), ctypes.POINTER(SimMultiNodeOptions),
                                            ctypes.POINTER(SimMultiNodeStats), ctypes.POINTER(CallInfo)], _c_int),
    "exactcoll_link_rates_init": ([ctypes.POINTER(LinkRates)], None),
    "exactcoll_model_multinode": ([_c_int, _c_int, _c_int, _c_int, _c_size, ctypes.POINTER(LinkRates),
                                   ctypes.POINTER(ModelPrediction), _c_int, ctypes.POINTER(_c_int)], _c_int),
}


def library_path():
    """Where libexactcoll.so is loaded from: $EXACTCOLL_LIBRARY, else next to this file."""
    return os.environ.get("EXACTCOLL_LIBRARY") or str(pathlib.Path(__file__).resolve().parent / "libexactcoll.so")


# The ops that only enqueue work on a stream: called through a PyDLL handle, which keeps the GIL
# (they never call back into Python and return in microseconds; releasing and retaking the GIL
# would cost about as much as the rest of the binding). Everything that may wait (stores,
# communicator creation, check) goes through the CDLL handle, which releases the GIL.
_ENQUEUE_ONLY = ("exactcoll_allreduce", "exactcoll_reduce_scatter", "exactcoll_allgather",
                 "exactcoll_fused_add_rmsnorm", "exactcoll_add_rmsnorm")


def _load():
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
        enqueue = ctypes.PyDLL(path)
    except OSError as e:
        raise ImportError(f"exactcoll: cannot load {path}: {e}") from e
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(enqueue if name in _ENQUEUE_ONLY else lib, name)
        function.argtypes = argtypes
        function.restype = restype
        setattr(lib, name, function)
    for c_name, struct in _STRUCTS.items():
        size = lib.exactcoll_struct_size(c_name.encode())
        if size != ctypes.sizeof(struct):
            raise ImportError(f"exactcoll: {path} has {c_name} of {size} bytes, this package expects "
                              f"{ctypes.sizeof(struct)}: the Python files and the library come from different builds")
    return lib


lib = _load()


def _enum(name_of):
    """{name: value} of one of the C header's enums: the library's names of 0, 1, ... up to the first
    value it has no name for."""
    table = {}
    for value in range(256):  # the C values are uint8_t enumerators (core/registry.h)
        name = name_of(value)
        if name is None:
            return table
        table[name.decode()] = value
    raise ImportError(f"exactcoll: {library_path()} names every value of an enum up to 255")


DTYPES = _enum(lib.exactcoll_dtype_name)
OPS = _enum(lib.exactcoll_op_name)
ALGOS = _enum(lib.exactcoll_algo_name)
FUSED_ALGOS = _enum(lib.exactcoll_fused_algo_name)
CONTRACTS = _enum(lib.exactcoll_contract_name)
_ALGO_NAMES = {v: k for k, v in ALGOS.items()}
_FUSED_ALGO_NAMES = {v: k for k, v in FUSED_ALGOS.items()}
_CONTRACT_NAMES = {v: k for k, v in CONTRACTS.items()}


def contract_name(value):
    """The name of a contract's C value ("canonical", "tree", ...)."""
    return _CONTRACT_NAMES[value]


def check(status):
    """Raises the Python exception for a non-zero status, with the library's message."""
    if status == OK:
        return
    message = lib.exactcoll_last_error().decode(errors="replace")
    if status == ERROR_INVALID_ARGUMENT:
        raise ValueError(message)
    if status == ERROR_OUT_OF_MEMORY:
        raise MemoryError(message)
    if status == ERROR_TIMEOUT:
        raise PeerTimeoutError(status, message)
    if status == ERROR_UNAVAILABLE:
        raise UnavailableError(status, message)
    raise Error(status, message)


def op_code(name):
    """The C value of an op named in either spelling ("allreduce" or "all_reduce": the library's
    table, exactcoll_op_from_name); ValueError naming the valid names otherwise."""
    value = ctypes.c_int()
    if not isinstance(name, str):
        raise ValueError(f"unknown op {name!r}; expected one of {', '.join(OPS)}")
    if lib.exactcoll_op_from_name(name.encode(), ctypes.byref(value)) != 0:
        raise ValueError(lib.exactcoll_last_error().decode().split(": ", 1)[-1].replace("name", "op", 1))
    return value.value


def code(table, name, what):
    """The enum value of name in table; ValueError listing the valid names otherwise."""
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {what} {name!r}; expected one of {', '.join(table)}") from None


# ---- option checks: every value is checked here before ctypes could truncate it ------------------

INT32_MAX, INT64_MAX, UINT64_MAX = 2 ** 31 - 1, 2 ** 63 - 1, 2 ** 64 - 1
FLOAT32_MAX = 3.4028234663852886e38
MAX_TRACE_ELEMENTS = 4096  # EXACTCOLL_MAX_TRACE_ELEMENTS
MAX_STORE_RANKS = 1024  # EXACTCOLL_MAX_STORE_RANKS


def ctype_range(ctype):
    """The integers a ctypes integer type holds unchanged: c_int -2**31..2**31-1, c_uint64 0..2**64-1."""
    bits = 8 * ctypes.sizeof(ctype)
    if ctype(-1).value < 0:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def field_type(struct, field):
    """The ctypes type of struct's field (SimOptions' "blocks" is c_int)."""
    return dict(struct._fields_)[field]


def int_option(name, value, ctype, low=None, high=None):
    """value as an int that ctype holds unchanged, in low..high where the library takes less than
    the whole type (blocks: 1..128 of a c_int); else ValueError naming the option and the range.
    Integers of any kind (numpy's too) pass; bool, floats and strings do not. Without this, ctypes
    keeps the low bits (2**32 + 1 blocks would run as 1 block, seed 2**64 as seed 0)."""
    type_low, type_high = ctype_range(ctype)
    low = type_low if low is None else low
    high = type_high if high is None else high
    if not type_low <= low <= high <= type_high:
        raise AssertionError(f"{name}: the range {low}..{high} does not fit {ctype.__name__}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer in {low}..{high}, got {value!r}")
    if not low <= int(value) <= high:
        raise ValueError(f"{name} must be {low}..{high}, got {int(value)}")
    return int(value)


def switch_option(name, value):
    """value as 1 or 0 for a C int flag: True/False (or the integers 1/0), else ValueError; a
    string such as "false" is not read as true."""
    if isinstance(value, bool) or (isinstance(value, numbers.Integral) and int(value) in (0, 1)):
        return 1 if value else 0
    raise ValueError(f"{name} must be True or False, got {value!r}")


def _real_in(value, low, high):
    # Compared before float(): an int past float's range (10**400) is out of range, not OverflowError.
    return (not isinstance(value, bool) and isinstance(value, numbers.Real) and low <= value <= high
            and low <= float(value) <= high)


def real_option(name, value, low, high):
    """value as a float in low..high (NaN and infinities refused), else ValueError naming the option."""
    if not _real_in(value, low, high):
        raise ValueError(f"{name} must be a number in {low}..{high}, got {value!r}")
    return float(value)


def eps_option(eps):
    """The RMSNorm epsilon as a float: finite, >= 0, at most float32's largest (the C API's float)."""
    if not _real_in(eps, 0.0, FLOAT32_MAX):
        raise ValueError(f"eps must be finite and >= 0 (a float32), got {eps!r}")
    return float(eps)


def text_option(name, text):
    """text (a str, bytes or path) as bytes for the C API, else ValueError: a NUL would end the C
    string early, so a trace path or a key would name another file or key than the caller's."""
    if not isinstance(text, (str, bytes, os.PathLike)):
        raise ValueError(f"{name} must be a string, got {type(text).__name__}")
    encoded = os.fsencode(text)
    if b"\0" in encoded:
        raise ValueError(f"{name} contains a NUL character: {text!r}")
    if not encoded:
        raise ValueError(f"{name} is empty")
    return encoded


def trace_elements_option(trace_elements):
    """The element indices to trace as a list of ints, each a uint64: at most MAX_TRACE_ELEMENTS of
    them, else ValueError. At most MAX_TRACE_ELEMENTS + 1 items are read, so an endless or huge
    iterable is refused rather than read to its end."""
    if isinstance(trace_elements, (str, bytes)):
        raise ValueError(f"trace_elements must be a list of element indices, got {trace_elements!r}")
    try:
        iterator = iter(trace_elements)
    except TypeError:
        raise ValueError(f"trace_elements must be a list of element indices, got {trace_elements!r}") from None
    elements = list(itertools.islice(iterator, MAX_TRACE_ELEMENTS + 1))
    if len(elements) > MAX_TRACE_ELEMENTS:
        try:
            count = len(trace_elements)
        except (TypeError, OverflowError):  # no length, or one past ssize_t (range(2**70))
            count = f"more than {MAX_TRACE_ELEMENTS}"
        raise ValueError(f"trace_elements names {count} elements; at most {MAX_TRACE_ELEMENTS}")
    element_type = field_type(SimOptions, "trace_elements")._type_
    return [int_option(f"trace_elements[{k}]", i, element_type) for k, i in enumerate(elements)]


def sim_options(blocks=1, schedule="threads", schedule_seed=1, timeout_ms=20000, trace=None, chrome_trace=None,
                trace_elements=None, contract="canonical"):
    """A SimOptions for the simulator calls (returned with the arrays it points into, to keep alive)."""
    options = SimOptions()
    lib.exactcoll_sim_options_init(ctypes.byref(options))
    if schedule not in ("threads", "seeded"):
        raise ValueError(f"schedule must be 'threads' or 'seeded', got {schedule!r}")
    options.blocks = int_option("blocks", blocks, field_type(SimOptions, "blocks"), 1, 128)
    options.seeded_schedule = 1 if schedule == "seeded" else 0
    options.schedule_seed = int_option("schedule_seed", schedule_seed, field_type(SimOptions, "schedule_seed"))
    # At most 2**31 - 1 ms (24 days), the bound of the library's other millisecond settings
    # (EXACTCOLL_STORE_CONNECT_TIMEOUT_MS); the C field would take more.
    options.timeout_ms = int_option("timeout_ms", timeout_ms, field_type(SimOptions, "timeout_ms"), 1, INT32_MAX)
    options.contract = code(CONTRACTS, contract, "contract")
    keep = []
    if trace is not None:
        keep.append(text_option("trace", trace))
        options.trace_path = keep[-1]
    if chrome_trace is not None:
        keep.append(text_option("chrome_trace", chrome_trace))
        options.chrome_trace_path = keep[-1]
    if trace_elements is not None:
        elements = trace_elements_option(trace_elements)
        array = (ctypes.c_uint64 * len(elements))(*elements)
        keep.append(array)
        options.trace_elements = ctypes.cast(array, ctypes.POINTER(ctypes.c_uint64))
        options.num_trace_elements = len(elements)
    return options, keep


def new_call_info():
    info = CallInfo()
    lib.exactcoll_call_info_init(ctypes.byref(info))
    return info
