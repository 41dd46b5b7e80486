"""The code every rank runs: connect to the store, start the process group, run the checks, and
exchange each check's result through the store (which doubles as the heartbeat).

Launched by `ddpdoctor probe` through torch's elastic launcher (`elastic_entry`), or by an external
launcher (`torchrun --nproc-per-node 4 -m ddpdoctor.probe`, see `__main__.py`), reading the usual
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.

Each rank writes `rank-<R>.json` into the directory named by the parent (atomically, after every
step), so that the parent can still build a verdict when this rank, or rank 0, hangs or dies.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Optional

from ddpdoctor.probe import results as R
from ddpdoctor.probe.options import CHECK_NAMES, faults_from_env

OUT_DIR_ENV = "DDPDOCTOR_PROBE_OUT"
CONFIG_ENV = "DDPDOCTOR_PROBE_CONFIG"


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this rank when its launcher dies, so that no rank outlives a
    killed agent (Linux only; elsewhere the watchdog in the parent is all there is)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent already died before prctl took effect
            os._exit(1)
    except Exception:
        pass


class RankFile:
    """This rank's progress, rewritten atomically after every step."""

    def __init__(self, out_dir: Optional[str], rank: int, data: dict[str, Any]) -> None:
        self.path = os.path.join(out_dir, f"rank-{rank}.json") if out_dir else None
        self.data = data

    def update(self, **changes: Any) -> None:
        self.data.update(changes)
        if not self.path:
            return
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".rank-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.data, fh, default=str)
        os.replace(tmp, self.path)


def _connect_store(rank: int, world_size: int, join_timeout: float, prefix: str) -> Any:
    import torch.distributed as dist

    addr = os.environ["MASTER_ADDR"]
    port = int(os.environ["MASTER_PORT"])
    # Under torchelastic the agent already hosts a store at MASTER_ADDR:MASTER_PORT; otherwise (a
    # bare RANK/WORLD_SIZE launch) rank 0 hosts it, as init_method="env://" would.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    is_master = not agent_store and rank == 0
    deadline = time.monotonic() + join_timeout
    while True:
        # Short connection attempts, retried: a connect that stalls (seen rarely on an overloaded
        # host right after fork) is abandoned and tried again rather than eating the whole budget.
        attempt = max(1.0, min(3.0, deadline - time.monotonic()))
        try:
            store = dist.TCPStore(addr, port, world_size, is_master=is_master,
                                  timeout=timedelta(seconds=attempt), wait_for_workers=False)
            break
        except Exception:  # noqa: BLE001
            if is_master or time.monotonic() + 0.1 >= deadline:
                raise
            time.sleep(0.1)
    store.set_timeout(timedelta(seconds=join_timeout))
    return dist.PrefixStore(prefix, store)


def default_config() -> dict[str, Any]:
    """The configuration under an external launcher: from the environment, then argv."""
    config: dict[str, Any] = {
        "backend": "auto", "device": "auto", "timeout": 5.0, "join_timeout": 60.0,
        "faults": "", "checks": list(CHECK_NAMES), "out_dir": None, "format": "text", "report": True,
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID", "external"),
    }
    if os.environ.get(CONFIG_ENV):
        config.update(json.loads(os.environ[CONFIG_ENV]))
    if os.environ.get(OUT_DIR_ENV):
        config["out_dir"] = os.environ[OUT_DIR_ENV]
    return config


def _pick(config: dict[str, Any], local_world_size: int) -> tuple[str, str, str]:
    """Backend/device for a rank. The parent normally decided already; this handles external launches."""
    import torch

    backend, device = config["backend"], config["device"]
    if backend != "auto" and device != "auto":
        return backend, device, "as requested"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        device = "cuda" if (backend == "nccl" or (gpus >= local_world_size and gpus > 0)) else "cpu"
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    return backend, device, f"{gpus} visible GPU(s) for {local_world_size} local rank(s)"


