"""DDP step parity: one DDP step over N equal shards must equal one single-process step over the
whole batch (DDP averages gradients, and a mean loss over equal shards averages the same way).

float64 keeps the tolerance tight enough that a wrong gradient average (e.g. summing instead of
averaging, or a rank training on the wrong shard) cannot hide in rounding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context, default_judge

NAME = "ddp-parity"
ADVICE = (
    "A DDP step does not match the single-process step: check that each rank gets a distinct equal "
    "shard (DistributedSampler), that the loss is a mean, that no parameter is updated outside DDP, and "
    "that gradients are not scaled twice (e.g. manual division by world size on top of DDP's average)."
)
TOL = 1e-10
PER_RANK = 3


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(4321)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 3)).to(device=device, dtype=torch.float64)


def _sgd_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.0)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def run(ctx: Context) -> dict[str, Any]:
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
    _sgd_step(reference, x, y)
    diff = max(float((a - b).abs().max().item()) for a, b in zip(local.parameters(), reference.parameters()))
    moved = max(float((a - b).abs().max().item()) for a, b in zip(reference.parameters(), _model(device).parameters()))
    if diff > TOL:
        return R.entry(ctx.rank, R.FAIL, f"parameters differ from the single-process step by {diff:.3g} (> {TOL:g})", max_abs_diff=diff, tolerance=TOL)
    return R.entry(ctx.rank, R.PASS, f"matches the single-process step (max diff {diff:.1g})", max_abs_diff=diff, tolerance=TOL, step_size=moved)


judge = default_judge(
    NAME, ADVICE,
    lambda entries: f"one DDP step over {len(entries)} shards equals one single-process step over the whole batch "
    f"(float64, max diff {max(e['detail']['max_abs_diff'] for e in entries):.1g} <= {TOL:g})",
)
