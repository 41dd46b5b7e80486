"""`--output-format github`: GitHub Actions workflow commands, which become PR annotations.

https://docs.github.com/actions/using-workflows/workflow-commands-for-github-actions
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ddpdoctor.findings import Finding, Severity

if TYPE_CHECKING:
    from ddpdoctor.report import ReportContext

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(value: str) -> str:
    # Same escaping as @actions/core's `escapeData`; `%` first so escapes are not re-escaped.
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    # Properties are `key=value` pairs separated by `,` and ended by `::`, hence the two extras.
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def is_pseudo_path(path: str) -> bool:
    """`<stdin>`, `<env>`, `<probe>`: findings that belong to no file in the checkout."""
    return path.startswith("<") and path.endswith(">")


def command(finding: Finding) -> str:
    properties: list[tuple[str, object]] = []
    # A file property GitHub cannot resolve makes the annotation vanish from the PR view; without
    # one it still shows on the workflow run summary, which is where `<env>` findings belong.
    if finding.cell is not None:
        # A notebook: its lines count within a cell, so the annotation names the file and, in
        # its title, the cell.
        properties.append(("file", finding.path))
        properties.append(("title", f"{finding.code} ({finding.name}) at cell {finding.cell}, line {finding.line}"))
    elif not is_pseudo_path(finding.path):
        properties += [
            ("file", finding.path),
            ("line", finding.line),
            ("col", finding.column),
            ("endLine", finding.end_line),
            ("endColumn", finding.end_column),
        ]
    if finding.cell is None:
        properties.append(("title", f"{finding.code} ({finding.name})"))
    rendered = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties)
    return f"::{_COMMAND[finding.severity]} {rendered}::{escape_data(finding.message)}"


def render(findings: Sequence[Finding], context: "ReportContext") -> str:
    return "\n".join(command(finding) for finding in sorted(findings, key=Finding.sort_key))
