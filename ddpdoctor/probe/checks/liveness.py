"""Hang and crash detection: every rank must arrive, within the timeout, at a store heartbeat and
then a backend barrier (gloo's `monitored_barrier`, which names late ranks itself).

The heartbeat is the per-check exchange through the c10d TCPStore (see ddpdoctor.probe.exchange):
a rank that never posts is named as missing once the timeout passes; a rank that raises posts its
traceback before it dies, so the others report it at once.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context
from ddpdoctor.probe.registry import plain_judge



def run(ctx: Context) -> R.RankEntry:
    # The faults live here: this is the check that must catch them.
    ctx.faults.maybe_crash()
    ctx.faults.maybe_hang()
    start = time.perf_counter()
    how = "monitored_barrier" if ctx.backend == "gloo" else "barrier"
    try:
        if ctx.backend == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=ctx.timeout), wait_all_ranks=True)
        else:
            dist.barrier()
    except Exception as exc:  # noqa: BLE001
        # This rank did arrive; the barrier failing means someone else did not. The store heartbeat
        # names who, so this rank is not blamed -- but keep the backend's own words.
        waited = time.perf_counter() - start
        return R.entry(
            ctx.rank, R.PASS, f"arrived; {how} failed after {waited:.1f}s (a peer is late)",
            barrier_error=str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__,
        )
    waited = time.perf_counter() - start
    return R.entry(ctx.rank, R.PASS, f"arrived; {how} took {waited * 1e3:.1f} ms", barrier_ms=round(waited * 1e3, 3))


judge = plain_judge("liveness", lambda entries: f"all {len(entries)} ranks alive: heartbeat and barrier within the timeout")
