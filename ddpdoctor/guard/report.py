"""How guard findings look: one line each on stderr as they happen, and the JSON report."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.terminal import escape_controls, use_color

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def finding_dict(finding: Finding) -> dict[str, Any]:
    listed = {"epochs": list(finding.details["epochs"])} if finding.details.get("epochs") else {}
    if finding.details.get("evidence"):  # the Flight Recorder's entries behind the finding
        listed["evidence"] = finding.details["evidence"]
    return {
        "code": finding.code,
        "name": finding.name,
        "severity": finding.severity.value,
        "ranks": list(finding.details.get("ranks", [])),
        "message": finding.message,
        "path": finding.path,
        "line": finding.line,
        "step": finding.details.get("step"),
        "epoch": finding.details.get("epoch"),
        **listed,
    }


def report_dict(command: Sequence[str], exit_code: int, world_size: int, findings: Sequence[Finding],
                summary: Optional[dict[str, int]] = None) -> dict[str, Any]:
    report: dict[str, Any] = {"command": list(command), "exit_code": exit_code, "world_size": world_size}
    if summary:
        report["summary"] = summary
    report["findings"] = [finding_dict(f) for f in findings]
    return report


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def summary_line(summary: dict[str, int], findings: Sequence[Finding], exit_code: int) -> str:
    """One line for the end of the run: what the guard watched, and what it found."""
    watched = ", ".join(_plural(summary.get(key, 0), noun) for key, noun in (
        ("ranks", "rank"), ("epochs", "epoch"), ("steps", "step"), ("collectives", "collective"),
        ("replica_checks", "replica check")))
    if not findings:
        return f"ddpdoctor guard: {watched}, no finding"
    codes = ", ".join(sorted({f.code for f in findings}))
    return f"ddpdoctor guard: {watched}, {_plural(len(findings), 'finding')} ({codes}); exit {exit_code}"


def plain_line(finding: Finding) -> str:
    ranks = finding.details.get("ranks", [])
    who = ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks)) if ranks else "all ranks"
    # What came over the side channel was escaped when it arrived; escaping again changes nothing.
    return escape_controls(f"{finding.path}:{finding.line}: {finding.code} [{who}] {finding.message}")


class Printer:
    """Prints each finding on stderr as it is found: rich on a terminal, plain when piped."""

    def __init__(self) -> None:
        self.color = use_color(stream=sys.stderr)
        self.console: Optional[Any] = None
        if self.color:
            from rich.console import Console

            self.console = Console(stderr=True, highlight=False)

    def __call__(self, finding: Finding) -> None:
        if self.console is None:
            sys.stderr.write(plain_line(finding) + "\n")
            sys.stderr.flush()
            return
        from rich.markup import escape

        ranks = finding.details.get("ranks", [])
        who = ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))
        path = escape(escape_controls(finding.path))
        self.console.print(
            f"[bold]{path}:{finding.line}[/bold]: [{_STYLE[finding.severity]}]{finding.code}"
            f"[/{_STYLE[finding.severity]}] [dim]{finding.name}[/dim] [magenta]\\[{who}][/magenta] "
            f"{escape(escape_controls(finding.message))}")

    def summary(self, findings: Sequence[Finding], summary: dict[str, int], exit_code: int) -> None:
        if not summary:
            return  # another node's guard diagnosed this job, and says so there
        sys.stderr.write(summary_line(summary, findings, exit_code) + os.linesep)
        sys.stderr.flush()
