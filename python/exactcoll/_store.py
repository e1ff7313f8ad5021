"""Stores: how the ranks of a job find each other (exactcoll.h, "stores")."""

import ctypes
import time

from . import _lib


def _place(rank, world_size):
    """(rank, world_size) checked: 1 <= world_size <= EXACTCOLL_MAX_STORE_RANKS, 0 <= rank < world_size."""
    world_size = _lib.int_option("world_size", world_size, ctypes.c_int, 1, _lib.MAX_STORE_RANKS)
    return _lib.int_option("rank", rank, ctypes.c_int, 0, world_size - 1), world_size


class Store:
    """A key-value store every rank of the job reaches, handed to libexactcoll as callbacks.

    backend: any object with
      set(key: str, value: bytes)
      get(key: str, timeout_s: float) -> bytes     raises TimeoutError when the key never appears
      add(key: str, delta: int) -> int
      delete(key: str) -> bool                      optional
    exactcoll.torch wraps torch.distributed's store this way, so no second port is needed.
    rank, world_size: this process's place in the job (barrier timeouts name the missing rank).
    """

    def __init__(self, backend, rank, world_size):
        self._backend = backend
        self._failure = None  # the exception a callback swallowed, chained to the library's error
        self._callbacks = self._make_callbacks(backend)
        rank, world_size = _place(rank, world_size)
        handle = ctypes.c_uint64()
        _lib.check(_lib.lib.exactcoll_store_create(ctypes.byref(self._callbacks), rank, world_size,
                                                   ctypes.byref(handle)))
        self.handle = handle.value
        self.rank = int(rank)
        self.world_size = int(world_size)

    @classmethod
    def tcp(cls, host, port, token, rank, world_size, bind_address=None, connect_timeout_s=60.0):
        """The library's own TCP store: rank 0 serves it on a port of its own (never torch's
        MASTER_PORT), every rank connects with the same token (>= 16 characters)."""
        store = cls.__new__(cls)
        store._backend = None
        store._failure = None
        store._callbacks = None
        rank, world_size = _place(rank, world_size)
        handle = ctypes.c_uint64()
        _lib.check(_lib.lib.exactcoll_store_create_tcp(
            _lib.text_option("host", host), _lib.int_option("port", port, ctypes.c_int, 0, 65535),
            None if bind_address is None else _lib.text_option("bind_address", bind_address),
            _lib.text_option("token", token), rank, world_size,
            int(_lib.real_option("connect_timeout_s", connect_timeout_s, 0.001, _lib.INT32_MAX / 1000) * 1000), ctypes.byref(handle)))
        store.handle = handle.value
        store.rank = int(rank)
        store.world_size = int(world_size)
        return store

    def check(self, status):
        """Raises for a failed call that used this store, chaining what a callback raised."""
        failure, self._failure = self._failure, None
        if status == _lib.OK:
            return
        try:
            _lib.check(status)
        except Exception as e:
            if failure is not None:
                raise e from failure
            raise

    def barrier(self, name, timeout_s=60.0):
        """Collective: returns once every rank entered barrier `name`; raises Error naming a rank
        that never arrived after timeout_s."""
        self.check(_lib.lib.exactcoll_store_barrier(self.handle, _lib.text_option("name", name),
                                                    int(_lib.real_option("timeout_s", timeout_s, 0.001, 2 ** 31) * 1000)))

    def close(self):
        """Releases the store (communicators made on it keep it alive until they are closed)."""
        if self.handle:
            handle, self.handle = self.handle, 0
            _lib.check(_lib.lib.exactcoll_store_destroy(handle))

    def _make_callbacks(self, backend):
        def guard(body):
            try:
                return body()
            except TimeoutError as e:
                self._failure = e
                _lib.lib.exactcoll_set_store_error(str(e).encode(errors="replace"))
                return _lib.ERROR_TIMEOUT
            except BaseException as e:  # noqa: BLE001 - nothing may unwind into C
                self._failure = e
                _lib.lib.exactcoll_set_store_error(f"{type(e).__name__}: {e}".encode(errors="replace"))
                return _lib.ERROR_STORE

        def set_(_user, key, value, size):
            def body():
                backend.set(key.decode(), ctypes.string_at(value, size) if size else b"")
                return _lib.OK
            return guard(body)

        def get(_user, key, timeout_ms, buffer, capacity, size):
            def body():
                value = bytes(backend.get(key.decode(), timeout_ms / 1000.0))
                size[0] = len(value)
                if value and capacity:
                    ctypes.memmove(buffer, value, min(capacity, len(value)))
                return _lib.OK
            return guard(body)

        def add(_user, key, delta, result):
            def body():
                result[0] = int(backend.add(key.decode(), int(delta)))
                return _lib.OK
            return guard(body)

        def erase(_user, key, existed):
            def body():
                existed[0] = 1 if backend.delete(key.decode()) else 0
                return _lib.OK
            return guard(body)

        callbacks = _lib.StoreCallbacks()
        callbacks.struct_size = ctypes.sizeof(_lib.StoreCallbacks)
        callbacks.set = _lib.SET_FN(set_)
        callbacks.get = _lib.GET_FN(get)
        callbacks.add = _lib.ADD_FN(add)
        if hasattr(backend, "delete"):
            callbacks.erase = _lib.ERASE_FN(erase)
        return callbacks


class MemoryStore:
    """A store backend for ranks that are threads of one process (tests, examples)."""

    def __init__(self):
        import threading
        self._values = {}
        self._changed = threading.Condition()

    def set(self, key, value):
        with self._changed:
            self._values[key] = bytes(value)
            self._changed.notify_all()

    def get(self, key, timeout_s):
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while key not in self._values:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"key {key!r} never appeared within {timeout_s:.3f} s")
                self._changed.wait(left)
            return self._values[key]

    def add(self, key, delta):
        with self._changed:
            value = int(self._values.get(key, b"0")) + delta
            self._values[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def delete(self, key):
        with self._changed:
            return self._values.pop(key, None) is not None
