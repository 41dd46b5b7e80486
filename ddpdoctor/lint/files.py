"""Finding the files to lint: explicit files as given, folders recursed for `*.py`, `*.pyi` and
Jupyter notebooks (`*.ipynb`, linted cell by cell)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from ddpdoctor.config import Settings

# Never descend into these: tool caches, VCS metadata, virtual environments, build output.
SKIP_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox",
        ".nox", ".venv", "venv", ".eggs", "node_modules", "build", "dist", "site-packages",
        ".ddpdoctor_cache", ".ipynb_checkpoints",
    }
)


class PathError(Exception):
    """A path the user named cannot be linted (missing, unreadable)."""


@dataclass(frozen=True)
class Discovered:
    files: list[str]
    skipped_dirs_without_python: list[str]
    warnings: list[str] = field(default_factory=list)  # folders that could not be read


def _is_virtualenv(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "pyvenv.cfg"))


def shown(path: str) -> str:
    """The name a file is reported under: as given, less any leading `./` (`ddpdoctor lint .`
    reports `train.py`, as ruff does, not `./train.py`). Only that prefix goes: `a/../b` is kept,
    since through a symlinked `a` it need not be `b`."""
    while path.startswith("./") and len(path) > 2:
        path = path[2:].lstrip("/") or "."
    return path


def discover(paths: Iterable[str], settings: Settings) -> Discovered:
    files: list[str] = []
    empty_dirs: list[str] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise PathError(f"{raw}: no such file or directory")
        if not path.is_dir() and not path.is_file():
            raise PathError(f"{raw}: not a regular file or folder (a FIFO, socket or device?)")
        if path.is_file():
            # An explicitly named file is linted whatever its suffix (pre-commit passes the names),
            # unless the configuration excludes it.
            if settings.is_excluded(raw):
                continue
            name = shown(raw)
            if name not in seen:
                seen.add(name)
                files.append(name)
            continue
        if not os.access(path, os.R_OK | os.X_OK):
            raise PathError(f"{raw}: permission denied")
        found = 0

        def unreadable(error: OSError) -> None:
            warnings.append(f"cannot read {error.filename}: {error.strerror}; skipped")

        for directory, dirnames, filenames in os.walk(raw, onerror=unreadable):
            dirnames[:] = sorted(
                d for d in dirnames
                if d not in SKIP_DIRS
                and not d.endswith(".egg-info")
                and not _is_virtualenv(os.path.join(directory, d))
                and not settings.is_excluded(os.path.join(directory, d))
            )
            for filename in sorted(filenames):
                if not filename.endswith((".py", ".pyi", ".ipynb")):
                    continue
                full = shown(os.path.join(directory, filename))
                if settings.is_excluded(full) or full in seen or not _is_regular(full):
                    continue
                seen.add(full)
                files.append(full)
                found += 1
        if found == 0:
            empty_dirs.append(raw)
    return Discovered(files, empty_dirs, warnings)


def _is_regular(path: str) -> bool:
    """A regular file, or a link to one. FIFOs, sockets and devices are never opened (a FIFO blocks
    the reader until something writes to it)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


class NotRegular(OSError):
    """A FIFO, socket or device where a source file was expected: never read (a FIFO blocks)."""


def read_regular(path: str, max_bytes: int) -> Optional[bytes]:
    """The bytes of a regular file, or None when it is larger than `max_bytes` (not read at all).

    Opened without blocking and checked on the open descriptor, so a FIFO that replaced the file
    since discovery cannot hang the run."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file")
        if info.st_size > max_bytes:
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
