"""The "exactcoll" torch.distributed backend on CPU tensors, with whatever torch is installed (CI:
Debian's torch 1.13): 2, 3 and 4 ranks as processes (backend_worker.py) joined through a FileStore,
every exact collective's output compared bit for bit against exactcoll.sim on the stacked inputs
(the GPU's bits), plus what each rank checked alone: fallbacks counted with their reasons, strict
mode, a new_group subgroup, bad inputs. Every wait is bounded: a rank that never finishes is killed
and named with the last stage it printed."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

import contract_reference as ref

try:
    import torch
except ImportError:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "backend_worker.py")
SETTINGS_ENV = ("EXACTCOLL_ALGO", "EXACTCOLL_REDUCE_SCATTER_ALGO", "EXACTCOLL_ALL_GATHER_ALGO", "EXACTCOLL_STRICT",
                "EXACTCOLL_BUFFER_MIB", "EXACTCOLL_CONTRACT")
DEADLINE_S = 90          # per job: a job that runs past it is killed (they take a few seconds)
INT_VIEW = {} if torch is None else {torch.bfloat16: torch.int16, torch.float16: torch.int16,
                                     torch.float32: torch.int32}
FORMAT = {} if torch is None else {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def storage(t):
    """A CPU tensor's storage as contract_reference takes it: uint16 bit patterns, or float32."""
    t = t.contiguous()
    return t.numpy() if t.dtype == torch.float32 else t.view(torch.int16).numpy().view(np.uint16)


def differing(got, want):
    """Elements whose bits differ (each a tensor or a contract_reference array; shapes and storage
    must match; NaN compares by its bits, so a canonical NaN equals itself and any other payload
    differs)."""
    got = ref.bits_of(storage(got) if torch is not None and isinstance(got, torch.Tensor) else got)
    want = ref.bits_of(storage(want) if torch is not None and isinstance(want, torch.Tensor) else want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size, 1)
    return int((got != want).sum())


def run_job(world_size, env_extra=None, deadline_s=DEADLINE_S, expect_results=True):
    """Runs world_size workers; returns (per-rank saved results, per-rank output, exit codes).
    Raises AssertionError naming the ranks that did not finish (killed), or (expect_results) that
    saved nothing."""
    tmp = tempfile.mkdtemp(prefix=f"exactcoll-backend-{world_size}-")
    # The backend's settings come from the environment: only the ones this job names.
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
    env.update(env_extra or {})
    procs, logs = [], []
    for rank in range(world_size):
        log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
        procs.append(subprocess.Popen([sys.executable, WORKER, str(rank), str(world_size),
                                       os.path.join(tmp, "store"), tmp], stdout=log, stderr=subprocess.STDOUT,
                                      env=env))
        logs.append(log)
    end = time.monotonic() + deadline_s
    stuck = []
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            stuck.append(rank)
    for rank in stuck:
        procs[rank].kill()
        procs[rank].wait(timeout=10)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    if stuck:
        last = {r: (outputs[r].strip().splitlines() or ["(printed nothing)"])[-1] for r in stuck}
        raise AssertionError(f"{world_size} ranks: rank(s) {stuck} never finished within {deadline_s} s and were "
                             f"killed; last stage printed: {last}")
    results = []
    for rank, proc in enumerate(procs):
        path = os.path.join(tmp, f"rank{rank}.pt")
        if not expect_results:
            continue
        if not os.path.exists(path):
            raise AssertionError(f"{world_size} ranks: rank {rank} exited {proc.returncode} without saving its "
                                 f"results; its output:\n{outputs[rank]}")
        results.append(torch.load(path))
    return results, outputs, [p.returncode for p in procs]


