"""Hang and crash detection under Horovod: every rank must post its heartbeat to the store within
the timeout. No Horovod collective here: they have no timeout, and the ranks that did arrive would
wait in it for ever for the one that did not."""

from __future__ import annotations

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context
from ddpdoctor.probe.registry import plain_judge


def run(ctx: Context) -> R.RankEntry:
    # The faults live here: this is the check that must catch them.
    ctx.faults.maybe_crash()
    ctx.faults.maybe_hang()
    return R.entry(ctx.rank, R.PASS, "arrived (store heartbeat)")


judge = plain_judge("liveness", lambda entries: f"all {len(entries)} ranks alive: store heartbeat within the timeout")
