"""exactcoll.linear's Python side on the CPU: the pointers, leading dimensions and strides it passes
to exactcoll_invariant_matmul, checked by running a stand-in for the C function on host memory
(float64 products rounded once to bf16, reading and writing exactly the elements the C API's
contract names); the tree order; the shards; the layers at TP = 1, 2, 4, 8; the backward passes.
The product's own bits need a GPU (python/tests/gpu_invariant_matmul_check.py).

    PYTHONPATH=<installed wheel> python3 -m unittest -v test_linear_cpu     (from python/tests)
"""

import ctypes
import unittest

import numpy as np
import torch

import exactcoll.linear as xl


def _view(pointer, rows, cols, ld):
    flat = np.ctypeslib.as_array((ctypes.c_uint16 * ((rows - 1) * ld + cols)).from_address(pointer))
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (2 * ld, 2))


def _to_bf16(bits):
    return torch.from_numpy(np.ascontiguousarray(bits).astype(np.int16)).view(torch.bfloat16)


def _store(bits_view, value):
    bits_view[...] = value.view(torch.int16).numpy().astype(np.uint16)


def _check_args(a, b, c, m, k, n, lda, ldb, ldc, strides):
    assert a % 16 == 0 and b % 16 == 0 and c % 16 == 0, "16-byte aligned pointers"
    for v in (lda, ldb, ldc) + tuple(strides):
        assert v % 8 == 0, f"leading dimension or stride {v} is not a multiple of 8 elements"
    assert lda >= k and ldb >= n and ldc >= n


def _leaf(a, b, m, k, n, lda, ldb):
    """One leaf's product as the C API's contract has it: float64 products rounded once to bf16."""
    return (_to_bf16(_view(a, m, k, lda)).double() @ _to_bf16(_view(b, k, n, ldb)).double()).to(torch.bfloat16)


def _stand_in(calls):
    """A Python exactcoll_invariant_matmul over host pointers (no GPU), recording each call."""

    def matmul(a, b, c, m, k, n, batch, lda, ldb, ldc, sa, sb, sc, dtype, device, stream):
        _check_args(a, b, c, m, k, n, lda, ldb, ldc, (sa, sb, sc) if batch > 1 else ())
        calls.append((m, k, n, batch, lda, ldb, ldc, sa, sb, sc))
        for i in range(batch):
            _store(_view(c + 2 * i * sc, m, n, ldc), _leaf(a + 2 * i * sa, b + 2 * i * sb, m, k, n, lda, ldb))
        return 0

    return matmul


def _pairs_stand_in(calls):
    """A Python exactcoll_invariant_matmul_pairs over host pointers: leaf l's A at a + l stride_a_leaf,
    B at b + l stride_b_leaf, pair p's C at c + p stride_c_pair = node(leaf 2p, leaf 2p+1), the node
    torch's bf16 `+` (float add, one rounding; the CPU's equals CUDA's for every non-NaN)."""

    def pairs_fn(a, b, c, m, k, n, pairs, lda, ldb, ldc, sa, sb, sc, dtype, device, stream):
        _check_args(a, b, c, m, k, n, lda, ldb, ldc, (sa, sb) + ((sc,) if pairs > 1 else ()))
        assert 1 <= pairs, pairs
        calls.append((m, k, n, pairs, lda, ldb, ldc, sa, sb, sc, c))
        for p in range(pairs):
            left = _leaf(a + 2 * (2 * p) * sa, b + 2 * (2 * p) * sb, m, k, n, lda, ldb)
            right = _leaf(a + 2 * (2 * p + 1) * sa, b + 2 * (2 * p + 1) * sb, m, k, n, lda, ldb)
            _store(_view(c + 2 * p * sc, m, n, ldc), left + right)
        return 0

    return pairs_fn


def _ref(a, b):
    return (a.double() @ b.double()).to(torch.bfloat16)


