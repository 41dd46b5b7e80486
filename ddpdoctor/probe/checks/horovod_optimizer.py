"""One hvd.DistributedOptimizer step over N shards, with the learning rate scaled by hvd.size() as
HVD001 asks, equals one single-process step at the base learning rate on the sum of the N shards'
mean losses -- what N workers' gradients add up to. (DistributedOptimizer averages the gradients;
scaling the rate by N turns that average back into the sum.) float64, judged against the rounding
bound of ddpdoctor.probe.tolerance."""

from __future__ import annotations

import torch
from torch import nn

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context, abs_grad_sum, param_abs_max
from ddpdoctor.probe.judges import judge_step, step_detail

NAME = "optimizer-step"
PER_RANK = 3
BASE_LR = 0.05
DTYPE = "float64"


def _model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 3)).to(dtype=torch.float64)


def run(ctx: Context) -> R.RankEntry:
    import horovod.torch as hvd

    world = hvd.size()
    gen = torch.Generator().manual_seed(77)
    n = PER_RANK * world
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    y = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    model = _model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=BASE_LR * world),
                                   named_parameters=model.named_parameters())
    shard = slice(PER_RANK * ctx.rank, PER_RANK * (ctx.rank + 1))
    opt.zero_grad()
    nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
    opt.step()

    reference = _model()
    grad_sum = abs_grad_sum(reference, lambda i: nn.functional.mse_loss(reference(x[i:i + 1]), y[i:i + 1]) / PER_RANK, n)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=BASE_LR)
    ref_opt.zero_grad()
    loss = sum(nn.functional.mse_loss(reference(x[PER_RANK * k:PER_RANK * (k + 1)]), y[PER_RANK * k:PER_RANK * (k + 1)])
               for k in range(world))
    loss.backward()  # type: ignore[union-attr]
    ref_opt.step()
    diff = max(float((a - b).abs().max().item()) for a, b in zip(model.parameters(), reference.parameters()))
    return R.entry(ctx.rank, R.PASS, f"max diff {diff:.3g} from the single-process step", **step_detail(
        diff, DTYPE, samples=n, shards=world, lr=BASE_LR, grad_abs_sum=grad_sum, param_abs_max=param_abs_max(reference)))


def judge(entries: list[R.RankEntry]) -> R.CheckRecord:
    return judge_step(NAME, f"one DistributedOptimizer step over {len(entries)} shards at lr x hvd.size() equals one "
                      "single-process step over the whole batch", entries)
