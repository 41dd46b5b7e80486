"""hvd.allreduce (Sum and Average), hvd.broadcast and hvd.allgather with exactly known results,
on every dtype Horovod takes on CPU and odd sizes; floats held to their dtype's rounding bound
for W terms (ddpdoctor.probe.tolerance), integers exact.

Rank r contributes (r + 1) * ((i % 7) + 1); the 8- and 16-bit integers, whose range a sum over many
ranks would overflow, contribute (i % 7) + 1 on every rank instead.
"""

from __future__ import annotations

from typing import Any

import torch

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.allreduce import describe, judge_mean, judge_sum, result_entry
from ddpdoctor.probe.checks.base import Context, max_rel_err, pattern
from ddpdoctor.probe.hvd_worker import DTYPES
from ddpdoctor.probe.registry import plain_judge

SIZES = (1, 7, 1023, 65537)
SMALL_INTS = {"uint8": 255, "int8": 127, "int16": 32767}
FLOATS = ("float16", "bfloat16", "float32", "float64")


def run(ctx: Context) -> R.RankEntry:
    import horovod.torch as hvd

    world, rank, device = ctx.world_size, ctx.rank, ctx.device
    failures: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    cases = 0
    worst = 0.0
    for dtype_name in DTYPES:
        if dtype_name in ctx.unsupported:
            skipped[dtype_name] = ctx.unsupported[dtype_name]
            continue
        same_everywhere = dtype_name in SMALL_INTS
        per_rank_total = world if same_everywhere else world * (world + 1) // 2
        if same_everywhere and 7 * world > SMALL_INTS[dtype_name]:
            skipped[dtype_name] = f"a sum over {world} ranks would overflow {dtype_name}"
            continue
        dtype = getattr(torch, dtype_name)
        for size in SIZES:
            mine = pattern(size, dtype, device) * (1 if same_everywhere else rank + 1)
            got = hvd.allreduce(mine, op=hvd.Sum, name=f"ddpdoctor.sum.{dtype_name}.{size}")
            ctx.faults.corrupt_allreduce_result(got)
            exact = pattern(size, torch.float64, device) * per_rank_total
            cases += 1
            failure = judge_sum(got, exact, dtype_name, world, op="allreduce Sum")
            worst = max(worst, max_rel_err(got, exact))
            if failure:
                failures.append(failure)
        if dtype_name in FLOATS:
            mine = pattern(1023, dtype, device) * (rank + 1)
            got = hvd.allreduce(mine, op=hvd.Average, name=f"ddpdoctor.avg.{dtype_name}")
            cases += 1
            failure = judge_mean(got, pattern(1023, torch.float64, device) * ((world + 1) / 2), dtype_name, world,
                                 op="allreduce Average")
            if failure:
                failures.append(failure)
    # Broadcast from the last rank, so that rank 0 is a receiver too: a copy, exact.
    src = world - 1
    mine = pattern(65537, torch.float32, device) * (src + 1) if rank == src else torch.zeros(65537, device=device)
    got = hvd.broadcast(mine, root_rank=src, name="ddpdoctor.broadcast")
    cases += 1
    if not torch.equal(got, pattern(65537, torch.float32, device) * (src + 1)):
        failures.append({"op": "broadcast", "dtype": "float32", "size": 65537, "src": src, "max_rel_err": float("nan")})
    # Allgather with a different number of rows per rank: rank j's block must hold j + 1 rows of j + 1.
    mine = torch.full((rank + 1, 3), rank + 1, dtype=torch.int64, device=device)
    got = hvd.allgather(mine, name="ddpdoctor.allgather")
    cases += 1
    want = torch.cat([torch.full((j + 1, 3), j + 1, dtype=torch.int64, device=device) for j in range(world)])
    if not torch.equal(got, want):
        failures.append({"op": "allgather", "dtype": "int64", "size": int(want.numel()), "max_rel_err": float("nan")})
    return result_entry(rank, cases, list(SIZES), worst, skipped, failures)


judge = plain_judge("allreduce", describe)
