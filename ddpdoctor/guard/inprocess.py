"""`guard.install()`: the guard without the `guard` command.

Under `ddpdoctor guard` the options come from the environment and this only makes sure the hooks
are in place. Alone, rank 0 hosts the side channel and the doctor in daemon threads and prints
findings on its own stderr; a stall stops every rank through the side channel.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Optional

from ddpdoctor.guard.options import ENV, GuardOptions

_host: Optional[Any] = None


def install(stall_timeout: Optional[float] = None, every: Optional[int] = None, store: Optional[str] = None,
            on_stall: Optional[str] = None) -> None:
    from ddpdoctor.guard.launch_args import parse_address

    options = GuardOptions.from_env()
    if options is None:
        if store:
            host, port = parse_address(store)
        else:
            host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            port = int(os.environ.get("MASTER_PORT", "29500")) + 1
        options = GuardOptions(host=host, port=port, rank0_hosts=True)
    changes: dict[str, Any] = {k: v for k, v in (("stall_timeout", stall_timeout), ("every", every),
                                                 ("on_stall", on_stall)) if v is not None}
    options = replace(options, **changes)
    os.environ[ENV] = options.to_env()

    from ddpdoctor.guard.hooks import watch_torch_distributed

    watch_torch_distributed()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from ddpdoctor.guard import patches, rank

        patches.patch_collectives(dist)
        rank.start(options)


def host_doctor(options: GuardOptions) -> None:
    """In rank 0: the side channel, the doctor, and a thread that ticks it."""
    global _host
    if _host is not None:
        return
    from ddpdoctor.guard.doctor import Doctor
    from ddpdoctor.guard.report import Printer
    from ddpdoctor.guard.server import SideChannel

    channel = SideChannel(options.host, options.port)
    doctor = Doctor(options, channel.send, Printer())
    channel.start(doctor)
    _host = (channel, doctor)

    def tick() -> None:
        stopped = False
        while True:
            time.sleep(0.25)
            doctor.tick()
            if doctor.stop_requested and not stopped:
                stopped = True
                sys.stderr.flush()
                channel.broadcast({"t": "stop", "why": doctor.stop_requested})

    threading.Thread(target=tick, name="ddpdoctor-guard-doctor", daemon=True).start()
