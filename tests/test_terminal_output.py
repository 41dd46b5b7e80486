"""Output a pipe can read: plain, whole lines when stdout is not a terminal (rules, probe, env);
rich tables and colour only on a terminal, as ruff does."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

from ddpdoctor.catalog import load_catalog
from ddpdoctor.cli import main
from ddpdoctor.terminal import plain_table


def test_plain_table_aligns_columns_and_never_pads_or_cuts_the_last() -> None:
    lines = plain_table(("code", "summary"), [("A1", "short"), ("LONGER9", "x" * 300)])
    assert lines == ["code     summary", "A1       short", "LONGER9  " + "x" * 300]


def test_rules_piped_is_one_whole_line_per_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    result = CliRunner().invoke(main, ["rules"])  # CliRunner's stdout is not a terminal
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["code", "name", "severity", "default", "fixable", "summary"]
    lint = [info for info in load_catalog().values() if info.kind == "lint"]
    assert len(lines) == 1 + len(lint)
    for info in lint:
        line = next(line for line in lines if line.startswith(info.code + " "))
        assert line.endswith(info.summary)  # whole, not squeezed into a 12-character column
    assert "\x1b[" not in result.output


def test_rules_on_a_terminal_is_a_rich_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    result = CliRunner().invoke(main, ["rules"])
    assert result.exit_code == 0
    assert "\x1b[" in result.output  # rich's styling


def _report() -> dict:
    from ddpdoctor.probe import results as R

    checks = [
        R.record("world", [R.entry(r, R.PASS, "") for r in range(2)], summary="2 ranks agree " + "y" * 150),
        R.record("allreduce", [R.entry(0, R.PASS, ""), R.entry(1, R.FAIL, "1/25 results wrong")],
                 summary="rank 1: 1/25 results wrong", advice="run nccl-tests"),
    ]
    return {"tool": "ddpdoctor probe", "exit_code": 1, "verdict": R.verdict(checks, 2), "backend": "gloo",
            "device": "cpu", "world_size": 2, "faults_injected": [], "environment": {"torch": "2.13", "host": "h"},
            "environment_findings": [], "checks": checks, "failures": [], "launch_error": None, "logs": None}


def test_probe_plain_report_has_no_boxes_and_whole_lines() -> None:
    from ddpdoctor.probe.report import render_plain

    out = io.StringIO()
    render_plain(_report(), out)
    lines = out.getvalue().splitlines()
    assert lines[1].split() == ["check", "r0", "r1", "verdict"]
    assert lines[2].startswith("world ") and lines[2].endswith("y" * 150)
    assert lines[3].split()[:3] == ["allreduce", "ok", "FAIL"]
    assert "  next: run nccl-tests" in lines
    assert lines[-1] == "verdict: 1 check(s) failed (allreduce) on rank 1"
    assert not any(ch in out.getvalue() for ch in "│┃━") and "\x1b[" not in out.getvalue()


def test_probe_rich_report_on_a_terminal_draws_a_table() -> None:
    from rich.console import Console

    from ddpdoctor.probe.report import render_rich

    buffer = io.StringIO()
    render_rich(_report(), Console(file=buffer, force_terminal=True, width=100))
    text = buffer.getvalue()
    assert "┃" in text or "│" in text
    assert "\x1b[" in text and "verdict: 1 check(s) failed" in text


def test_env_plain_text_never_folds_a_long_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.env import collect_env
    from ddpdoctor.env.render import to_text

    value = "INIT," * 60
    monkeypatch.setenv("NCCL_DEBUG_SUBSYS", value)
    text = to_text(collect_env(), [], color=False)
    assert any(value in line for line in text.splitlines())


def test_one_escape_table_for_every_command() -> None:
    """A control character reads the same in lint's report (file names, messages) and in what env,
    probe and guard print: each written as Python escapes it, one record a line."""
    from ddpdoctor.report.text import escaped
    from ddpdoctor.terminal import escape_controls

    raw = "a\x1b[31mb\nc\td\re\x7f\x85\x9b\u2028\u2029\x00é→"
    expected = "a\\x1b[31mb\\nc\\td\\re\\x7f\\x85\\x9b\\u2028\\u2029\\x00é→"
    assert escape_controls(raw) == expected
    assert escaped(raw) == expected
