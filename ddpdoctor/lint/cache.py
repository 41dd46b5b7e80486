"""A cache of lint results keyed by file content, ddpdoctor version and configuration.

One JSON file per (version, configuration) in `.ddpdoctor_cache/` next to the configuration (or in
the working directory): path -> [content hash, findings]. Loaded once, written once, atomically.
A corrupt or unreadable cache is ignored, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Optional

from ddpdoctor import __version__
from ddpdoctor.findings import Finding
from ddpdoctor.lint.fixes import atomic_write

CACHE_DIR_NAME = ".ddpdoctor_cache"


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class ResultCache:
    def __init__(self, root: Path, key: str) -> None:
        self.directory = root / CACHE_DIR_NAME
        self.file = self.directory / f"v{__version__}-{key}.json"
        self.entries: dict[str, list[Any]] = {}
        self.dirty = False
        try:
            loaded = json.loads(self.file.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                self.entries = loaded
        except (OSError, ValueError):
            pass

    def get(
        self, path: str, digest: str, unchanged: Optional[Callable[[Path, Optional[str]], bool]] = None
    ) -> Optional[list[Finding]]:
        """The cached findings, if `digest` matches and every project module the analysis read is
        still as it was (`unchanged(path, state)`, as ProjectSources.unchanged)."""
        entry = self.entries.get(os.path.abspath(path))
        if not entry or entry[0] != digest:
            return None
        depends = entry[2] if len(entry) > 2 else {}
        if not isinstance(depends, dict):
            return None
        if depends and (unchanged is None or not all(unchanged(Path(p), state) for p, state in depends.items())):
            return None
        try:
            return [Finding.from_dict(d) for d in entry[1]]
        except (KeyError, TypeError, ValueError):
            return None

    def put(
        self, path: str, digest: str, findings: list[Finding], depends: Optional[dict[str, Optional[str]]] = None
    ) -> None:
        self.entries[os.path.abspath(path)] = [digest, [f.to_dict() for f in findings], depends or {}]
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.directory.mkdir(exist_ok=True)
            gitignore = self.directory / ".gitignore"
            if not gitignore.exists():
                gitignore.write_text("# Created by ddpdoctor\n*\n", encoding="utf-8")
            atomic_write(str(self.file), json.dumps(self.entries).encode("utf-8"))
        except OSError:
            pass  # a read-only checkout still lints; it just is not cached
