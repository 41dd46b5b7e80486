"""Counts per code (`--statistics`), shared by the text and JSON reports."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ddpdoctor.findings import Finding, Severity


def is_fixable(finding: Finding) -> bool:
    """What `--fix` would apply: an applicable fix that actually edits something."""
    return finding.fix is not None and finding.fix.applicable and bool(finding.fix.edits)


@dataclass(frozen=True)
class CodeCount:
    code: str
    name: str
    severity: Severity
    count: int
    fixable: int  # how many of them `--fix` would fix


def code_counts(findings: Sequence[Finding]) -> list[CodeCount]:
    """One entry per code, most frequent first (ties by code, for stable output)."""
    counts = Counter(finding.code for finding in findings)
    fixable = Counter(finding.code for finding in findings if is_fixable(finding))
    first: dict[str, Finding] = {}
    for finding in findings:
        first.setdefault(finding.code, finding)
    return [
        CodeCount(code, first[code].name, first[code].severity, count, fixable[code])
        for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]
