"""The training loop `guard_overhead.py` times: a small MLP under DDP, gloo on CPU, a DataLoader
with a DistributedSampler, and one logging all-reduce per epoch, as real loops have. Rank 0 prints
the loop's own wall and CPU time (start-up excluded, barriers on both ends). With GUARD_PROFILE_OUT set,
rank 0 also profiles its loop (guard_step_profile.py)."""

import cProfile
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
generator = torch.Generator().manual_seed(1)
data = TensorDataset(torch.randn(4096, 64, generator=generator), torch.randint(0, 10, (4096,), generator=generator))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=32, sampler=sampler)
dist.barrier()
profile_out = os.environ.get("GUARD_PROFILE_OUT") if dist.get_rank() == 0 else None
# Timed by this thread's CPU time: the machine's load and the guard's reporter thread do not count.
profile = cProfile.Profile(time.thread_time) if profile_out else None
started, cpu_started = time.perf_counter(), time.process_time()
if profile:
    profile.enable()
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    dist.all_reduce(loss.detach())
if profile and profile_out:
    profile.disable()
    profile.dump_stats(profile_out)
dist.barrier()
if dist.get_rank() == 0:
    # Wall time, and this process's CPU time (all its threads, the guard's reporter included), which
    # a shared machine's load disturbs less.
    print(f"LOOP_S={time.perf_counter() - started:.6f} CPU_S={time.process_time() - cpu_started:.6f}", flush=True)
dist.destroy_process_group()
