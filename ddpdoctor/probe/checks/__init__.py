"""The probe's checks, one small module each; which exist, in what order, with what advice and
which fault proves them is declared in ddpdoctor.probe.registry. Each module provides

    run(ctx: Context) -> RankEntry                  on every rank
    judge(entries: list[RankEntry]) -> CheckRecord  optional; once all entries are in (rank 0)

These modules import torch (and the horovod_* ones Horovod): they are loaded in the ranks only.
"""