class LinearOnCpu(unittest.TestCase):
    def setUp(self):
        self.calls, self.pair_calls = [], []
        self.saved = (xl._bound, xl._CURRENT_STREAM, torch.Tensor.is_cuda, torch.Tensor.get_device)
        xl._bound = lambda: (_stand_in(self.calls), None, _pairs_stand_in(self.pair_calls))
        xl._CURRENT_STREAM = lambda device: 0
        torch.Tensor.is_cuda = property(lambda self: True)  # host tensors pass the CUDA checks
        torch.Tensor.get_device = lambda self: 0
        self.g = torch.Generator().manual_seed(0)

    def tearDown(self):
        xl._bound, xl._CURRENT_STREAM, torch.Tensor.is_cuda, torch.Tensor.get_device = self.saved

    def rand(self, *shape):
        return torch.randn(*shape, generator=self.g).to(torch.bfloat16)

    def assertBits(self, got, want):
        self.assertEqual(tuple(got.shape), tuple(want.shape))
        self.assertTrue(torch.equal(got.contiguous().view(torch.int16), want.contiguous().view(torch.int16)))

    def test_layouts(self):
        a, b = self.rand(40, 64), self.rand(64, 48)
        self.assertBits(xl.invariant_matmul(a, b), _ref(a, b))
        self.assertBits(xl.invariant_matmul(a[8:9], b), _ref(a[8:9], b))           # one row, offset
        self.assertBits(xl.invariant_matmul(a[3:20], b), _ref(a[3:20], b))         # misaligned rows: copied
        self.assertBits(xl.invariant_matmul(a, b[:, 8:24]), _ref(a, b[:, 8:24]))   # column view, ldb = 48
        self.assertEqual(self.calls[-1][5], 48)
        self.assertBits(xl.invariant_matmul(a, b[:, 3:11]), _ref(a, b[:, 3:11]))   # misaligned columns: copied

    def test_batches(self):
        a, b = self.rand(5, 16, 64), self.rand(5, 64, 32)
        self.assertBits(xl.invariant_matmul(a, b), torch.stack([_ref(a[i], b[i]) for i in range(5)]))
        self.assertBits(xl.invariant_matmul(a, b[0]), torch.stack([_ref(a[i], b[0]) for i in range(5)]))
        self.assertEqual(self.calls[-1][8], 0)  # one B: stride 0
        self.assertBits(xl.invariant_matmul(a[:1], b), torch.stack([_ref(a[0], b[i]) for i in range(5)]))

    def test_refusals(self):
        with self.assertRaises(ValueError):
            xl.invariant_matmul(self.rand(4, 12), self.rand(12, 8))  # K = 12: rows not 16-byte multiples
        with self.assertRaises(ValueError):
            xl.invariant_matmul(self.rand(4, 16).float(), self.rand(16, 8).float())
        with self.assertRaises(ValueError):
            xl.invariant_matmul(self.rand(4, 16), self.rand(8, 8))

    def test_tree_sum_order(self):
        x = self.rand(8, 5) * 1000
        want = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]))
        self.assertBits(xl.tree_sum(x), want)
        with self.assertRaises(ValueError):
            xl.tree_sum(x[:3])

    def test_row_parallel_every_tp(self):
        hidden, out, leaves = 128, 32, 8
        w, x = self.rand(out, hidden), self.rand(7, hidden)
        kl = hidden // leaves
        whole = None
        for tp in (1, 2, 4, 8):
            local = hidden // tp
            partials = []
            for rank in range(tp):
                module = xl.TreeRowParallelLinear.from_full(w, rank, tp, leaves)
                products = module.leaf_products(x[:, rank * local:(rank + 1) * local])
                for j in range(leaves // tp):
                    leaf = rank * (leaves // tp) + j
                    self.assertBits(products[j], _ref(x[:, leaf * kl:(leaf + 1) * kl], w[:, leaf * kl:(leaf + 1) * kl].t()))
                partials.append(module(x[:, rank * local:(rank + 1) * local], reduce=False))
                # The pair products' tree: the bits of the leaf products' tree (the path before pairs).
                self.assertBits(partials[-1], xl.tree_sum(products.detach()))
            total = xl.tree_sum(torch.stack(partials))
            whole = total if whole is None else whole
            self.assertBits(total, whole)
        self.assertBits(xl.TreeRowParallelLinear.from_full(w, 0, 1, leaves)(x), whole)

    def test_pair_products(self):
        """The first tree level fused into the product: the arguments the layer passes to
        exactcoll_invariant_matmul_pairs (leaf strides Kl elements in x's rows and Kl rows of W^T,
        pair entries M rows apart) and the pairs' bits (each leaf's product, then torch's `+`)."""
        hidden, out, leaves = 128, 32, 8
        w, x = self.rand(out, hidden), self.rand(7, hidden)
        kl = hidden // leaves
        module = xl.TreeRowParallelLinear.from_full(w, 0, 1, leaves)
        # Below _PAIR_MIN_ROWS rows the forward takes the batched leaf products (and tree_sum).
        self.assertBits(module(x, reduce=False), xl.tree_sum(module.leaf_products(x)))
        self.assertEqual((len(self.pair_calls), len(self.calls)), (0, 2))
        saved, xl._PAIR_MIN_ROWS = xl._PAIR_MIN_ROWS, 1  # the pair path at these small shapes
        self.addCleanup(setattr, xl, "_PAIR_MIN_ROWS", saved)
        pairs = module.pair_products(x)
        self.assertEqual(self.pair_calls[-1][:10], (7, kl, out, 4, hidden, out, out, kl, kl * out, 7 * out))
        products = module.leaf_products(x)
        for p in range(4):
            self.assertBits(pairs[p], products[2 * p] + products[2 * p + 1])
        self.pair_calls.clear(), self.calls.clear()
        self.assertBits(module(x, reduce=False), xl.tree_sum(products))
        self.assertEqual((len(self.pair_calls), len(self.calls)), (1, 0))  # the forward: one pair product only
        # x's rows a view with a wider stride (lda 256), one row, and W^T shared by all leaves' rows.
        wide = self.rand(7, 2 * hidden)
        self.assertBits(module(wide[:, :hidden], reduce=False), module(wide[:, :hidden].contiguous(), reduce=False))
        self.assertEqual(self.pair_calls[-2][4], 2 * hidden)
        self.assertBits(module(x[2:3], reduce=False), module(x, reduce=False)[2:3])
        # 2 leaves on the rank (TP 4 of 8): the pair is the partial.
        rank2 = xl.TreeRowParallelLinear.from_full(w, 2, 4, leaves)
        self.assertBits(rank2(x[:, 64:96], reduce=False), rank2.leaf_products(x[:, 64:96])[0] +
                        rank2.leaf_products(x[:, 64:96])[1])
        # 1 leaf (TP 8): no pair product.
        self.pair_calls.clear()
        one = xl.TreeRowParallelLinear.from_full(w, 3, 8, leaves)
        self.assertBits(one(x[:, 48:64], reduce=False), one.leaf_products(x[:, 48:64])[0])
        self.assertEqual(self.pair_calls, [])
        with self.assertRaises(ValueError):
            one.pair_products(x[:, 48:64])

    def test_tree_sum_into_out(self):
        for n in (1, 2, 4, 8):
            stacked = self.rand(n, 3, 16)
            out = torch.empty(3, 16, dtype=torch.bfloat16)
            self.assertIs(xl.tree_sum(stacked, out=out), out)
            self.assertBits(out, xl.tree_sum(stacked))

    def test_chunked_rows_match_one_call(self):
        """The prefill overlap's chunks: every row reduced once, in order, with the one-call bits
        (a stand-in all-reduce that mixes each row's columns, so a row read from the wrong place
        or reduced twice shows)."""

        class Comm:
            world_size = 2

            def __init__(self):
                self.rows, self.cap = [], 0

            def set_max_blocks(self, blocks):
                previous, self.cap = self.cap, blocks
                return previous

            def all_reduce(self, x, *, out=None):
                self.rows.append((x.shape[0], self.cap))
                y = x + x.roll(1, -1)
                return y if out is None else out.copy_(y)

        hidden, out_features = 128, 24
        w, x = self.rand(out_features, hidden), self.rand(10, hidden // 2)
        # 4 leaves on this rank (2 pairs, then tree_sum), 2 (their pair is the partial), 1 (its product is the partial)
        for leaves, tp in ((8, 2), (4, 2), (2, 2)):
            comm = Comm()
            self.pair_calls.clear()
            one_call = xl.TreeRowParallelLinear.from_full(w, 1, tp, leaves, comm, chunk_rows=0)
            chunked = xl.TreeRowParallelLinear.from_full(w, 1, tp, leaves, comm, chunk_rows=4)
            with torch.no_grad():
                want = one_call(x)  # 10 rows: under _PAIR_MIN_ROWS, the leaf products (no pair call)
                self.assertEqual((comm.rows, len(self.pair_calls)), ([(10, 0)], 0))
                comm.rows.clear()
                # Chunks under _PAIR_MIN_ROWS take the leaf products; then (threshold 1) the pair products.
                self.calls.clear()
                self.assertBits(chunked(x), want)
                self.assertEqual((len(self.pair_calls), [c[0] for c in self.calls]), (0, [4, 4, 2]))
                comm.rows.clear()
                saved, xl._PAIR_MIN_ROWS = xl._PAIR_MIN_ROWS, 1
                try:
                    self.assertBits(chunked(x.view(2, 5, hidden // 2)), want.view(2, 5, out_features))
                finally:
                    xl._PAIR_MIN_ROWS = saved
                self.assertEqual(comm.rows, [(4, 64), (4, 64), (2, 64)])  # the overlap's grid cap, then back
                self.assertEqual(comm.cap, 0)
                kl = hidden // leaves
                chunk_calls = [c[:10] for c in self.pair_calls]
                if leaves == 8:  # 2 pairs into the chunk buffer's rows (a view: pair entries 4 rows apart)
                    self.assertEqual(chunk_calls, [(r, kl, 24, 2, 64, 24, 24, kl, kl * 24, 4 * 24) for r in (4, 4, 2)])
                elif leaves == 4:  # one pair, written into the partial's rows: 4 rows of 24 apart, no copy
                    self.assertEqual(chunk_calls, [(r, kl, 24, 1, 64, 24, 24, kl, kl * 24, 0) for r in (4, 4, 2)])
                    pointers = [c[10] for c in self.pair_calls]
                    self.assertEqual([q - pointers[0] for q in pointers], [0, 4 * 24 * 2, 8 * 24 * 2])
                else:
                    self.assertEqual(self.pair_calls, [])
                comm.rows.clear()
                self.assertBits(chunked(x[:4]), want[:4])  # not more than chunk_rows rows: one call
                self.assertEqual(comm.rows, [(4, 0)])
            comm.rows.clear()
            self.assertBits(chunked(x), want)  # autograd recording (weight_t requires grad): one call
            self.assertEqual(comm.rows, [(10, 0)])
        # overlap_blocks=0 keeps the caller's cap; a failing chunk still restores the cap.
        comm = Comm()
        comm.cap = 16
        keep = xl.TreeRowParallelLinear.from_full(w, 1, 2, 8, comm, chunk_rows=4, overlap_blocks=0)
        with torch.no_grad():
            keep(x)
        self.assertEqual((comm.rows, comm.cap), ([(4, 16), (4, 16), (2, 16)], 16))
        comm.cap = 0
        comm.all_reduce = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("peer gone"))
        with torch.no_grad(), self.assertRaises(RuntimeError):
            chunked_fail = xl.TreeRowParallelLinear.from_full(w, 1, 2, 8, comm, chunk_rows=4)
            chunked_fail(x)
        self.assertEqual(comm.cap, 0)
        for bad in (dict(chunk_rows=-1), dict(overlap_blocks=-1), dict(overlap_blocks=True), dict(overlap_blocks=2**31)):
            with self.assertRaises(ValueError):
                xl.TreeRowParallelLinear(128, 32, 0, 2, 8, **bad)

    def test_shards_cover_the_weight(self):
        w = self.rand(24, 64)
        for tp in (1, 2, 4, 8):
            self.assertBits(torch.cat([xl.row_parallel_shard(w, r, tp) for r in range(tp)], 0), w.t())
        q, k = self.rand(32, 16), self.rand(8, 16)
        got = torch.cat([xl.column_parallel_shard([q, k], r, 4) for r in range(4)], 1)
        want = torch.cat([torch.cat([q[8 * r:8 * r + 8], k[2 * r:2 * r + 2]]) for r in range(4)]).t()
        self.assertBits(got, want)
        with self.assertRaises(ValueError):
            xl.TreeRowParallelLinear(100, 32, 0, 2, 8)   # 100 is not 8 leaves of a multiple of 8
        with self.assertRaises(ValueError):
            xl.TreeRowParallelLinear(128, 32, 0, 3, 8)   # 3 does not divide 8

    def test_column_parallel_fused_parts(self):
        w, x = self.rand(32, 128), self.rand(5, 128)
        module = xl.TreeColumnParallelLinear.from_full([w, w[:16]], 1, 2)
        self.assertEqual(module.split_sizes, [16, 8])
        self.assertBits(module(x), torch.cat([_ref(x, w[16:32].t()), _ref(x, w[8:16].t())], 1))

    def test_backward(self):
        w, x = self.rand(32, 128), self.rand(7, 64)
        module = xl.TreeRowParallelLinear.from_full(w, 0, 2, 8)
        xg = x.clone().requires_grad_(True)
        module(xg, reduce=False).float().sum().backward()
        ones = torch.ones(7, 32)
        torch.testing.assert_close(xg.grad.float(), ones @ module.weight_t.detach().float().t(), atol=0.1, rtol=0.02)
        torch.testing.assert_close(module.weight_t.grad.float(), x.float().t() @ ones, atol=0.1, rtol=0.02)
        # The pair products' backward (each leaf gets its node's gradient) equals the leaf products' summed in
        # pairs, under a different weight per pair (so a pair's gradient given to the wrong leaves shows).
        pair_module, leaf_module = (xl.TreeRowParallelLinear.from_full(w, 0, 2, 8) for _ in range(2))
        xp, xo = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        weights = torch.randn(2, 7, 32, generator=self.g)
        (pair_module.pair_products(xp).float() * weights).sum().backward()
        (leaf_module.leaf_products(xo).float().view(2, 2, 7, 32).sum(1) * weights).sum().backward()
        torch.testing.assert_close(xp.grad, xo.grad, atol=0, rtol=0)
        torch.testing.assert_close(pair_module.weight_t.grad, leaf_module.weight_t.grad, atol=0, rtol=0)
        a, b = self.rand(6, 16).requires_grad_(True), self.rand(16, 8).requires_grad_(True)
        xl.invariant_matmul(a, b).float().sum().backward()
        self.assertEqual((tuple(a.grad.shape), tuple(b.grad.shape)), ((6, 16), (16, 8)))


if __name__ == "__main__":
    unittest.main()