def run_worker(config: dict[str, Any]) -> int:
    """Runs this rank; returns the probe's exit status (meaningful on rank 0)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _die_with_parent()
    # torchelastic turns SIGTERM into a Python exception, which a check would catch and report as
    # its own error -- and the rank would keep running while the launcher waits for it to stop.
    # When the launcher stops this rank (because another one failed), just stop.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import torch
    import torch.distributed as dist

    from ddpdoctor.probe import checks as check_modules
    from ddpdoctor.probe.checks.base import Context, probe_support
    from ddpdoctor.probe.exchange import exchange, missing_advice, post_crash
    from ddpdoctor.probe.faults import Faults, InjectedCrash

    torch.set_num_threads(1)  # ranks share the host's cores; oversubscription only adds noise
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    node_rank = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    timeout = float(config["timeout"])
    names = [n for n in CHECK_NAMES if n in config["checks"]]
    rank_file = RankFile(
        config.get("out_dir"), rank,
        {"rank": rank, "local_rank": local_rank, "node_rank": node_rank, "world_size": world_size,
         "pid": os.getpid(), "host": socket.gethostname(), "running": "startup", "finished": False, "records": {}, "own": {},
         # Wall-clock marks (time.time()) of the start-up phases, to see where start cost goes.
         "timeline": {"start": time.time()}},
    )
    rank_file.update()
    _wait_for_siblings(config.get("out_dir"), local_world_size)
    # If start-up stalls (store or process-group creation), leave this rank's Python stack in its
    # log: the launcher redirects stderr there and the report points at it.
    faulthandler.dump_traceback_later(timeout, repeat=False, file=sys.stderr)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = _connect_store(rank, world_size, float(config["join_timeout"]), f"ddpdoctor/{config['run_id']}/{restart}/")
    try:
        backend, device_type, why = _pick(config, local_world_size)
        if device_type == "cuda":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        ctx = Context(
            rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size,
            node_rank=node_rank, backend=backend, device=device, timeout=timeout,
            faults=Faults(faults_from_env(config.get("faults", "")), rank),
        )
        rank_file.update(backend=backend, device=str(device), pick_reason=why)
        pg_ready = False

        def start_process_group() -> None:
            """Created after the `world` check, which needs only the store: a rank that never makes it
            to start-up is then named by that check instead of surfacing as its peers' timeouts."""
            init_kwargs: dict[str, Any] = {"device_id": device} if device_type == "cuda" else {}
            dist.init_process_group(
                backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=world_size,
                timeout=timedelta(seconds=timeout), **init_kwargs,
            )
            faulthandler.cancel_dump_traceback_later()
            rank_file.data["timeline"]["process_group"] = time.time()
            ctx.unsupported = probe_support(backend, device, world_size)
            rank_file.data["timeline"]["support_probed"] = time.time()
            rank_file.update(unsupported=ctx.unsupported)

        records: dict[str, Any] = {}
        abort: Optional[str] = None
        for name in names:
            if abort:
                records[name] = R.record(name, [R.entry(r, R.SKIP, abort) for r in range(world_size)], summary=abort, status=R.SKIP)
                rank_file.data["records"][name] = records[name]
                continue
            rank_file.update(running=name)
            module = check_modules.load(name)
            started = time.perf_counter()
            try:
                if name != "world" and not pg_ready:
                    try:
                        start_process_group()
                        pg_ready = True
                    except Exception as exc:  # noqa: BLE001
                        raise RuntimeError(f"could not initialise the {backend} process group: {_first_line(exc)}") from exc
                mine = module.run(ctx)
            except InjectedCrash:
                raise  # the self-test wants this rank really dead
            except Exception as exc:  # noqa: BLE001 -- report it, attributed to this rank
                mine = R.entry(rank, R.ERROR, f"{type(exc).__name__}: {_first_line(exc)}"[:300],
                               traceback=traceback.format_exc()[-4000:])
            mine["detail"]["seconds"] = round(time.perf_counter() - started, 4)
            rank_file.data["own"][name] = mine
            rank_file.update()
            judge = getattr(module, "judge", None) or _plain_judge(name, getattr(module, "ADVICE", ""))
            rec, missing = exchange(store, name, rank, world_size, mine, timeout, _safe_judge(name, judge))
            if missing:
                rec["advice"] = rec.get("advice") or missing_advice(missing) or ""
                rec["status"] = R.FAIL
                # The missing ranks are the news; the others' errors are usually just waiting on them.
                gone = next(e for e in rec["ranks"] if e["rank"] == missing[0])
                rec["summary"] = f"{R.format_ranks(missing)}: {gone['message']}"
                abort = f"not run: {R.format_ranks(missing)} stopped responding during {name}"
            elif rec["status"] == R.ERROR:
                # A rank raised mid-sequence: the process group may be out of step, so stop here.
                abort = f"not run: {name} raised on {R.format_ranks(R.ranks_with(rec, R.ERROR))}"
            records[name] = rec
            rank_file.data["records"][name] = rec
            rank_file.update()
        rank_file.data["timeline"]["checks_done"] = time.time()
        rank_file.update(running=None, finished=True)
        _finish(store, rank, world_size, timeout, records, abort is not None)
        if abort is None and pg_ready:
            dist.destroy_process_group()
        if rank == 0 and config.get("report"):
            from ddpdoctor.probe.report import emit_worker_report

            return emit_worker_report(records, backend, str(device), config.get("format", "text"))
        return R.exit_code(records.values())
    except BaseException:
        text = traceback.format_exc()
        post_crash(store, rank, text)
        rank_file.update(crashed=text[-4000:])
        raise


