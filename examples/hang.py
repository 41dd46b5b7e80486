"""A DDP job that hangs, for `ddpdoctor guard -- torchrun --standalone --nproc-per-node 3 examples/hang.py`.

Runs on CPU (gloo). Bug: rank 1 logs a metric with an all_reduce the other ranks never call, so
the others wait in the barrier and rank 1 in the all_reduce, forever (30 minutes, gloo's default).
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    optimizer.step()
    if rank == 1:
        dist.all_reduce(loss.detach())  # bug: only rank 1 gets here
    dist.barrier()
dist.destroy_process_group()
