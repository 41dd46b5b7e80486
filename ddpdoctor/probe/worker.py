"""The code every rank runs, whatever the framework: connect to the store, run the registry's checks
in order, and exchange each check's result through the store (which doubles as the heartbeat).

torch ranks are forked by torch's elastic launcher (`elastic_entry`) or started by an external one
(`torchrun --nproc-per-node 4 -m ddpdoctor.probe`, see `__main__.py`); Horovod ranks by Horovod's
runner or horovodrun (`ddpdoctor.probe.hvd_worker`). What differs between them is a `Session`: how
the process group starts, which store to use, which device.

Each rank writes `rank-<R>.json` into the directory named by the parent (atomically, after every
step), so that the parent can still build a verdict when this rank, or rank 0, hangs or dies.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from ddpdoctor.probe import results as R
from ddpdoctor.probe.config import CONFIG_ENV, OUT_DIR_ENV, RankConfig
from ddpdoctor.probe.registry import CheckSpec, Judge, checks_for


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this rank when its launcher dies, so that no rank outlives a
    killed agent (Linux only; elsewhere the watchdog in the parent is all there is)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() == 1:  # the parent already died before prctl took effect
            os._exit(1)
    except Exception:  # noqa: BLE001 -- best effort
        pass


def quiet_signals() -> None:
    """SIGTERM and SIGINT end this rank at once, as their default does.

    torchelastic turns SIGTERM into a Python exception, which a check would catch and report as its
    own error while the launcher waits for the rank to stop; and a Ctrl-C that reaches every
    process of the terminal's group must not become a failed check on each rank: the parent reports
    the run as interrupted."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class RankFile:
    """This rank's progress, rewritten atomically after every step. Each write counts up
    `progress`: the parent's watchdog judges a rank stuck when that count stops moving for longer
    than its phase allows (ddpdoctor.probe.procs.ProgressTracker)."""

    def __init__(self, out_dir: Optional[str], rank: int, data: dict[str, Any]) -> None:
        self.path = os.path.join(out_dir, f"rank-{rank}.json") if out_dir else None
        self.data = data

    def update(self, **changes: Any) -> None:
        self.data.update(changes)
        self.data["progress"] = int(self.data.get("progress", 0)) + 1
        if not self.path:
            return
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".rank-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.data, fh, default=str)
        os.replace(tmp, self.path)


@dataclass(frozen=True)
class Identity:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int


class Session(Protocol):
    """What one framework contributes to a rank's run."""

    backend: str

    def context(self) -> Any:
        """The checks' Context (ddpdoctor.probe.checks.base), once the device is chosen."""

    def start(self) -> None:
        """Start the process group (or its equivalent); raise if it cannot."""

    def stop(self) -> None:
        """Tear down after a clean run."""


