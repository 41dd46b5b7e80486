"""DistributedSampler: shards are disjoint, cover the dataset, and reshuffle between epochs when
`set_epoch` is called -- and repeat the same order when it is not (lint rule DDP001
missing-set-epoch), which the report explains.
"""

from __future__ import annotations

from typing import Any, cast

import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context
from ddpdoctor.probe.registry import plain_judge

NOTE = (
    "without set_epoch() every epoch repeats the same order on every rank -- call sampler.set_epoch(epoch) "
    "each epoch (lint rule DDP001 missing-set-epoch)"
)
PER_RANK = 16


def run(ctx: Context) -> R.RankEntry:
    n = PER_RANK * ctx.world_size
    sampler: DistributedSampler[int] = DistributedSampler(cast(Any, range(n)), num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0)
    sampler.set_epoch(0)
    epoch0 = list(sampler)
    repeat = list(sampler)  # a second epoch without set_epoch: must be identical
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    shards: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(shards, {"epoch0": epoch0, "epoch1": epoch1})
    problems: list[str] = []
    for key in ("epoch0", "epoch1"):
        seen: dict[int, int] = {}
        for r, shard in enumerate(shards):
            for i in shard[key]:
                if i in seen and seen[i] != r:
                    problems.append(f"{key}: index {i} on ranks {seen[i]} and {r}")
                    break
                seen[i] = r
        if len(seen) != n:
            problems.append(f"{key}: shards cover {len(seen)} of {n} samples")
    if epoch0 == epoch1:
        problems.append("set_epoch(1) did not change this rank's order")
    detail = {
        "dataset_size": n,
        "shard_size": len(epoch0),
        "reshuffled_with_set_epoch": epoch0 != epoch1,
        "repeats_without_set_epoch": epoch0 == repeat,
        "note": NOTE,
    }
    if problems:
        return R.entry(ctx.rank, R.FAIL, "; ".join(problems[:3]), **detail)
    return R.entry(ctx.rank, R.PASS, "disjoint, covering, reshuffled by set_epoch", **detail)


def _describe(ranks: list[R.RankEntry]) -> str:
    d = ranks[0]["detail"]
    return (
        f"{len(ranks)} shards of {d['shard_size']} are disjoint and cover all {d['dataset_size']} samples; "
        f"set_epoch() reshuffles them. Note: {NOTE}"
    )


judge = plain_judge("sampler", _describe)
