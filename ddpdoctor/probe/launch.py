"""Start the ranks through torch's own elastic launcher (the engine behind torchrun) and bring back
whatever they left: per-rank result files, exit codes and tracebacks.

Settings chosen for start cost: `start_method="fork"` (no re-import of torch per rank; the parent
never initialises CUDA, so forking is safe), the c10d rendezvous on an agent-chosen loopback port,
`max_restarts=0` (a probe must report a failure, not paper over it).

A watchdog thread makes sure no process is left behind: once the ranks of this node that are still
healthy have finished, a rank that is still running after a short grace period is hung, and it is
killed (and named as such); past an overall deadline everything is killed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

from ddpdoctor.probe.options import ProbeOptions, faults_to_env

# How long a still-running rank may lag behind finished ones before it counts as hung.
GRACE_S = 2.0


@dataclass
class LaunchOutcome:
    out_dir: str
    rank_files: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Global rank -> {"exitcode", "signal", "message", "traceback", "local_rank"}.
    failures: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Set when the launch itself failed (rendezvous, bad address): the probe could not run.
    launch_error: Optional[str] = None
    killed_hung_pids: set[int] = field(default_factory=set)
    deadline_hit: bool = False
    elapsed_s: float = 0.0
    started_at: float = 0.0


def run_id_for(options: ProbeOptions) -> str:
    if options.run_id:
        return options.run_id
    if options.nnodes > 1:
        # Every node must agree on the id without talking first: derive it from the endpoint.
        return "ddpdoctor-" + "".join(c if c.isalnum() else "-" for c in str(options.rdzv_endpoint))
    return f"ddpdoctor-{uuid.uuid4().hex[:12]}"


def overall_deadline(options: ProbeOptions) -> float:
    """Upper bound on a run: join, plus each check's worst case (run + exchange + decision wait)."""
    return options.join_timeout + len(options.checks) * (3 * options.timeout + 2) + 10


def _children(pid: int) -> list[int]:
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            found.append(int(name))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
        return stat[stat.rfind(")") + 2] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def read_rank_files(out_dir: str) -> dict[int, dict[str, Any]]:
    files: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(out_dir)
    except OSError:
        return files
    for name in names:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(out_dir, name)) as fh:
                    data = json.load(fh)
                files[int(data["rank"])] = data
            except (OSError, ValueError, KeyError):
                continue
    return files


class Watchdog(threading.Thread):
    def __init__(self, out_dir: str, deadline_s: float, outcome: LaunchOutcome) -> None:
        super().__init__(name="ddpdoctor-probe-watchdog", daemon=True)
        self.out_dir = out_dir
        self.deadline = time.monotonic() + deadline_s
        self.outcome = outcome
        self.stop = threading.Event()

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

    def run(self) -> None:
        first_finish: Optional[float] = None
        me = os.getpid()
        while not self.stop.wait(0.05):
            files = read_rank_files(self.out_dir)
            finished = {f["pid"] for f in files.values() if f.get("finished")}
            if finished and first_finish is None:
                first_finish = time.monotonic()
            if time.monotonic() > self.deadline:
                self.outcome.deadline_hit = True
                for pid in _children(me):
                    self.outcome.killed_hung_pids.add(pid)
                    self._kill(pid)
                return
            if first_finish is not None and time.monotonic() - first_finish > GRACE_S:
                # The others are done: anything still running on this node is hung.
                for pid in _children(me):
                    if pid not in finished and _alive(pid):
                        self.outcome.killed_hung_pids.add(pid)
                        self._kill(pid)