def run_checks(
    config: RankConfig, me: Identity, store: Any, rank_file: RankFile, session: Session, specs: tuple[CheckSpec, ...]
) -> tuple[dict[str, R.CheckRecord], bool]:
    """Runs the checks in order on this rank; returns (records, aborted)."""
    from ddpdoctor.probe.exchange import exchange, missing_advice
    from ddpdoctor.probe.faults import InjectedCrash

    records: dict[str, R.CheckRecord] = {}
    abort: Optional[str] = None
    started_group = False
    ctx = session.context()
    for spec in specs:
        if abort:
            records[spec.name] = R.skipped(spec.name, me.world_size, abort)
            rank_file.data["records"][spec.name] = records[spec.name]
            continue
        rank_file.update(running=spec.name)
        implementation = spec.implementation()
        started = time.perf_counter()
        try:
            if spec.needs_process_group and not started_group:
                try:
                    session.start()
                    started_group = True
                except Exception as exc:  # noqa: BLE001
                    raise RuntimeError(f"could not initialise the {session.backend} process group: {first_line(exc)}") from exc
                # A step of its own: creating the group and running the check each get their bound.
                rank_file.data["timeline"]["group"] = time.time()
                rank_file.update()
            mine = implementation.run(ctx)
        except InjectedCrash:
            raise  # the self-test wants this rank really dead
        except Exception as exc:  # noqa: BLE001 -- report it, attributed to this rank
            mine = R.entry(me.rank, R.ERROR, f"{type(exc).__name__}: {first_line(exc)}"[:300],
                           traceback=R.clip_traceback(traceback.format_exc()))
        mine["detail"]["seconds"] = round(time.perf_counter() - started, 4)
        rank_file.data["own"][spec.name] = mine
        rank_file.update()
        rec, missing = exchange(store, spec.name, me.rank, me.world_size, mine, config.timeout,
                                safe_judge(spec.name, implementation.judge))
        if rec["status"] in (R.FAIL, R.ERROR) and not rec.get("advice"):
            rec["advice"] = spec.advice
        if missing:
            rec["advice"] = missing_advice(missing) or rec.get("advice", "")
            rec["status"] = R.FAIL
            # The missing ranks are the news; the others' errors are usually just waiting on them.
            gone = next(e for e in rec["ranks"] if e["rank"] == missing[0])
            rec["summary"] = R.blame_line(missing, gone["message"])
            abort = f"not run: {R.format_ranks(missing)} stopped responding during {spec.name}"
        elif rec["status"] == R.ERROR:
            # A rank raised mid-sequence: the process group may be out of step, so stop here.
            abort = f"not run: {spec.name} raised on {R.format_ranks(R.ranks_with(rec, R.ERROR))}"
        records[spec.name] = rec
        rank_file.data["records"][spec.name] = rec
        rank_file.update()
    if abort is None and started_group:
        session.stop()
    return records, abort is not None


def finish(store: Any, rank: int, world_size: int, timeout: float, aborted: bool) -> None:
    """Rank 0 waits (briefly) until the others have read its last verdict, in case it hosts the store."""
    store.set(f"done/{rank}", "1")
    if rank != 0 or aborted:
        return
    deadline = time.monotonic() + timeout
    pending = set(range(1, world_size))
    while pending and time.monotonic() < deadline:
        pending = {r for r in pending if not store.check([f"done/{r}"])}
        if pending:
            time.sleep(0.01)


def wait_for_siblings(out_dir: Optional[str], local_world_size: int, limit_s: float = 2.0) -> None:
    """Do not touch the network until every local rank has been forked.

    The launcher forks the ranks one after another from a parent whose store-server thread is busy
    serving the ranks forked first; a child forked while that thread holds an internal lock inherits
    the lock held and deadlocks in its own TCPStore constructor (seen about once in 40 runs, always
    on the last local rank). Each rank writes its file right after the fork, so once all of this
    node's files exist, forking is over and connecting is safe.
    """
    if not out_dir:
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            count = sum(1 for n in os.listdir(out_dir) if n.startswith("rank-") and n.endswith(".json"))
        except OSError:
            return
        if count >= local_world_size:
            return
        time.sleep(0.002)


def new_rank_file(config: RankConfig, me: Identity) -> RankFile:
    rank_file = RankFile(
        config.out_dir, me.rank,
        {"rank": me.rank, "local_rank": me.local_rank, "node_rank": me.node_rank, "world_size": me.world_size,
         "pid": os.getpid(), "host": socket.gethostname(), "running": "startup", "finished": False,
         "records": {}, "own": {},
         # Wall-clock marks (time.time()) of the start-up phases, to see where start cost goes.
         "timeline": {"start": time.time()}},
    )
    rank_file.update()
    return rank_file


