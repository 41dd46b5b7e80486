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
    start: int = 0  # clock ticks after boot: with the pid, names one process even after pid reuse

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
                           session=int(fields[3]), start=int(fields[19]))
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


def descendants(pid: int, table: Optional[dict[int, ProcessStat]] = None) -> list[int]:
    """Every process below `pid`, nearest first (Horovod's runner puts a shell and a middleman
    between us and a rank)."""
    return below({pid}, process_table() if table is None else table)


def below(roots: "set[int]", table: dict[int, ProcessStat]) -> list[int]:
    """Every process of `table` below any of `roots`, nearest first."""
    by_parent: dict[int, list[int]] = {}
    for stat in table.values():
        by_parent.setdefault(stat.ppid, []).append(stat.pid)
    found: list[int] = []
    seen = set(roots)
    frontier = list(roots)
    while frontier:
        kids = [kid for parent in frontier for kid in by_parent.get(parent, ()) if kid not in seen]
        seen.update(kids)
        found.extend(kids)
        frontier = kids
    return found


def session_members(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    return [p.pid for p in process_table().values() if p.session == sid and not p.zombie]
