"""Reporters: turn a list of `Finding`s into text for a terminal, a machine or a CI service.

Reporters know nothing of where a finding came from (lint, env or probe) and never touch the
filesystem: everything they need besides the findings travels in a `ReportContext`.

Every format returns a string without a trailing newline; an empty string means "print nothing"
(text with `quiet` and no findings, github with no findings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

import ddpdoctor
from ddpdoctor.findings import Finding

if TYPE_CHECKING:
    from ddpdoctor.catalog import RuleInfo

FORMATS = ("text", "json", "sarif", "github")


@dataclass
class ReportContext:
    files_checked: int = 0
    color: bool = False  # True only on a TTY (the CLI decides, including NO_COLOR)
    show_source: bool = False  # code frame under each finding (CLI: on a TTY)
    statistics: bool = False  # a per-code count table instead of the finding list
    sources: Mapping[str, str] = field(default_factory=dict)  # path -> file text, for code frames
    fixed: int = 0  # how many findings --fix fixed (for the summary)
    quiet: bool = False  # findings only, no summary, nothing when clean
    tool_version: str = ddpdoctor.__version__
    catalog: Optional[Mapping[str, "RuleInfo"]] = None  # None: `load_catalog()`, on first use

    def rules(self) -> Mapping[str, "RuleInfo"]:
        """The catalog, loaded lazily so that formats which never need it (text, json, github)
        keep working even while a half-written rule page would make the catalog fail to load."""
        if self.catalog is None:
            from ddpdoctor.catalog import load_catalog

            self.catalog = load_catalog()
        return self.catalog


def _renderer(fmt: str) -> Callable[[Sequence[Finding], ReportContext], str]:
    # Only the asked-for format's module is imported: `import ddpdoctor.report` stays cheap, and
    # rich (which only coloured text needs) is never imported for json, sarif or github.
    if fmt == "text":
        from ddpdoctor.report import text

        return text.render
    if fmt == "json":
        from ddpdoctor.report import json_report

        return json_report.render
    if fmt == "sarif":
        from ddpdoctor.report import sarif

        return sarif.render
    if fmt == "github":
        from ddpdoctor.report import github

        return github.render
    raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")


def render(findings: Sequence[Finding], fmt: str, context: ReportContext) -> str:
    """Render `findings` in format `fmt` (one of `FORMATS`)."""
    return _renderer(fmt)(findings, context)


__all__ = ["FORMATS", "ReportContext", "render"]
