"""The Python layer's errors and plumbing: ValueError for bad shapes, dtypes and names (with the
library's message), exceptions never crashes; stores over Python callbacks (barriers through them,
a missing rank named, a callback's own exception chained); the wheel's metadata."""

import ctypes
import os
import pathlib
import tempfile
import threading
import unittest

import numpy as np

import exactcoll
import exactcoll.sim as xs
from exactcoll import _lib
from value_errors import assert_value_errors


class Errors(unittest.TestCase):
    def test_bad_inputs_are_value_errors(self):
        x = np.zeros((2, 8), dtype=np.uint16)
        cases = [
            (lambda: xs.all_reduce(x), "pass dtype='bf16' or 'fp16'"),
            (lambda: xs.all_reduce(x, dtype="bf17"), "pass dtype='bf16' or 'fp16'"),
            (lambda: xs.all_reduce(np.zeros((2, 8), np.float64)), "has dtype float64"),
            (lambda: xs.all_reduce(np.zeros((2, 8), np.float32), dtype="bf16"), "float32 but dtype='bf16'"),
            (lambda: xs.all_reduce(x, dtype="bf16", algo="fastest"), "unknown algo 'fastest'"),
            (lambda: xs.all_reduce(x, dtype="bf16", algo="nccl"), "nccl runs on GPUs only"),
            (lambda: xs.all_reduce(np.zeros(8, np.float32)), "must be shaped [ranks, ...]"),
            (lambda: xs.all_reduce(np.zeros((17, 8), np.float32)), "the simulator runs 1..16"),
            (lambda: xs.reduce_scatter(np.zeros((3, 8), np.float32)), "must be a multiple of the ranks"),
            (lambda: xs.all_gather(x, dtype="bf16", algo="copy_engine"), "copy_engine runs on GPUs only"),
            (lambda: xs.all_reduce(x, dtype="bf16", blocks=0), "blocks must be 1..128"),
            (lambda: xs.all_reduce(x, dtype="bf16", schedule="random"), "schedule must be"),
            (lambda: xs.all_reduce(x, dtype="bf16", trace_elements=[99]), "trace element 99 is past"),
            (lambda: xs.all_reduce(x, dtype="bf16", trace="/nonexistent-dir/t.jsonl"), "cannot write the trace"),
        ]
        f12 = np.zeros((2, 3, 12), np.uint16)
        r12, w12 = np.zeros((3, 12), np.uint16), np.zeros(12, np.uint16)
        f = np.zeros((2, 3, 16), np.uint16)
        r, w = np.zeros((3, 16), np.uint16), np.zeros(16, np.uint16)
        cases += [
            (lambda: xs.fused_add_rms_norm(f12, r12, w12, dtype="bf16"), "not a positive multiple of the bf16 pack"),
            (lambda: xs.fused_add_rms_norm(f, r[:2], w, dtype="bf16"), "residual must be shaped like"),
            (lambda: xs.fused_add_rms_norm(f, r, w[:4], dtype="bf16"), "weight must be shaped [H]"),
            (lambda: xs.fused_add_rms_norm(f, r, w, float("nan"), dtype="bf16"), "eps must be finite"),
            (lambda: xs.fused_add_rms_norm(f, r, w, -1.0, dtype="bf16"), "eps must be finite"),
            (lambda: xs.fused_add_rms_norm(f, r, w, dtype="bf16", algo="nccl_split"), "nccl_split runs on GPUs only"),
            (lambda: xs.fused_add_rms_norm(f, r, w, dtype="bf16", contract="aiter"), "unknown contract 'aiter'"),
            (lambda: xs.fused_add_rms_norm(f, r, w, dtype="bf16", algo="two_stage", contract="f32_residual"),
             "algo must be auto"),
        ]
        assert_value_errors(self, cases)

    def test_options_are_checked_before_ctypes_could_truncate_them(self):
        """Each of these once ran with a truncated value (2**32 + 1 blocks as 1 block, timeout_ms
        2**64 + 5 as 5 ms, schedule_seed 2**64 as seed 0, trace element 2**64 as element 0) or wrote
        a file named by the part of a path before a NUL. Every entry point of exactcoll.sim is asked."""
        trace_dir = tempfile.mkdtemp()
        trace_path = os.path.join(trace_dir, "t.jsonl")
        cut_path = os.path.join(trace_dir, "t.jsonl\0rest")

        class Endless:  # an iterable without a length that must not be read past the bound
            def __iter__(self):
                yield from range(4097)
                raise AssertionError("trace_elements was read past its 4097th element")

        cases = [
            (dict(blocks=2 ** 32 + 1), "blocks must be 1..128, got 4294967297"),
            (dict(blocks=1.5), "blocks must be an integer"),
            (dict(blocks=True), "blocks must be an integer"),
            (dict(timeout_ms=2 ** 64 + 5), "timeout_ms must be 1..2147483647"),
            (dict(timeout_ms=0), "timeout_ms must be 1..2147483647"),
            (dict(schedule="seeded", schedule_seed=2 ** 64), "schedule_seed must be 0..18446744073709551615"),
            (dict(schedule="seeded", schedule_seed=-1), "schedule_seed must be 0.."),
            (dict(trace=trace_path, trace_elements=[2 ** 64]), "trace_elements[0] must be 0..18446744073709551615"),
            (dict(trace=trace_path, trace_elements=[0, -1]), "trace_elements[1] must be 0.."),
            (dict(trace=trace_path, trace_elements=[0.5]), "trace_elements[0] must be an integer"),
            (dict(trace=trace_path, trace_elements="5"), "must be a list of element indices"),
            (dict(trace=trace_path, trace_elements=5), "must be a list of element indices"),
            (dict(trace=trace_path, trace_elements=range(4097)), "names 4097 elements; at most 4096"),
            # Counted while read: an endless iterable is refused after 4097 items, not read forever.
            (dict(trace=trace_path, trace_elements=Endless()), "more than 4096 elements; at most 4096"),
            (dict(trace=cut_path), "trace contains a NUL character"),
            (dict(chrome_trace=cut_path), "chrome_trace contains a NUL character"),
        ]
        x = np.zeros((2, 8), dtype=np.float32)
        f, r, w = np.zeros((2, 1, 8), np.float32), np.zeros((1, 8), np.float32), np.ones(8, np.float32)
        entry_points = {"all_reduce": lambda **o: xs.all_reduce(x, **o),
                        "reduce_scatter": lambda **o: xs.reduce_scatter(x, **o),
                        "all_gather": lambda **o: xs.all_gather(x, **o),
                        "fused_add_rms_norm": lambda **o: xs.fused_add_rms_norm(f, r, w, **o),
                        "add_rms_norm": lambda **o: xs.add_rms_norm(r, r, w, **o)}
        for entry, call in entry_points.items():
            for options, message in cases:
                with self.subTest(entry=entry, options=str(options)[:60]):
                    with self.assertRaises(ValueError) as caught:
                        call(**options)
                    self.assertIn(message, str(caught.exception))
        self.assertEqual(os.listdir(trace_dir), [], "a refused call wrote a file")
        # numpy integers are integers; the largest seed is accepted.
        xs.all_reduce(x, blocks=np.int64(2), schedule="seeded", schedule_seed=2 ** 64 - 1)
        # An int past float's range is out of range too (not float()'s OverflowError).
        for eps in (float("inf"), 1e39, 10 ** 400, "0.1", True):
            with self.subTest(eps=eps):
                with self.assertRaises(ValueError) as caught:
                    xs.fused_add_rms_norm(f, r, w, eps)
                self.assertIn("eps must be finite and >= 0", str(caught.exception))

    def test_integer_options_are_checked_against_their_ctypes_type(self):
        """One helper bounds every integer option by the C type it is stored in, whatever narrower
        range the library sets; a narrower range that does not fit the type is a bug of the caller."""
        for value, ctype, message in ((2 ** 31, ctypes.c_int, "n must be -2147483648..2147483647, got 2147483648"),
                                      (-1, ctypes.c_size_t, "n must be 0..18446744073709551615, got -1"),
                                      (-1, ctypes.c_uint64, "n must be 0..18446744073709551615, got -1"),
                                      (2 ** 63, ctypes.c_int64, "n must be -9223372036854775808..9223372036854775807"),
                                      (False, ctypes.c_int, "n must be an integer"),
                                      ("3", ctypes.c_int, "n must be an integer")):
            with self.subTest(value=value, ctype=ctype.__name__):
                with self.assertRaises(ValueError) as caught:
                    _lib.int_option("n", value, ctype)
                self.assertIn(message, str(caught.exception))
        self.assertEqual(_lib.int_option("n", np.uint64(2 ** 64 - 1), ctypes.c_uint64), 2 ** 64 - 1)
        self.assertEqual(_lib.int_option("n", -2 ** 31, ctypes.c_int), -2 ** 31)
        with self.assertRaises(AssertionError):
            _lib.int_option("n", 1, ctypes.c_int, 0, 2 ** 32)
        self.assertEqual(_lib.field_type(_lib.SimOptions, "blocks"), ctypes.c_int)
        # A length past ssize_t is refused by the count too, not by len()'s OverflowError.
        with self.assertRaises(ValueError) as caught:
            _lib.trace_elements_option(range(2 ** 70))
        self.assertIn("more than 4096 elements; at most 4096", str(caught.exception))
        self.assertEqual(_lib.trace_elements_option(np.arange(3, dtype=np.uint64)), [0, 1, 2])

    def test_a_scalar_is_reported_with_its_own_shape(self):
        """A 0-d input was made 1-d on the way in: its error said shape (1,), and add_rms_norm ran
        it as a row of H = 1."""
        for x in (np.float32(1.0), np.array(1.0, dtype=np.float32)):
            with self.assertRaises(ValueError) as caught:
                xs.all_reduce(x)
            self.assertIn("got shape ()", str(caught.exception))
        scalar, one = np.float32(1.0), np.ones(1, np.float32)
        cases = [(lambda: xs.add_rms_norm(scalar, scalar, one), "x must have at least one dimension"),
                 (lambda: xs.fused_add_rms_norm(np.zeros((2, 8), np.float32), scalar, np.ones(8, np.float32)),
                  "residual must be shaped like one rank's x (8,), got ()"),
                 (lambda: xs.fused_add_rms_norm(np.zeros((2, 1, 8), np.float32), np.zeros((1, 8), np.float32),
                                                scalar), "weight must be shaped [H] = (8,), got ()")]
        assert_value_errors(self, cases)

    def test_store_options_are_checked(self):
        memory = exactcoll.MemoryStore()
        for rank, world_size, message in ((0, 2 ** 32 + 1, "world_size must be 1..1024"), (0, 0, "world_size must"),
                                          (2, 2, "rank must be 0..1"), (0.5, 2, "rank must be an integer")):
            with self.subTest(rank=rank, world_size=world_size):
                with self.assertRaises(ValueError) as caught:
                    exactcoll.Store(memory, rank, world_size)
                self.assertIn(message, str(caught.exception))
        store = exactcoll.Store(memory, 0, 1)
        with self.assertRaises(ValueError) as caught:
            store.barrier("a\0b", 1.0)
        self.assertIn("name contains a NUL character", str(caught.exception))
        for timeout_s in (float("nan"), 10 ** 400, "1"):
            with self.subTest(timeout_s=timeout_s):
                with self.assertRaises(ValueError) as caught:
                    store.barrier("b", timeout_s)
                self.assertIn("timeout_s must be a number", str(caught.exception))
        store.barrier("fine", 1.0)
        with self.assertRaises(ValueError) as caught:
            exactcoll.Store.tcp("127.0.0.1", 2 ** 16 + 5, "0123456789abcdef", 0, 1)
        self.assertIn("port must be 0..65535, got 65541", str(caught.exception))
        store.close()

    def test_names_match_the_library(self):
        """The tables are read from the library (its registry); they must hold the C header's values:
        each EXACTCOLL_ALGO_ONE_SHOT = 1 line of the installed header is ALGOS["one_shot"] == 1."""
        header = pathlib.Path(exactcoll.__file__).parent / "include" / "exactcoll" / "exactcoll.h"
        text = header.read_text()
        for table, prefix, from_name in ((_lib.DTYPES, "EXACTCOLL_", _lib.lib.exactcoll_dtype_from_name),
                                         (_lib.OPS, "EXACTCOLL_OP_", None),
                                         (_lib.ALGOS, "EXACTCOLL_ALGO_", _lib.lib.exactcoll_algo_from_name),
                                         (_lib.FUSED_ALGOS, "EXACTCOLL_FUSED_", _lib.lib.exactcoll_fused_algo_from_name),
                                         (_lib.CONTRACTS, "EXACTCOLL_CONTRACT_", _lib.lib.exactcoll_contract_from_name)):
            self.assertGreaterEqual(len(table), 3)
            self.assertEqual(sorted(table.values()), list(range(len(table))))
            for name, value in table.items():
                self.assertRegex(text, rf"\b{prefix}{name.upper()} = {value}\b", f"{name} = {value} in the header")
                if from_name is not None:
                    back = ctypes.c_int(-1)
                    self.assertEqual(from_name(name.encode(), ctypes.byref(back)), _lib.OK)
                    self.assertEqual(back.value, value)
        self.assertEqual(_lib.ALGOS["lamport_one_shot"], 8)
        self.assertEqual(_lib.ALGOS["lamport_two_shot"], 9)
        self.assertEqual(_lib.FUSED_ALGOS["push_one_stage_reg"], 9)

    def test_gpu_calls_without_a_gpu_raise(self):
        store = exactcoll.Store(exactcoll.MemoryStore(), 0, 1)
        handle = ctypes.c_uint64()
        status = _lib.lib.exactcoll_comm_create(store.handle, 0, 1, None, ctypes.byref(handle))
        if status == _lib.OK:
            self.skipTest("this machine has a GPU")
        with self.assertRaises(exactcoll.Error) as caught:
            _lib.check(status)
        self.assertTrue(str(caught.exception))
        old = store.handle
        store.close()
        with self.assertRaises(ValueError) as caught:  # a destroyed handle is an error, not a crash
            _lib.check(_lib.lib.exactcoll_store_destroy(old))
        self.assertIn(f"store handle {old} was destroyed", str(caught.exception))


