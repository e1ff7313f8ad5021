"""exactcoll: collectives whose every output bit is fixed by a written rounding contract.

  exactcoll.sim    the simulator on numpy arrays (CPU; the GPUs' bits without a GPU)
  exactcoll.torch  a communicator over torch.distributed's process group, ops on CUDA tensors,
                   torch.library custom ops for torch.compile and CUDA graphs (needs torch >= 2.4)
  exactcoll.Store  the rendezvous as callbacks over a key-value store the program already has
  exactcoll.model_multinode  the multi-node performance model (exactcoll's algorithms beside NCCL's)

The package loads libexactcoll.so (the C API, include/exactcoll/exactcoll.h) through ctypes, so
one wheel serves every CPython >= 3.9 and every torch version.
"""

import ctypes

from . import _lib
from ._lib import Error, PeerTimeoutError, UnavailableError, library_path
from ._store import MemoryStore, Store

__version__ = _lib.lib.exactcoll_version_string().decode().split()[0]

__all__ = ["Error", "PeerTimeoutError", "UnavailableError", "Store", "MemoryStore", "has_cuda", "library_path",
           "model_multinode", "__version__"]


def has_cuda():
    """Whether this libexactcoll was built with CUDA (the GPU communicators work)."""
    return bool(_lib.lib.exactcoll_has_cuda())


def model_multinode(op="allreduce", *, nodes, bytes, gpus_per_node=8, dtype="bf16", **rates):
    """Predicted times of op (allreduce, reduce_scatter, allgather; all_reduce and all_gather are
    accepted too) on `nodes` nodes of gpus_per_node
    GPUs for a message of `bytes` per rank: a list of dicts (algorithm, time_us, nic_bytes,
    chunk_elements), exactcoll's algorithms first, then NCCL's ring and tree, then, where nodes and
    gpus_per_node are powers of two, "exactcoll tree" (the tree contract's exchange: other bits than
    the chain's). The model is the library's (`exactcoll model` prints the same). rates: nvlink_gbps, network_gbps,
    network_latency_us, kernel_latency_us, nvlink_step_us (defaults: exactcoll_link_rates_init's).

    Example: model_multinode("allreduce", nodes=4, bytes=64 << 20, network_gbps=25)
    """
    link = _lib.LinkRates()
    _lib.lib.exactcoll_link_rates_init(ctypes.byref(link))
    for name, value in rates.items():
        if name not in dict(_lib.LinkRates._fields_) or name == "struct_size":
            raise TypeError(f"model_multinode() got an unexpected keyword argument {name!r}")
        setattr(link, name, _lib.real_option(name, value, 0.0, 1e12))
    predictions = (_lib.ModelPrediction * _lib.MODEL_MAX_PREDICTIONS)()
    count = ctypes.c_int()
    _lib.check(_lib.lib.exactcoll_model_multinode(
        _lib.op_code(op), _lib.code(_lib.DTYPES, dtype, "dtype"),
        _lib.int_option("nodes", nodes, ctypes.c_int), _lib.int_option("gpus_per_node", gpus_per_node, ctypes.c_int),
        _lib.int_option("bytes", bytes, ctypes.c_size_t), ctypes.byref(link), predictions, len(predictions),
        ctypes.byref(count)))
    return [{"algorithm": p.algorithm.decode(), "time_us": p.time_us, "nic_bytes": p.nic_bytes,
             "chunk_elements": p.chunk_elements} for p in predictions[:count.value]]
