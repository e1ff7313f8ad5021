# torchrun --nproc-per-node 2 python/examples/quickstart.py      (the ranks may share one GPU)
import os, torch, torch.distributed as dist
import exactcoll.sim, exactcoll.torch

dist.init_process_group("gloo")                    # any backend: exactcoll uses only its store
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
comm = exactcoll.torch.Communicator()              # collective; bootstraps through torch's store
torch.manual_seed(dist.get_rank())                 # each rank's own partial sums
x = torch.randn(16, 4096, dtype=torch.bfloat16, device="cuda")
residual, weight = torch.ones_like(x), torch.ones(4096, dtype=torch.bfloat16, device="cuda")
out, residual_out = comm.fused_add_rms_norm(x, residual, weight, 1e-6)
y = comm.all_reduce(x)
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, x.cpu())          # every rank's x, to recompute on the CPU
want = exactcoll.sim.all_reduce(torch.stack(everyone))[dist.get_rank()]
same = torch.equal(y.cpu().view(torch.int16), want.view(torch.int16))
print(f"rank {dist.get_rank()}: all_reduce equals exactcoll.sim bit for bit: {same}")
comm.close()