def _wait_for_siblings(out_dir: Optional[str], local_world_size: int, limit_s: float = 2.0) -> None:
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _plain_judge(name: str, advice: str) -> Any:
    from ddpdoctor.probe.checks.base import default_judge

    return default_judge(name, advice)


def _safe_judge(name: str, judge: Any) -> Any:
    def wrapped(entries: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            return judge(entries)
        except Exception as exc:  # noqa: BLE001 -- a judge bug must not lose the entries
            rec = R.record(name, entries, summary=f"could not judge: {type(exc).__name__}: {exc}", status=R.ERROR)
            return rec

    return wrapped


def _finish(store: Any, rank: int, world_size: int, timeout: float, records: dict[str, Any], aborted: bool) -> None:
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


def elastic_entry(config_json: str) -> int:
    """The function `elastic_launch` forks into on every local rank."""
    return run_worker(json.loads(config_json))


def main(argv: Optional[list[str]] = None) -> None:
    """`python -m ddpdoctor.probe` under an external launcher (torchrun, SLURM srun with env set)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ddpdoctor.probe", description="ddpdoctor probe worker (one rank)")
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default=None)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--inject-fault", action="append", default=[])
    parser.add_argument("--checks", default=None)
    parser.add_argument("--format", choices=("text", "json"), default=None)
    args = parser.parse_args(argv)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            print(f"ddpdoctor.probe: {var} is not set; run under a launcher (torchrun --nproc-per-node N -m ddpdoctor.probe) "
                  "or use `ddpdoctor probe --nproc N`", file=sys.stderr)
            sys.exit(R.EXIT_COULD_NOT_RUN)
    from ddpdoctor.probe.options import OptionError, parse_checks, parse_faults, faults_to_env

    config = default_config()
    try:
        for key in ("backend", "device", "timeout", "format"):
            if getattr(args, key) is not None:
                config[key] = getattr(args, key)
        if args.inject_fault:
            config["faults"] = faults_to_env(parse_faults(args.inject_fault))
        if args.checks:
            config["checks"] = list(parse_checks(args.checks))
    except OptionError as exc:
        print(f"ddpdoctor.probe: {exc}", file=sys.stderr)
        sys.exit(R.EXIT_COULD_NOT_RUN)
    sys.exit(run_worker(config))
