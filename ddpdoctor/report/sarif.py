"""`--output-format sarif`: SARIF 2.1.0 for GitHub code scanning and other SARIF viewers.

One run; `tool.driver.rules` describes every lint rule in the catalog (so a viewer can show rules
that found nothing) plus any other rule a finding used, and each result points at its rule by
`ruleId` and `ruleIndex`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Mapping, Sequence
from urllib.parse import quote

from ddpdoctor.findings import Edit, Finding, Severity

if TYPE_CHECKING:
    from ddpdoctor.catalog import RuleInfo
    from ddpdoctor.report import ReportContext

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/ddpdoctor/ddpdoctor"
SRCROOT = "%SRCROOT%"

_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:/")
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def artifact_location(path: str) -> dict[str, str]:
    """A SARIF artifactLocation for a path as the finding gave it.

    `uri` must be a valid URI reference, so characters such as spaces or the angle brackets of
    `<stdin>` are percent-encoded; `/` is kept so the relative path still reads as one.
    """
    posix = path.replace(os.sep, "/") if os.sep != "/" else path
    if PurePosixPath(posix).is_absolute():
        return {"uri": "file://" + quote(_name_bytes(posix), safe="/")}
    if _WINDOWS_DRIVE.match(posix):
        return {"uri": "file:///" + posix[:2] + quote(_name_bytes(posix[2:]), safe="/")}
    return {"uri": quote(_name_bytes(posix), safe="/"), "uriBaseId": SRCROOT}


def _name_bytes(name: str) -> bytes:
    # A name that is not valid UTF-8 carries its bytes as lone surrogates: percent-encode those bytes.
    return name.encode("utf-8", "surrogateescape")


def _region(line: int, column: int, end_line: int, end_column: int) -> dict[str, int]:
    # The schema demands positive numbers and viewers choke on an end before the start; env and
    # probe findings may carry placeholder positions, so clamp rather than emit invalid SARIF.
    line, column = max(line, 1), max(column, 1)
    end_line = max(end_line, line)
    end_column = max(end_column, 1)
    if end_line == line:
        end_column = max(end_column, column)
    return {"startLine": line, "startColumn": column, "endLine": end_line, "endColumn": end_column}


def _replacement(edit: Edit) -> dict[str, Any]:
    return {
        "deletedRegion": _region(edit.line, edit.column, edit.end_line, edit.end_column),
        "insertedContent": {"text": edit.content},
    }


def _level(severity: Severity) -> str:
    return _LEVEL[severity]


def rule_descriptor(info: "RuleInfo") -> dict[str, Any]:
    full = info.section("What it does") or info.summary
    return {
        "id": info.code,
        "name": info.name,
        "shortDescription": {"text": info.summary},
        "fullDescription": {"text": full},
        "helpUri": info.help_uri,
        "help": {"text": info.body, "markdown": info.body},
        "defaultConfiguration": {"level": _level(info.severity), "enabled": info.default_on},
        "properties": {"tags": ["ddpdoctor", info.kind], "fixable": info.fixable},
    }


def _fallback_descriptor(finding: Finding) -> dict[str, Any]:
    # A code missing from the catalog (a plugin, a page still being written) still needs a rule
    # entry, or `ruleIndex` would point at nothing.
    return {
        "id": finding.code,
        "name": finding.name,
        "shortDescription": {"text": finding.name},
        "defaultConfiguration": {"level": _level(finding.severity)},
        "properties": {"tags": ["ddpdoctor", finding.source]},
    }


def _descriptors(
    findings: Sequence[Finding], catalog: Mapping[str, "RuleInfo"]
) -> list[dict[str, Any]]:
    used = {finding.code: finding for finding in findings}
    codes = {code for code, info in catalog.items() if info.kind == "lint"} | set(used)
    descriptors: list[dict[str, Any]] = []
    for code in sorted(codes):
        info = catalog.get(code)
        descriptors.append(rule_descriptor(info) if info else _fallback_descriptor(used[code]))
    return descriptors


def _result(finding: Finding, rule_index: int) -> dict[str, Any]:
    location = artifact_location(finding.path)
    result: dict[str, Any] = {
        "ruleId": finding.code,
        "ruleIndex": rule_index,
        "level": _level(finding.severity),
        # SARIF requires message text; an empty one would render as a blank alert.
        "message": {"text": finding.message or finding.name},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": location,
                    "region": _region(
                        finding.line, finding.column, finding.end_line, finding.end_column
                    ),
                }
            }
        ],
    }
    if finding.cell is not None:
        # A notebook's lines count within a cell, not within the JSON file a viewer would show:
        # the file alone, and where in it as properties.
        del result["locations"][0]["physicalLocation"]["region"]
        result["properties"] = {"cell": finding.cell, "cellLine": finding.line, "cellColumn": finding.column}
        return result
    if finding.fix is not None and finding.fix.edits:
        result["fixes"] = [
            {
                "description": {"text": finding.fix.description},
                "artifactChanges": [
                    {
                        "artifactLocation": dict(location),
                        "replacements": [_replacement(edit) for edit in finding.fix.edits],
                    }
                ],
            }
        ]
    if finding.details:
        result["properties"] = {"details": finding.details}
    return result


def build(findings: Sequence[Finding], context: "ReportContext") -> dict[str, Any]:
    """The SARIF log as a dict (the tests validate this against the official schema)."""
    ordered = sorted(findings, key=Finding.sort_key)
    rules = _descriptors(ordered, context.rules())
    index = {rule["id"]: i for i, rule in enumerate(rules)}
    driver: dict[str, Any] = {
        "name": "ddpdoctor",
        "version": context.tool_version,
        "informationUri": INFORMATION_URI,
        "rules": rules,
    }
    run: dict[str, Any] = {
        "tool": {"driver": driver},
        # libcst positions count code points, not UTF-16 units (the SARIF default).
        "columnKind": "unicodeCodePoints",
        "results": [_result(finding, index[finding.code]) for finding in ordered],
    }
    return {"$schema": SCHEMA_URI, "version": "2.1.0", "runs": [run]}


def render(findings: Sequence[Finding], context: "ReportContext") -> str:
    # `default=str` for the same reason as the JSON reporter: free-form `details`.
    return json.dumps(build(findings, context), indent=2, ensure_ascii=False, default=str)
