"""A small DDP trainer with two real bugs, for `ddpdoctor lint examples/buggy_train.py`.

Launch (if it were correct): torchrun --nproc-per-node 4 examples/buggy_train.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")

    model = build_model().cuda()
    model = DDP(model, device_ids=[local_rank])
    # Bug: converting after wrapping: DDP keeps training the old BatchNorm layers.
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        images = torch.randn(32, 3, 32, 32, device="cuda")
        target = torch.randint(0, 10, (32,), device="cuda")
        loss = nn.functional.cross_entropy(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # Bug: every rank writes the same file at the same time.
    torch.save(model.module.state_dict(), "checkpoint.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
