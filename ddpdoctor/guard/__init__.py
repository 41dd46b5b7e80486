"""`ddpdoctor guard`: the doctor inside the user's own job.

Importing this package does not import torch. In-code use, for those who prefer it to the
`ddpdoctor guard -- COMMAND` wrapper:

    from ddpdoctor import guard
    guard.install()          # before or after init_process_group

Under `ddpdoctor guard` this is what the injected bootstrap already does; without it, rank 0
hosts the side channel and the doctor in background threads (on MASTER_ADDR, port
MASTER_PORT + 1 unless `store="HOST:PORT"` is given, or any free port when that one is taken: the
other ranks read the port from the job's own store) and prints findings on its stderr.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["install"]


def install(stall_timeout: Optional[float] = None, every: Optional[int] = None, store: Optional[str] = None,
            on_stall: Optional[str] = None) -> None:
    from ddpdoctor.guard.inprocess import install as _install

    _install(stall_timeout=stall_timeout, every=every, store=store, on_stall=on_stall)

