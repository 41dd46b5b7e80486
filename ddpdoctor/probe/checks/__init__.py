"""The probe's checks, one small module each. Each module provides

    NAME: str
    ADVICE: str                                   -- what to do next when it fails
    run(ctx: Context) -> dict                     -- this rank's entry (see ddpdoctor.probe.results)
    judge(entries: list[dict]) -> dict            -- optional: the check record from all ranks' entries

`run` executes on every rank; `judge` on rank 0 once all entries are in (or the timeout passed).
"""

from __future__ import annotations

import importlib
from types import ModuleType

_MODULES = {
    "world": "world",
    "liveness": "liveness",
    "allreduce": "allreduce",
    "param-sync": "param_sync",
    "ddp-parity": "ddp_parity",
    "syncbn": "syncbn",
    "sampler": "sampler",
    "bandwidth": "bandwidth",
}


def load(name: str) -> ModuleType:
    return importlib.import_module(f"ddpdoctor.probe.checks.{_MODULES[name]}")
