"""One rank of test_torch_backend.py: joins a job through a FileStore with the "exactcoll"
torch.distributed backend, runs the collectives on CPU tensors, and saves every rank-local input
and output (torch.save) for the test to compare against exactcoll.sim. It checks here only what a
rank sees alone (counts, strict mode refusals, errors); the bits are compared by the test.

    python3 backend_worker.py RANK WORLD_SIZE STORE_FILE OUT_DIR

Prints "rank R: <stage>" before each stage, so a test that times out can say where a rank was.
"""

import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist

import exactcoll.torch as xt

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def stage(rank, text):
    print(f"rank {rank}: {text}", flush=True)


def random_values(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 4).to(dtype)


def nasty_values(rank, world_size, count, dtype, seed):
    """Inputs whose sum depends on the order of the adds: per element, one rank holds a large value
    B, another -B, and the others small values s with B/s near 2^24, so that B + s in fp32 (the
    contract's accumulator) is a tie or loses s, while s added after the cancellation survives.
    Which rank holds B or -B varies per element, so the rank-order fold and any other order give
    different bits somewhere (with 3 or more ranks; two values sum the same either way). Plus inf,
    -inf and NaN on a few elements. The generator is seeded without the rank, so every rank agrees
    on the layout."""
    g = torch.Generator().manual_seed(seed)
    big_exp, scale = {torch.bfloat16: (24, 1.0), torch.float16: (14, 2.0 ** -9), torch.float32: (24, 1.0)}[dtype]
    big = 2.0 ** (big_exp + torch.randint(0, 2, (count,), generator=g).double())
    big = big * torch.where(torch.rand(count, generator=g) < 0.5, -1.0, 1.0)
    holder = torch.randint(0, world_size, (count,), generator=g)
    canceller = (holder + 1 + torch.randint(0, max(world_size - 1, 1), (count,), generator=g)) % world_size
    small_choices = torch.tensor([1.0, -1.0, 0.5, 1.5, 2.0, 3.0, -0.75, 0.25], dtype=torch.float64) * scale
    small = small_choices[torch.randint(0, len(small_choices), (world_size, count), generator=g)]
    value = small[rank].clone()
    value = torch.where(holder == rank, big, value)
    value = torch.where((canceller == rank) & (canceller != holder), -big, value)
    specials = torch.randint(0, count, (3,), generator=g)
    if rank == 0:
        value[specials[0]] = float("inf")
    if rank == world_size - 1:
        value[specials[1]] = float("-inf")
        value[specials[2]] = float("nan")
    return value.to(dtype)


