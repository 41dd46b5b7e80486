"""Parameter sync: after DDP construction and after one step, every parameter and buffer hashes the
same on all ranks.

Each rank seeds its model differently on purpose, so the check passes only if DDP's initial
broadcast really made rank 0's weights everyone's. Hashes must agree bit for bit; when they do not,
the odd ones out (or, with no majority, the ranks farthest from a locally computed reference) are
blamed.
"""

from __future__ import annotations


import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context, abs_grad_sum, param_abs_max, tensor_hash
from ddpdoctor.probe.judges import differ_from_reference
from ddpdoctor.probe.tolerance import step_tolerance

NAME = "param-sync"
LR = 0.1


class _Scaled(nn.Module):
    """A module with a buffer that training does not change, so buffer hashes must stay equal."""

    scale: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def make_model(seed: int, device: torch.device) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), _Scaled(), nn.Linear(16, 4)).to(device)


def _state(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach() for t in model.parameters()] + [b.detach() for b in model.buffers()]


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((x.double() - y.double()).abs().max().item()) for x, y in zip(_state(a), _state(b)))


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def run(ctx: Context) -> R.RankEntry:
    device = ctx.device
    model = make_model(1000 + ctx.rank, device)  # deliberately different on every rank
    ddp = DDP(model, device_ids=[device.index] if ctx.on_cuda else None)
    ctx.faults.desync_parameters(model)
    reference = make_model(1000, device)  # what rank 0 built: what everyone must now hold
    hash_init = tensor_hash(_state(model))
    diff_init = _max_diff(model, reference)

    gen = torch.Generator().manual_seed(7)
    x_all = torch.randn(2 * ctx.world_size, 8, generator=gen).to(device)
    y_all = torch.randn(2 * ctx.world_size, 4, generator=gen).to(device)
    shard = slice(2 * ctx.rank, 2 * ctx.rank + 2)
    _step(ddp, x_all[shard], y_all[shard])
    n = x_all.shape[0]
    grad_sum = abs_grad_sum(reference, lambda i: nn.functional.mse_loss(reference(x_all[i:i + 1]), y_all[i:i + 1]) / n, n)
    _step(reference, x_all, y_all)
    hash_step = tensor_hash(_state(model))
    diff_step = _max_diff(model, reference)
    return R.entry(
        ctx.rank, R.PASS, f"hashes {hash_init} / {hash_step}",
        hash_init=hash_init, hash_step=hash_step,
        max_diff_vs_reference_init=diff_init, max_diff_vs_reference_step=diff_step,
        # A DDP step and the local whole-batch step differ only by float32 rounding, this much at most.
        tolerance_step=step_tolerance("float32", n, ctx.world_size, LR, grad_sum, param_abs_max(reference)),
    )


def judge(entries: list[R.RankEntry]) -> R.CheckRecord:
    live = [e for e in entries if e["status"] == R.PASS]
    bad_init = differ_from_reference(live, "hash_init", "max_diff_vs_reference_init", "tolerance_init")
    # A rank that starts the step with other weights sends other gradients, and DDP averages them
    # into every rank's step: after a bad start every rank's step differs, but only the ranks that
    # started wrong are at fault. The step is judged only when the start was right.
    bad_step = set() if bad_init else differ_from_reference(live, "hash_step", "max_diff_vs_reference_step", "tolerance_step")
    for e in live:
        d = e["detail"]
        if e["rank"] in bad_init:
            e["status"] = R.FAIL
            e["message"] = (
                f"parameters/buffers differ from rank 0's after DDP construction (hash {d['hash_init']}, "
                f"max diff vs reference {d['max_diff_vs_reference_init']:.3g})"
            )
        elif e["rank"] in bad_step:
            e["status"] = R.FAIL
            e["message"] = (
                f"parameters/buffers differ from the single-process reference after one step (hash {d['hash_step']}, "
                f"max diff {d['max_diff_vs_reference_step']:.3g} > bound {d.get('tolerance_step', 0.0):.3g})"
            )
    rec = R.record(NAME, entries)
    if R.blame_failures(rec):
        if bad_init and len(bad_init) < len(live):
            rec["summary"] += "; the other ranks' first step differs too, through the averaged gradients"
    else:
        rec["summary"] = (
            f"every parameter and buffer hashes the same on all {len(live)} ranks after DDP construction "
            f"and after one step ({live[0]['detail']['hash_step'] if live else '?'})"
        )
    return rec
