# Torch baselines for `exactcoll bench-overlap`, measured in the same device call (torchrun, one
# process per GPU): the FSDP-style product beside an NCCL all-gather, and AG->matmul (NCCL
# all-gather + matmul, torch's fused_all_gather_matmul on symmetric memory, the full matmul alone).
# Same method as the C++ bench: per variant the max over ranks of each rank's median of ITERS
# per-iteration CUDA-event times after a warm-up, the variants that run a product interleaved
# round by round (so each sees the same clock and power state); random normal operands.
#   usage: torchrun --nproc-per-node 4 tools/overlap/torch_baseline.py
import os
import sys

import torch
import torch.distributed as dist

ITERS = 30
WARMUP = 3


def main():
    local = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    rank = dist.get_rank()
    rows = []

    def bench(fn):
        for _ in range(WARMUP):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(ITERS)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(ITERS)]
        for i in range(ITERS):
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        times = sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
        t = torch.tensor([times[len(times) // 2]], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def bench_interleaved(fns):
        for _ in range(WARMUP):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
        dist.barrier()
        events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(ITERS)] for _ in fns]
        for i in range(ITERS):
            for v, fn in enumerate(fns):
                events[v][i][0].record()
                fn()
                events[v][i][1].record()
        torch.cuda.synchronize()
        out = []
        for v in range(len(fns)):
            times = sorted(s.elapsed_time(e) * 1000.0 for s, e in events[v])
            t = torch.tensor([times[len(times) // 2]], device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out.append(t.item())
        return out

    def add(section, dtype, variant, us, flops=0.0):
        rows.append((section, str(dtype).replace("torch.", ""), variant, us, flops / (us * 1e6) if flops else 0.0))
        if rank == 0:
            print(f"  torch {section} {rows[-1][1]} {variant}: {us:.1f} us", flush=True)

    def attempt(label, fn):
        try:
            fn()
        except Exception as e:  # one failed baseline must not hide the others
            if rank == 0:
                print(f"  torch {label}: FAILED {type(e).__name__}: {e}", flush=True)

    side = torch.cuda.Stream()
    for dtype in (torch.bfloat16, torch.float16):
        # FSDP: 8192^3 product, 64 MiB all-gather output.
        def fsdp():
            a = torch.randn(8192, 8192, device=dev, dtype=dtype)
            b = torch.randn(8192, 8192, device=dev, dtype=dtype)
            shard = torch.randn((64 << 20) // 2 // world, device=dev, dtype=dtype)
            out = torch.empty(shard.numel() * world, device=dev, dtype=dtype)
            flops = 2.0 * 8192**3
            add("fsdp", dtype, "NCCL all-gather alone", bench(lambda: dist.all_gather_into_tensor(out, shard)))

            def seq():
                dist.all_gather_into_tensor(out, shard)
                torch.matmul(a, b)

            def overlapped():
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    dist.all_gather_into_tensor(out, shard)
                torch.matmul(a, b)
                torch.cuda.current_stream().wait_stream(side)

            mm, sq, ov = bench_interleaved([lambda: torch.matmul(a, b), seq, overlapped])
            add("fsdp", dtype, "matmul alone", mm, flops)
            add("fsdp", dtype, "sequential, NCCL all-gather", sq, flops)
            add("fsdp", dtype, "overlapped, NCCL all-gather", ov, flops)

        attempt(f"fsdp {dtype}", fsdp)

        for m, k, n in ((8192, 8192, 8192), (2048, 16384, 8192)):
            shape = f"{m}x{k}x{n}"

            def ag(m=m, k=k, n=n, shape=shape):
                a = torch.randn(m // world, k, device=dev, dtype=dtype)
                b = torch.randn(k, n, device=dev, dtype=dtype)
                full = torch.empty(m, k, device=dev, dtype=dtype)
                dist.all_gather_into_tensor(full, a)
                flops = 2.0 * m * k * n

                def agmm():
                    dist.all_gather_into_tensor(full, a)
                    torch.matmul(full, b)

                fns = [lambda: torch.matmul(full, b), agmm]
                names = ["full matmul alone", "NCCL all-gather + matmul"]
                try:
                    import torch.distributed._symmetric_memory as symm_mem

                    group = dist.group.WORLD.group_name
                    symm_mem.enable_symm_mem_for_group(group)
                    fused = lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [b], gather_dim=0, group_name=group)
                    fused()
                    fns.append(fused)
                    names.append("torch fused_all_gather_matmul")
                except Exception as e:
                    if rank == 0:
                        print(f"  torch fused_all_gather_matmul {shape}: FAILED {type(e).__name__}: {e}", flush=True)
                for name, us in zip(names, bench_interleaved(fns)):
                    add("ag", dtype, f"{shape} {name}", us, flops)

            attempt(f"ag {dtype} {shape}", ag)

    if rank == 0:
        print(f"\n# torch {torch.__version__} baselines ({world} ranks, {torch.cuda.get_device_name(dev)}; max over ranks of the median of {ITERS})")
        print("| section | dtype | variant | time (us) | TFLOP/s |\n|---|---|---|---|---|")
        for section, dtype, variant, us, tflops in rows:
            print(f"| {section} | {dtype} | {variant} | {us:.1f} | {tflops:.1f} |" if tflops else f"| {section} | {dtype} | {variant} | {us:.1f} | - |")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
