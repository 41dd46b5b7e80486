"""A cache of lint results keyed by file content, ddpdoctor's version and code, and configuration.

One JSON file per (version, code stamp, configuration) in `.ddpdoctor_cache/` next to the
configuration (or in the working directory): path -> [content hash, findings]. Loaded once, written
once, atomically. The code stamp covers an editable install or a patched build of the same version,
whose rules changed while `__version__` did not: results of the old code are never served.
A corrupt or unreadable cache is ignored, never an error; every entry is validated when read (its
shape, codes the run selected, lines inside the file) and anything off is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Optional, Union

from ddpdoctor import __version__
from ddpdoctor.catalog import rule_info
from ddpdoctor.findings import Finding
from ddpdoctor.lint.files import read_regular
from ddpdoctor.lint.safe_write import atomic_write

CACHE_DIR_NAME = ".ddpdoctor_cache"
MAX_CACHE_BYTES = 256 * 1024 * 1024


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_stamps: dict[Path, str] = {}


def code_stamp(package_dir: Path = _PACKAGE_DIR) -> str:
    """A short digest of the linter's own code as installed: the path, size and modification time
    (stat only, no reads) of every module a lint result depends on, the package's top-level modules
    (findings, config, catalog) and everything under lint/; not probe/, env/ or guard/, which a warm
    run should not pay to stat. Computed once per process and directory."""
    stamp = _stamps.get(package_dir)
    if stamp is None:
        parts: list[str] = []
        for path in sorted([*package_dir.glob("*.py"), *(package_dir / "lint").rglob("*.py")]):
            try:
                st = path.stat()
            except OSError:
                continue
            parts.append(f"{path.relative_to(package_dir).as_posix()}:{st.st_size}:{st.st_mtime_ns}")
        stamp = content_hash("\n".join(parts).encode())[:12]
        _stamps[package_dir] = stamp
    return stamp


class ResultCache:
    def __init__(self, root: Path, key: str) -> None:
        self.directory = root / CACHE_DIR_NAME
        self.key = key
        self.file = self.directory / f"v{__version__}-{code_stamp()}-{key}.json"
        self.entries: dict[str, list[Any]] = {}
        self._verdicts: dict[tuple[str, Optional[str]], bool] = {}
        self.dirty = False
        try:
            data = read_regular(str(self.file), MAX_CACHE_BYTES)
            loaded = json.loads(data.decode("utf-8")) if data is not None else None
            if isinstance(loaded, dict):
                self.entries = loaded
        except (OSError, ValueError, RecursionError):
            pass  # missing, a FIFO, not UTF-8, not JSON, nested too deeply: start afresh

    def get(
        self,
        path: str,
        digest: str,
        codes: frozenset[str],
        lines: Union[int, Callable[[], int]],
        unchanged: Optional[Callable[[str, Optional[str]], bool]] = None,
    ) -> Optional[list[Finding]]:
        """The cached findings, or None (a miss) unless the entry is exactly what we write, its
        `digest` matches and every project module the analysis read is still as it was
        (`unchanged(path, state)`, as ProjectSources.unchanged)."""
        entry = self.entries.get(os.path.abspath(path))
        if not isinstance(entry, list) or len(entry) != 3 or entry[0] != digest or not isinstance(entry[1], list):
            return None
        depends = entry[2]
        if not isinstance(depends, dict) or not all(
            isinstance(p, str) and (state is None or isinstance(state, str)) for p, state in depends.items()
        ):
            return None
        if depends and (unchanged is None or not all(self._unchanged(unchanged, p, state) for p, state in depends.items())):
            return None
        try:
            findings = [Finding.from_dict(d) for d in entry[1]]
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError):
            return None
        # The line count (an upper bound that each cached position must respect) is only worth
        # counting when there is a finding to check: most cached files have none.
        if findings:
            count = lines() if callable(lines) else lines
            if not all(_plausible(f, codes, count) for f in findings):
                return None
        return findings

    def _unchanged(self, unchanged: Callable[[str, Optional[str]], bool], path: str, state: Optional[str]) -> bool:
        """`unchanged(path, state)`, asked once per run: the files of a project share most of their
        dependencies (a warm run over torch/distributed asked 1,832 times about a few hundred)."""
        key = (path, state)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = unchanged(path, state)
        return verdict

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
            if not os.path.lexists(gitignore):  # whatever is there (even a FIFO) is left alone
                gitignore.write_text("# Created by ddpdoctor\n*\n", encoding="utf-8")
            atomic_write(str(self.file), json.dumps(self.entries).encode("utf-8"))
            self._drop_stale_siblings()
        except OSError:
            pass  # a read-only checkout still lints; it just is not cached


    def _drop_stale_siblings(self) -> None:
        """Files of the same configuration written by another version or code of ddpdoctor can never
        be read again: remove them, so that the cache does not grow with every upgrade."""
        suffix = f"-{self.key}.json"
        for other in self.directory.glob(f"v*{suffix}"):
            if other != self.file and other.is_file() and not other.is_symlink():
                try:
                    other.unlink()
                except OSError:
                    pass


def _plausible(finding: Finding, codes: frozenset[str], lines: int) -> bool:
    """A finding this run could have produced for a file of `lines` lines."""
    numbers = (finding.line, finding.column, finding.end_line, finding.end_column)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in numbers):
        return False
    if not (finding.line <= finding.end_line <= lines) or not isinstance(finding.message, str):
        return False
    info = rule_info(finding.code) if isinstance(finding.code, str) else None
    if info is None or finding.code not in codes or finding.name != info.name:
        return False
    for edit in finding.fix.edits if finding.fix else ():
        if not all(isinstance(n, int) and n >= 1 for n in (edit.line, edit.column, edit.end_line, edit.end_column)):
            return False
        if edit.end_line > lines + 1 or not isinstance(edit.content, str):
            return False
    return True
