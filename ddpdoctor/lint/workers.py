"""Lint worker processes that cannot outlive the run, hang it, or take it down.

A small pool of forked processes, one task each at a time, watched by the parent:
- a worker that exceeds the per-file time budget (stuck in native code, where the in-process
  budget of `isolation.contain` cannot reach) is killed and replaced; its file gets DDP999;
- a worker that dies (a crash in native code, the memory limit) is replaced; its file gets DDP999
  and the other files are linted as usual (concurrent.futures would fail every pending file);
- workers die with their parent: on Linux the kernel sends them SIGKILL when the parent dies
  (PR_SET_PDEATHSIG), even a parent killed by SIGKILL; SIGTERM/Ctrl-C in the parent kill them too.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

PR_SET_PDEATHSIG = 1
# The parent adds this to the budget before killing: the in-process budget answers first when it can.
GRACE_S = 10.0
# Address space per worker: far above what a file under the size limit needs (about 0.7 GB per MB
# of source), far below what takes a shared machine down.
MEMORY_FLOOR_BYTES = 4 * 1024**3
MEMORY_PER_SOURCE_BYTE = 1024


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _limit_memory(max_source_bytes: int) -> None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux
        return
    limit = max(MEMORY_FLOOR_BYTES, max_source_bytes * MEMORY_PER_SOURCE_BYTE)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _serve(
    conn: Connection,
    func: Callable[[Any], Any],
    parent_pid: int,
    max_source_bytes: int,
    initializer: Optional[Callable[..., None]],
    initargs: tuple[Any, ...],
) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _limit_memory(max_source_bytes)
    if initializer is not None:
        initializer(*initargs)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, task = message
        try:
            conn.send((index, func(task)))
        except Exception as error:  # noqa: BLE001 - a bug of ours: this task's result says so
            conn.send((index, _Failed(f"internal error in the analysis: {type(error).__name__}")))


@dataclass(frozen=True)
class _Failed:
    reason: str


@dataclass
class _Worker(Generic[T]):
    process: Any
    conn: Connection
    task: Optional[tuple[int, T, float]] = None  # (index, task, deadline)


def _reason_for_death(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"the analysis crashed ({name}; out of memory or a parser bug)"
    return f"the analysis crashed (exit status {exitcode})"


def run_tasks(
    func: Callable[[T], R],
    tasks: Sequence[T],
    processes: int,
    budget_s: float,
    lost: Callable[[T, str], R],
    max_source_bytes: int = 0,
    initializer: Optional[Callable[..., None]] = None,
    initargs: tuple[Any, ...] = (),
) -> list[R]:
    """`[func(t) for t in tasks]` on `processes` workers. A task whose worker is killed (time
    budget) or dies gets `lost(task, reason)` instead. `initializer(*initargs)` runs once in each
    worker, as with concurrent.futures."""
    context = multiprocessing.get_context("fork")
    results: list[Optional[R]] = [None] * len(tasks)
    pending = list(range(len(tasks)))
    pending.reverse()
    workers: list[_Worker[T]] = []
    parent = os.getpid()

    def spawn() -> _Worker[T]:
        ours, theirs = context.Pipe()
        process = context.Process(
            target=_serve, args=(theirs, func, parent, max_source_bytes, initializer, initargs), daemon=True
        )
        process.start()
        theirs.close()
        return _Worker(process, ours)

    def retire(worker: _Worker[T], reason: str) -> None:
        assert worker.task is not None
        index, task, _ = worker.task
        results[index] = lost(task, reason)
        worker.process.kill()
        worker.process.join()
        worker.conn.close()
        workers.remove(worker)
        if pending:
            workers.append(spawn())

    restore = _terminate_raises()
    try:
        workers.extend(spawn() for _ in range(max(1, min(processes, len(tasks)))))
        while pending or any(w.task for w in workers):
            for worker in workers:
                if worker.task is None and pending:
                    index = pending.pop()
                    worker.task = (index, tasks[index], time.monotonic() + budget_s + GRACE_S)
                    worker.conn.send((index, tasks[index]))
            busy = [w for w in workers if w.task is not None]
            timeout = max(0.0, min(w.task[2] for w in busy if w.task) - time.monotonic())
            ready = wait([w.conn for w in busy], timeout)
            for worker in list(busy):
                if worker.conn in ready:
                    try:
                        index, result = worker.conn.recv()
                    except (EOFError, OSError):
                        worker.process.join()
                        retire(worker, _reason_for_death(worker.process.exitcode))
                        continue
                    results[index] = lost(tasks[index], result.reason) if isinstance(result, _Failed) else result
                    worker.task = None
                elif worker.task is not None and time.monotonic() >= worker.task[2]:
                    retire(worker, f"analysis exceeded its time budget ({budget_s:g} s)")
    finally:
        for worker in workers:
            if worker.task is None:
                try:
                    worker.conn.send(None)
                except OSError:
                    pass
            else:
                worker.process.kill()
        for worker in workers:
            worker.process.join(1.0)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
        restore()
    if any(result is None for result in results):  # pragma: no cover - a bug of ours
        raise RuntimeError(f"{results.count(None)} lint tasks got no result")
    return cast("list[R]", results)


def _terminate_raises() -> Callable[[], None]:
    """While workers run, SIGTERM unwinds the parent (so its `finally` kills them) instead of
    ending it on the spot; PR_SET_PDEATHSIG covers SIGKILL, which nothing can catch."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