class Worker:
    def __init__(self, rank, world_size, out_dir):
        self.rank, self.n, self.out_dir = rank, world_size, out_dir
        self.cases = []     # exact collectives: inputs and outputs for the test to compare
        self.checks = []    # (name, ok, detail): what this rank checked alone

    def check(self, name, ok, detail=""):
        self.checks.append((name, bool(ok), str(detail)))

    def expect_raises(self, name, exc_type, text, fn):
        try:
            fn()
        except exc_type as e:
            self.check(name, text in str(e), f"raised {type(e).__name__}: {e}")
            return
        except Exception as e:  # the wrong exception is a failure, named
            self.check(name, False, f"raised {type(e).__name__} instead of {exc_type.__name__}: {e}")
            return
        self.check(name, False, f"did not raise {exc_type.__name__}")

    def case(self, name, op, inputs, output, members=None):
        self.cases.append({"name": name, "op": op, "input": inputs.clone(), "output": output.clone(),
                           "members": members if members is not None else list(range(self.n))})

    # ---- the scenarios -------------------------------------------------------------------------

    def exact_ops(self):
        r, n = self.rank, self.n
        for i, dtype in enumerate(DTYPES):
            name = str(dtype).rsplit(".", 1)[-1]
            stage(r, f"exact ops {name}")
            x = random_values((8, 33), dtype, 1000 * i + r)
            y = x.clone()
            dist.all_reduce(y)
            self.case(f"all_reduce random {name}", "all_reduce", x, y)

            x = nasty_values(r, n, 4096, dtype, 77 + i)
            y = x.clone()
            work = dist.all_reduce(y, async_op=True)
            self.check(f"async all_reduce {name}: wait() returns True", work.wait() is True)
            self.check(f"async all_reduce {name}: get_future() holds the output",
                       torch.equal(work.get_future().wait()[0].view(torch.uint8), y.view(torch.uint8)))
            self.case(f"all_reduce nasty {name}", "all_reduce", x, y)

            x = random_values((), dtype, 2000 * i + r)  # a 0-d tensor (a loss, a norm)
            y = x.clone()
            dist.all_reduce(y)
            self.case(f"all_reduce scalar {name}", "all_reduce", x, y)

            x = nasty_values(r, n, n * 6 * 5, dtype, 91 + i).reshape(n * 6, 5)
            y = torch.empty(6, 5, dtype=dtype)
            dist.reduce_scatter_tensor(y, x)
            self.case(f"reduce_scatter_tensor nasty {name}", "reduce_scatter", x, y)

            x = random_values((n * 2, 7), dtype, 3000 * i + r)
            y = torch.empty(2, 7, dtype=dtype)
            dist.reduce_scatter(y, list(x.chunk(n)))
            self.case(f"reduce_scatter (list form) {name}", "reduce_scatter", x, y)

            x = random_values((4, 3), dtype, 4000 * i + r)
            y = torch.empty(n * 4, 3, dtype=dtype)
            dist.all_gather_into_tensor(y, x)
            self.case(f"all_gather_into_tensor {name}", "all_gather", x, y)

            a, b = random_values((5,), dtype, 5000 * i + r), nasty_values(r, n, 64, dtype, 55 + i)
            ya, yb = a.clone(), b.clone()
            dist.all_reduce_coalesced([ya, yb])
            self.case(f"all_reduce_coalesced [0] {name}", "all_reduce", a, ya)
            self.case(f"all_reduce_coalesced [1] nasty {name}", "all_reduce", b, yb)

    def fallbacks(self):
        r, n = self.rank, self.n
        stage(r, "fallbacks")
        before = xt.backend_fallbacks()

        x = torch.tensor([float(r), -float(r), 0.5 * r])
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        self.check("MAX all_reduce went to gloo, right values",
                   torch.equal(x, torch.tensor([float(n - 1), 0.0, 0.5 * (n - 1)])), x)

        t = torch.arange(4, dtype=torch.int64) + 10 * r
        dist.all_reduce(t)
        want = torch.arange(4, dtype=torch.int64) * n + 10 * (n * (n - 1) // 2)
        self.check("int64 SUM all_reduce went to gloo, right values", torch.equal(t, want), t)

        b = torch.full((3,), float(r))
        dist.broadcast(b, src=0)
        self.check("broadcast went to gloo, right values", torch.equal(b, torch.zeros(3)), b)

        # Bad inputs: a non-contiguous tensor and an unsupported dtype fall back (counted), with
        # gloo's sum; a size mismatch is a ValueError raised before any rank sends anything.
        base = torch.full((3, 4), float(r + 1))
        nc = base.t()
        dist.all_reduce(nc)
        self.check("non-contiguous fp32 SUM went to gloo, right values",
                   torch.equal(nc, torch.full((4, 3), float(n * (n + 1) // 2))), nc)
        d = torch.full((2,), 0.25 * (r + 1), dtype=torch.float64)
        dist.all_reduce(d)
        self.check("float64 SUM went to gloo, right values",
                   torch.equal(d, torch.full((2,), 0.25 * (n * (n + 1) // 2), dtype=torch.float64)), d)
        self.expect_raises("reduce_scatter_tensor with a wrong output size is a ValueError", ValueError,
                           f"hold {n} x the other's elements",
                           lambda: dist.reduce_scatter_tensor(torch.empty(5), torch.ones(4 * n)))

        mixed_f, mixed_i = random_values((6,), torch.float32, 6000 + r), torch.full((2,), r, dtype=torch.int64)
        yf, yi = mixed_f.clone(), mixed_i.clone()
        # dist.all_reduce_coalesced refuses mixed dtypes, but torch >= 2's coalescing manager can
        # hand the group such a list (one all_reduce per tensor, queued): called on the group here.
        dist.group.WORLD.allreduce_coalesced([yf, yi], dist.AllreduceCoalescedOptions()).wait()
        self.case("all_reduce_coalesced [fp32, int64]: the fp32 one", "all_reduce", mixed_f, yf)
        self.check("all_reduce_coalesced [fp32, int64]: the int64 one summed by gloo",
                   torch.equal(yi, torch.full((2,), n * (n - 1) // 2, dtype=torch.int64)), yi)

        dist.barrier()
        after = xt.backend_fallbacks()
        grown = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
        want = {("all_reduce", "op MAX"): 1, ("all_reduce", "dtype torch.int64"): 1,
                ("broadcast", "not an op exactcoll runs"): 1, ("all_reduce", "non-contiguous"): 1,
                ("all_reduce", "dtype torch.float64"): 1, ("all_reduce_coalesced", "dtype torch.int64"): 1,
                ("barrier", "runs on gloo"): 1}
        self.check("fallbacks counted, each with its reason", grown == want, f"counted {grown}, want {want}")

    def strict_mode(self, strict_from_env):
        r = self.rank
        stage(r, "strict mode")
        if strict_from_env:
            settings = xt.configure_backend()
            self.check("EXACTCOLL_STRICT=1 read from the environment", settings["strict"] is True, settings)
        previous = xt.configure_backend(strict=True)
        try:
            exact_before = xt.backend_counts().get("all_reduce", {}).get("exact", 0)
            self.expect_raises("strict: a MAX all_reduce on fp32 raises FallbackError", xt.FallbackError,
                               "all_reduce would leave exactcoll (op MAX)",
                               lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.MAX))
            self.expect_raises("strict: a float64 SUM all_reduce raises FallbackError", xt.FallbackError,
                               "dtype torch.float64", lambda: dist.all_reduce(torch.ones(3, dtype=torch.float64)))
            t = torch.ones(2, dtype=torch.int64)
            dist.all_reduce(t)  # integer sums do not depend on the order: allowed in strict mode 1
            self.check("strict 1: an int64 SUM all_reduce still runs", torch.equal(t, torch.full((2,), self.n)), t)
            b = torch.full((2,), float(r))
            dist.broadcast(b, src=0)  # data movement keeps the bits: allowed in strict mode 1
            self.check("strict 1: broadcast still runs", torch.equal(b, torch.zeros(2)), b)
            y = torch.ones(4, dtype=torch.bfloat16)
            dist.all_reduce(y)
            self.check("strict: an exact all_reduce runs",
                       xt.backend_counts()["all_reduce"]["exact"] == exact_before + 1)
            xt.configure_backend(strict="all")
            self.expect_raises("strict all: a broadcast raises FallbackError", xt.FallbackError,
                               "broadcast would leave exactcoll", lambda: dist.broadcast(torch.ones(2), src=0))
        finally:
            xt.configure_backend(**previous)
        self.expect_raises("configure_backend checks algorithm names", ValueError, "algo must be one of",
                           lambda: xt.configure_backend(algo="fastest"))

    def subgroup(self):
        r, n = self.rank, self.n
        stage(r, "subgroup")
        members = [0, n - 1] if n > 2 else [0, 1]
        group = dist.new_group(members)  # every rank calls new_group, members or not
        if r not in members:
            return
        self.check("new_group is an exactcoll group", type(group).__name__ == "ExactcollProcessGroup", type(group))
        self.check("new_group's group_name is torch's name for it", isinstance(group.group_name, str)
                   and group.group_name != dist.group.WORLD.group_name, group.group_name)
        x = nasty_values(members.index(r), len(members), 999, torch.bfloat16, 7)
        y = x.clone()
        dist.all_reduce(y, group=group)
        self.case("subgroup all_reduce nasty bfloat16", "all_reduce", x, y, members)
        x = random_values((len(members) * 3,), torch.float16, 8000 + r)
        y = torch.empty(3, dtype=torch.float16)
        dist.reduce_scatter_tensor(y, x, group=group)
        self.case("subgroup reduce_scatter_tensor float16", "reduce_scatter", x, y, members)
        counts = xt.backend_counts(group)
        self.check("the subgroup counts its own ops", counts == {"all_reduce": {"exact": 1, "fallback": 0},
                                                                 "reduce_scatter_tensor": {"exact": 1, "fallback": 0}},
                   counts)

    def run(self, strict_from_env):
        if strict_from_env:
            # Strict from the start: the fallback scenario would raise, so strict mode goes first
            # and is then switched off.
            self.strict_mode(True)
            xt.configure_backend(strict=False)
        self.exact_ops()
        self.fallbacks()
        if not strict_from_env:
            self.strict_mode(False)
        self.subgroup()
        # The CPU path has no communicator whose captured inputs need registering: nothing to do,
        # on every rank alike; a group of another backend is named as such.
        self.check("register_graph_buffers on the CPU path registers nothing", xt.register_graph_buffers() == 0)
        self.expect_raises("register_graph_buffers of a gloo group", ValueError, "is not a group of the exactcoll backend",
                           lambda: xt.register_graph_buffers(group=dist.new_group(backend="gloo")))
        stage(self.rank, "done")


def main():
    rank, world_size, store_file, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    stage(rank, "init_process_group")
    dist.init_process_group("exactcoll", store=dist.FileStore(store_file, world_size), rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=30))
    worker = Worker(rank, world_size, out_dir)
    try:
        worker.check("the default group is an exactcoll group", dist.get_backend() == "exactcoll", dist.get_backend())
        worker.run(strict_from_env=os.environ.get("EXACTCOLL_STRICT") == "1")
        error = None
    except Exception:  # saved for the test to print with this rank's name
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
    torch.save({"cases": worker.cases, "checks": worker.checks, "counts": xt.backend_counts(),
                "fallbacks": xt.backend_fallbacks(), "settings": xt.configure_backend(), "error": error},
               os.path.join(out_dir, f"rank{rank}.pt"))
    stage(rank, "saved")
    dist.barrier()  # nobody tears the store down while another rank still uses it
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
