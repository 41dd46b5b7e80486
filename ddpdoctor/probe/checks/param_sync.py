"""Parameter sync: after DDP construction and after one step, every parameter and buffer hashes the
same on all ranks.

Each rank seeds its model differently on purpose, so the check passes only if DDP's initial
broadcast really made rank 0's weights everyone's. Hashes must agree bit for bit; when they do not,
the odd ones out (or, with no majority, the ranks farthest from a locally computed reference) are
blamed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context, blame_failures, tensor_hash

NAME = "param-sync"
ADVICE = (
    "Parameters drift apart between ranks: do not modify parameters or load checkpoints on one rank "
    "after wrapping in DDP (load before wrapping, or on all ranks), keep per-rank code paths identical, "
    "and see lint rules about rank-conditional code. Re-run with TORCH_DISTRIBUTED_DEBUG=DETAIL."
)


class _Scaled(nn.Module):
    """A module with a buffer that training does not change, so buffer hashes must stay equal."""

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
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def run(ctx: Context) -> dict[str, Any]:
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
    _step(reference, x_all, y_all)
    hash_step = tensor_hash(_state(model))
    diff_step = _max_diff(model, reference)
    return R.entry(
        ctx.rank, R.PASS, f"hashes {hash_init} / {hash_step}",
        hash_init=hash_init, hash_step=hash_step,
        max_diff_vs_reference_init=diff_init, max_diff_vs_reference_step=diff_step,
    )


def _blame(entries: list[dict[str, Any]], key: str, diff_key: str, tol: float) -> set[int]:
    counts = Counter(e["detail"][key] for e in entries)
    if len(counts) <= 1:
        return set()
    top, n = counts.most_common(1)[0]
    if n * 2 > len(entries):
        return {e["rank"] for e in entries if e["detail"][key] != top}
    # No majority (e.g. two ranks): blame whoever is far from the reference, else everyone.
    far = {e["rank"] for e in entries if e["detail"][diff_key] > tol}
    return far or {e["rank"] for e in entries}


def judge(entries: list[dict[str, Any]]) -> dict[str, Any]:
    live = [e for e in entries if e["status"] == R.PASS]
    bad_init = _blame(live, "hash_init", "max_diff_vs_reference_init", 0.0)
    bad_step = _blame(live, "hash_step", "max_diff_vs_reference_step", 1e-5)
    for e in live:
        where = [w for w, bad in (("after DDP construction", bad_init), ("after one step", bad_step)) if e["rank"] in bad]
        if where:
            e["status"] = R.FAIL
            e["message"] = (
                f"parameters/buffers differ from the other ranks {' and '.join(where)} "
                f"(hash {e['detail']['hash_init']} / {e['detail']['hash_step']}, max diff vs reference "
                f"{e['detail']['max_diff_vs_reference_init']:.3g} / {e['detail']['max_diff_vs_reference_step']:.3g})"
            )
    rec = R.record(NAME, entries)
    if not blame_failures(rec, ADVICE):
        rec["summary"] = (
            f"every parameter and buffer hashes the same on all {len(live)} ranks after DDP construction "
            f"and after one step ({live[0]['detail']['hash_step'] if live else '?'})"
        )
    return rec