class Stores(unittest.TestCase):
    def test_barrier_through_python_callbacks(self):
        backend = exactcoll.MemoryStore()
        stores = [exactcoll.Store(backend, r, 3) for r in range(3)]
        errors = []

        def rank(r):
            try:
                for _ in range(3):
                    stores[r].barrier("lined-up", 10.0)
            except Exception as e:  # collected, asserted below
                errors.append(e)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for s in stores:
            s.close()

    def test_missing_rank_is_named(self):
        backend = exactcoll.MemoryStore()
        stores = [exactcoll.Store(backend, r, 3) for r in range(3)]
        failures = {}

        def rank(r):
            try:
                stores[r].barrier("start", 0.3)
            except exactcoll.Error as e:
                failures[r] = str(e)

        threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 2)]  # rank 1 never comes
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in (0, 2):
            self.assertIn("barrier 'user/start': rank 1 never arrived", failures[r])

    def test_callback_exceptions_become_errors_and_chain(self):
        class Broken(exactcoll.MemoryStore):
            def add(self, key, delta):  # the barrier's first store operation is an add
                raise ConnectionError("the store's server went away")

        store = exactcoll.Store(Broken(), 0, 2)
        with self.assertRaises(exactcoll.Error) as caught:
            store.barrier("x", 1.0)
        self.assertIn("ConnectionError: the store's server went away", str(caught.exception))
        self.assertIsInstance(caught.exception.__cause__, ConnectionError)
        store.close()

    def test_long_values_pass_through(self):
        backend = exactcoll.MemoryStore()
        # core/key_barrier.h: rank 0, first of 2, waits for round 0's done key. Set beforehand to a
        # long value, it passes only when the 10000 bytes come through (a second get, larger buffer).
        backend.set("user/big/0/done", b"x" * 10000)
        store = exactcoll.Store(backend, 0, 2)
        store.barrier("big", 1.0)
        store.close()


