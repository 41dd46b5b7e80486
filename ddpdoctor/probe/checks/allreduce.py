"""All-reduce SUM (plus broadcast and all-gather) with exactly known results.

Rank r contributes (r + 1) * ((i % 7) + 1) at index i, so the sum is ((i % 7) + 1) * W(W+1)/2: small
integers, exactly representable in every dtype tried (float16 included), so the expected result is
exact and any deviation is a real error, not rounding. Integers must match exactly; floats within a
tight tolerance (the reduction order may differ, the values do not need it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context, default_judge

NAME = "allreduce"
ADVICE = (
    "Wrong collective results on the named rank point at its hardware or transport: run nccl-tests "
    "(all_reduce_perf -c 1) on that node, check `nvidia-smi -q` for ECC/Xid errors, try "
    "NCCL_P2P_DISABLE=1 / NCCL_IB_DISABLE=1 to isolate the link, and drain the node if it persists."
)

DTYPES = ("float32", "float64", "int64", "float16", "bfloat16")
# Element counts: tiny, odd, and up to ~1 MB of float32 on CPU (several MB on GPU).
CPU_SIZES = (1, 7, 1023, 65537, 262147)
CUDA_SIZES = (1, 7, 1023, 65537, 1048573, 4194301)
LARGE_ONLY_FROM = 65537
LARGE_DTYPES = ("float32", "int64")
_TOL = {"float32": 1e-6, "float64": 1e-12, "float16": 1e-3, "bfloat16": 1e-2, "int64": 0.0}


def _pattern(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return (torch.arange(size, device=device, dtype=torch.int64) % 7 + 1).to(dtype)


def _max_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    diff = (got.double() - want.double()).abs() / want.double().abs().clamp_min(1.0)
    return float(diff.max().item()) if diff.numel() else 0.0


def run(ctx: Context) -> dict[str, Any]:
    world, rank, device = ctx.world_size, ctx.rank, ctx.device
    sizes = CUDA_SIZES if ctx.on_cuda else CPU_SIZES
    failures: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    cases = 0
    worst = 0.0
    for dtype_name in DTYPES:
        if dtype_name in ctx.unsupported:
            skipped[dtype_name] = ctx.unsupported[dtype_name]
            continue
        dtype = getattr(torch, dtype_name)
        for size in sizes:
            if size > LARGE_ONLY_FROM and dtype_name not in LARGE_DTYPES and not ctx.on_cuda:
                continue  # keep CPU runs short: the largest size only where it matters most
            base = _pattern(size, dtype, device)
            t = base * (rank + 1)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            ctx.faults.corrupt_allreduce_result(t)
            want = base * (world * (world + 1) // 2)
            err = _max_rel_err(t, want)
            worst = max(worst, err)
            cases += 1
            if err > _TOL[dtype_name]:
                bad = int(((t.double() - want.double()).abs() > 0).nonzero()[0].item())
                failures.append(
                    {"op": "all_reduce", "dtype": dtype_name, "size": size, "max_rel_err": err,
                     "first_bad_index": bad, "got": float(t.view(-1)[bad].item()), "want": float(want.view(-1)[bad].item())}
                )
    if "avg" in ctx.unsupported:
        skipped["ReduceOp.AVG"] = ctx.unsupported["avg"]
    else:
        t = _pattern(1023, torch.float32, device) * (rank + 1)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        want = _pattern(1023, torch.float32, device) * ((world + 1) / 2)
        err = _max_rel_err(t, want)
        cases += 1
        if err > 1e-6:
            failures.append({"op": "all_reduce AVG", "dtype": "float32", "size": 1023, "max_rel_err": err})
    # Broadcast from the last rank, so that rank 0 is a receiver too.
    src = world - 1
    t = _pattern(65537, torch.float32, device) * (src + 1) if rank == src else torch.zeros(65537, device=device)
    dist.broadcast(t, src=src)
    err = _max_rel_err(t, _pattern(65537, torch.float32, device) * (src + 1))
    cases += 1
    if err > 0:
        failures.append({"op": "broadcast", "dtype": "float32", "size": 65537, "src": src, "max_rel_err": err})
    # All-gather: slot j must hold rank j's contribution.
    mine = _pattern(1023, torch.int64, device) * (rank + 1)
    slots = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(slots, mine)
    cases += 1
    for j, slot in enumerate(slots):
        if not torch.equal(slot, _pattern(1023, torch.int64, device) * (j + 1)):
            failures.append({"op": "all_gather", "dtype": "int64", "size": 1023, "slot": j})
    detail: dict[str, Any] = {"cases": cases, "sizes": list(sizes), "max_rel_err": worst, "skipped": skipped}
    if failures:
        f = failures[0]
        return R.entry(
            rank, R.FAIL,
            f"{len(failures)}/{cases} results wrong, e.g. {f['op']} {f['dtype']} x{f['size']} (max rel err {f['max_rel_err']:.3g})",
            failures=failures[:10], **detail,
        )
    note = f"; skipped {', '.join(skipped)}" if skipped else ""
    return R.entry(rank, R.PASS, f"{cases} results exact (max rel err {worst:.1g}){note}", **detail)


def _describe(entries: list[dict[str, Any]]) -> str:
    d = entries[0]["detail"]
    skipped = d.get("skipped") or {}
    text = f"{d['cases']} all-reduce/broadcast/all-gather results exact on every rank, 1 to {max(d['sizes'])} elements"
    if skipped:
        text += "; skipped: " + "; ".join(f"{k} ({v})" for k, v in skipped.items())
    return text


judge = default_judge(NAME, ADVICE, _describe)
