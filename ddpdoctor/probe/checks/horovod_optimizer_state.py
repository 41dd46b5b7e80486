"""hvd.broadcast_optimizer_state: every rank takes one local Adam step on its own data (so its
moments and step count differ), then the broadcast must leave rank 0's state everywhere -- checked
bit for bit against rank 0's state rebuilt locally."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context
from ddpdoctor.probe.registry import plain_judge


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(99)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2 * (1 + seed % 3))
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(4, 5, generator=gen), torch.randn(4, 2, generator=gen)
    for _ in range(1 + seed % 2):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model, opt


def state_hash(opt: torch.optim.Optimizer) -> str:
    """Over every state value (tensors and numbers alike, as float64) and the hyper-parameters."""
    digest = hashlib.sha256()
    state: dict[Any, Any] = opt.state_dict()["state"]
    for index in sorted(state):
        for key in sorted(state[index]):
            value = torch.as_tensor(state[index][key], dtype=torch.float64).reshape(-1)
            digest.update(f"{index}.{key}:".encode() + value.contiguous().numpy().tobytes())
    for group in opt.state_dict()["param_groups"]:
        digest.update(repr(sorted((k, v) for k, v in group.items() if k != "params" and isinstance(v, (int, float)))).encode())
    return digest.hexdigest()[:16]


def run(ctx: Context) -> R.RankEntry:
    import horovod.torch as hvd

    model, opt = _trained(500 + ctx.rank)  # deliberately different on every rank
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    got = state_hash(opt)
    want = state_hash(_trained(500)[1])
    if got != want:
        return R.entry(ctx.rank, R.FAIL, f"optimizer state differs from rank 0's after broadcast_optimizer_state "
                       f"(hash {got} != {want})", hash=got, want=want)
    return R.entry(ctx.rank, R.PASS, f"rank 0's Adam state, bit for bit ({got})", hash=got, want=want)


judge = plain_judge(
    "optimizer-state",
    lambda entries: f"Adam state (moments, step, lr) equals rank 0's on all {len(entries)} ranks after "
    "hvd.broadcast_optimizer_state",
)
