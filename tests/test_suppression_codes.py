"""DDP100: a code in a suppression comment that names no rule silences nothing, and says so.

Every unknown code in `# ddpdoctor: ignore[...]` (a comment for ddpdoctor alone); in `# noqa:` only
codes of ddpdoctor's own families, since `# noqa: E501` belongs to another linter. It behaves like a
rule: selected by default, `--select`/`--ignore`/per-file-ignores, suppressible, explained."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.cli import main
from ddpdoctor.config import Settings, lint_catalog
from ddpdoctor.lint.engine import SUPPRESSION_CODE, lint_source
from ddpdoctor.lint.suppress import suppressions, unknown_codes

SAVE = 'import torch\ntorch.save(model.state_dict(), "checkpoint.pt")'
KNOWN = lint_catalog()


def ddp100(source: str, settings: Settings | None = None) -> list[tuple[int, int, str]]:
    result = lint_source(source, "t.py", settings or Settings())
    return [(f.line, f.column, f.message) for f in result.findings if f.code == SUPPRESSION_CODE]


def test_unknown_codes_in_each_form() -> None:
    source = (
        "a = 1  # ddpdoctor: ignore[DDP08, XYZ123]\n"
        "b = 2  # noqa: E501, DDP0012, B008\n"
        "c = 3  # noqa: ddp001  # ddpdoctor: ignore[amp002]\n"
        "d = 4  # ddpdoctor: ignore\n"
        "e = 5  # noqa\n"
    )
    found = [(n.line, n.column, n.written, n.ddpdoctor) for n in unknown_codes(source, KNOWN)]
    assert found == [(1, 28, "DDP08", True), (1, 35, "XYZ123", True), (2, 22, "DDP0012", False)]
    lines = source.splitlines()
    assert (lines[0][27:32], lines[0][34:40], lines[1][21:28]) == ("DDP08", "XYZ123", "DDP0012")  # 1-based columns


def test_the_suppression_table_is_read_as_before() -> None:
    source = "a  # ddpdoctor: ignore[DDP001 ,DDP002]\nb  # noqa: e501,ddp003\nc  # DDPDOCTOR: IGNORE\nd  # noqa\n"
    assert suppressions(source) == {1: {"DDP001", "DDP002"}, 2: {"E501", "DDP003"}, 3: {"*"}}


def test_a_mistyped_code_is_reported_where_it_is_written_with_the_nearest_real_code() -> None:
    source = SAVE + "  # ddpdoctor: ignore[DDP08]\n"
    assert source.splitlines()[1].index("DDP08") == 69
    assert ddp100(source) == [
        (2, 70, "`DDP08` in this `# ddpdoctor: ignore[...]` comment is not a ddpdoctor rule code, so it "
         "silences nothing. Did you mean `DDP008` or `DDP018`?")
    ]


def test_one_nearest_code_is_named_alone() -> None:
    (_, _, message), = ddp100("x = 1  # ddpdoctor: ignore[HVD04]\n")
    assert message.endswith("Did you mean `HVD004`?")
    (_, _, message), = ddp100("x = 1  # ddpdoctor: ignore[DDP0012]\n")  # one keystroke from three codes
    assert message.endswith("Did you mean `DDP001`, `DDP002` or `DDP012`?")


def test_a_code_like_no_rule_gets_the_list_of_codes_instead() -> None:
    (line, _, message), = ddp100("x = 1  # ddpdoctor: ignore[QQQ999]\n")
    assert line == 1 and message.endswith("See `ddpdoctor rules` for the rule codes.")


def test_known_codes_and_other_linters_codes_are_left_alone() -> None:
    source = "x = 1  # noqa: E501, F401, DDP008, ddp001\ny = 2  # ddpdoctor: ignore[DDP999, DDP100]\nz = 3  # noqa\n"
    assert ddp100(source) == []


def test_it_runs_on_a_file_no_rule_parses() -> None:
    # No distributed word at all: the pre-filter parses nothing, the comment is still read.
    assert [line for line, _, _ in ddp100("import os\nos.getcwd()  # noqa: DDP0001\n")] == [2]


def test_selected_ignored_and_suppressed_like_a_rule(tmp_path: Path) -> None:
    source = "x = 1  # ddpdoctor: ignore[DDP08]\n"
    assert len(ddp100(source, Settings(select=("DDP100",)))) == 1
    assert ddp100(source, Settings(select=("DDP",), ignore=("DDP100",))) == []
    assert ddp100(source, Settings(select=("AMP",))) == []
    assert ddp100("x = 1  # ddpdoctor: ignore[DDP08, DDP100]\n") == []
    assert ddp100("x = 1  # ddpdoctor: ignore[DDP08]  # noqa: DDP100\n") == []
    (tmp_path / "pyproject.toml").write_text('[tool.ddpdoctor]\nper-file-ignores = { "legacy/*" = ["DDP100"] }\n')
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "old.py").write_text(source)
    (tmp_path / "new.py").write_text(source)
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(main, ["lint", "--no-cache", "."], catch_exceptions=False)
    finally:
        os.chdir(old)
    assert result.exit_code == 1
    assert [line.split(":")[0] for line in result.output.splitlines() if "DDP100" in line] == ["new.py"]


def test_with_fix_it_is_reported_on_the_fixed_text() -> None:
    source = (
        "import torch\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "x = 1  # ddpdoctor: ignore[AMP01]\n"
    )
    result = lint_source(source, "t.py", Settings(select=("AMP001", "DDP100")), fix=True)
    assert result.fixed_source is not None and "torch.amp.GradScaler" in result.fixed_source
    fixed_line = result.fixed_source.splitlines().index("x = 1  # ddpdoctor: ignore[AMP01]") + 1
    assert [(f.code, f.line) for f in result.findings] == [("DDP100", fixed_line)]
    assert ("DDP100", 3) in [(f.code, f.line) for f in result.findings_before_fix]


def test_explained_and_listed() -> None:
    runner = CliRunner()
    assert "# DDP100 invalid-rule-code" in runner.invoke(main, ["explain", "DDP100"]).output
    listed = runner.invoke(main, ["rules"]).output
    assert any(line.startswith("DDP100  invalid-rule-code") and " on " in line for line in listed.splitlines())


@pytest.mark.parametrize("comment", ["# ddpdoctor: ignore[DDP08]", "# noqa: DDP0012"])
def test_the_cli_reports_it_as_a_warning(tmp_path: Path, comment: str) -> None:
    (tmp_path / "t.py").write_text(f"x = 1  {comment}\n")
    result = CliRunner().invoke(main, ["lint", "--no-cache", str(tmp_path / "t.py")], catch_exceptions=False)
    assert result.exit_code == 1
    assert ": DDP100 " in result.output and "(1 warning)" in result.output