@unittest.skipIf(torch is None, "torch is not installed")
class TorchBackendOnCpu(unittest.TestCase):
    def check_job(self, world_size, env_extra=None):
        contract = (env_extra or {}).get("EXACTCOLL_CONTRACT", "canonical")
        results, outputs, codes = run_job(world_size, env_extra)
        for rank, (result, output, code) in enumerate(zip(results, outputs, codes)):
            self.assertIsNone(result["error"], f"rank {rank} of {world_size} failed:\n{result['error']}")
            self.assertEqual(code, 0, f"rank {rank} of {world_size} exited {code}:\n{output}")
            failed = [(name, detail) for name, ok, detail in result["checks"] if not ok]
            self.assertEqual(failed, [], f"rank {rank} of {world_size}: checks failed")
            self.assertGreater(len(result["checks"]), 10)
        self.compare_bits(results, world_size, contract)
        return results

    def compare_bits(self, results, world_size, contract="canonical"):
        """Every exact case: each member's output against the independent numpy reference of the
        contract (contract_reference.py, which shares nothing with the library's fold) on the
        members' stacked inputs (in group-rank order), bit for bit. Under tree, some case must also
        differ from the canonical reference (or the job did not run the tree)."""
        fold = ref.tree if contract == "tree" else ref.all_reduce
        differs_from_canonical = 0
        names = [c["name"] for c in results[0]["cases"]]
        self.assertGreaterEqual(len(names), 25, names)
        order_sensitive = 0
        for index, name in enumerate(names):
            members = results[0]["cases"][index]["members"]
            cases = [results[g]["cases"][[c["name"] for c in results[g]["cases"]].index(name)] for g in members]
            op = cases[0]["op"]
            stacked = torch.stack([c["input"].reshape(-1) for c in cases])
            fmt = FORMAT[stacked.dtype]

            def expected(x, reduce=fold):  # every member's expected output, [members, ...]
                if op == "all_gather":
                    return np.broadcast_to(x.reshape(1, -1), (len(members), x.size))
                reduced = reduce(x, fmt)
                if op == "all_reduce":
                    return np.broadcast_to(reduced, (len(members), reduced.size))
                return reduced.reshape(len(members), -1)  # reduce_scatter: block g is member g's

            want = expected(storage(stacked))
            for group_rank, case in enumerate(cases):
                got = case["output"].reshape(-1)
                bad = differing(got, want[group_rank])
                self.assertEqual(bad, 0, f"{world_size} ranks, {name}: rank {members[group_rank]}'s output differs "
                                         f"from exactcoll.sim in {bad} of {got.numel()} elements")
            if contract == "tree":
                canonical = expected(storage(stacked), ref.all_reduce)
                differs_from_canonical += differing(np.ascontiguousarray(want), np.ascontiguousarray(canonical))
                continue  # the reverse-order check below is the canonical chain's (a tree of two is symmetric)
            if "nasty" in name and op != "all_gather" and len(members) >= 3:
                # The inputs are made so that the order of the adds matters: the fold in reverse rank
                # order gives other bits, so the comparison above would catch a backend that summed
                # in another order.
                # (reduce_scatter: block b of the flipped job's sum is still block b.)
                other = expected(storage(stacked.flip(0)))
                self.assertGreater(differing(want, other), 0,
                                   f"{name}: the reverse-order fold gives the same bits: the case is not "
                                   "order-sensitive")
                order_sensitive += 1
        if contract == "tree":
            self.assertGreater(differs_from_canonical, 0, "every tree output equals the canonical one")
        elif world_size >= 3:
            self.assertGreaterEqual(order_sensitive, 9)

    def check_counts(self, results, world_size):
        for rank, result in enumerate(results):
            counts = result["counts"]
            # Per dtype: 3 all_reduce, 1 reduce_scatter_tensor, 1 reduce_scatter, 1 all_gather_into_tensor,
            # 2 all_reduce_coalesced tensors; then the fallback scenario's fp32 coalesced tensor, the
            # strict scenario's bf16 all_reduce and the subgroup's ops (its members only).
            in_subgroup = rank in ([0, world_size - 1] if world_size > 2 else [0, 1])
            self.assertEqual(counts["all_reduce"]["exact"], 3 * 3 + 1 + int(in_subgroup), counts)
            self.assertEqual(counts["reduce_scatter_tensor"]["exact"], 3 + int(in_subgroup), counts)
            self.assertEqual(counts["reduce_scatter"], {"exact": 3, "fallback": 0}, counts)
            self.assertEqual(counts["all_gather_into_tensor"], {"exact": 3, "fallback": 0}, counts)
            self.assertEqual(counts["all_reduce_coalesced"], {"exact": 7, "fallback": 1}, counts)
            fallbacks = result["fallbacks"]
            self.assertNotIn(("all_reduce", "op SUM"), fallbacks)
            for (op, reason), n in fallbacks.items():
                if op in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"):
                    self.assertTrue(reason.startswith(("op ", "dtype ", "non-contiguous")),
                                    f"rank {rank}: {op} fell back for {reason!r}")

    def test_two_ranks_strict_from_the_environment(self):
        results = self.check_job(2, {"EXACTCOLL_STRICT": "1"})
        self.check_counts(results, 2)
        self.assertEqual(results[0]["settings"]["strict"], False)  # the worker switched it off

    def test_three_ranks_two_shot_from_the_environment(self):
        results = self.check_job(3, {"EXACTCOLL_ALGO": "two_shot", "EXACTCOLL_REDUCE_SCATTER_ALGO": "direct"})
        self.check_counts(results, 3)
        self.assertEqual(results[1]["settings"]["algo"], "two_shot")
        self.assertEqual(results[1]["settings"]["reduce_scatter_algo"], "direct")

    def test_four_ranks_tree_contract_from_the_environment(self):
        self.check_job(4, {"EXACTCOLL_CONTRACT": "tree"})

    def test_four_ranks(self):
        results = self.check_job(4)
        self.check_counts(results, 4)
        self.assertEqual(results[3]["settings"]["algo"], "auto")

    def test_every_all_reduce_algorithm_of_the_library_can_be_chosen(self):
        """EXACTCOLL_ALGO and configure_backend(algo=...) take every all-reduce algorithm of the
        library's registry (_lib.ALGOS, read from the library: all but the all-gather and
        reduce-scatter ones, direct and copy_engine), so a new one (lamport_two_shot) is offered."""
        from exactcoll import _lib, distributed
        self.assertEqual(sorted(distributed.ALL_REDUCE_ALGOS), sorted(set(_lib.ALGOS) - {"direct", "copy_engine"}))

    def test_a_bad_environment_value_fails_init_naming_it(self):
        _, outputs, codes = run_job(1, {"EXACTCOLL_ALGO": "fastest"}, deadline_s=60, expect_results=False)
        self.assertNotEqual(codes[0], 0)
        self.assertIn("EXACTCOLL_ALGO must be one of auto, one_shot", outputs[0])

    def test_backend_registered_and_group_less_communicator_checks(self):
        """import exactcoll.torch registers the backend; the group-less communicator the backend
        makes checks its options first (naming them), then needs CUDA."""
        import torch.distributed as dist
        import exactcoll
        import exactcoll.torch as xt
        self.assertIn("EXACTCOLL", dist.Backend._plugins)
        self.assertTrue(xt._register_backend())  # a second registration is a no-op, not an error
        store = dist.HashStore()
        with self.assertRaises(ValueError) as caught:
            xt.Communicator._over_store(store, 0, 1, name="x", whole_job=False, buffer_mib=0)
        self.assertIn("buffer_mib must be", str(caught.exception))
        if not torch.cuda.is_available():
            with self.assertRaises(exactcoll.UnavailableError):
                xt.Communicator._over_store(store, 0, 1, name="x", whole_job=False)

    def test_the_comparison_sees_one_flipped_bit(self):
        """differing() is what every bit comparison above relies on: one flipped low bit in one
        element, or a NaN with another payload, must count."""
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            a = torch.randn(100).to(dtype)
            b = a.clone()
            self.assertEqual(differing(a, b), 0)
            b.view(INT_VIEW[dtype])[37] ^= 1
            self.assertEqual(differing(a, b), 1, dtype)
            nan = torch.full((1,), float("nan"), dtype=dtype)
            other = nan.clone()
            other.view(INT_VIEW[dtype])[0] ^= 1
            self.assertEqual(differing(nan, other), 1, dtype)


if __name__ == "__main__":
    unittest.main()
