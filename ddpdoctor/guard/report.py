"""How guard findings look: one line each on stderr as they happen, and the JSON report."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.terminal import escape_controls, use_color

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def finding_dict(finding: Finding) -> dict[str, Any]:
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
    }


def report_dict(command: Sequence[str], exit_code: int, world_size: int, findings: Sequence[Finding]) -> dict[str, Any]:
    return {"command": list(command), "exit_code": exit_code, "world_size": world_size,
            "findings": [finding_dict(f) for f in findings]}


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

    def summary(self, findings: Sequence[Finding], world_size: int, exit_code: int) -> None:
        if not findings:
            return
        codes = ", ".join(sorted({f.code for f in findings}))
        noun = "finding" if len(findings) == 1 else "findings"
        sys.stderr.write(f"ddpdoctor guard: {len(findings)} {noun} ({codes}) in a {world_size}-rank job; "
                         f"exit {exit_code}{os.linesep}")
        sys.stderr.flush()
