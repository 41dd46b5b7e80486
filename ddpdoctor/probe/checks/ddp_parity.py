"""DDP step parity: one DDP step over N equal shards must equal one single-process step over the
whole batch (DDP averages gradients, and a mean loss over equal shards averages the same way).

Each rank reports how far its parameters are from the reference and the size the roundings are
relative to; the judge holds that distance to the bound `tolerance.step_tolerance` derives for this
dtype, batch and number of shards. float64 keeps that bound far below any real error (a sum
instead of an average, a rank on the wrong shard).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context, abs_grad_sum, param_abs_max
from ddpdoctor.probe.judges import judge_step, step_detail

NAME = "ddp-parity"
PER_RANK = 3
LR = 0.5
DTYPE = "float64"


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(4321)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 3)).to(device=device, dtype=torch.float64)


def _sgd_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.0)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def run(ctx: Context) -> R.RankEntry:
    device = ctx.device
    gen = torch.Generator().manual_seed(99)
    n = PER_RANK * ctx.world_size
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64).to(device)
    y = torch.randn(n, 3, generator=gen, dtype=torch.float64).to(device)
    local = _model(device)
    ddp = DDP(local, device_ids=[device.index] if ctx.on_cuda else None)
    shard = slice(PER_RANK * ctx.rank, PER_RANK * (ctx.rank + 1))
    _sgd_step(ddp, x[shard], y[shard])
    reference = _model(device)
    grad_sum = abs_grad_sum(reference, lambda i: nn.functional.mse_loss(reference(x[i:i + 1]), y[i:i + 1]) / n, n)
    _sgd_step(reference, x, y)
    diff = max(float((a - b).abs().max().item()) for a, b in zip(local.parameters(), reference.parameters()))
    return R.entry(ctx.rank, R.PASS, f"max diff {diff:.3g} from the single-process step", **step_detail(
        diff, DTYPE, samples=n, shards=ctx.world_size, lr=LR, grad_abs_sum=grad_sum, param_abs_max=param_abs_max(reference)))


def judge(entries: list[R.RankEntry]) -> R.CheckRecord:
    return judge_step(NAME, f"one DDP step over {len(entries)} shards equals one single-process step over the whole batch", entries)
