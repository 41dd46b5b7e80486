"""All-reduce bandwidth sweep, reported the way nccl-tests does, plus per-rank timings.

algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce (the nccl-tests formula, which makes
the figure comparable to the link speed whatever the rank count). Every rank times the same sweep
and a fixed local compute workload; a rank whose compute takes far longer than the median is
flagged as a straggler (performance, not correctness: the check still passes, and says so).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context

NAME = "bandwidth"
STRAGGLER_ADVICE = (
    "A straggler slows every step of every rank: check that rank's node for CPU/GPU contention, "
    "thermal throttling (nvidia-smi -q -d PERFORMANCE), a wrong NUMA/CPU binding, or other jobs."
)
CPU_SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20)
CUDA_SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)
ITERS = 5
CPU_ITERS = 3  # CPU "bandwidth" is a sanity figure, not a benchmark: keep it cheap
STRAGGLER_FACTOR = 2.0
STRAGGLER_MIN_S = 0.02


def _sync(ctx: Context) -> None:
    if ctx.on_cuda:
        torch.cuda.synchronize(ctx.device)


def run(ctx: Context) -> R.RankEntry:
    sizes = CUDA_SIZES if ctx.on_cuda else CPU_SIZES
    factor = 2 * (ctx.world_size - 1) / ctx.world_size
    rows: list[dict[str, Any]] = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=ctx.device)
        dist.all_reduce(t)  # warm-up: connection set-up and allocation are not bandwidth
        _sync(ctx)
        dist.barrier()
        start = time.perf_counter()
        iters = ITERS if ctx.on_cuda else CPU_ITERS
        for _ in range(iters):
            dist.all_reduce(t)
        _sync(ctx)
        seconds = (time.perf_counter() - start) / iters
        algbw = nbytes / seconds / 1e9
        rows.append({"bytes": nbytes, "time_us": seconds * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * factor})
    # Same local work on every rank: a slow one is a straggler whatever the network does.
    a = torch.randn(128, 128, device=ctx.device)
    _sync(ctx)
    start = time.perf_counter()
    for _ in range(20):
        a = torch.tanh(a @ a)
    _sync(ctx)
    compute_s = time.perf_counter() - start
    return R.entry(ctx.rank, R.PASS, f"busbw {rows[-1]['busbw_GBps']:.2f} GB/s at {rows[-1]['bytes'] >> 10} KiB", sweep=rows, compute_s=compute_s)


def judge(entries: list[R.RankEntry]) -> R.CheckRecord:
    live = [e for e in entries if e["status"] == R.PASS]
    rec = R.record(NAME, entries)
    if R.blame_failures(rec):
        return rec
    # The slowest rank defines a collective's time, so report the max over ranks per size.
    table = []
    for i, row in enumerate(live[0]["detail"]["sweep"]):
        slowest = max(e["detail"]["sweep"][i]["time_us"] for e in live)
        algbw = row["bytes"] / (slowest / 1e6) / 1e9
        n = len(entries)
        table.append({"bytes": row["bytes"], "time_us": round(slowest, 1), "algbw_GBps": round(algbw, 4), "busbw_GBps": round(algbw * 2 * (n - 1) / n, 4)})
    median = statistics.median(e["detail"]["compute_s"] for e in live)
    stragglers = []
    for e in live:
        slow = e["detail"]["compute_s"]
        e["detail"]["straggler"] = slow > STRAGGLER_FACTOR * median and slow - median > STRAGGLER_MIN_S
        if e["detail"]["straggler"]:
            stragglers.append(e["rank"])
            e["message"] += f"; straggler: local compute {slow * 1e3:.0f} ms vs median {median * 1e3:.0f} ms"
    rec["detail"] = {"sweep": table, "compute_median_s": median, "stragglers": stragglers}
    last = table[-1]
    rec["summary"] = (
        f"all-reduce {last['bytes'] >> 10} KiB: {last['time_us']:.0f} us, algbw {last['algbw_GBps']:.2f} GB/s, "
        f"busbw {last['busbw_GBps']:.2f} GB/s"
    )
    if stragglers:
        rec["summary"] += f"; straggler: {R.format_ranks(stragglers)} (> {STRAGGLER_FACTOR:g}x the median local compute time)"
        rec["advice"] = STRAGGLER_ADVICE
    return rec
