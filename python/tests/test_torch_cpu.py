"""exactcoll.torch's CPU-side pieces, with whatever torch is installed (CI: Debian's torch 1.13,
CPU only): the bootstrap through a real torch.distributed store (TorchStore over c10d HashStore
and TCPStore: barriers across ranks, a missing rank named, c10d's zero timeout), and the module's
clear errors without a process group. The GPU half runs in python/examples/tp_block_check.py."""

import threading
import unittest

import numpy as np

try:
    import torch
    import torch.distributed as dist
except ImportError:  # the whole file needs torch
    torch = None

import exactcoll
from value_errors import assert_value_errors

if torch is not None:
    import exactcoll.torch as xt


@unittest.skipIf(torch is None, "torch is not installed")
class TorchStoreBootstrap(unittest.TestCase):
    def run_ranks(self, make_store, ranks, present, barrier_name, timeout_s):
        errors = {}

        def rank(r):
            try:
                store = exactcoll.Store(xt.TorchStore(make_store(r)), r, ranks)
                for _ in range(2):
                    store.barrier(barrier_name, timeout_s)
                store.close()
            except Exception as e:  # collected, asserted by the caller
                errors[r] = e

        threads = [threading.Thread(target=rank, args=(r,)) for r in present]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors

    def test_barrier_over_hash_store(self):
        shared = dist.HashStore()
        self.assertEqual(self.run_ranks(lambda r: shared, 3, range(3), "hash", 10.0), {})

    def test_barrier_over_tcp_store_and_missing_rank(self):
        server = dist.TCPStore("127.0.0.1", 0, 3, True, wait_for_workers=False)
        port = server.port

        def client(r):
            return server if r == 0 else dist.TCPStore("127.0.0.1", port, 3, False)

        self.assertEqual(self.run_ranks(client, 3, range(3), "tcp", 20.0), {})
        errors = self.run_ranks(client, 3, (0, 2), "tcp-missing", 0.5)  # rank 1 never comes
        for r in (0, 2):
            self.assertIsInstance(errors[r], exactcoll.Error)
            self.assertIn("rank 1 never arrived", str(errors[r]))

    def test_zero_timeout_is_a_check_not_a_wait_forever(self):
        adapter = xt.TorchStore(dist.HashStore())
        with self.assertRaises(TimeoutError):
            adapter.get("absent", 0)
        adapter.set("here", b"1")
        self.assertEqual(adapter.get("here", 0), b"1")


