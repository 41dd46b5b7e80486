"""The parent's hold on its ranks, whichever launcher started them: find them, read what they
left, kill the hung ones, and make sure none outlives the run -- including on Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Iterator, Optional

from ddpdoctor.probe.results import LaunchOutcome
from ddpdoctor.procfs import descendants, read_stat

# How long a still-running rank may lag behind finished ones before it counts as hung (scaled by
# the oversubscription: 16 ranks on 2 cores finish far apart without anyone hanging).
GRACE_S = 2.0
# The signals torch elastic may turn into its own shutdown: its defaults but SIGINT and SIGTERM,
# which stay ours (see interruptible).
SIGNALS_FOR_TORCH_ELASTIC = "SIGHUP,SIGQUIT"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    if stat is not None:
        return not stat.zombie
    try:  # no /proc here: ask the kernel whether the pid exists
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _resource_tracker_pid() -> Optional[int]:
    """multiprocessing's resource tracker (Horovod's runner starts one): a helper of this process,
    not a rank; killing it only makes Python warn at exit."""
    try:
        from multiprocessing import resource_tracker

        return getattr(resource_tracker._resource_tracker, "_pid", None)
    except Exception:  # noqa: BLE001 -- private API; without it, nothing is spared
        return None


def kill_descendants(pid: int, spare_helpers: bool = True) -> None:
    """SIGKILL every process below `pid`; `spare_helpers` keeps multiprocessing's resource tracker,
    which warns at our exit if killed mid-run -- but after an interrupted run it would warn about
    the semaphores the interrupted launcher left, so then it goes too."""
    spare = _resource_tracker_pid() if spare_helpers else None
    for child in descendants(pid):
        if child != spare and alive(child):
            kill(child)


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


class ProgressTracker:
    """When each rank last made progress, by the parent's own clock, and whether all have stopped.

    A rank rewrites its file after every step (start-up, each check's start, its result and its
    verdict), counting up `progress`. Every wait between two steps is bounded by the rank's own
    timeouts (`budgets`, per phase: ddpdoctor.probe.budgets), so a rank silent for longer than its
    phase's bound is stuck. Ranks are judged only when every running rank of this node is stuck:
    while one still progresses, its exchange names the hung peer sooner. A rank of another node
    cannot be seen from here, but a local rank's waits on remote peers are bounded all the same, so
    a silent local rank is not just waiting on a busy remote one; the overall deadline stays the
    safety net."""

    def __init__(self, budgets: dict[str, float]) -> None:
        self.budgets = budgets
        self.longest = max(budgets.values(), default=0.0)
        self._seen: dict[int, tuple[Any, float]] = {}  # pid -> (progress mark, when it last changed)

    def bound(self, phase: Any) -> float:
        """A phase this run did not announce (a rank of a newer version?) gets the longest bound."""
        return self.budgets.get(str(phase), self.longest)

    def observe(self, files: dict[int, dict[str, Any]], now: float) -> None:
        for data in files.values():
            pid = data.get("pid")
            if not isinstance(pid, int):
                continue
            mark = (data.get("progress"), data.get("running"))
            last = self._seen.get(pid)
            if last is None or last[0] != mark:
                self._seen[pid] = (mark, now)

    def stalled(self, files: dict[int, dict[str, Any]], now: float,
                is_alive: Callable[[int], bool] = alive) -> dict[int, float]:
        """pid -> its phase's bound, for every running rank, once each has gone without progress
        for longer than that bound; empty while any running rank is within its bound."""
        out: dict[int, float] = {}
        for data in files.values():
            pid = data.get("pid")
            if data.get("finished") or not isinstance(pid, int) or pid not in self._seen or not is_alive(pid):
                continue
            limit = self.bound(data.get("running"))
            if now - self._seen[pid][1] <= limit:
                return {}
            out[pid] = limit
        return out


class Watchdog(threading.Thread):
    """Kills ranks that are still running `grace_s` after another rank of this node finished (they
    are hung), all running ranks when none has made progress within its phase's budget (nobody is
    left to report them: one rank, or every rank stuck at once), and everything once the overall
    deadline passes."""

    def __init__(self, out_dir: str, deadline_s: float, outcome: LaunchOutcome, grace_s: float = GRACE_S,
                 budgets: Optional[dict[str, float]] = None) -> None:
        super().__init__(name="ddpdoctor-probe-watchdog", daemon=True)
        self.out_dir = out_dir
        self.deadline = time.monotonic() + deadline_s
        self.outcome = outcome
        self.grace_s = grace_s
        self.progress = ProgressTracker(budgets) if budgets else None
        self.stop = threading.Event()

    def run(self) -> None:
        first_finish: Optional[float] = None
        me = os.getpid()
        while not self.stop.wait(0.05):
            files = read_rank_files(self.out_dir)
            now = time.monotonic()
            finished = {f["pid"] for f in files.values() if f.get("finished")}
            ranks = {f["pid"] for f in files.values()}
            if finished and first_finish is None:
                first_finish = now
            if now > self.deadline:
                self.outcome.deadline_hit = True
                for pid in descendants(me):
                    if pid in ranks:
                        self.outcome.killed_hung_pids.add(pid)
                    kill(pid)
                return
            if first_finish is not None and now - first_finish > self.grace_s:
                # The others are done: a rank of this node still running is hung.
                for pid in ranks - finished:
                    if alive(pid):
                        self.outcome.killed_hung_pids.add(pid)
                        kill(pid)
            if self.progress is not None:
                self.progress.observe(files, now)
                # Once a rank has finished, the rule above names the others sooner.
                stalled = self.progress.stalled(files, now) if not finished else {}
                for pid, bound in stalled.items():
                    self.outcome.killed_hung_pids.add(pid)
                    self.outcome.stalled_pids[pid] = bound
                    kill(pid)


@contextlib.contextmanager
def interruptible(outcome: LaunchOutcome) -> Iterator[None]:
    """Ctrl-C (SIGINT) or SIGTERM kills every process below us at once and ends the launch as
    interrupted (outcome.stop_signal says which).

    torch elastic would turn these into its own shutdown, which asks the ranks to stop, waits up to
    30 s for them and then reports the survivors' verdicts as if the run had ended; its handlers are
    kept off them (TORCHELASTIC_SIGNALS_TO_HANDLE) so ours stay in place for the whole launch."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    me = os.getpid()

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        outcome.interrupted = True
        outcome.stop_signal = signal.Signals(signum).name
        kill_descendants(me, spare_helpers=False)
        raise KeyboardInterrupt

    saved_handlers = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    saved_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = SIGNALS_FOR_TORCH_ELASTIC
    try:
        yield
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)
        if saved_env is None:
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        else:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = saved_env
        if outcome.interrupted:
            kill_descendants(me, spare_helpers=False)
