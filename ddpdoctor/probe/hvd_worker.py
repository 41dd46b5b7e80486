"""A Horovod rank: started by Horovod's runner under `ddpdoctor probe --framework horovod`
(`horovod_entry`), or by an external `horovodrun ... python -m ddpdoctor.probe --framework horovod`
(`external_horovod_rank`). It runs the same loop as a torch rank (ddpdoctor.probe.worker) with a
Horovod session: hvd.init() for the process group, the parent's TCPStore (or rank 0's) for the
verdicts, CPU tensors over gloo.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

from ddpdoctor.probe.config import RankConfig
from ddpdoctor.probe.worker import Identity, connect_store, die_with_parent, quiet_signals, run_rank

BACKEND = "horovod-gloo"
# Every dtype horovod.torch takes on CPU, plus bfloat16, which 0.28.1 refuses (reported as a skip).
DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def identity_from_env() -> Identity:
    """Horovod's launchers set these before the process starts, so the rank is known before hvd.init()."""
    return Identity(
        rank=int(os.environ["HOROVOD_RANK"]),
        world_size=int(os.environ["HOROVOD_SIZE"]),
        local_rank=int(os.environ.get("HOROVOD_LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("HOROVOD_LOCAL_SIZE", "1")),
        node_rank=int(os.environ.get("HOROVOD_CROSS_RANK", "0")),
    )


def probe_dtypes(hvd: Any) -> dict[str, str]:
    """dtype -> why Horovod refuses it. Horovod checks the dtype when the op is enqueued, on every
    rank alike, so a refusal is local and the ranks stay in step."""
    import torch

    unsupported: dict[str, str] = {}
    for name in DTYPES:
        try:
            hvd.allreduce(torch.ones(1, dtype=getattr(torch, name)), op=hvd.Sum, name=f"ddpdoctor.support.{name}")
        except Exception as exc:  # noqa: BLE001 -- any refusal means "not supported here"
            text = str(exc).strip().splitlines()
            unsupported[name] = f"Horovod refused {name} allreduce: {type(exc).__name__}: {text[0] if text else ''}"[:200]
    return unsupported


class HorovodSession:
    backend = BACKEND

    def __init__(self, config: RankConfig, me: Identity, initialized: bool = False) -> None:
        import torch

        from ddpdoctor.probe.checks.base import Context
        from ddpdoctor.probe.faults import Faults

        import horovod.torch  # noqa: F401 -- imported before the ranks join, so its cost is not a check's

        torch.set_num_threads(1)  # ranks share the host's cores; oversubscription only adds noise
        self.initialized = initialized
        self._ctx = Context(
            rank=me.rank, world_size=me.world_size, local_rank=me.local_rank, local_world_size=me.local_world_size,
            node_rank=me.node_rank, backend=BACKEND, device=torch.device("cpu"), timeout=config.timeout,
            faults=Faults(config.faults, me.rank),
        )

    def context(self) -> Any:
        return self._ctx

    def start(self) -> None:
        import horovod.torch as hvd

        from ddpdoctor.probe import stall

        if not self.initialized:
            hvd.init()
            self.initialized = True
        stall.disarm()
        self._ctx.unsupported = probe_dtypes(hvd)

    def stop(self) -> None:
        import horovod.torch as hvd

        hvd.shutdown()


def horovod_entry(config_json: str) -> int:
    """What Horovod's runner starts on every slot (pickled by reference, imported in the rank)."""
    config = RankConfig.from_json(config_json)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    die_with_parent()
    quiet_signals()
    me = identity_from_env()
    assert config.store_addr is not None
    return run_rank(
        config, me,
        connect=lambda: connect_store(str(config.store_addr), config.store_port, me.world_size + 1, False,
                                      config.join_timeout, f"ddpdoctor/{config.run_id}/"),
        make_session=lambda store: HorovodSession(config, me),
    )


def external_horovod_rank(config: RankConfig) -> int:
    """Under horovodrun there is no parent of ours: rank 0 hosts the store and tells the others
    where it is through Horovod itself (hvd.broadcast_object), after hvd.init()."""
    import horovod.torch as hvd
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    quiet_signals()
    hvd.init()
    me = Identity(rank=hvd.rank(), world_size=hvd.size(), local_rank=hvd.local_rank(),
                  local_world_size=hvd.local_size(), node_rank=hvd.cross_rank())
    server = None
    where: Any = None
    if me.rank == 0:
        server = dist.TCPStore("0.0.0.0", 0, me.world_size + 1, is_master=True,
                               timeout=timedelta(seconds=config.join_timeout), wait_for_workers=False)
        host = "127.0.0.1" if hvd.local_size() == hvd.size() else socket.gethostbyname(socket.gethostname())
        where = (host, int(server.port))
    host, port = hvd.broadcast_object(where, root_rank=0, name="ddpdoctor.store")
    try:
        return run_rank(
            config, me,
            connect=lambda: connect_store(host, port, me.world_size + 1, False, config.join_timeout, "ddpdoctor/"),
            make_session=lambda store: HorovodSession(config, me, initialized=True),
        )
    finally:
        del server
