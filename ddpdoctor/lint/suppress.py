"""Inline suppression comments.

`# ddpdoctor: ignore[DDP001, DDP008]` or `# noqa: DDP001` on the reported line (or on the last
line of a multi-line finding) silences those codes; a bare `# ddpdoctor: ignore` silences every code
on that line. A bare `# noqa` does NOT silence ddpdoctor: it is usually written for another linter,
and a distributed-training bug is not what its author meant to hide.

A code that names no rule silences nothing; `unknown_codes` finds them (as ruff's RUF102 does), for
the engine's DDP100 warning: any unknown code in a `# ddpdoctor: ignore[...]` comment, which speaks
to ddpdoctor alone, but in a `# noqa:` comment only codes of ddpdoctor's own families (`DDP123`),
since `# noqa: E501` is another linter's business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Collection, Iterator, Optional, Sequence

from ddpdoctor.findings import Finding

_IGNORE = re.compile(r"#\s*ddpdoctor\s*:\s*ignore\b(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE)
_NOQA = re.compile(r"#\s*noqa\s*:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)", re.IGNORECASE)
_CODE = re.compile(r"[^\s,]+")
_FAMILY = re.compile(r"[A-Z]*")
ALL = "*"


@dataclass(frozen=True)
class NamedCode:
    """A code written in a suppression comment: where (1-based line and column) and in which form."""

    line: int
    column: int
    code: str  # upper-cased, as matching compares it
    written: str  # as written
    ddpdoctor: bool  # in `# ddpdoctor: ignore[...]` (else in `# noqa:`)


def _comment_lines(source: str) -> Iterator[tuple[int, str]]:
    # A cheap pre-check before the line scan; the comments are matched in any case, so is this.
    lowered = source.lower()
    if "ddpdoctor" not in lowered and "noqa" not in lowered:
        return
    for number, line in enumerate(source.splitlines(), start=1):
        if "#" in line:
            yield number, line


def _named_on(number: int, line: str) -> Iterator[Optional[NamedCode]]:
    """The codes one line's suppression comments name; None for a bare `# ddpdoctor: ignore`."""
    for pattern, ddpdoctor in ((_IGNORE, True), (_NOQA, False)):
        for match in pattern.finditer(line):
            if match.group("codes") is None:
                yield None
                continue
            offset = match.start("codes")
            for code in _CODE.finditer(match.group("codes")):
                written = code.group()
                yield NamedCode(number, offset + code.start() + 1, written.upper(), written, ddpdoctor)


def suppressions(source: str) -> dict[int, frozenset[str]]:
    """1-based line -> codes silenced there (`{"*"}` for all)."""
    out: dict[int, frozenset[str]] = {}
    for number, line in _comment_lines(source):
        codes = {ALL if named is None else named.code for named in _named_on(number, line)}
        if codes:
            out[number] = frozenset(codes)
    return out


def unknown_codes(source: str, known: Collection[str]) -> list[NamedCode]:
    """The codes in suppression comments that name none of the `known` codes: every such code in a
    `# ddpdoctor: ignore[...]`; in a `# noqa:` only those of a family (letters) some known code has."""
    families = {_FAMILY.match(code).group() for code in known}  # type: ignore[union-attr]
    out: list[NamedCode] = []
    for number, line in _comment_lines(source):
        for named in _named_on(number, line):
            if named is None or named.code in known:
                continue
            if named.ddpdoctor or _FAMILY.match(named.code).group() in families:  # type: ignore[union-attr]
                out.append(named)
    return out


def is_suppressed(finding: Finding, table: dict[int, frozenset[str]]) -> bool:
    for line in {finding.line, finding.end_line}:
        codes = table.get(line)
        if codes and (ALL in codes or finding.code in codes):
            return True
    return False


def apply_suppressions(findings: Sequence[Finding], source: Optional[str]) -> list[Finding]:
    if source is None:
        return list(findings)
    table = suppressions(source)
    if not table:
        return list(findings)
    return [f for f in findings if not is_suppressed(f, table)]
