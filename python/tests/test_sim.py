"""exactcoll.sim against the independent numpy reference of the contract (contract_reference.py):
every algorithm, world sizes 1-8, the three dtypes, adversarial inputs, compared bit for bit.
The seed is printed; EXACTCOLL_TEST_SEED reproduces a run."""

import os
import tempfile
import unittest

import numpy as np

import contract_reference as ref
import exactcoll.sim as xs
from exactcoll import _lib

SEED = int(os.environ.get("EXACTCOLL_TEST_SEED", "20261124"))
print(f"test_sim: seed {SEED} (EXACTCOLL_TEST_SEED={SEED} reproduces)")



def runs_in_simulator(call):
    """Whether the simulator runs a tiny call, or refuses its algorithm (GPU-only, or not this op's)."""
    try:
        call()
        return True
    except ValueError as e:
        if "runs on GPUs only" in str(e) or "has no algorithm" in str(e):
            return False
        raise


# Every algorithm of the library's tables (its registry) that the simulator runs: a new one is
# tested here without a change to this file. The known ones must be among them (so that a broken
# filter cannot empty the lists).
_ONES = np.zeros((2, 8), dtype=np.uint16)
ALLREDUCE_ALGOS = [a for a in _lib.ALGOS
                   if runs_in_simulator(lambda: xs.all_reduce(_ONES, dtype="bf16", algo=a))]
FUSED_ALGOS = [a for a in _lib.FUSED_ALGOS
               if runs_in_simulator(lambda: xs.fused_add_rms_norm(_ONES.reshape(2, 1, 8), _ONES[0].reshape(1, 8),
                                                                  _ONES[0], 1e-6, dtype="bf16", algo=a))]
assert set(ALLREDUCE_ALGOS) >= {"auto", "one_shot", "two_shot", "push_one_shot", "push_two_shot",
                                "lamport_one_shot"}, ALLREDUCE_ALGOS
assert set(FUSED_ALGOS) >= {"auto", "one_stage", "two_stage", "push_one_stage", "lamport_one_stage", "unfused",
                            "one_stage_reg", "gather_norm", "push_one_stage_reg"}, FUSED_ALGOS
DTYPES = ["bf16", "fp16", "fp32"]


def as_input(bits, fmt):
    return bits  # uint16 bit patterns for bf16/fp16, float32 for fp32


def assert_bits_equal(test, got, want, what):
    got_bits, want_bits = ref.bits_of(got), ref.bits_of(want)
    test.assertEqual(got_bits.shape, want_bits.shape, what)
    differ = np.flatnonzero(got_bits.ravel() != want_bits.ravel())
    if differ.size:
        i = differ[0]
        test.fail(f"{what}: {differ.size} of {got_bits.size} elements differ; first at flat index {i}: "
                  f"got {got_bits.ravel()[i]:#x}, want {want_bits.ravel()[i]:#x}")


