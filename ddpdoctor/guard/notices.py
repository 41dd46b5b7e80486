"""The guard's own warnings on stderr: about the guard (a peer it dropped, its own failure), never
a finding about the job, and each kind said once however often it happens."""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from ddpdoctor.terminal import escape_controls


class Notices:
    def __init__(self, stream: "TextIO | None" = None) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self.said: set[str] = set()
        self.counts: dict[str, int] = {}

    def warn(self, kind: str, text: str) -> None:
        """Say `text` the first time `kind` happens; count the rest."""
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if kind in self.said:
                return
            self.said.add(kind)
        self._write(text)

    def summary(self, kinds: "tuple[str, ...]", what: str) -> None:
        """One closing line when `kinds` happened more often than was said."""
        with self.lock:
            total = sum(self.counts.get(kind, 0) for kind in kinds)
            said = sum(1 for kind in kinds if kind in self.said)
        if total > said:
            self._write(f"in all, {total} {what}")

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        try:
            stream.write(f"ddpdoctor guard: warning: {escape_controls(text)}\n")
            stream.flush()
        except (OSError, ValueError):  # a closed stderr must not take the guard down
            pass
