"""Who is who under Horovod: rank layout and versions from every rank, before hvd.init(); a rank
whose Horovod, torch or Python differs from the others fails."""

from __future__ import annotations

import os
import platform
import socket

import torch

from ddpdoctor.probe import results as R
from ddpdoctor.probe.checks.base import Context
from ddpdoctor.probe.judges import fail_ranks, version_disagreements

NAME = "world"
_VERSION_KEYS = ("horovod", "torch", "python")
_ENV_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
             "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_GLOO_IFACE", "OMP_NUM_THREADS")


def run(ctx: Context) -> R.RankEntry:
    import horovod

    detail = {
        "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(ctx.device),
        "backend": ctx.backend,
        "versions": {"horovod": horovod.__version__, "torch": torch.__version__, "python": platform.python_version()},
        "env": {k: os.environ[k] for k in _ENV_VARS if k in os.environ},
    }
    return R.entry(ctx.rank, R.PASS, f"{detail['host']} horovod {horovod.__version__} torch {torch.__version__}", **detail)


def judge(entries: list[R.RankEntry]) -> R.CheckRecord:
    live = [e for e in entries if e["status"] == R.PASS]
    fail_ranks(live, version_disagreements(live, _VERSION_KEYS))
    rec = R.record(NAME, entries)
    if not R.blame_failures(rec):
        hosts = sorted({e["detail"]["host"] for e in live})
        v = live[0]["detail"]["versions"] if live else {}
        rec["summary"] = (f"{len(live)} ranks on {len(hosts)} host(s), horovod {v.get('horovod')} with gloo, "
                          f"torch {v.get('torch')}: versions agree")
    return rec