@unittest.skipIf(torch is None, "torch is not installed")
class TorchModule(unittest.TestCase):
    def test_communicator_needs_a_process_group(self):
        if dist.is_initialized():
            self.skipTest("a process group exists")
        with self.assertRaises(RuntimeError) as caught:
            xt.Communicator()
        self.assertIn("init_process_group", str(caught.exception))

    def test_tensors_are_checked_before_torch_sees_them(self):
        """A numpy array where a tensor belongs is the library's ValueError naming the argument, not
        torch's TypeError from empty_like; checked before any CUDA use, so CPU tensors reach it."""
        a, w = np.zeros((2, 8), np.float32), np.ones(8, np.float32)
        t, tw = torch.zeros(2, 8), torch.ones(8)
        cases = [(lambda: xt.add_rms_norm(a, a, w, 1e-6), "x must be a torch.Tensor, got ndarray"),
                 (lambda: xt.add_rms_norm(t, a, tw, 1e-6), "residual must be a torch.Tensor, got ndarray"),
                 (lambda: xt.add_rms_norm(t, t, w, 1e-6), "weight must be a torch.Tensor, got ndarray"),
                 (lambda: xt.add_rms_norm(t, t, tw, 1e-6, out=a), "out must be a torch.Tensor, got ndarray"),
                 (lambda: xt.add_rms_norm(t, t, tw, 1e-6, residual_out=[0.0]),
                  "residual_out must be a torch.Tensor, got list"),
                 (lambda: xt.add_rms_norm(t, t, tw, float("nan")), "eps must be finite and >= 0"),
                 (lambda: xt.add_rms_norm(t, t, tw, 10 ** 400), "eps must be finite and >= 0")]
        assert_value_errors(self, cases)

    def test_communicator_ops_name_an_argument_that_is_not_a_tensor(self):
        """The ops check their arguments' types before they touch the communicator or CUDA. No
        communicator can be made without a GPU, so these calls go to one that never was
        (Communicator.__new__): each must stop at the type check, naming the argument."""
        comm = xt.Communicator.__new__(xt.Communicator)
        a, t, tw = np.zeros((2, 8), np.float32), torch.zeros(2, 8), torch.ones(8)
        cases = [(lambda: comm.all_reduce(a), "x must be a torch.Tensor, got ndarray"),
                 (lambda: comm.all_reduce(t, out=a), "out must be a torch.Tensor, got ndarray"),
                 (lambda: comm.all_reduce_(a), "x must be a torch.Tensor, got ndarray"),
                 (lambda: comm.reduce_scatter(a), "x must be a torch.Tensor, got ndarray"),
                 (lambda: comm.reduce_scatter(t, out=a), "out must be a torch.Tensor, got ndarray"),
                 (lambda: comm.all_gather(a), "x must be a torch.Tensor, got ndarray"),
                 (lambda: comm.all_gather(t, out=a), "out must be a torch.Tensor, got ndarray"),
                 (lambda: comm.fused_add_rms_norm(t, t, a[0]), "weight must be a torch.Tensor, got ndarray"),
                 (lambda: comm.fused_add_rms_norm(t, t, tw, residual_out=a),
                  "residual_out must be a torch.Tensor, got ndarray"),
                 (lambda: comm.fused_add_rms_norm(t, t, tw, 10 ** 400), "eps must be finite and >= 0"),
                 (lambda: comm.register(a), "tensor must be a torch.Tensor, got ndarray")]
        assert_value_errors(self, cases)

    def test_communicator_options_are_checked_first(self):
        """Checked before the process group is looked at, so they fail here without one."""
        cases = [(dict(buffer_mib=2 ** 64), "buffer_mib must be a number"), (dict(buffer_mib=0), "buffer_mib must be"),
                 (dict(buffer_mib=10 ** 400), "buffer_mib must be a number"),
                 (dict(flag_timeout_ms=2 ** 64 + 5), "flag_timeout_ms must be 1..18446744073709551615"),
                 (dict(flag_timeout_ms=0), "flag_timeout_ms must be 1.."),
                 (dict(flag_timeout_ms=True), "flag_timeout_ms must be an integer"),
                 (dict(flag_timeout_ms=5000.0), "flag_timeout_ms must be an integer"),
                 (dict(store_timeout_s=float("inf")), "store_timeout_s must be a number"),
                 (dict(store_timeout_s=10 ** 400), "store_timeout_s must be a number"),
                 (dict(node=-1), "node must be 0..2147483647"), (dict(node=2 ** 32), "node must be 0..2147483647"),
                 (dict(local_world_size=0), "local_world_size must be 1..2147483647"),
                 (dict(local_world_size=2 ** 32 + 1), "local_world_size must be 1..2147483647"),
                 (dict(use_nccl="false"), "use_nccl must be True or False, got 'false'"),
                 (dict(programmatic_launch=2), "programmatic_launch must be True or False, got 2"),
                 (dict(graph_in_place="yes"), "graph_in_place must be True or False, got 'yes'"),
                 (dict(eager_in_place=1.0), "eager_in_place must be True or False, got 1.0"),
                 (dict(name="a\0b"), "name contains a NUL character"), (dict(name=7), "name must be a string"),
                 (dict(name=""), "name is empty")]
        for options, message in cases:
            with self.subTest(options=str(options)[:60]):
                with self.assertRaises(ValueError) as caught:
                    xt.Communicator(**options)
                self.assertIn(message, str(caught.exception))

    def test_custom_ops_exist_when_torch_has_custom_op(self):
        self.assertEqual(xt.CUSTOM_OPS, hasattr(torch.library, "custom_op"))
        if xt.CUSTOM_OPS:
            self.assertTrue(hasattr(torch.ops.exactcoll, "fused_add_rms_norm"))


if __name__ == "__main__":
    unittest.main()
