"""Every process of a guarded job, found by descent, and how they are stopped.

The guard makes itself a child subreaper (Linux): a process of the job whose parent dies (a rank
whose launcher was killed) is re-parented to the guard, not to init, so that descent from the
guard finds the whole job, torchrun's ranks in sessions of their own included. Each process is
remembered by pid and start time, so that after the guard itself is gone its supervisor still
knows them and never signals a stranger that reused a pid.

Stopping: SIGTERM (or the signal the user sent) to every process, then SIGKILL to whatever is left
once the launcher has had its own grace: `LAUNCHER_GRACE_S` (torchrun's: it signals its ranks
and waits that long before it kills them), or `AFTER_LAUNCHER_S` after the launcher has exited.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Callable, Optional

from ddpdoctor.procfs import ProcessStat, below, process_table

LAUNCHER_GRACE_S = 30.0  # torch.distributed.elastic's shutdown timeout
STOP_GRACE_S = LAUNCHER_GRACE_S + 5.0
AFTER_LAUNCHER_S = 2.0
KILL_WAIT_S = 5.0
POLL_S = 0.05
PR_SET_CHILD_SUBREAPER = 36
# How often the guard and its supervisor look at the process table while the job runs: one scan
# reads every /proc/PID/stat (about 40 µs each), so not on every tick of a busy node.
WATCH_S = 1.0


def become_subreaper() -> bool:
    """Orphans of this process's descendants come back to it instead of init (Linux 3.4+)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class Job:
    """The processes below `root` (the guard), by pid and start time, minus `exclude`."""

    def __init__(self, root: int, exclude: "set[int] | None" = None) -> None:
        self.root = root
        self.exclude = set(exclude or ())
        self.known: dict[int, int] = {}
        self.table: dict[int, ProcessStat] = {}
        self.refreshed = float("-inf")

    def refresh(self) -> None:
        self.table = process_table()
        roots = {self.root} | {pid for pid in self.known if self._same(pid)}
        for pid in below(roots, self.table):
            if pid not in self.exclude and pid != os.getpid():
                self.known.setdefault(pid, self.table[pid].start)

    def watch(self) -> None:
        """refresh(), at most every WATCH_S."""
        now = time.monotonic()
        if now - self.refreshed >= WATCH_S:
            self.refreshed = now
            self.refresh()

    def _same(self, pid: int) -> bool:
        stat = self.table.get(pid)
        return stat is not None and stat.start == self.known.get(pid)

    def alive(self) -> list[int]:
        return [pid for pid in self.known if self._same(pid) and not self.table[pid].zombie]

    def zombies_of(self, parent: int) -> list[int]:
        return [pid for pid in self.known if self._same(pid) and self.table[pid].zombie
                and self.table[pid].ppid == parent]

    def signal(self, signum: int) -> int:
        sent = 0
        for pid in self.alive():
            try:
                os.kill(pid, signum)
                sent += 1
            except OSError:
                pass
        return sent


def reap_orphans(job: Job, keep: "set[int]") -> None:
    """Collect the exit status of re-parented processes that ended (not those in `keep`, whose
    owner, a Popen, waits for them itself)."""
    for pid in job.zombies_of(os.getpid()):
        if pid in keep:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


def stop(job: Job, launcher: Optional[int], signum: int = signal.SIGTERM, grace: float = STOP_GRACE_S,
         reap: Callable[[], None] = lambda: None) -> None:
    """`signum` to every process of the job, then SIGKILL to what is left after the grace."""
    job.refresh()
    job.signal(signum)
    started = time.monotonic()
    launcher_gone: Optional[float] = None
    while True:
        reap()
        job.refresh()
        left = job.alive()
        if not left:
            return
        now = time.monotonic()
        if launcher_gone is None and (launcher is None or launcher not in left):
            launcher_gone = now
        if now - started > grace or (launcher_gone is not None and now - launcher_gone > AFTER_LAUNCHER_S):
            break
        time.sleep(POLL_S)
    deadline = time.monotonic() + KILL_WAIT_S
    while job.alive() and time.monotonic() < deadline:
        job.signal(signal.SIGKILL)
        time.sleep(POLL_S)
        reap()
        job.refresh()
