"""The text reporter: ruff-style lines, code frames, summary, statistics, quiet, color."""

from __future__ import annotations

import re

import pytest

from ddpdoctor.findings import Edit, Finding, Fix, Severity
from ddpdoctor.report import FORMATS, ReportContext, render

SOURCE = (
    "import torch\n"
    "model = DDP(model)\n"
    "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
    "\tloss = 日本(x)  # tab-indented, wide characters\n"
    "for epoch in range(3):\r\n"
    "    train(loader,\n"
    "          epoch)\n"
)

SYNCBN = Finding(
    "DDP002", "syncbn-after-ddp", Severity.ERROR, "SyncBatchNorm conversion applied after DDP",
    "train.py", 3, 9, 3, 48,
    Fix("Convert before wrapping", True, (Edit(3, 1, 3, 55, ""),)),
)
WIDE = Finding("DDP050", "wide-call", Severity.WARNING, "call 日本\nsecond line of the message",
               "train.py", 4, 9, 4, 12)
MULTILINE = Finding("DDP101", "no-set-epoch", Severity.WARNING, "set_epoch() missing",
                    "train.py", 6, 5, 7, 16, Fix("Needs review", False, (Edit(6, 5, 6, 5, "x"),)))
FIRST_LINE = Finding("DDP001", "no-destroy", Severity.ERROR, "never destroyed", "train.py",
                     1, 1, 1, 7, Fix("Nothing to edit", True, ()))
OTHER = Finding("DDP101", "no-set-epoch", Severity.WARNING, "set_epoch() missing",
                "a dir/m,o:d é.py", 2, 1, 2, 4)
ENV = Finding("ENV001", "nccl-p2p-disabled", Severity.INFO, "NCCL_P2P_DISABLE=1", "<env>",
              source="env")
ALL = [SYNCBN, WIDE, MULTILINE, FIRST_LINE, OTHER, ENV]


def _text(findings: list[Finding], **options: object) -> str:
    context = ReportContext(catalog={}, **options)  # type: ignore[arg-type]
    return render(findings, "text", context)


def test_formats_and_unknown_format() -> None:
    assert FORMATS == ("text", "json", "sarif", "github")
    with pytest.raises(ValueError, match="unknown output format 'xml'"):
        render([], "xml", ReportContext(catalog={}))


def test_lines_sorted_then_summary() -> None:
    assert _text(ALL, files_checked=4) == (
        "ENV001 NCCL_P2P_DISABLE=1\n"  # no file, so no location
        "a dir/m,o:d é.py:2:1: DDP101 set_epoch() missing\n"
        "train.py:1:1: DDP001 never destroyed\n"
        "train.py:3:9: DDP002 SyncBatchNorm conversion applied after DDP\n"
        "train.py:4:9: DDP050 call 日本\n"
        "    second line of the message\n"
        "train.py:6:5: DDP101 set_epoch() missing\n"
        # Only SYNCBN counts as fixable: MULTILINE's fix is not applicable, FIRST_LINE's has no
        # edits; `<env>` is not a file.
        "Found 6 problems (2 errors, 3 warnings, 1 info) in 2 files. 1 fixable with --fix."
    )


def test_summary_singular_and_without_files() -> None:
    assert _text([SYNCBN]).endswith("\nFound 1 problem (1 error) in 1 file. 1 fixable with --fix.")
    assert _text([ENV]).endswith("\nFound 1 problem (1 info).")
    assert _text([OTHER, ENV, ENV]).endswith("\nFound 3 problems (1 warning, 2 info) in 1 file.")


def test_summary_reports_what_fix_fixed() -> None:
    assert _text([OTHER], fixed=2).endswith(
        "\nFound 1 problem (1 warning) in 1 file. Fixed 2 problems.")
    assert _text([], fixed=1, files_checked=3) == "Fixed 1 problem. All checks passed! (3 files)"


def test_all_checks_passed() -> None:
    assert _text([], files_checked=12) == "All checks passed! (12 files)"
    assert _text([], files_checked=1) == "All checks passed! (1 file)"
    assert _text([]) == "All checks passed!"


