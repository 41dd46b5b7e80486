"""`--output-format json`: a stable, sorted JSON array of `Finding.to_dict()`.

With `--statistics`, the counts instead, as ruff prints them: one object per code,
`{"code", "name", "count", "fixable"}` (how many of them `--fix` would fix), most frequent first (ties by code).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Sequence

from ddpdoctor.findings import Finding
from ddpdoctor.report.counts import code_counts

if TYPE_CHECKING:
    from ddpdoctor.report import ReportContext


def render(findings: Sequence[Finding], context: "ReportContext") -> str:
    ordered = sorted(findings, key=Finding.sort_key)
    if context.statistics:
        return json.dumps(statistics(ordered), indent=2, ensure_ascii=False)
    # `default=str`: env and probe findings carry free-form `details` (paths, versions, numpy
    # scalars); a machine-readable report must not crash on one odd value.
    return json.dumps(
        [finding.to_dict() for finding in ordered], indent=2, ensure_ascii=False, default=str
    )


def statistics(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    return [
        {"code": row.code, "name": row.name, "count": row.count, "fixable": row.fixable}
        for row in code_counts(findings)
    ]
