"""Start Horovod ranks through Horovod's own runner (`horovod.runner.run`, gloo controller, all
slots on localhost) and bring back what they left, as `launch.py` does for torch.

Horovod's collectives have no timeout, so the verdicts travel through a TCPStore the parent
hosts on loopback (the ranks' `exchange` is the same as under torch): a hung or dead rank is named
by the store's timeouts, never waited for inside a collective.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from datetime import timedelta
from typing import Any, Iterator

from ddpdoctor.probe.budgets import overall_deadline, phase_budgets
from ddpdoctor.probe.config import RankConfig
from ddpdoctor.probe.launch import one_line
from ddpdoctor.probe.procs import Watchdog, interruptible, kill_descendants, read_rank_files
from ddpdoctor.probe.rendezvous import LOOPBACK, bound_store
from ddpdoctor.probe.results import LaunchOutcome


def launch_horovod(config: RankConfig, nproc: int, grace_s: float) -> LaunchOutcome:
    from horovod.runner import run as horovod_run

    from ddpdoctor.probe.hvd_worker import horovod_entry

    quiet_resource_tracker()
    out_dir = tempfile.mkdtemp(prefix="ddpdoctor-probe-")
    outcome = LaunchOutcome(out_dir=out_dir)
    store = bound_store(LOOPBACK, 0, world_size=nproc + 1, timeout=timedelta(seconds=config.join_timeout),
                        wait_for_workers=False)
    config = config.with_(out_dir=out_dir, report=False, store_addr=LOOPBACK, store_port=int(store.port))
    watchdog = Watchdog(out_dir, overall_deadline(config), outcome, grace_s, phase_budgets(config, nproc))
    watchdog.start()
    started = time.monotonic()
    outcome.started_at = time.time()
    chatter = io.StringIO()
    try:
        with interruptible(outcome), _keep_our_sigint(), _one_rank_named(), contextlib.redirect_stdout(chatter), \
                contextlib.redirect_stderr(chatter):
            horovod_run(
                horovod_entry, args=(config.to_json(),), num_proc=nproc, hosts=f"localhost:{nproc}",
                use_gloo=True, network_interfaces=["lo"], disable_cache=True,
                start_timeout=max(1, int(round(config.join_timeout))),
                # Ranks' own output goes to files (shown on failure), so --format json stays clean.
                output_filename=os.path.join(out_dir, "logs"),
            )
    except Exception as exc:  # noqa: BLE001 -- a rank failed (named from its file) or the runner could not start
        outcome.launch_error = one_line(exc)
    finally:
        outcome.elapsed_s = time.monotonic() - started
        watchdog.stop.set()
        kill_descendants(os.getpid())  # never leave a rank behind, whatever happened
    outcome.rank_files = read_rank_files(out_dir)
    outcome.failures = failures_from_files(outcome)
    runner_log = os.path.join(out_dir, "logs", "horovod-runner.txt")
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(runner_log), exist_ok=True)
        with open(runner_log, "w") as fh:
            fh.write(chatter.getvalue())
    explained = any(f.get("crashed") for f in outcome.rank_files.values()) or outcome.killed_hung_pids
    if explained and outcome.launch_error and outcome.launch_error.startswith("RuntimeError: Horovod detected"):
        # A rank ended badly and its file says which and how, which is the news.
        outcome.launch_error = None
    elif outcome.launch_error:
        # Nobody's file explains it: say what the runner saw (its own log is kept with the ranks').
        last = [line for line in chatter.getvalue().splitlines() if line.strip()]
        outcome.launch_error += f" (Horovod's runner: {last[-1].strip()[:200]}; {runner_log})" if last else f" ({runner_log})"
    del store
    return outcome


def failures_from_files(outcome: LaunchOutcome) -> dict[int, dict[str, Any]]:
    """Horovod's runner says only "a process exited non-zero"; the rank files say who: a rank that
    wrote a traceback died on its own, one killed as hung is the watchdog's, and any other that
    did not finish was stopped by the runner after the first failure."""
    failures: dict[int, dict[str, Any]] = {}
    for rank, data in outcome.rank_files.items():
        if data.get("finished") or data.get("pid") in outcome.killed_hung_pids:
            continue
        crashed = str(data.get("crashed") or "")
        info: dict[str, Any] = {"local_rank": data.get("local_rank", rank), "pid": data.get("pid", 0)}
        if crashed:
            last = [line for line in crashed.strip().splitlines() if line.strip()]
            info.update(exitcode=1, signal=None, message=last[-1].strip() if last else "", traceback=crashed)
        else:
            info.update(exitcode=-15, signal="SIGTERM", message="", traceback="")
        failures[rank] = info
    return failures


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker ourselves, told to keep quiet.

    Horovod's runner leaves semaphores behind, which the tracker unlinks when we exit -- its job --
    with a UserWarning on the user's stderr ("There appear to be 10 leaked semaphore objects").
    The tracker is a separate interpreter that takes our -W options when it starts, so start it
    now with one that silences exactly that warning."""
    import sys
    from multiprocessing import resource_tracker

    saved = list(sys.warnoptions)
    sys.warnoptions.append("ignore:resource_tracker:UserWarning")
    try:
        resource_tracker.ensure_running()
    except Exception:  # noqa: BLE001 -- only a warning is at stake
        pass
    finally:
        sys.warnoptions[:] = saved


def padded_rank(rank: int, size: int) -> str:
    """A rank's number as Horovod's gloo launcher pads it in its output files' names (`rank.03` of 12),
    for every size: Horovod 0.28.1's own `_pad_rank` takes log10(size - 1), a math domain error for a
    single rank, so `--nproc 1` failed before any rank started."""
    return str(rank).zfill(len(str(max(size - 1, 1))))


@contextlib.contextmanager
def _one_rank_named() -> Iterator[None]:
    import horovod.runner.gloo_run as gloo_run

    original = gloo_run._pad_rank
    gloo_run._pad_rank = padded_rank
    try:
        yield
    finally:
        gloo_run._pad_rank = original


@contextlib.contextmanager
def _keep_our_sigint() -> Iterator[None]:
    """Horovod's gloo launcher installs SIGINT/SIGTERM handlers that ask its threads to stop the
    ranks politely; ours (procs.interruptible) kills them at once, so keep it."""
    import horovod.runner.gloo_run as gloo_run

    original = gloo_run.register_shutdown_event

    def no_handlers() -> Any:
        import threading

        return threading.Event()

    gloo_run.register_shutdown_event = no_handlers
    try:
        yield
    finally:
        gloo_run.register_shutdown_event = original
