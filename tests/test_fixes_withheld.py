"""Findings whose fix is withheld: the edit would need a fact the script does not give for certain
(an import in scope everywhere, a local rank on that path, the optimizer a clip belongs to...).
The finding must stay, with no fix at all, so `--fix` changes nothing and says it remains."""

from __future__ import annotations

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

CASES = {
    "DDP008 the save shares its line with another statement": (
        "DDP008",
        """
import torch
import torch.distributed as dist

def main():
    dist.init_process_group("nccl")
    if dist.get_rank() == 0:
        print("go")
    torch.save({"w": 1}, "ckpt.pt"); print("saved")

main()
""",
    ),
    "HVD001 horovod imported inside the function": (
        "HVD001",
        """
import torch

def main():
    import horovod.torch as hvd
    hvd.init()
    model = torch.nn.Linear(2, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
""",
    ),
    "HVD003 hvd.init() on the line of an if": (
        "HVD003",
        """
import horovod.torch as hvd
import torch

if True: hvd.init()
model = torch.nn.Linear(2, 2).cuda()
""",
    ),
    "HVD003 torch not imported as a module: nothing here spells torch.cuda.set_device": (
        "HVD003",
        """
import horovod.torch as hvd
from torch.nn import Linear

hvd.init()
model = Linear(2, 2).cuda()
""",
    ),
    "AMP002 the scaler steps two optimizers after the clip": (
        "AMP002",
        """
import torch

def train(gen, disc, g_opt, d_opt, loader):
    scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        with torch.autocast("cuda"):
            loss = gen(x).mean() + disc(x).mean()
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(list(gen.parameters()) + list(disc.parameters()), 1.0)
        scaler.step(g_opt)
        scaler.step(d_opt)
        scaler.update()
""",
    ),
    "AMP002 no scaler.step after the clip (the optimizer is unknown)": (
        "AMP002",
        """
import torch

def train(model, loader, step_fn):
    scaler = torch.amp.GradScaler("cuda")
    for x in loader:
        with torch.autocast("cuda"):
            loss = model(x).mean()
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        step_fn(scaler)
""",
    ),
    "DDP011 the local rank is computed only after the group exists": (
        "DDP011",
        """
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
device_id = dist.get_rank() % torch.cuda.device_count()
model = torch.nn.Linear(4, 4).cuda(device_id)
dist.barrier()
""",
    ),
    "DDP011 argparse --local_rank only (torchrun passes no such argument)": (
        "DDP011",
        """
import argparse
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
dist.init_process_group("nccl")
model = torch.nn.Linear(4, 4).cuda(args.local_rank)
dist.barrier()
""",
    ),
    "DDP003 no local rank anywhere (only the global rank)": (
        "DDP003",
        """
import torch
import torch.distributed as dist

def main():
    dist.init_process_group(backend="nccl", init_method="env://")
    rank = dist.get_rank()
    torch.cuda.set_device(0)
""",
    ),
    "DDP003 the local rank is read only after the literal": (
        "DDP003",
        """
import os
import torch
import torch.distributed as dist

def main():
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(0)
    local_rank = int(os.environ["LOCAL_RANK"])
""",
    ),
    "DDP002 wrapped in one method, converted in another": (
        "DDP002",
        """
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

class Trainer:
    def wrap(self):
        self.model = DDP(self.model, device_ids=[0])

    def enable_sync_bn(self):
        self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
""",
    ),
    "DDP002 converted into another name": (
        "DDP002",
        """
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

def main(net):
    model = DDP(net, device_ids=[0])
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model, synced
""",
    ),
    # `DEVICE = f"cuda:{local_rank}"` at the top of the module would raise NameError on import:
    # the local rank only exists inside main().
    "DDP003 a module constant names the GPU, the local rank is a local of main()": (
        "DDP003",
        """
import os
import torch
import torch.distributed as dist

DEVICE = "cuda:0"

def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = torch.nn.Linear(4, 4).to(DEVICE)
    return model

main()
""",
    ),
}

SUGGESTED = {
    "AMP002 clip inside the accumulation loop, step outside it (would unscale twice per step)": (
        "AMP002",
        """
import torch

def train(model, optimizer, batches):
    scaler = torch.amp.GradScaler("cuda")
    for chunk in batches:
        for x in chunk:
            with torch.autocast("cuda"):
                loss = model(x).mean()
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
""",
    ),
    "DDP008 every rank copies the file after the save": (
        "DDP008",
        """
import shutil
import torch
import torch.distributed as dist

def main():
    dist.init_process_group("nccl")
    if dist.get_rank() == 0:
        print("go")
    torch.save({"w": 1}, "ckpt.pt")
    shutil.copyfile("ckpt.pt", "best.pt")

main()
""",
    ),
    "DDP008 every rank copies the file saved by keyword": (
        "DDP008",
        """
import shutil
import torch
import torch.distributed as dist

def main(path):
    dist.init_process_group("nccl")
    if dist.get_rank() == 0:
        print("go")
    torch.save({"w": 1}, f=path)
    shutil.copyfile(path, "best.pt")

main("ckpt.pt")
""",
    ),
    "DDP008 FSDP (state_dict is collective)": (
        "DDP008",
        """
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

def main():
    dist.init_process_group("nccl")
    model = FSDP(torch.nn.Linear(2, 2).cuda())
    if dist.get_rank() == 0:
        print("go")
    torch.save(model.state_dict(), "ckpt.pt")

main()
""",
    ),
}


@pytest.mark.parametrize("name", sorted(SUGGESTED))
def test_fix_suggested_not_applied(name: str) -> None:
    code, source = SUGGESTED[name]
    result = lint_source(source.lstrip(), "train.py", Settings(select=(code,)))
    assert [f.code for f in result.findings] == [code]
    fix = result.findings[0].fix
    assert fix is not None and not fix.applicable and fix.edits
    fixed = lint_source(source.lstrip(), "train.py", Settings(select=(code,)), fix=True)
    assert fixed.fixed == 0 and fixed.fixed_source is None


@pytest.mark.parametrize("name", sorted(CASES))
def test_finding_without_fix(name: str) -> None:
    code, source = CASES[name]
    result = lint_source(source.lstrip(), "train.py", Settings(select=(code,)))
    assert [f.code for f in result.findings] == [code]
    assert result.findings[0].fix is None
    fixed = lint_source(source.lstrip(), "train.py", Settings(select=(code,)), fix=True)
    assert fixed.fixed == 0 and fixed.fixed_source is None
