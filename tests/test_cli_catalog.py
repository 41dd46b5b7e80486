"""`ddpdoctor rules` and `ddpdoctor explain`: the catalog as users see it."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ddpdoctor import __version__
from ddpdoctor.catalog import load_catalog
from ddpdoctor.cli import main

LINT_CODES = sorted(c for c, i in load_catalog().items() if i.kind == "lint")
ENV_CODES = sorted(c for c, i in load_catalog().items() if i.kind == "env")
GUARD_CODES = sorted(c for c, i in load_catalog().items() if i.kind == "guard")


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_rules_table_lists_every_lint_rule_with_its_facts() -> None:
    result = invoke("rules")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split()[:5] == ["code", "name", "severity", "default", "fixable"]
    for code in LINT_CODES:
        info = load_catalog()[code]
        row = next(line for line in lines if line.startswith(code))
        assert info.name in row and info.severity.value in row
        assert ("on" if info.default_on else "off") in row.split()
    assert not any(line.startswith("ENV") for line in lines)


def test_rules_json_and_all() -> None:
    payload = json.loads(invoke("rules", "--format", "json").output)
    assert [r["code"] for r in payload] == LINT_CODES
    amp001 = next(r for r in payload if r["code"] == "AMP001")
    assert amp001 == {
        "code": "AMP001", "name": "deprecated-cuda-amp", "severity": "info", "default": "off", "fixable": True, "fix": "auto",
        "kind": "lint", "summary": amp001["summary"], "help_uri": amp001["help_uri"],
    }
    everything = json.loads(invoke("rules", "--all", "--format", "json").output)
    assert {r["code"] for r in everything} == set(LINT_CODES) | set(ENV_CODES) | set(GUARD_CODES)
    assert GUARD_CODES == [f"GRD00{n}" for n in range(1, 8)]


def test_explain_prints_the_page_and_is_case_insensitive() -> None:
    result = invoke("explain", "ddp001")
    assert result.exit_code == 0
    assert result.output.startswith("# DDP001 missing-set-epoch")
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
        assert section in result.output
    assert "severity: warning" in result.output


def test_explain_json_and_unknown_code() -> None:
    payload = json.loads(invoke("explain", "HVD001", "--format", "json").output)
    assert payload["code"] == "HVD001" and payload["name"] == "horovod-lr-not-scaled"
    assert "## Why is this bad?" in payload["body"]
    missing = invoke("explain", "DDP123")
    assert missing.exit_code == 2
    assert missing.output.strip() == "ddpdoctor: error: unknown rule code or name 'DDP123' (see 'ddpdoctor rules')"


def test_version() -> None:
    result = invoke("--version")
    assert result.output.strip() == f"ddpdoctor {__version__}"


def test_suggested_fixes_are_not_called_fixable() -> None:
    payload = {r["code"]: r for r in json.loads(invoke("rules", "--format", "json").output)}
    assert payload["DDP010"]["fixable"] is False and payload["DDP010"]["fix"] == "suggested"
    row = next(line for line in invoke("rules").output.splitlines() if line.startswith("DDP010"))
    assert "suggested" in row.split()


def test_rules_and_explain_list_the_field_rules() -> None:
    """Issue 11's codes: DDP012 (on, suggested fix) and DP003 (on, no fix)."""
    payload = {r["code"]: r for r in json.loads(invoke("rules", "--format", "json").output)}
    assert (payload["DDP012"]["name"], payload["DDP012"]["default"], payload["DDP012"]["fix"]) == (
        "load-without-map-location", "on", "suggested",
    )
    assert (payload["DP003"]["name"], payload["DP003"]["default"], payload["DP003"]["fix"]) == (
        "dataparallel-inside-rank", "on", "none",
    )
    table = invoke("rules").output
    assert any(line.startswith("DDP012") and "suggested" in line for line in table.splitlines())
    page = invoke("explain", "DDP012").output
    assert page.startswith("# DDP012 load-without-map-location") and "map_location" in page
    assert invoke("explain", "dp003").output.startswith("# DP003 dataparallel-inside-rank")
