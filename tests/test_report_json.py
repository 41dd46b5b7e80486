"""The json reporter: a sorted array of `Finding.to_dict()`, indent 2, unicode kept."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.findings import Edit, Finding, Fix, Severity
from ddpdoctor.report import ReportContext, render

FIX = Fix("Call sampler.set_epoch(epoch) at the top of the epoch loop", True,
          (Edit(10, 5, 10, 5, "sampler.set_epoch(epoch)\n    "),))
FINDINGS = [
    Finding("DDP101", "no-set-epoch", Severity.WARNING, "set_epoch() never called\non sampler",
            "train.py", 10, 5, 10, 30, FIX),
    Finding("DDP002", "syncbn-after-ddp", Severity.ERROR, "convert après DDP — modèle",
            "train.py", 10, 5, 10, 30),
    Finding("DDP002", "syncbn-after-ddp", Severity.ERROR, "first", "a dir/m,o:d.py", 1, 1, 1, 4),
    Finding("ENV001", "nccl-p2p-disabled", Severity.INFO, "NCCL_P2P_DISABLE=1", "<env>",
            source="env", details={"NCCL_P2P_DISABLE": "1", "where": Path("/etc/environment")}),
]


def _render(findings: list[Finding]) -> str:
    return render(findings, "json", ReportContext(catalog={}))


def test_array_sorted_by_path_line_column_code() -> None:
    data = json.loads(_render(FINDINGS))
    assert [(d["path"], d["line"], d["column"], d["code"]) for d in data] == [
        ("<env>", 1, 1, "ENV001"),
        ("a dir/m,o:d.py", 1, 1, "DDP002"),
        ("train.py", 10, 5, "DDP002"),
        ("train.py", 10, 5, "DDP101"),
    ]


def test_every_entry_has_the_documented_keys() -> None:
    required = {"code", "name", "severity", "message", "path", "line", "column", "end_line",
                "end_column", "fix"}
    for entry in json.loads(_render(FINDINGS)):
        assert required <= entry.keys()
        assert entry["severity"] in ("error", "warning", "info")


def test_fix_is_null_or_description_applicable_edits() -> None:
    by_code = {(d["code"], d["path"]): d for d in json.loads(_render(FINDINGS))}
    assert by_code[("DDP002", "train.py")]["fix"] is None
    assert by_code[("DDP101", "train.py")]["fix"] == {
        "description": "Call sampler.set_epoch(epoch) at the top of the epoch loop",
        "applicable": True,
        "edits": [{"line": 10, "column": 5, "end_line": 10, "end_column": 5,
                   "content": "sampler.set_epoch(epoch)\n    "}],
    }


def test_round_trips_through_finding_from_dict() -> None:
    data = json.loads(_render(FINDINGS[:3]))
    assert sorted(FINDINGS[:3], key=Finding.sort_key) == [Finding.from_dict(d) for d in data]


def test_indent_two_unicode_kept_and_odd_details_stringified() -> None:
    text = _render(FINDINGS)
    assert text.startswith('[\n  {\n    "code": ')
    assert "convert après DDP — modèle" in text  # not \u00e8-escaped
    env = json.loads(text)[0]
    assert env["details"] == {"NCCL_P2P_DISABLE": "1", "where": "/etc/environment"}
    assert env["source"] == "env"


def test_empty() -> None:
    assert _render([]) == "[]"
