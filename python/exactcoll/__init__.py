"""exactcoll: collectives whose every output bit is fixed by a written rounding contract.

  exactcoll.sim    the simulator on numpy arrays (CPU; the GPUs' bits without a GPU)
  exactcoll.torch  a communicator over torch.distributed's process group, ops on CUDA tensors,
                   torch.library custom ops for torch.compile and CUDA graphs (needs torch >= 2.4)
  exactcoll.Store  the rendezvous as callbacks over a key-value store the program already has

The package loads libexactcoll.so (the C API, include/exactcoll/exactcoll.h) through ctypes, so
one wheel serves every CPython >= 3.9 and every torch version.
"""

from . import _lib
from ._lib import Error, PeerTimeoutError, UnavailableError, library_path
from ._store import MemoryStore, Store

__version__ = _lib.lib.exactcoll_version_string().decode().split()[0]

__all__ = ["Error", "PeerTimeoutError", "UnavailableError", "Store", "MemoryStore", "has_cuda", "library_path",
           "__version__"]


def has_cuda():
    """Whether this libexactcoll was built with CUDA (the GPU communicators work)."""
    return bool(_lib.lib.exactcoll_has_cuda())
