"""A small DDP trainer with two real bugs, for `ddpdoctor lint examples/buggy_train.py`.

Launch (if it were correct): torchrun --nproc-per-node 4 examples/buggy_train.py
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 30 * 30, 10))


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")

    model = nn.SyncBatchNorm.convert_sync_batchnorm(build_model().cuda())
    model = DDP(model, device_ids=[local_rank])
    dataset = TensorDataset(torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,)))
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # Bug: the sampler's epoch is never set, so every epoch replays the same shuffle.
    for epoch in range(10):
        for images, target in loader:
            loss = nn.functional.cross_entropy(model(images.cuda()), target.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    # Bug: every rank writes the same file at the same time.
    torch.save(model.module.state_dict(), "checkpoint.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