class Collectives(unittest.TestCase):
    def test_every_algorithm_size_and_dtype_matches_the_reference(self):
        rng = np.random.default_rng(SEED)
        for fmt in DTYPES:
            for ranks in range(1, 9):
                count = ranks * 37  # not a pack multiple: the tails run too
                x = ref.adversarial(rng, (ranks, count), fmt)
                want = ref.all_reduce(x, fmt)
                for algo in ALLREDUCE_ALGOS:
                    got = xs.all_reduce(x, dtype=fmt, algo=algo)
                    for r in range(ranks):
                        assert_bits_equal(self, got[r], want, f"all_reduce {algo} {fmt} ranks {ranks} rank {r}")
                for algo in ["auto", "direct"]:
                    got = xs.reduce_scatter(x, dtype=fmt, algo=algo)
                    block = count // ranks
                    for r in range(ranks):
                        assert_bits_equal(self, got[r], want[r * block:(r + 1) * block],
                                          f"reduce_scatter {algo} {fmt} ranks {ranks} rank {r}")
                    got = xs.all_gather(x, dtype=fmt, algo=algo)
                    for r in range(ranks):
                        assert_bits_equal(self, got[r], x.reshape(-1), f"all_gather {algo} {fmt} ranks {ranks}")

    def test_tree_contract_every_algorithm_matches_the_reference(self):
        rng = np.random.default_rng(SEED + 3)
        for fmt in DTYPES:
            for ranks in (1, 2, 3, 4, 6, 8):
                count = ranks * 37
                x = ref.adversarial(rng, (ranks, count), fmt)
                want = ref.tree(x, fmt)
                for algo in ALLREDUCE_ALGOS:
                    got = xs.all_reduce(x, dtype=fmt, algo=algo, contract="tree")
                    for r in range(ranks):
                        assert_bits_equal(self, got[r], want, f"tree all_reduce {algo} {fmt} ranks {ranks} rank {r}")
                got = xs.reduce_scatter(x, dtype=fmt, contract="tree")
                block = count // ranks
                for r in range(ranks):
                    assert_bits_equal(self, got[r], want[r * block:(r + 1) * block], f"tree reduce_scatter {fmt}")

    def test_tree_is_the_same_at_every_tp_size(self):
        # Eight leaves per element: at TP = t each rank's input is the tree over its 8 / t leaves;
        # the tree all-reduce over the t ranks gives the tree over all eight, the same bits for every t.
        rng = np.random.default_rng(SEED + 4)
        leaves = ref.narrow(rng.standard_normal((8, 200)).astype(np.float32) * 4, "bf16")
        want = ref.tree(leaves, "bf16")
        for tp in (1, 2, 4, 8):
            partials = np.stack([ref.tree(leaves[r * (8 // tp):(r + 1) * (8 // tp)], "bf16") for r in range(tp)])
            got = xs.all_reduce(partials, dtype="bf16", contract="tree")
            assert_bits_equal(self, got[0], want, f"tree at TP {tp}")
        # Canonical does not have that property: some element differs between TP 2 and TP 8.
        canonical = [xs.all_reduce(np.stack([ref.tree(leaves[r * (8 // tp):(r + 1) * (8 // tp)], "bf16")
                                             for r in range(tp)]), dtype="bf16")[0] for tp in (2, 8)]
        self.assertTrue(np.any(canonical[0] != canonical[1]), "canonical happened to match at TP 2 and 8")

    def test_tree_refusals(self):
        x = np.zeros((2, 8), dtype=np.uint16)
        with self.assertRaisesRegex(ValueError, "library's contracts"):
            xs.all_reduce(x, dtype="bf16", contract="f32_residual")
        with self.assertRaisesRegex(ValueError, "unknown contract"):
            xs.all_reduce(x, dtype="bf16", contract="pairwise")
        with tempfile.TemporaryDirectory() as d:  # a traced element records its tree's nodes
            path = os.path.join(d, "t.jsonl")
            xs.all_reduce(x, dtype="bf16", algo="one_shot", contract="tree", trace=path, trace_elements=[1])
            with open(path) as f:
                events = f.read()
            self.assertEqual(events.count('"event":"tree_node"'), 2)  # one node on each of the 2 ranks
            self.assertNotIn('"event":"fold"', events)

    def test_across_nodes_the_bits_of_one_node(self):
        # nodes= runs the multi-node path (emulated nodes over a simulated network): every rank's
        # output equals the independent reference of as many ranks on one node, for both contracts.
        rng = np.random.default_rng(SEED + 7)
        for dtype in DTYPES:
            for nodes, per_node in ((2, 2), (4, 2), (2, 4)):
                ranks = nodes * per_node
                x = ref.adversarial(rng, (ranks, 128 * ranks), dtype)
                want = ref.all_reduce(x, dtype)
                got = xs.all_reduce(x, dtype=dtype, nodes=nodes, chunk_elements=64)
                for r in range(ranks):
                    assert_bits_equal(self, got[r], want, f"{dtype} {nodes}x{per_node} rank {r}")
                tree = xs.all_reduce(x, dtype=dtype, nodes=nodes, contract="tree")
                one_node_tree = xs.all_reduce(x, dtype=dtype, contract="tree")
                assert_bits_equal(self, tree, one_node_tree, f"{dtype} {nodes}x{per_node} tree")
                rs = xs.reduce_scatter(x, dtype=dtype, nodes=nodes)
                assert_bits_equal(self, rs, xs.reduce_scatter(x, dtype=dtype), f"{dtype} reduce_scatter")
                ag = xs.all_gather(x, dtype=dtype, nodes=nodes)
                assert_bits_equal(self, ag, xs.all_gather(x, dtype=dtype), f"{dtype} all_gather")
        x = np.zeros((4, 64), dtype=np.uint16)
        for kwargs, message in ((dict(nodes=3), "multiple of 3"), (dict(nodes=2, algo="one_shot"), "algo 'auto'"),
                                (dict(chunk_elements=64), "chunk_elements goes with nodes"),
                                (dict(nodes=0), "nodes must be 1..1024"),
                                (dict(nodes=2, chunk_elements=65), "multiple of 64")):
            with self.subTest(**{k: str(v) for k, v in kwargs.items()}):
                with self.assertRaisesRegex(ValueError, message):
                    xs.all_reduce(x, dtype="bf16", **kwargs)

    def test_comparison_catches_one_flipped_bit(self):
        rng = np.random.default_rng(SEED + 1)
        x = ref.adversarial(rng, (3, 64), "bf16")
        got = xs.all_reduce(x, dtype="bf16")
        got[1, 17] ^= np.uint16(1)
        with self.assertRaises(AssertionError):
            assert_bits_equal(self, got[1], ref.all_reduce(x, "bf16"), "flipped")

    def test_shapes_blocks_and_schedules(self):
        rng = np.random.default_rng(SEED + 2)
        x = rng.standard_normal((4, 6, 5)).astype(np.float32)
        want = ref.all_reduce(x, "fp32")
        y = xs.all_reduce(x, blocks=3, schedule="seeded", schedule_seed=9)
        self.assertEqual(y.shape, (4, 6, 5))
        assert_bits_equal(self, y[2], want, "seeded, 3 blocks")
        rs = xs.reduce_scatter(np.ascontiguousarray(np.broadcast_to(x[:, :4], (4, 4, 5))))
        self.assertEqual(rs.shape, (4, 1, 5))
        ag = xs.all_gather(x)
        self.assertEqual(ag.shape, (4, 24, 5))
        assert_bits_equal(self, ag[3], x.reshape(24, 5), "all_gather keeps bits")

    def test_float16_arrays_and_torch_tensors(self):
        rng = np.random.default_rng(SEED + 3)
        x16 = rng.standard_normal((3, 40)).astype(np.float16)
        y16 = xs.all_reduce(x16)
        self.assertEqual(y16.dtype, np.float16)
        assert_bits_equal(self, y16[0], ref.all_reduce(x16.view(np.uint16), "fp16"), "float16 input")
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        xt = torch.from_numpy(rng.standard_normal((2, 24)).astype(np.float32)).to(torch.bfloat16)
        yt = xs.all_reduce(xt)
        self.assertEqual(yt.dtype, torch.bfloat16)
        bits = xt.view(torch.int16).numpy().view(np.uint16)
        assert_bits_equal(self, yt.view(torch.int16).numpy().view(np.uint16)[1], ref.all_reduce(bits, "bf16"),
                          "torch bf16")

    def test_traces(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.jsonl")
            chrome = os.path.join(d, "t.json")
            x = np.full((2, 9), 0x3F80, dtype=np.uint16)  # 1.0 in bf16
            y = xs.all_reduce(x, dtype="bf16", algo="one_shot", schedule="seeded", trace=path, chrome_trace=chrome,
                              trace_elements=[8])
            self.assertEqual(int(y[0, 8]), 0x4000)
            with open(path) as f:
                text = f.read()
            self.assertIn('"event":"fold"', text)
            self.assertIn('"stored":"0x4000"', text)
            self.assertTrue(os.path.getsize(chrome) > 0)


class Fused(unittest.TestCase):
    def check(self, rng, fmt, ranks, rows, hidden, algo="auto", contract="canonical", specials=False):
        if specials:
            x = ref.adversarial(rng, (ranks, rows, hidden), fmt)
            residual = ref.adversarial(rng, (rows, hidden), fmt)
        else:
            x = ref.narrow(rng.standard_normal((ranks, rows, hidden)).astype(np.float32), fmt)
            residual = ref.narrow(rng.standard_normal((rows, hidden)).astype(np.float32) * 2, fmt)
        weight = ref.narrow(rng.standard_normal(hidden).astype(np.float32) * 0.5, fmt)
        out, ro = xs.fused_add_rms_norm(x, residual, weight, 1e-6, dtype=None if fmt == "fp32" else fmt, algo=algo,
                                        contract=contract)
        want_out, want_ro = ref.fused_add_rms_norm(x, residual, weight, 1e-6, fmt, contract)
        what = f"{fmt} ranks {ranks} rows {rows} H {hidden} {algo} {contract}"
        for r in range(ranks):
            assert_bits_equal(self, ro[r], want_ro, what + f" residual_out rank {r}")
            assert_bits_equal(self, out[r], want_out, what + f" out rank {r}")
        return x, residual, weight, out

    def test_every_algorithm_matches_the_reference(self):
        rng = np.random.default_rng(SEED + 10)
        for fmt in DTYPES:
            for ranks in (1, 2, 3, 5, 8):
                for algo in FUSED_ALGOS:
                    self.check(rng, fmt, ranks, 3, 64, algo)
                self.check(rng, fmt, ranks, 2, 64, "auto", specials=True)

    def test_model_hidden_sizes(self):
        rng = np.random.default_rng(SEED + 11)
        for fmt in DTYPES:
            for hidden in (2880, 4096, 5120):
                self.check(rng, fmt, 2, 2, hidden)

    def test_tree_contract(self):
        rng = np.random.default_rng(SEED + 13)
        for fmt in DTYPES:
            for ranks in (1, 3, 4):
                for algo in FUSED_ALGOS:
                    self.check(rng, fmt, ranks, 3, 64, algo, contract="tree")
            self.check(rng, fmt, 4, 2, 64, "auto", contract="tree", specials=True)

    def test_alternative_contracts(self):
        rng = np.random.default_rng(SEED + 12)
        for fmt in DTYPES:
            self.check(rng, fmt, 4, 3, 64, contract="f32_residual")
            self.check(rng, fmt, 4, 3, 64, contract="bf16_accumulate")
        # rotated_two_shot folds in a rotated order: with 2 ranks that is the same sum.
        x = ref.narrow(rng.standard_normal((2, 3, 64)).astype(np.float32), "bf16")
        residual = ref.narrow(rng.standard_normal((3, 64)).astype(np.float32), "bf16")
        weight = ref.narrow(rng.standard_normal(64).astype(np.float32), "bf16")
        rotated = xs.fused_add_rms_norm(x, residual, weight, dtype="bf16", contract="rotated_two_shot")
        canonical = xs.fused_add_rms_norm(x, residual, weight, dtype="bf16")
        assert_bits_equal(self, rotated[0], canonical[0], "rotated_two_shot, 2 ranks")

    def test_add_rms_norm_is_the_fused_op_on_one_rank(self):
        rng = np.random.default_rng(SEED + 14)
        for fmt in DTYPES:
            x = ref.adversarial(rng, (5, 64), fmt)
            residual = ref.adversarial(rng, (5, 64), fmt)
            weight = ref.narrow(rng.standard_normal(64).astype(np.float32), fmt)
            out, ro = xs.add_rms_norm(x, residual, weight, 1e-6, dtype=None if fmt == "fp32" else fmt)
            want_out, want_ro = ref.fused_add_rms_norm(x[None], residual, weight, 1e-6, fmt)
            assert_bits_equal(self, ro, want_ro, f"{fmt} add_rms_norm residual_out")
            assert_bits_equal(self, out, want_out, f"{fmt} add_rms_norm out")

    def test_batch_invariance(self):
        # A row's bits do not depend on the rows around it: alone, or among 7, 64 or 256.
        rng = np.random.default_rng(SEED + 13)
        for fmt in DTYPES:
            hidden = 256
            x = ref.narrow(rng.standard_normal((4, 256, hidden)).astype(np.float32), fmt)
            residual = ref.narrow(rng.standard_normal((256, hidden)).astype(np.float32), fmt)
            weight = ref.narrow(rng.standard_normal(hidden).astype(np.float32), fmt)
            dt = None if fmt == "fp32" else fmt
            alone = xs.fused_add_rms_norm(x[:, :1], residual[:1], weight, dtype=dt)
            for rows in (8, 65, 256):
                batch = xs.fused_add_rms_norm(x[:, :rows], residual[:rows], weight, dtype=dt)
                assert_bits_equal(self, batch[0][:, :1], alone[0], f"{fmt} out, row 0 of {rows}")
                assert_bits_equal(self, batch[1][:, :1], alone[1], f"{fmt} residual_out, row 0 of {rows}")


if __name__ == "__main__":
    unittest.main()