def run_rank(
    config: RankConfig, me: Identity, connect: Callable[[], Any], make_session: Callable[[Any], Session]
) -> int:
    """The whole life of one rank; returns the probe's exit status (meaningful on rank 0)."""
    from ddpdoctor.probe import stall
    from ddpdoctor.probe.exchange import post_crash

    rank_file = new_rank_file(config, me)
    wait_for_siblings(config.out_dir, me.local_world_size)
    # If start-up stalls (store, join or process-group creation), leave this rank's Python stacks
    # in its log: the launcher redirects stderr there and the report points at it.
    stall.arm(stall.startup_budget(config.timeout, config.join_timeout))
    store = connect()
    try:
        session = make_session(store)
        rank_file.update(backend=session.backend)
        join(store, me, config.join_timeout)
        specs = tuple(s for s in checks_for(config.framework) if s.name in config.checks)
        records, aborted = run_checks(config, me, store, rank_file, session, specs)
        rank_file.data["timeline"]["checks_done"] = time.time()
        rank_file.update(running=None, finished=True)
        finish(store, me.rank, me.world_size, config.timeout, aborted)
        if me.rank == 0 and config.report:
            from ddpdoctor.probe.report import emit_worker_report

            return emit_worker_report(list(records.values()), session.backend, str(session.context().device),
                                      me.world_size, config.output_format, config.framework)
        return R.exit_code(records.values())
    except BaseException:
        text = traceback.format_exc()
        post_crash(store, me.rank, text)
        rank_file.update(crashed=R.clip_traceback(text))
        raise
    finally:
        stall.disarm()  # checks that need no process group never reach the session's start


def join(store: Any, me: Identity, join_timeout: float) -> None:
    """Wait (up to the join timeout) until every rank has started, before the first check's
    timeout starts counting: ranks that start slowly (spawned ranks import torch themselves, and
    16 ranks on 2 cores take turns) are late, not hung. A rank that never joins is named by the
    first check."""
    from datetime import timedelta

    store.set(f"joined/{me.rank}", "1")
    try:
        store.wait([f"joined/{r}" for r in range(me.world_size)], timedelta(seconds=join_timeout))
    except Exception:  # noqa: BLE001 -- the store reports a timeout as an error
        pass


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def safe_judge(name: str, judge: Judge) -> Judge:
    def wrapped(entries: list[R.RankEntry]) -> R.CheckRecord:
        try:
            return judge(entries)
        except Exception as exc:  # noqa: BLE001 -- a judge bug must not lose the entries
            return R.record(name, entries, summary=f"could not judge: {type(exc).__name__}: {exc}", status=R.ERROR)

    return wrapped


# ------------------------------------------------------------------------------ torch.distributed


def connect_torch_store(rank: int, world_size: int, join_timeout: float, prefix: str) -> Any:
    addr = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    # Under torchelastic the agent already hosts a store at MASTER_ADDR:MASTER_PORT; otherwise (a
    # bare RANK/WORLD_SIZE launch) rank 0 hosts it, as init_method="env://" would.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return connect_store(addr, port, world_size, not agent_store and rank == 0, join_timeout, prefix)


def connect_store(addr: str, port: int, world_size: int, is_master: bool, join_timeout: float, prefix: str) -> Any:
    from datetime import timedelta

    import torch.distributed as dist

    from ddpdoctor.probe.options import OptionError, resolve_local_address
    from ddpdoctor.probe.rendezvous import bound_store

    bind_to: Optional[str] = None
    if is_master:
        # Rank 0 hosting the store (a bare RANK/WORLD_SIZE launch): listen on MASTER_ADDR only, as
        # the probe's own launch does, not on every interface.
        try:
            bind_to = resolve_local_address(addr)
        except OptionError:
            bind_to = None  # not an address of this host as far as we can tell: torch's own choice
    deadline = time.monotonic() + join_timeout
    while True:
        # Short connection attempts, retried: a connect that stalls (seen rarely on an overloaded
        # host right after fork) is abandoned and tried again rather than eating the whole budget.
        attempt = max(1.0, min(3.0, deadline - time.monotonic()))
        options: dict[str, Any] = {"world_size": world_size, "timeout": timedelta(seconds=attempt),
                                   "wait_for_workers": False}
        try:
            if is_master and bind_to is not None:
                store = bound_store(bind_to, port, **options)
            else:
                store = dist.TCPStore(addr, port, is_master=is_master, **options)
            break
        except Exception:  # noqa: BLE001
            if is_master or time.monotonic() + 0.1 >= deadline:
                raise
            time.sleep(0.1)
    store.set_timeout(timedelta(seconds=join_timeout))
    return dist.PrefixStore(prefix, store)


