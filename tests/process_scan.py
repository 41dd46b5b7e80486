"""The tests' own look at /proc, written apart from `ddpdoctor.procfs` on purpose: a leftover
check that used the code under test would pass whenever that code found nothing."""

from __future__ import annotations

import os
from typing import Optional


def _stat_fields(pid: int) -> Optional[list[str]]:
    """/proc/<pid>/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def children(pid: int) -> list[int]:
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None and int(fields[1]) == pid:
                kids.append(int(name))
    return kids


def marked_processes(variable: str, mark: str) -> list[int]:
    """Live processes (not this one) whose environment holds variable=mark: every process a test's
    run started inherits the mark, so what is left of it can be found afterwards."""
    needle = f"{variable}={mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if needle not in handle.read().split(b"\0"):
                    continue
        except OSError:
            continue
        if alive(int(name)):
            found.append(int(name))
    return found
