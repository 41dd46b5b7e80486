"""Applying fixes: text edits -> new source -> re-parse -> atomic write.

A run never loses the user's work: edits that overlap are deferred to the next round, the result is
re-parsed with libcst before anything is written (a fix that produced invalid Python is dropped
and reported), and the file is replaced atomically (temp file in the same folder, fsync, rename),
keeping its permissions.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from typing import Sequence

import libcst as cst

from ddpdoctor.findings import Finding


class FixError(Exception):
    pass


def _offsets(source: str) -> list[int]:
    """Offset of the start of each 1-based line (index 0 unused)."""
    starts = [0, 0]
    for index, char in enumerate(source):
        if char == "\n":
            starts.append(index + 1)
    return starts


def apply_fixes(source: str, findings: Sequence[Finding]) -> tuple[str, int]:
    """Apply every applicable, non-overlapping fix once. Returns (new source, fixes applied)."""
    starts = _offsets(source)
    newline = "\r\n" if "\r\n" in source else "\n"

    def offset(line: int, column: int) -> int:
        if line >= len(starts):
            return len(source)
        return starts[line] + column - 1

    planned: list[tuple[int, int, str, int]] = []  # (start, end, text, finding index)
    taken: list[tuple[int, int]] = []
    applied: set[int] = set()
    for index, finding in enumerate(findings):
        if finding.fix is None or not finding.fix.applicable or not finding.fix.edits:
            continue
        spans = [(offset(e.line, e.column), offset(e.end_line, e.end_column), e) for e in finding.fix.edits]
        if any(s < te and ts < e or (s == e == ts == te) for s, e, _ in spans for ts, te in taken):
            continue  # overlaps an earlier fix: the next round picks it up
        for start, end, edit in spans:
            content = edit.content.replace("\r\n", "\n")
            if newline != "\n":
                content = content.replace("\n", newline)
            planned.append((start, end, content, index))
            taken.append((start, end))
        applied.add(index)
    if not planned:
        return source, 0
    out = source
    for start, end, content, _ in sorted(planned, key=lambda p: (p[0], p[1]), reverse=True):
        out = out[:start] + content + out[end:]
    return out, len(applied)


def verify(source: str) -> None:
    try:
        cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        raise FixError(f"a fix produced invalid Python ({error.message} at line {error.raw_line}); nothing was written") from None


def atomic_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else None
    fd, temp = tempfile.mkstemp(prefix=".ddpdoctor-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
        )
    )