def test_quiet_prints_findings_only_and_nothing_when_clean() -> None:
    assert _text([SYNCBN, OTHER], quiet=True, files_checked=3) == (
        "a dir/m,o:d é.py:2:1: DDP101 set_epoch() missing\n"
        "train.py:3:9: DDP002 SyncBatchNorm conversion applied after DDP"
    )
    assert _text([], quiet=True, files_checked=3) == ""
    assert _text([], quiet=True, color=True) == ""


def test_statistics_table_sorted_by_count() -> None:
    findings = [OTHER, SYNCBN, MULTILINE, ENV, OTHER, FIRST_LINE, SYNCBN]
    assert _text(findings, statistics=True, files_checked=9) == (
        "3  DDP101  no-set-epoch\n"
        "2  DDP002  syncbn-after-ddp\n"
        "1  DDP001  no-destroy\n"
        "1  ENV001  nccl-p2p-disabled\n"
        "Found 7 problems (3 errors, 3 warnings, 1 info) in 2 files. 2 fixable with --fix."
    )
    many = [OTHER] * 12 + [ENV]
    assert _text(many, statistics=True, quiet=True) == (
        "12  DDP101  no-set-epoch\n"
        " 1  ENV001  nccl-p2p-disabled"
    )
    assert _text([], statistics=True, files_checked=2) == "All checks passed! (2 files)"


def test_code_frames() -> None:
    out = _text([SYNCBN, FIRST_LINE, WIDE, MULTILINE, OTHER], show_source=True,
                sources={"train.py": SOURCE})
    assert out == (
        # No source for this path: the line alone.
        "a dir/m,o:d é.py:2:1: DDP101 set_epoch() missing\n"
        # Line 1 has no line before it; a fix shows its description.
        "train.py:1:1: DDP001 never destroyed\n"
        "  |\n"
        "1 | import torch\n"
        "  | ^^^^^^ DDP001\n"
        "  |\n"
        "  = help: Nothing to edit\n"
        "\n"
        "train.py:3:9: DDP002 SyncBatchNorm conversion applied after DDP\n"
        "  |\n"
        "2 | model = DDP(model)\n"
        "3 | model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
        "  |         " + "^" * 39 + " DDP002\n"
        "  |\n"
        "  = help: Convert before wrapping\n"
        "\n"
        # Tabs are expanded and 日本 is two cells per character, so the caret still lines up.
        "train.py:4:9: DDP050 call 日本\n"
        "    second line of the message\n"
        "  |\n"
        "3 | model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
        "4 |     loss = 日本(x)  # tab-indented, wide characters\n"
        "  |            ^^^^^ DDP050\n"
        "  |\n"
        "\n"
        # A range over several lines is underlined to the end of its first line; the \r\n on
        # line 5 counts as one line break.
        "train.py:6:5: DDP101 set_epoch() missing\n"
        "  |\n"
        "5 | for epoch in range(3):\n"
        "6 |     train(loader,\n"
        "  |     ^^^^^^^^^^^^^ DDP101\n"
        "  |\n"
        "  = help: Needs review\n"
        "\n"
        "Found 5 problems (2 errors, 3 warnings) in 2 files. 1 fixable with --fix."
    )


def test_code_frame_gutter_widens_and_odd_lines_are_skipped() -> None:
    source = "".join(f"x{i} = {i}\n" for i in range(1, 11))
    ten = Finding("DDP009", "n", Severity.ERROR, "m", "f.py", 10, 1, 10, 4)
    beyond = Finding("DDP009", "n", Severity.ERROR, "m", "f.py", 99, 1, 99, 2)
    out = _text([ten, beyond], show_source=True, sources={"f.py": source}, quiet=True)
    assert out == (
        "f.py:10:1: DDP009 m\n"
        "   |\n"
        " 9 | x9 = 9\n"
        "10 | x10 = 10\n"
        "   | ^^^ DDP009\n"
        "   |\n"
        "\n"
        "f.py:99:1: DDP009 m"
    )


def test_control_characters_in_source_do_not_reach_the_terminal() -> None:
    finding = Finding("DDP009", "n", Severity.ERROR, "m", "f.py", 1, 1, 1, 2)
    out = _text([finding], show_source=True, sources={"f.py": "x = '\x1b[31m'\n"}, quiet=True)
    assert "\x1b" not in out
    assert "1 | x = '\ufffd[31m'" in out


