"""The learning-rate scaling the run would use: HVD001 asks for lr x hvd.size(). Every rank reports
hvd.size() and the scaled rate; they must agree with each other and with the number of ranks that
answered, or the ranks would train with different rates (or average over a wrong count)."""

from __future__ import annotations

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context

NAME = "lr-scaling"
BASE_LR = 0.1


def run(ctx: Context) -> R.RankEntry:
    import horovod.torch as hvd

    size = hvd.size()
    return R.entry(ctx.rank, R.PASS, f"hvd.size() {size}: lr {BASE_LR:g} x {size} = {BASE_LR * size:g}",
                   size=size, local_size=hvd.local_size(), base_lr=BASE_LR, scaled_lr=BASE_LR * size)


def judge(entries: list[R.RankEntry]) -> R.CheckRecord:
    live = [e for e in entries if e["status"] == R.PASS]
    # The number of ranks that answered is the truth; a rank that disagrees with it (and so with
    # the others) would scale its rate, and average its gradients, over a wrong count.
    for e in live:
        size = e["detail"]["size"]
        if size != len(entries):
            e["status"] = R.FAIL
            e["message"] = f"hvd.size() is {size} on this rank, but {len(entries)} ranks run: lr would be scaled x{size}"
    rec = R.record(NAME, entries)
    if not R.blame_failures(rec) and live:
        d = live[0]["detail"]
        rec["summary"] = (f"hvd.size() = {d['size']} on every rank: lr {d['base_lr']:g} scales to {d['scaled_lr']:g} "
                          "(HVD001: lr x hvd.size())")
    return rec