def pick(config: RankConfig, local_world_size: int) -> tuple[str, str, str]:
    """Backend/device for a rank. The parent normally decided already; this handles external launches."""
    import torch

    backend, device = config.backend, config.device
    if backend != "auto" and device != "auto":
        return backend, device, "as requested"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if (backend == "nccl" or (gpus >= local_world_size and gpus > 0)) else "cpu"
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    return backend, device, f"{gpus} visible GPU(s) for {local_world_size} local rank(s)"


class TorchSession:
    """torch.distributed: the process group starts after the `world` check, which needs only the
    store, so that a rank that never gets that far is named by it instead of surfacing as its
    peers' timeouts."""

    def __init__(self, config: RankConfig, me: Identity, store: Any) -> None:
        import torch

        from ddpdoctor.probe.checks.base import Context
        from ddpdoctor.probe.faults import Faults

        torch.set_num_threads(1)  # ranks share the host's cores; oversubscription only adds noise
        self.backend, device_type, _why = pick(config, me.local_world_size)
        if device_type == "cuda":
            torch.cuda.set_device(me.local_rank)
            device = torch.device("cuda", me.local_rank)
        else:
            device = torch.device("cpu")
        self.store = store
        self.me = me
        self._ctx = Context(
            rank=me.rank, world_size=me.world_size, local_rank=me.local_rank, local_world_size=me.local_world_size,
            node_rank=me.node_rank, backend=self.backend, device=device, timeout=config.timeout,
            faults=Faults(config.faults, me.rank), link_bytes=config.link_bytes,
        )

    def context(self) -> Any:
        return self._ctx

    def start(self) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        from ddpdoctor.probe import stall
        from ddpdoctor.probe.checks.base import probe_support

        device = self._ctx.device
        init_kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(
            self.backend, store=dist.PrefixStore("pg/", self.store), rank=self.me.rank,
            world_size=self.me.world_size, timeout=timedelta(seconds=self._ctx.timeout), **init_kwargs,
        )
        stall.disarm()
        self._ctx.unsupported = probe_support(self.backend, device, self.me.world_size)

    def stop(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def torch_identity() -> Identity:
    return Identity(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        node_rank=int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))),
    )


def run_torch_rank(config: RankConfig) -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    die_with_parent()
    quiet_signals()
    me = torch_identity()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return run_rank(
        config, me,
        connect=lambda: connect_torch_store(me.rank, me.world_size, config.join_timeout,
                                            f"ddpdoctor/{config.run_id}/{restart}/"),
        make_session=lambda store: TorchSession(config, me, store),
    )


def elastic_entry(config_json: str) -> int:
    """The function `elastic_launch` forks into on every local rank."""
    return run_torch_rank(RankConfig.from_json(config_json))


# ------------------------------------------------------------------------------ external launchers


def config_from_environment() -> RankConfig:
    """The configuration under an external launcher: from the environment (argv is applied on top)."""
    config = RankConfig(run_id=os.environ.get("TORCHELASTIC_RUN_ID", "external"))
    if os.environ.get(CONFIG_ENV):
        config = RankConfig.from_dict({**json.loads(config.to_json()), **json.loads(os.environ[CONFIG_ENV])})
    if os.environ.get(OUT_DIR_ENV):
        config = config.with_(out_dir=os.environ[OUT_DIR_ENV])
    return config
