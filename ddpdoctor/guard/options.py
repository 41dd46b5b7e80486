"""What a guard run is told, and how it travels to the ranks: one JSON environment variable.

Nothing here imports torch: the `guard` command, the bootstrap in every Python process of the job
and the linter's process all read this module.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

# The side channel's address and the options, as the ranks inherit them.
ENV = "DDPDOCTOR_GUARD"
# Optional, set by the user on every node of a multi-node job: the secret that authenticates the
# ranks and the other nodes' guards (else each guard draws its own), and the job's identity (else
# derived from torchrun's rendezvous options).
SECRET_ENV = "DDPDOCTOR_GUARD_SECRET"
JOB_ENV = "DDPDOCTOR_GUARD_JOB"
# Set in a process once its guard is active, so that a nested `ddpdoctor guard` or a second
# `guard.install()` does not guard the same rank twice.
ACTIVE_ENV = "DDPDOCTOR_GUARD_ACTIVE"


@dataclass(frozen=True)
class GuardOptions:
    host: str = "127.0.0.1"
    port: int = 0
    stall_timeout: float = 60.0
    every: int = 100
    # Straggler: a window of optimizer steps, and how far above the others' median a rank must be.
    straggler_window: int = 20
    straggler_ratio: float = 1.5
    # Below this many seconds of excess per step a slower rank is noise, not a straggler.
    straggler_min_excess: float = 0.02
    on_stall: str = "stop"  # "stop" the job, or only "report" it
    # How often each rank's reporter thread sends what its main thread recorded.
    flush_interval: float = 0.5
    # In-code use without the `guard` command: rank 0 hosts the side channel and the doctor.
    rank0_hosts: bool = False
    # What a rank's hello must carry: handed down in the environment (DDPDOCTOR_GUARD), which only
    # the job's own user can read (/proc/PID/environ), never on a command line.
    secret: str = field(default="", repr=False)

    def to_env(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_env(cls, environ: Optional[dict[str, str]] = None) -> Optional["GuardOptions"]:
        raw = (environ if environ is not None else os.environ).get(ENV)
        if not raw:
            return None
        try:
            data: dict[str, Any] = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        known = {f.name: f.type for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return None
