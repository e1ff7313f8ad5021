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
        torch's TypeError from empty_like."""
        a, w = np.zeros((2, 8), np.float32), np.ones(8, np.float32)
        with self.assertRaises(ValueError) as caught:
            xt.add_rms_norm(a, a, w, 1e-6)
        self.assertIn("x must be a torch.Tensor, got ndarray", str(caught.exception))
        t = torch.zeros(2, 8)
        with self.assertRaises(ValueError) as caught:
            xt.add_rms_norm(t, a, w, 1e-6)
        self.assertIn("residual must be a torch.Tensor, got ndarray", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            xt.add_rms_norm(t, t, torch.ones(8), float("nan"))
        self.assertIn("eps must be finite and >= 0", str(caught.exception))

    def test_communicator_options_are_checked_first(self):
        cases = [(dict(buffer_mib=2 ** 64), "buffer_mib must be a number"), (dict(buffer_mib=0), "buffer_mib must be"),
                 (dict(flag_timeout_ms=2 ** 64 + 5), "flag_timeout_ms must be 1..18446744073709551615"),
                 (dict(flag_timeout_ms=0), "flag_timeout_ms must be 1.."),
                 (dict(store_timeout_s=float("inf")), "store_timeout_s must be a number"),
                 (dict(node=-1), "node must be 0..2147483647"), (dict(local_world_size=0), "local_world_size must be"),
                 (dict(name="a\0b"), "name contains a NUL character")]
        for options, message in cases:
            with self.subTest(options=options), self.assertRaises(ValueError) as caught:
                xt.Communicator(**options)
            self.assertIn(message, str(caught.exception))

    def test_custom_ops_exist_when_torch_has_custom_op(self):
        self.assertEqual(xt.CUSTOM_OPS, hasattr(torch.library, "custom_op"))
        if xt.CUSTOM_OPS:
            self.assertTrue(hasattr(torch.ops.exactcoll, "fused_add_rms_norm"))


if __name__ == "__main__":
    unittest.main()