def launch(options: ProbeOptions, backend: str, device: str, nproc: int) -> LaunchOutcome:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ddpdoctor.probe.worker import elastic_entry

    _preimport(options.checks)
    out_dir = tempfile.mkdtemp(prefix="ddpdoctor-probe-")
    outcome = LaunchOutcome(out_dir=out_dir)
    run_id = run_id_for(options)
    config = {
        "backend": backend, "device": device, "timeout": options.timeout, "join_timeout": options.join_timeout,
        "faults": faults_to_env(options.faults), "checks": list(options.checks), "out_dir": out_dir,
        "run_id": run_id, "report": False,
    }
    if options.nnodes > 1:
        endpoint = str(options.rdzv_endpoint)
        is_host = options.node_rank == 0
    else:
        endpoint = f"{options.master_addr}:{options.master_port}"  # port 0: the agent picks a free one
        is_host = True
    timeout_s = max(1, int(round(options.join_timeout)))
    launch_config = LaunchConfig(
        min_nodes=options.nnodes,
        max_nodes=options.nnodes,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        rdzv_configs={"join_timeout": timeout_s, "read_timeout": timeout_s, "is_host": is_host,
                      "last_call_timeout": 1, "close_timeout": max(1, int(options.timeout))},
        max_restarts=0,
        start_method="fork",
        monitor_interval=0.05,
        local_addr=options.master_addr if options.nnodes == 1 else None,
        # Ranks' own output goes to files (shown on failure), so --format json stays clean.
        logs_specs=DefaultLogsSpecs(log_dir=os.path.join(out_dir, "logs"), redirects=Std.ALL),
    )
    # Workers read OMP_NUM_THREADS at import time of their BLAS pools: fix it before forking.
    saved_omp = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    watchdog = Watchdog(out_dir, overall_deadline(options), outcome)
    watchdog.start()
    # The launcher's INFO/WARNING chatter ("Terminating process ... via SIGTERM") is not our output:
    # what matters from it reaches the report.
    quiet = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing", "torch.distributed.launcher")]
    saved_levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.CRITICAL)
    started = time.monotonic()
    outcome.started_at = time.time()
    try:
        with _short_exit_barrier(max(2.0, options.timeout)):
            elastic_launch(launch_config, elastic_entry)(json.dumps(config))
    except ChildFailedError as exc:
        for global_rank, failure in exc.failures.items():
            outcome.failures[int(global_rank)] = _failure_info(failure)
    except Exception as exc:  # noqa: BLE001 -- rendezvous/connection errors: the probe could not run
        outcome.launch_error = _one_line(exc)
    except KeyboardInterrupt:
        outcome.launch_error = "interrupted"
    finally:
        outcome.elapsed_s = time.monotonic() - started
        watchdog.stop.set()
        for pid in _children(os.getpid()):
            if _alive(pid):  # never leave a rank behind, whatever happened
                os.kill(pid, signal.SIGKILL)
        for lg, level in zip(quiet, saved_levels):
            lg.setLevel(level)
        if saved_omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved_omp
    outcome.rank_files = read_rank_files(out_dir)
    return outcome


@contextlib.contextmanager
def _short_exit_barrier(seconds: float) -> Iterator[None]:
    """Bound the agent's exit barrier, which otherwise waits 300 s for the other nodes' agents.

    When a node dies the survivors' ranks report it within their timeouts, but their agent would then
    sit in that barrier for five minutes before the verdict could be printed. `launch_agent` builds a
    `LocalElasticAgent` with no way to pass `exit_barrier_timeout`, so for the duration of our launch
    the name it looks up is a subclass that sets it (a no-op should the attribute ever be renamed).
    """
    import torch.distributed.launcher.api as launcher_api

    base = launcher_api.LocalElasticAgent

    class _ProbeAgent(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._exit_barrier_timeout = seconds

    launcher_api.LocalElasticAgent = _ProbeAgent
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = base


def _preimport(checks: tuple[str, ...]) -> None:
    """Import, once in the parent, what the ranks would otherwise each import after the fork.

    DDP's constructor pulls in torch._dynamo (and sympy with it): about a second per process. Paid
    once here, every forked rank inherits it; paid in N ranks sharing a few cores, it costs N times
    as much. Done in this thread, before forking, because forking while another thread holds the
    import lock would deadlock the child.
    """
    if "param-sync" in checks or "ddp-parity" in checks:
        import torch._dynamo  # noqa: F401
        import torch.nn.parallel  # noqa: F401


def _one_line(exc: BaseException) -> str:
    parts = [f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"]
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip():
        parts.append(f"caused by {type(cause).__name__}: {str(cause).strip().splitlines()[0]}")
    return "; ".join(parts)[:400]


def _failure_info(failure: Any) -> dict[str, Any]:
    exitcode = int(failure.exitcode)
    sig = None
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode).name
        except ValueError:
            sig = f"signal {-exitcode}"
    data = failure.error_file_data if isinstance(getattr(failure, "error_file_data", None), dict) else {}
    message = data.get("message") if data else None
    tb = ""
    if isinstance(message, dict):
        tb = str(message.get("extraInfo", {}).get("py_callstack", ""))
        message = message.get("message")
    return {
        "local_rank": int(failure.local_rank),
        "pid": int(failure.pid),
        "exitcode": exitcode,
        "signal": sig,
        "message": str(message or failure.message or "")[:2000],
        "traceback": tb[-4000:],
    }
