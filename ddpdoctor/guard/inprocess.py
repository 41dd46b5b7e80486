"""`guard.install()`: the guard without the `guard` command.

Under `ddpdoctor guard` the options come from the environment and this only makes sure the hooks
are in place. Alone, rank 0 hosts the side channel and the doctor in daemon threads and prints
findings on its own stderr; a stall stops every rank through the side channel.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any, Optional

from ddpdoctor.guard.options import ENV, SECRET_ENV, GuardOptions

_host: Optional[Any] = None
# Where rank 0 publishes the side channel's port in the job's store, and how long the others wait
# for it: rank 0 publishes right after its own init_process_group returns.
PORT_KEY = "ddpdoctor/guard/side-channel-port"
SECRET_KEY = "ddpdoctor/guard/side-channel-secret"
PORT_WAIT_S = 60.0


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


def meet_rank0(options: GuardOptions, rank: int) -> Optional[GuardOptions]:
    """In-code use, right after init_process_group: rank 0 opens the side channel and publishes its
    port in the job's own store; every other rank reads it there. None: this rank runs unguarded.

    The configured port (MASTER_PORT + 1, or `store=`) is only rank 0's first choice. Anything may
    hold it, an ephemeral port of one of the job's own connections included, and then the others
    could only be refused and the job would run unguarded into the hang it was meant to diagnose;
    with the port in the store, rank 0 takes any free one instead.
    """
    store = _job_store()
    if rank == 0:
        # The secret the other ranks must show: drawn here, handed over through the job's own store
        # (or DDPDOCTOR_GUARD_SECRET, set by the user on every rank, when there is no store).
        secret = os.environ.get(SECRET_ENV) or (secrets.token_hex(16) if store is not None else "")
        try:
            port = host_doctor(replace(options, secret=secret), any_port=store is not None) if secret else 0
        except OSError as error:
            sys.stderr.write(f"ddpdoctor guard: rank 0 cannot open the guard's side channel on "
                             f"{options.host}:{options.port} ({error}); running unguarded\n")
            port = 0
        if store is not None:
            store.set(SECRET_KEY, secret)
            store.set(PORT_KEY, str(port))  # 0 tells the others to run unguarded without waiting
        return replace(options, port=port, secret=secret) if port else None
    if store is None:
        secret = os.environ.get(SECRET_ENV, "")
        return replace(options, secret=secret) if secret else None
    try:
        store.wait([PORT_KEY], timedelta(seconds=PORT_WAIT_S))
        port = int(store.get(PORT_KEY))
        secret = store.get(SECRET_KEY).decode() if port else ""
    except Exception as error:  # noqa: BLE001 - never break the user's job
        sys.stderr.write(f"ddpdoctor guard: rank {rank} did not hear from the guard on rank 0 ({error}); "
                         f"running unguarded\n")
        return None
    return replace(options, port=port, secret=secret) if port else None


def _job_store() -> Optional[Any]:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # noqa: BLE001 - an older or newer torch without it: the configured port
        return None


def host_doctor(options: GuardOptions, any_port: bool = False) -> int:
    """In rank 0: the side channel, the doctor, and a thread that ticks it. Returns the port it
    listens on; `any_port`: when the configured port is taken, listen on a free one."""
    global _host
    if _host is not None:
        return int(_host[0].address[1])
    from ddpdoctor.guard.doctor import Doctor
    from ddpdoctor.guard.report import Printer
    from ddpdoctor.guard.server import SideChannel

    try:
        channel = SideChannel(options.host, options.port, options.secret)
    except OSError:
        if not any_port:
            raise
        channel = SideChannel(options.host, 0, options.secret)
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
    return int(channel.address[1])
