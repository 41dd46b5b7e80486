"""The command line as a newcomer meets it (issue 26): counts in JSON, the summary with -o, a
configuration error that names its file, `train.py` not `./train.py`, `rules` on an 80-column
terminal, `explain` by a rule's name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli_helpers import invoke
from ddpdoctor.catalog import load_catalog
from ddpdoctor.cli import main

ROOT = Path(__file__).resolve().parent.parent
BUGGY = (ROOT / "examples" / "buggy_train.py").read_text(encoding="utf-8")
ANSI = re.compile(r"\x1b\[[0-9;]*m")




@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[tool.ddpdoctor]\n")
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "second.py").write_text(BUGGY)
    return tmp_path


def test_statistics_in_json_are_counts_per_code(project: Path) -> None:
    result = invoke(["lint", "--no-cache", "--statistics", "--format", "json", "."], project)
    assert result.exit_code == 1
    assert json.loads(result.stdout) == [
        {"code": "DDP001", "name": "missing-set-epoch", "count": 2, "fixable": 2},
        {"code": "DDP008", "name": "unguarded-checkpoint-save", "count": 2, "fixable": 0},
    ]


def test_statistics_refuse_formats_that_cannot_hold_counts(project: Path) -> None:
    result = invoke(["lint", "--no-cache", "--statistics", "--format", "sarif", "."], project)
    assert result.exit_code == 2
    assert result.stderr.strip() == "ddpdoctor: error: --statistics counts findings per code in text or json, not sarif"


def test_output_file_keeps_the_summary_in_a_text_report_and_on_the_terminal(project: Path) -> None:
    result = invoke(["lint", "--no-cache", "-o", "report.txt", "train.py"], project)
    assert result.exit_code == 1 and result.stdout == ""
    summary = "Found 2 problems (2 warnings) in 1 file. 1 fixable with --fix."
    lines = (project / "report.txt").read_text().splitlines()
    assert [line.split(" ")[1] for line in lines[:-1]] == ["DDP001", "DDP008"]
    assert lines[-1] == summary
    assert result.stderr == f"{summary} Report written to report.txt.\n"


def test_output_file_in_json_stays_pure_json_and_the_terminal_gets_the_summary(project: Path) -> None:
    result = invoke(["lint", "--no-cache", "--format", "json", "-o", "report.json", "train.py"], project)
    assert result.exit_code == 1 and result.stdout == ""
    assert [f["code"] for f in json.loads((project / "report.json").read_text())] == ["DDP001", "DDP008"]
    assert result.stderr.startswith("Found 2 problems (2 warnings) in 1 file.")


def test_output_file_quiet_says_nothing(project: Path) -> None:
    result = invoke(["lint", "--no-cache", "-q", "-o", "report.txt", "train.py"], project)
    assert result.exit_code == 1 and result.stdout == "" and result.stderr == ""
    assert "Found" not in (project / "report.txt").read_text()


def test_an_unknown_code_in_the_configuration_names_the_file_and_key(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.ddpdoctor]\nextend-select = ["DDP001", "DDP0X"]\n')
    result = invoke(["lint", "--no-cache", "train.py"], project)
    assert result.exit_code == 2
    config = project / "pyproject.toml"
    assert result.stderr == (
        f"ddpdoctor: error: {config}: 'extend-select': unknown rule code or prefix 'DDP0X' (see 'ddpdoctor rules')\n"
    )
    (project / "pyproject.toml").write_text('[tool.ddpdoctor.per-file-ignores]\n"tests/*" = ["NOPE1"]\n')
    result = invoke(["lint", "--no-cache", "train.py"], project)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"ddpdoctor: error: {config}: per-file-ignores['tests/*']: unknown rule code")


@pytest.mark.parametrize("args", [["."], [], ["./"], ["./train.py", "./jobs"], [".//train.py", "jobs/"]])
def test_paths_print_without_a_leading_dot_slash(project: Path, args: list[str]) -> None:
    result = invoke(["lint", "--no-cache", "-q", *args], project)
    paths = sorted({line.split(":")[0] for line in result.stdout.splitlines()})
    assert paths == ["jobs/second.py", "train.py"], result.stdout


def test_a_file_named_twice_is_linted_once(project: Path) -> None:
    result = invoke(["lint", "--no-cache", "-q", "./train.py", "train.py"], project)
    assert len(result.stdout.splitlines()) == 2


def _screen(width: int) -> list[str]:
    result = CliRunner().invoke(main, ["rules"], env={"FORCE_COLOR": "1", "NO_COLOR": "", "COLUMNS": str(width)})
    assert result.exit_code == 0
    return [ANSI.sub("", line) for line in result.stdout.splitlines()]


def test_rules_on_an_80_column_terminal_keep_every_summary_whole_and_within_the_width() -> None:
    lines = _screen(80)
    assert all(len(line.rstrip()) <= 80 for line in lines)
    lint = [info for info in load_catalog().values() if info.kind == "lint"]
    assert len(lines) <= 1 + 3 * len(lint)  # the six-column table took about 10 lines a rule
    flowing = " ".join(" ".join(line.split()) for line in lines)
    for info in lint:
        facts = f"{info.severity.value}, {'on' if info.default_on else 'off'} by default"
        assert f"{info.code} {info.name} ({facts}" in flowing
        assert " ".join(info.summary.split()) in flowing, info.code


def test_rules_on_a_wide_terminal_are_the_six_column_table() -> None:
    lines = _screen(200)
    assert lines[0].split() == ["code", "name", "severity", "default", "fixable", "summary"]
    ddp001 = next(line for line in lines if line.startswith("DDP001 "))
    assert ddp001.split()[:5] == ["DDP001", "missing-set-epoch", "warning", "on", "yes"]


@pytest.mark.parametrize("name", ["missing-set-epoch", "MISSING-SET-EPOCH", "ddp001"])
def test_explain_takes_a_rule_name_as_well_as_its_code(name: str) -> None:
    by_code = CliRunner().invoke(main, ["explain", "DDP001"])
    by_name = CliRunner().invoke(main, ["explain", name])
    assert by_name.exit_code == 0 and by_name.stdout == by_code.stdout
    assert by_name.stdout.startswith("# DDP001 missing-set-epoch")


def test_explain_an_unknown_name_is_a_one_line_error() -> None:
    result = CliRunner().invoke(main, ["explain", "missing-set-epochs"])
    assert result.exit_code == 2
    assert result.stderr == "ddpdoctor: error: unknown rule code or name 'missing-set-epochs' (see 'ddpdoctor rules')\n"


def test_server_without_its_extra_is_a_one_line_error() -> None:
    import subprocess
    import sys

    code = "import sys; sys.modules['pygls'] = None; from ddpdoctor.cli import main; main(['server'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == (
        "ddpdoctor: error: the server needs pygls and lsprotocol (pygls is missing): pip install 'ddpdoctor[server]'\n")
