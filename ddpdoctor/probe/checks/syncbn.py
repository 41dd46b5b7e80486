"""SyncBatchNorm parity against BatchNorm over the concatenated global batch.

On CUDA this runs the real `nn.SyncBatchNorm`: forward output, running statistics and input
gradient. `nn.SyncBatchNorm` refuses CPU tensors, so on CPU the check verifies the cross-rank
exchange SyncBatchNorm relies on instead -- all-gathered per-rank (mean, var, count) combined into
global statistics for the forward, all-reduced gradient sums for the backward -- against the same
reference, and says so in its result.
"""

from __future__ import annotations

from typing import Any


import torch
import torch.distributed as dist
from torch import nn

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context
from ddpdoctor.probe.registry import plain_judge

C, PER_RANK = 5, 4
TOL = 1e-9


def _data(world: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    # Different per-channel offsets and scales so the global and local statistics really differ.
    x = torch.randn(world * PER_RANK, C, generator=gen, dtype=torch.float64) * torch.arange(1, C + 1) + torch.arange(C)
    g = torch.randn(world * PER_RANK, C, generator=gen, dtype=torch.float64)
    return x.to(device), g.to(device)


def _bn(cls: type, device: torch.device) -> Any:  # BatchNorm1d or SyncBatchNorm
    bn = cls(C, momentum=0.1).to(device=device, dtype=torch.float64)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, C))
        bn.bias.copy_(torch.linspace(-0.2, 0.2, C))
    return bn


def _reference(x: torch.Tensor, g: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, Any, torch.Tensor]:
    bn = _bn(nn.BatchNorm1d, device).train()
    xr = x.clone().requires_grad_(True)
    out = bn(xr)
    out.backward(g)
    assert xr.grad is not None
    return out.detach(), bn, xr.grad.detach()


def _manual_sync(x: torch.Tensor, g: torch.Tensor, ctx: Context) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What SyncBatchNorm does, with plain collectives: returns (out, running_mean, running_var, grad)."""
    bn = _bn(nn.BatchNorm1d, ctx.device)
    n = torch.tensor([float(x.shape[0])], dtype=torch.float64, device=x.device)
    stats = torch.cat([x.mean(0), x.var(0, unbiased=False), n])
    gathered = [torch.empty_like(stats) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, stats)
    means = torch.stack([s[:C] for s in gathered])
    vars_ = torch.stack([s[C:2 * C] for s in gathered])
    counts = torch.stack([s[2 * C:] for s in gathered])  # (world, 1)
    total = counts.sum()
    mean = (means * counts).sum(0) / total
    # Combine per-rank variances with the parallel-variance formula (within + between).
    var = ((vars_ + (means - mean) ** 2) * counts).sum(0) / total
    invstd = torch.rsqrt(var + bn.eps)
    xhat = (x - mean) * invstd
    out = xhat * bn.weight.detach() + bn.bias.detach()
    running_mean = (1 - bn.momentum) * bn.running_mean + bn.momentum * mean
    running_var = (1 - bn.momentum) * bn.running_var + bn.momentum * var * total / (total - 1)
    # Backward: SyncBatchNorm all-reduces sum(dy) and sum(dy * xhat) over the global batch.
    sums = torch.stack([g.sum(0), (g * xhat).sum(0)])
    dist.all_reduce(sums)
    grad = bn.weight.detach() * invstd * (g - sums[0] / total - xhat * sums[1] / total)
    return out, running_mean, running_var, grad


def _real_sync(x: torch.Tensor, g: torch.Tensor, ctx: Context) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    bn = _bn(nn.SyncBatchNorm, ctx.device).train()
    xr = x.clone().requires_grad_(True)
    out = bn(xr)
    out.backward(g)
    assert xr.grad is not None
    return out.detach(), bn.running_mean.detach(), bn.running_var.detach(), xr.grad.detach()


def run(ctx: Context) -> R.RankEntry:
    x_all, g_all = _data(ctx.world_size, ctx.device)
    shard = slice(PER_RANK * ctx.rank, PER_RANK * (ctx.rank + 1))
    ref_out, ref_bn, ref_grad = _reference(x_all, g_all, ctx.device)
    if ctx.on_cuda:
        what = "nn.SyncBatchNorm (forward, running stats, input gradient)"
        out, rmean, rvar, grad = _real_sync(x_all[shard], g_all[shard], ctx)
    else:
        what = ("the cross-rank statistic exchange nn.SyncBatchNorm relies on (all-gathered mean/var/count "
                "and all-reduced gradient sums; nn.SyncBatchNorm itself needs CUDA)")
        out, rmean, rvar, grad = _manual_sync(x_all[shard], g_all[shard], ctx)
    errors = {
        "output": float((out - ref_out[shard]).abs().max().item()),
        "running_mean": float((rmean - ref_bn.running_mean).abs().max().item()),
        "running_var": float((rvar - ref_bn.running_var).abs().max().item()),
        "input_grad": float((grad - ref_grad[shard]).abs().max().item()),
    }
    bad = {k: v for k, v in errors.items() if v > TOL}
    if bad:
        return R.entry(ctx.rank, R.FAIL, "differs from BatchNorm over the global batch: " + ", ".join(f"{k} {v:.3g}" for k, v in bad.items()), checked=what, errors=errors, tolerance=TOL)
    return R.entry(ctx.rank, R.PASS, f"checked {what}", checked=what, errors=errors, tolerance=TOL)


judge = plain_judge(
    "syncbn",
    lambda entries: f"equals BatchNorm over the global batch (max err {max(max(e['detail']['errors'].values()) for e in entries):.1g}); "
    f"checked {entries[0]['detail']['checked']}",
)
