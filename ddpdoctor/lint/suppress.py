"""Inline suppression comments.

`# ddpdoctor: ignore[DDP001, DDP008]` or `# noqa: DDP001` on the reported line (or on the last
line of a multi-line finding) silences those codes; a bare `# ddpdoctor: ignore` silences every code
on that line. A bare `# noqa` does NOT silence ddpdoctor: it is usually written for another linter,
and a distributed-training bug is not what its author meant to hide.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from ddpdoctor.findings import Finding

_IGNORE = re.compile(r"#\s*ddpdoctor\s*:\s*ignore\b(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE)
_NOQA = re.compile(r"#\s*noqa\s*:\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)", re.IGNORECASE)
ALL = "*"


def suppressions(source: str) -> dict[int, frozenset[str]]:
    """1-based line -> codes silenced there (`{"*"}` for all)."""
    out: dict[int, frozenset[str]] = {}
    # A cheap pre-check before the line scan; the comments are matched in any case, so is this.
    lowered = source.lower()
    if "ddpdoctor" not in lowered and "noqa" not in lowered:
        return out
    for number, line in enumerate(source.splitlines(), start=1):
        if "#" not in line:
            continue
        codes: set[str] = set()
        for match in _IGNORE.finditer(line):
            listed = match.group("codes")
            if listed is None:
                codes.add(ALL)
            else:
                codes.update(c.strip().upper() for c in re.split(r"[\s,]+", listed) if c.strip())
        for match in _NOQA.finditer(line):
            codes.update(c.strip().upper() for c in re.split(r"[\s,]+", match.group("codes")) if c.strip())
        if codes:
            out[number] = frozenset(codes)
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
