"""All-reduce SUM and AVG (plus broadcast and all-gather) with exactly known results.

Rank r contributes (r + 1) * ((i % 7) + 1) at index i, so the sum is ((i % 7) + 1) * W(W+1)/2,
computed exactly in float64. Integers must match exactly; floats within the rounding bound of
their dtype for W terms (ddpdoctor.probe.tolerance), which is zero error while every partial sum is
representable and grows only as far as W roundings in that dtype can reach.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context, first_bad_index, max_rel_err, pattern
from ddpdoctor.probe.registry import plain_judge
from ddpdoctor.probe.tolerance import mean_tolerance, sum_tolerance

DTYPES = ("float32", "float64", "int64", "float16", "bfloat16")
# Element counts: tiny, odd, and up to ~1 MB of float32 on CPU (several MB on GPU).
CPU_SIZES = (1, 7, 1023, 65537, 262147)
CUDA_SIZES = (1, 7, 1023, 65537, 1048573, 4194301)
LARGE_ONLY_FROM = 65537
LARGE_DTYPES = ("float32", "int64")


def judge_sum(got: torch.Tensor, exact: torch.Tensor, dtype: str, terms: int, op: str = "all_reduce") -> dict[str, Any]:
    """{} when `got` is within the bound for a sum of `terms` values in `dtype`, else the failure."""
    return _judge(got, exact, dtype, sum_tolerance(dtype, terms), op)


def judge_mean(got: torch.Tensor, exact: torch.Tensor, dtype: str, terms: int, op: str = "all_reduce AVG") -> dict[str, Any]:
    return _judge(got, exact, dtype, mean_tolerance(dtype, terms), op)


def _judge(got: torch.Tensor, exact: torch.Tensor, dtype: str, tolerance: float, op: str) -> dict[str, Any]:
    err = max_rel_err(got, exact)
    if err <= tolerance:
        return {}
    bad = first_bad_index(got, exact, tolerance)
    return {"op": op, "dtype": dtype, "size": int(got.numel()), "max_rel_err": err, "tolerance": tolerance,
            "first_bad_index": bad, "got": float(got.view(-1)[bad].item()), "want": float(exact.view(-1)[bad].item())}


def run(ctx: Context) -> R.RankEntry:
    world, rank, device = ctx.world_size, ctx.rank, ctx.device
    sizes = CUDA_SIZES if ctx.on_cuda else CPU_SIZES
    failures: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    cases = 0
    worst = 0.0
    total = world * (world + 1) // 2
    for dtype_name in DTYPES:
        if dtype_name in ctx.unsupported:
            skipped[dtype_name] = ctx.unsupported[dtype_name]
            continue
        dtype = getattr(torch, dtype_name)
        for size in sizes:
            if size > LARGE_ONLY_FROM and dtype_name not in LARGE_DTYPES and not ctx.on_cuda:
                continue  # keep CPU runs short: the largest size only where it matters most
            t = pattern(size, dtype, device) * (rank + 1)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            ctx.faults.corrupt_allreduce_result(t)
            exact = pattern(size, torch.float64, device) * total
            worst = max(worst, max_rel_err(t, exact))
            cases += 1
            failure = judge_sum(t, exact, dtype_name, world)
            if failure:
                failures.append(failure)
    if "avg" in ctx.unsupported:
        skipped["ReduceOp.AVG"] = ctx.unsupported["avg"]
    else:
        t = pattern(1023, torch.float32, device) * (rank + 1)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        cases += 1
        failure = judge_mean(t, pattern(1023, torch.float64, device) * ((world + 1) / 2), "float32", world)
        if failure:
            failures.append(failure)
    # Broadcast from the last rank, so that rank 0 is a receiver too: a copy, exact.
    src = world - 1
    t = pattern(65537, torch.float32, device) * (src + 1) if rank == src else torch.zeros(65537, device=device)
    dist.broadcast(t, src=src)
    cases += 1
    failure = _judge(t, pattern(65537, torch.float64, device) * (src + 1), "float32", 0.0, "broadcast")
    if failure:
        failures.append(failure)
    # All-gather: slot j must hold rank j's contribution.
    mine = pattern(1023, torch.int64, device) * (rank + 1)
    slots = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(slots, mine)
    cases += 1
    for j, slot in enumerate(slots):
        if not torch.equal(slot, pattern(1023, torch.int64, device) * (j + 1)):
            failures.append({"op": "all_gather", "dtype": "int64", "size": 1023, "slot": j, "max_rel_err": float("nan")})
    return result_entry(rank, cases, list(sizes), worst, skipped, failures)


def result_entry(rank: int, cases: int, sizes: list[int], worst: float, skipped: dict[str, str],
                 failures: list[dict[str, Any]]) -> R.RankEntry:
    detail: dict[str, Any] = {"cases": cases, "sizes": sizes, "max_rel_err": worst, "skipped": skipped}
    if failures:
        f = failures[0]
        return R.entry(
            rank, R.FAIL,
            f"{len(failures)}/{cases} results wrong, e.g. {f['op']} {f['dtype']} x{f['size']} "
            f"(max rel err {f['max_rel_err']:.3g} > bound {f.get('tolerance', 0.0):.3g})",
            failures=failures[:10], **detail,
        )
    note = f"; skipped {', '.join(skipped)}" if skipped else ""
    return R.entry(rank, R.PASS, f"{cases} results within their rounding bound (max rel err {worst:.1g}){note}", **detail)


def describe(entries: list[R.RankEntry]) -> str:
    d = entries[0]["detail"]
    skipped = d.get("skipped") or {}
    text = (f"{d['cases']} all-reduce/broadcast/all-gather results exact (within the dtype's rounding bound for "
            f"{len(entries)} terms) on every rank, 1 to {max(d['sizes'])} elements")
    if skipped:
        text += "; skipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items())
    return text


judge = plain_judge("allreduce", describe)