class Model(unittest.TestCase):
    """exactcoll.model_multinode: the library's multi-node performance model from Python."""

    def test_predictions(self):
        fast = exactcoll.model_multinode("allreduce", nodes=4, bytes=64 << 20)
        self.assertEqual([p["algorithm"] for p in fast],
                         ["exactcoll chain", "chain, overlapped", "exactcoll direct", "nccl ring", "nccl tree",
                          "exactcoll tree"])
        self.assertTrue(all(p["time_us"] > 0 for p in fast))
        self.assertGreater(fast[0]["chunk_elements"], 0)
        # A slower network makes every algorithm that crosses nodes slower.
        slow = exactcoll.model_multinode("allreduce", nodes=4, bytes=64 << 20, network_gbps=5)
        for a, b in zip(fast, slow):
            self.assertLess(a["time_us"], b["time_us"], a["algorithm"])
        # NCCL's all-gather has no tree, and the tree contract's all-gather is the same copy; the
        # tree contract's row needs powers of two.
        # Either spelling of an op (core/registry.h kOpAliases, through exactcoll_op_from_name).
        self.assertEqual(exactcoll.model_multinode("all_reduce", nodes=4, bytes=64 << 20), fast)
        with self.assertRaisesRegex(ValueError, "unknown op 'all_sum'; expected one of allreduce, reduce_scatter"):
            exactcoll.model_multinode("all_sum", nodes=4, bytes=1 << 20)
        gather = exactcoll.model_multinode("allgather", nodes=2, bytes=1 << 20, dtype="fp32")
        self.assertEqual([p["algorithm"] for p in gather], ["exactcoll chain", "chain, overlapped", "nccl ring"])
        odd = exactcoll.model_multinode("reduce_scatter", nodes=3, bytes=1 << 20)
        self.assertEqual([p["algorithm"] for p in odd], ["exactcoll chain", "chain, overlapped", "nccl ring"])
        tree = exactcoll.model_multinode("reduce_scatter", nodes=4, bytes=1 << 20)[-1]
        self.assertEqual(tree["algorithm"], "exactcoll tree")
        self.assertEqual(tree["nic_bytes"], 3 / 4 * (1 << 20) / 8)

    def test_bad_inputs(self):
        assert_value_errors(self, [
            (lambda: exactcoll.model_multinode(nodes=0, bytes=1 << 20), "nodes must be 1..1024, got 0"),
            (lambda: exactcoll.model_multinode(nodes=2, bytes=8), "bytes must be 64..2^40"),
            (lambda: exactcoll.model_multinode("alltoall", nodes=2, bytes=1 << 20), "unknown op 'alltoall'"),
            (lambda: exactcoll.model_multinode(nodes=2, bytes=1 << 20, network_gbps=float("nan")), "network_gbps"),
            (lambda: exactcoll.model_multinode(nodes=2, bytes=1 << 20, network_gbps=0), "link rates must be"),
        ])
        with self.assertRaises(TypeError):
            exactcoll.model_multinode(nodes=2, bytes=1 << 20, nvlink=1)


class Package(unittest.TestCase):
    def test_readme_quickstart_is_the_example_file(self):
        # The README's PyTorch example is python/examples/quickstart.py, which the GPU run executes.
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "..", "..", "README.md")) as f:
            readme = f.read()
        with open(os.path.join(here, "..", "examples", "quickstart.py")) as f:
            example = f.read()
        block = readme.split("```python\n# torchrun --nproc-per-node 2 python/examples/quickstart.py", 1)[1]
        block = "# torchrun --nproc-per-node 2 python/examples/quickstart.py" + block.split("```", 1)[0]
        self.assertEqual(block, example)

    def test_version_and_library(self):
        self.assertRegex(exactcoll.__version__, r"^\d+\.\d+\.\d+$")
        self.assertTrue(os.path.exists(exactcoll.library_path()))
        self.assertIn(exactcoll.has_cuda(), (True, False))


if __name__ == "__main__":
    unittest.main()
