"""hvd.broadcast_parameters: every rank builds its model from a different seed on purpose, so the
check passes only if the broadcast really made rank 0's weights everyone's -- compared bit for bit
against rank 0's model rebuilt locally, so the blame is exact on any number of ranks."""

from __future__ import annotations

import torch
from torch import nn

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context, tensor_hash
from ddpdoctor.probe.registry import plain_judge

ROOT_SEED = 2000


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    norm = nn.BatchNorm1d(16)
    model = nn.Sequential(nn.Linear(8, 16), norm, nn.Tanh(), nn.Linear(16, 4))
    with torch.no_grad():  # buffers that differ per rank too, so that they must be broadcast as well
        assert norm.running_mean is not None and norm.running_var is not None
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.0)
    return model


def state_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach() for t in model.state_dict().values()]


def run(ctx: Context) -> R.RankEntry:
    import horovod.torch as hvd

    model = make_model(ROOT_SEED + ctx.rank)  # deliberately different on every rank
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ctx.faults.desync_parameters(model)
    got = tensor_hash(state_tensors(model))
    want = tensor_hash(state_tensors(make_model(ROOT_SEED)))
    if got != want:
        diff = max(float((a.double() - b.double()).abs().max().item())
                   for a, b in zip(state_tensors(model), state_tensors(make_model(ROOT_SEED))))
        return R.entry(ctx.rank, R.FAIL, f"weights differ from rank 0's after broadcast_parameters (hash {got} != {want}, "
                       f"max diff {diff:.3g})", hash=got, want=want, max_diff=diff)
    return R.entry(ctx.rank, R.PASS, f"rank 0's weights, bit for bit ({got})", hash=got, want=want)


judge = plain_judge(
    "broadcast-parameters",
    lambda entries: f"every parameter and buffer equals rank 0's on all {len(entries)} ranks after "
    f"hvd.broadcast_parameters ({entries[0]['detail']['hash']})",
)
