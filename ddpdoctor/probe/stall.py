"""The start-up watchdog: when a rank's start-up (store, join, process group) outlives its budget,
leave the rank's Python stacks in its log, which the launcher redirects and the report points at.

Not `faulthandler.dump_traceback_later`: its C watchdog thread reads the other threads' frames
without holding the GIL and can crash the rank it is meant to diagnose (CPython gh-131580,
gh-140815). We saw exactly that: a rank still importing torch on a loaded machine died of SIGSEGV
when the dump fired. This watchdog is a Python thread that formats the stacks with the GIL held, so
the worst case is a late dump (while the main thread holds the GIL inside C code), never a crash.
"""

from __future__ import annotations

import sys
import threading
import traceback
from typing import Optional, TextIO

HEADER = "ddpdoctor: start-up still running after {seconds:g} s; Python stacks of this rank:"

_lock = threading.Lock()
_armed: Optional[threading.Timer] = None


def startup_budget(timeout: float, join_timeout: float) -> float:
    """How long start-up may take before it is a stall: connecting and joining wait for the
    slowest rank (join timeout), creating the process group waits for its peers (check timeout).
    The per-check timeout alone is far too short: a spawned rank spends seconds importing torch."""
    return join_timeout + timeout


def format_stacks(exclude: Optional[int] = None) -> str:
    """Every thread's stack, innermost call last, the main thread first."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    order = sorted(frames, key=lambda ident: (ident != main, ident))
    parts = []
    for ident in order:
        if ident == exclude:
            continue
        stack = "".join(traceback.format_stack(frames[ident]))
        parts.append(f"Thread {names.get(ident, hex(ident))} ({ident:#x}):\n{stack}")
    return "\n".join(parts)


def _dump(seconds: float, stream: Optional[TextIO]) -> None:
    out = stream if stream is not None else sys.stderr
    text = HEADER.format(seconds=seconds) + "\n" + format_stacks(exclude=threading.get_ident())
    try:
        out.write(text + "\n")
        out.flush()
    except (OSError, ValueError):  # the log is gone or closed: nothing left to tell
        pass


def arm(seconds: float, stream: Optional[TextIO] = None) -> None:
    """Dump this process's stacks once, `seconds` from now, unless `disarm()` comes first.
    Arming again replaces the earlier timer."""
    global _armed
    timer = threading.Timer(seconds, _dump, args=(seconds, stream))
    timer.daemon = True  # never keeps a finished rank alive
    timer.name = "ddpdoctor-startup-watchdog"
    with _lock:
        if _armed is not None:
            _armed.cancel()
        _armed = timer
    timer.start()


def disarm() -> None:
    """Start-up is over (or the rank is leaving): no dump. Safe to call when not armed."""
    global _armed
    with _lock:
        if _armed is not None:
            _armed.cancel()
            _armed = None