def test_no_ansi_without_color_even_when_the_environment_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    for options in ({}, {"show_source": True, "sources": {"train.py": SOURCE}},
                    {"statistics": True}):
        assert "\x1b" not in _text(ALL, files_checked=3, **options)
    assert "\x1b" not in _text([], files_checked=3)


def test_color_uses_ansi_codes_per_severity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")  # the CLI decides; the reporter obeys `color`
    out = _text([SYNCBN, OTHER, ENV], color=True, show_source=True,
                sources={"train.py": SOURCE})
    assert "\x1b[" in out
    assert "\x1b[1;31mDDP002\x1b[0m" in out  # error: bold red
    assert "\x1b[1;33mDDP101\x1b[0m" in out  # warning: bold yellow
    assert "\x1b[1;36mENV001\x1b[0m" in out  # info: bold cyan
    # Colour changes nothing but the escapes: strip them and the plain output comes back.
    plain = _text([SYNCBN, OTHER, ENV], show_source=True, sources={"train.py": SOURCE})
    assert re.sub(r"\x1b\[[0-9;]*m", "", out) == plain
    assert "\x1b[" in _text([], color=True)


def test_user_text_is_never_parsed_as_markup() -> None:
    finding = Finding("DDP009", "n", Severity.ERROR, "use [bold]x[/bold] :smile: here",
                      "[red]f.py", 1, 1, 1, 2)
    for color in (False, True):
        out = _text([finding], color=color, quiet=True)
        assert "[bold]x[/bold] :smile: here" in out
        assert "[red]f.py" in out


def test_windows_line_breaks_in_a_message_leave_no_carriage_return() -> None:
    finding = Finding("DDP009", "n", Severity.ERROR, "first\r\nsecond\rthird", "f.py")
    assert _text([finding], quiet=True) == "f.py:1:1: DDP009 first\n    second\n    third"


def test_long_lines_are_not_wrapped_with_color() -> None:
    finding = Finding("DDP009", "n", Severity.ERROR, "word " * 100, "f.py", 1, 1, 1, 2)
    assert len(_text([finding], color=True, quiet=True).splitlines()) == 1


def test_findings_without_a_file_print_no_location() -> None:
    gpu = Finding("ENV002", "gpu-throttled", Severity.WARNING, "GPU 3 is throttled", "<GPU 3>", source="env")
    probe = Finding("PRB001", "allreduce", Severity.ERROR, "rank 1 is wrong", "<probe>", source="probe")
    lines = _text([ENV, gpu, probe]).splitlines()
    assert lines[:3] == ["GPU 3: ENV002 GPU 3 is throttled", "ENV001 NCCL_P2P_DISABLE=1", "PRB001 rank 1 is wrong"]
    assert not any(":1:1:" in line for line in lines)


@pytest.mark.parametrize("color", [False, True])
def test_a_file_name_with_a_newline_or_control_characters_stays_on_its_finding_line(color: bool) -> None:
    forged = "a.py:1:1: DDP001 forged"
    finding = Finding("DDP009", "n", Severity.ERROR, "real", f"x\n{forged}\r\x1b[2K\u2028y.py", 1, 1, 1, 2)
    out = _text([finding], color=color, quiet=True)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # the reporter's own colour codes
    assert plain == "x\\na.py:1:1: DDP001 forged\\r\\x1b[2K\\u2028y.py:1:1: DDP009 real"
    assert len(out.splitlines()) == 1


def test_control_characters_in_a_message_are_escaped_and_its_lines_stay_indented() -> None:
    finding = Finding("DDP009", "n", Severity.ERROR, "from \x1b[31mother.py\nsecond\tline", "f.py")
    assert _text([finding], quiet=True) == "f.py:1:1: DDP009 from \\x1b[31mother.py\n    second\\tline"


def test_ordinary_names_and_messages_are_shown_as_they_are() -> None:
    finding = Finding("DDP009", "n", Severity.ERROR, "call 日本 é — fine", "a dir/m,o:d é.py", 2, 3, 2, 4)
    assert _text([finding], quiet=True) == "a dir/m,o:d é.py:2:3: DDP009 call 日本 é — fine"
