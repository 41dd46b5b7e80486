"""`--output-format json`: a stable, sorted JSON array of `Finding.to_dict()`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Sequence

from ddpdoctor.findings import Finding

if TYPE_CHECKING:
    from ddpdoctor.report import ReportContext


def render(findings: Sequence[Finding], context: "ReportContext") -> str:
    ordered = sorted(findings, key=Finding.sort_key)
    # `default=str`: env and probe findings carry free-form `details` (paths, versions, numpy
    # scalars); a machine-readable report must not crash on one odd value.
    return json.dumps(
        [finding.to_dict() for finding in ordered], indent=2, ensure_ascii=False, default=str
    )
