"""Start torch ranks through torch's own elastic launcher (the engine behind torchrun) and bring
back whatever they left: per-rank result files, exit codes and tracebacks.

Settings chosen for start cost: `start_method="fork"` (no re-import of torch per rank; the parent
never initialises CUDA, so forking is safe), the c10d rendezvous on an agent-chosen loopback port,
`max_restarts=0` (a probe must report a failure, not paper over it).

A watchdog (ddpdoctor.probe.procs) makes sure no process is left behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import signal
import tempfile
import time
import uuid
from typing import Any, Iterator

from ddpdoctor.probe.budgets import overall_deadline, phase_budgets
from ddpdoctor.probe.config import RankConfig
from ddpdoctor.probe.procs import SIGNALS_FOR_TORCH_ELASTIC, Watchdog, alive, interruptible, read_rank_files
from ddpdoctor.procfs import children
from ddpdoctor.probe.registry import checks_for
from ddpdoctor.probe.rendezvous import stores_bound_to
from ddpdoctor.probe.results import LaunchOutcome, clip_traceback


# The variables that choose the interface each backend's own sockets listen on: gloo's pairs, and
# NCCL's bootstrap (and socket transport, unused between GPUs of one node, which talk over P2P/SHM).
TRANSPORT_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def loopback_transport(bind_addr: "str | None", nnodes: int) -> dict[str, str]:
    """On one node whose rendezvous is on loopback, the backends' own listening sockets go there too
    (gloo would otherwise listen on the address the host name resolves to, often the LAN's, and
    NCCL's bootstrap on the first interface it likes); a variable the user set wins."""
    if nnodes != 1 or bind_addr is None:
        return {}
    try:
        if not ipaddress.ip_address(bind_addr).is_loopback:
            return {}
        names = {name for _, name in socket.if_nameindex()}
    except (ValueError, OSError, AttributeError):
        return {}
    if "lo" not in names:
        return {}
    return {name: "lo" for name in TRANSPORT_INTERFACE_VARIABLES if name not in os.environ}


def run_id_for(run_id: "str | None", nnodes: int, rdzv_endpoint: "str | None") -> str:
    if run_id:
        return run_id
    if nnodes > 1:
        # Every node must agree on the id without talking first: derive it from the endpoint.
        return "ddpdoctor-" + "".join(c if c.isalnum() else "-" for c in str(rdzv_endpoint))
    return f"ddpdoctor-{uuid.uuid4().hex[:12]}"


def launch(config: RankConfig, nproc: int, nnodes: int, node_rank: int, endpoint: str, local_addr: "str | None",
           grace_s: float, bind_addr: "str | None" = None, verbose: bool = False) -> LaunchOutcome:
    """`bind_addr`: where the stores this node hosts listen (None: torch's own choice, every
    interface); `verbose` lets torch elastic's own log through."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ddpdoctor.probe.worker import elastic_entry

    preimport(config)
    # torch's LaunchConfig asks torch.cuda.is_available(), which (unless told to count GPUs through
    # NVML) registers CUDA's fork poisoning: every forked rank then fails at its first CUDA call with
    # "Cannot re-initialize CUDA in forked subprocess" (found by scripts/gpu-check on an H100).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    out_dir = tempfile.mkdtemp(prefix="ddpdoctor-probe-")
    outcome = LaunchOutcome(out_dir=out_dir)
    config = config.with_(out_dir=out_dir, report=False)
    timeout_s = max(1, int(round(config.join_timeout)))
    extra: dict[str, Any] = {}
    if "signals_to_handle" in getattr(LaunchConfig, "__dataclass_fields__", {}):
        # SIGINT stays ours (procs.interruptible); older torch reads the variable that sets.
        extra["signals_to_handle"] = SIGNALS_FOR_TORCH_ELASTIC
    launch_config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc,
        run_id=config.run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        rdzv_configs={"join_timeout": timeout_s, "read_timeout": timeout_s, "is_host": nnodes == 1 or node_rank == 0,
                      "last_call_timeout": 1, "close_timeout": max(1, int(config.timeout))},
        max_restarts=0,
        start_method="fork",
        monitor_interval=0.05,
        local_addr=local_addr,
        # Ranks' own output goes to files (shown on failure), so --format json stays clean.
        logs_specs=DefaultLogsSpecs(log_dir=os.path.join(out_dir, "logs"), redirects=Std.ALL),
        **extra,
    )
    # Workers read OMP_NUM_THREADS at import time of their BLAS pools: fix it before forking.
    rank_environment = {"OMP_NUM_THREADS": "1", **loopback_transport(bind_addr, nnodes)}
    saved_environment = {name: os.environ.get(name) for name in rank_environment}
    os.environ.update(rank_environment)
    watchdog = Watchdog(out_dir, overall_deadline(config, nproc * nnodes), outcome, grace_s,
                        phase_budgets(config, nproc * nnodes))
    watchdog.start()
    # The launcher's INFO/WARNING chatter ("Terminating process ... via SIGTERM") is not our output:
    # what matters from it reaches the report.
    quiet = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing", "torch.distributed.launcher")]
    saved_levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.INFO if verbose else logging.CRITICAL)
    started = time.monotonic()
    outcome.started_at = time.time()
    try:
        with interruptible(outcome), _short_exit_barrier(max(2.0, config.timeout)), stores_bound_to(bind_addr):
            elastic_launch(launch_config, elastic_entry)(config.to_json())
    except ChildFailedError as exc:
        for global_rank, failure in exc.failures.items():
            outcome.failures[int(global_rank)] = _failure_info(failure)
    except RendezvousTimeoutError:
        # torch says nothing more than the class name; say who is missing and what to do.
        outcome.launch_error = (
            f"the other node(s) did not join the rendezvous at {endpoint} within --join-timeout "
            f"{config.join_timeout:g}s: start `ddpdoctor probe` on every node (--node-rank 0..{nnodes - 1}) with "
            "the same --nnodes and --rdzv-endpoint"
        )
    except Exception as exc:  # noqa: BLE001 -- rendezvous/connection errors: the probe could not run
        outcome.launch_error = one_line(exc)
    finally:
        outcome.elapsed_s = time.monotonic() - started
        watchdog.stop.set()
        for pid in children(os.getpid()):
            if alive(pid):  # never leave a rank behind, whatever happened
                os.kill(pid, signal.SIGKILL)
        for lg, level in zip(quiet, saved_levels):
            lg.setLevel(level)
        for name, value in saved_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
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

    setattr(launcher_api, "LocalElasticAgent", _ProbeAgent)
    try:
        yield
    finally:
        setattr(launcher_api, "LocalElasticAgent", base)


def preimport(config: RankConfig) -> None:
    """Import, once in the parent, what the ranks would otherwise each import after the fork.

    DDP's constructor pulls in torch._dynamo (and sympy with it): about a second per process. Paid
    once here, every forked rank inherits it; paid in N ranks sharing a few cores, it costs N times
    as much. Done in this thread, before forking, because forking while another thread holds the
    import lock would deadlock the child.
    """
    import importlib

    for spec in checks_for(config.framework):
        if spec.name in config.checks:
            for module in spec.preimport:
                importlib.import_module(module)


def one_line(exc: BaseException) -> str:
    parts = [f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"]
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
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
        "traceback": clip_traceback(tb),
    }
