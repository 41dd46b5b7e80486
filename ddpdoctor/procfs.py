"""The process table, read from /proc (Linux): what the probe and the guard need to find the
processes a launch started -- its children, everything below it, a session's members -- and to
tell a live process from a zombie. No torch, no psutil: the linter's install must stay small.

Elsewhere /proc is absent and every query answers "nothing found"; callers fall back on what they
started themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ProcessStat:
    """The fields of /proc/<pid>/stat that matter to us (proc(5))."""

    pid: int
    state: str  # "R", "S", "D", "Z" (zombie: exited, not yet reaped), ...
    ppid: int
    pgrp: int
    session: int

    @property
    def zombie(self) -> bool:
        return self.state == "Z"


def read_stat(pid: int) -> Optional[ProcessStat]:
    """One process's stat, or None when it is gone (or /proc is unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name, in parentheses, may itself contain spaces and parentheses: split after
    # the last ")".
    fields = text[text.rfind(")") + 2:].split()
    try:
        return ProcessStat(pid=pid, state=fields[0], ppid=int(fields[1]), pgrp=int(fields[2]),
                           session=int(fields[3]))
    except (IndexError, ValueError):
        return None


def process_table() -> dict[int, ProcessStat]:
    """Every process this user can see, by pid (a process that exits mid-scan is left out)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    table: dict[int, ProcessStat] = {}
    for name in names:
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                table[stat.pid] = stat
    return table


def children(pid: int) -> list[int]:
    return [p.pid for p in process_table().values() if p.ppid == pid]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, nearest first (Horovod's runner puts a shell and a middleman
    between us and a rank)."""
    table = process_table()
    found: list[int] = []
    frontier = {pid}
    while frontier:
        kids = [p.pid for p in table.values() if p.ppid in frontier and p.pid not in found]
        found.extend(kids)
        frontier = set(kids)
    return found


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    return [p.pid for p in process_table().values() if p.session == sid and not p.zombie]
