"""Applying fixes: text edits -> new source -> re-parse -> re-lint -> accepted or not.

A run never loses the user's work: edits that overlap are deferred to the next round; each fix is
applied alone, the result re-parsed with libcst and re-linted, and kept only when its own finding
is gone and no finding is new. Writing the result to disk is `ddpdoctor.lint.safe_write`'s job.
"""

from __future__ import annotations

import difflib
import re
from typing import Callable, Iterator, Sequence

import libcst as cst

from ddpdoctor.findings import Finding
from ddpdoctor.lint.safe_write import atomic_write

__all__ = ["FixError", "apply_fixes", "atomic_write", "fix_rounds", "is_applicable", "unified_diff", "verify"]

# libcst (like CPython's tokenizer) ends a line at "\r\n", "\r" or "\n" and nowhere else: finding
# positions count lines this way, so edits must too (a lone "\r" counted otherwise puts an edit on
# the wrong line).
_LINE_END = re.compile(r"\r\n|\r|\n")
# Each fix is tried alone and re-linted; this caps the re-lints per file.
MAX_FIX_ATTEMPTS = 64


class FixError(Exception):
    pass


def _line_starts(source: str) -> list[int]:
    """Offset of the start of each 1-based line (index 0 unused)."""
    return [0, 0] + [match.end() for match in _LINE_END.finditer(source)]


def _newline_of(source: str) -> str:
    match = _LINE_END.search(source)
    return match.group() if match else "\n"


def is_applicable(finding: Finding, unsafe: bool = False) -> bool:
    """A fix `--fix` applies: safe ones always, the others (`applicable=False`) with --unsafe-fixes."""
    return finding.fix is not None and bool(finding.fix.edits) and (finding.fix.applicable or unsafe)


def apply_fixes(source: str, findings: Sequence[Finding], unsafe: bool = False) -> tuple[str, int]:
    """Apply every applicable, non-overlapping fix once. Returns (new source, fixes applied)."""
    starts = _line_starts(source)
    newline = _newline_of(source)

    def offset(line: int, column: int) -> int:
        if line >= len(starts):
            return len(source)
        return min(starts[line] + column - 1, len(source))

    planned: list[tuple[int, int, str]] = []
    taken: list[tuple[int, int]] = []
    applied = 0
    for finding in findings:
        if not is_applicable(finding, unsafe):
            continue
        assert finding.fix is not None
        spans = [(offset(e.line, e.column), offset(e.end_line, e.end_column), e) for e in finding.fix.edits]
        if any(s < te and ts < e or (s == e == ts == te) for s, e, _ in spans for ts, te in taken):
            continue  # overlaps an earlier fix: the next round picks it up
        for start, end, edit in spans:
            content = _LINE_END.sub(newline, edit.content)
            planned.append((start, end, content))
            taken.append((start, end))
        applied += 1
    if not planned:
        return source, 0
    out = source
    for start, end, content in sorted(planned, key=lambda p: (p[0], p[1]), reverse=True):
        out = out[:start] + content + out[end:]
    return out, applied


def verify(source: str) -> None:
    try:
        cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        raise FixError(f"a fix produced invalid Python ({error.message} at line {error.raw_line})") from None


def _code_counts(findings: Sequence[Finding]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.code] = counts.get(finding.code, 0) + 1
    return counts


def _improves(before: Sequence[Finding], fixed: Finding, after: Sequence[Finding]) -> bool:
    """The fix removed its own finding and added none: for every code, the count after is at most
    the count before, and one less for the fixed code."""
    old, new = _code_counts(before), _code_counts(after)
    old[fixed.code] -= 1
    return all(count <= old.get(code, 0) for code, count in new.items())


def fix_rounds(
    source: str,
    findings: Sequence[Finding],
    relint: Callable[[str], list[Finding]],
    unsafe: bool = False,
) -> tuple[str, list[Finding], int]:
    """Apply fixes one at a time, each re-parsed and re-linted before it is kept.

    Returns (fixed source, the findings that remain, fixes applied). A fix that breaks the parse,
    leaves its own finding or adds any finding is dropped and its finding stays."""
    current, remaining, total = source, list(findings), 0
    rejected: set[tuple[str, int]] = set()
    attempts = 0
    while attempts < MAX_FIX_ATTEMPTS:
        candidate = next(_candidates(current, remaining, rejected, unsafe), None)
        if candidate is None:
            break
        attempts += 1
        finding, key, new = candidate
        try:
            verify(new)
            after = relint(new)
        except FixError:
            rejected.add(key)
            continue
        if not _improves(remaining, finding, after):
            rejected.add(key)
            continue
        current, remaining, total = new, after, total + 1
    return current, remaining, total


def _candidates(
    source: str, findings: Sequence[Finding], rejected: set[tuple[str, int]], unsafe: bool
) -> Iterator[tuple[Finding, tuple[str, int], str]]:
    for finding in findings:
        if not is_applicable(finding, unsafe):
            continue
        new, applied = apply_fixes(source, [finding], unsafe)
        # Keyed by the text it would produce: a rejected fix is retried only once other fixes
        # changed the file.
        key = (finding.code, hash(new))
        if applied and new != source and key not in rejected:
            yield finding, key, new


def _diff_lines(text: str) -> list[str]:
    """Lines as `patch` reads them: only "\\n" ends a line (str.splitlines would also split at
    form feeds, "\\x1c".."\\x1e", "\\x85", "\\u2028"... and the hunks would not apply)."""
    return [part for part in re.split(r"(?<=\n)", text) if part]


def unified_diff(path: str, before: str, after: str) -> str:
    """A diff that `patch -p1` applies, including to files without a final newline."""
    out: list[str] = []
    for line in difflib.unified_diff(_diff_lines(before), _diff_lines(after), fromfile=f"a/{path}", tofile=f"b/{path}"):
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)
