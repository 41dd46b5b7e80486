"""The fix machinery itself: edits, overlaps, line endings, verification and atomic writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ddpdoctor.findings import Edit, Finding, Fix, Severity
from ddpdoctor.lint.fixes import FixError, apply_fixes, atomic_write, unified_diff, verify


def finding(*edits: Edit, applicable: bool = True) -> Finding:
    return Finding(
        code="AMP001", name="deprecated-cuda-amp", severity=Severity.INFO, message="m", path="t.py",
        fix=Fix("rewrite", applicable, tuple(edits)),
    )


def test_edits_apply_right_to_left_on_1_based_positions() -> None:
    source = "a = foo(1)\nb = foo(2)\n"
    fixed, count = apply_fixes(source, [finding(Edit(1, 5, 1, 8, "bar")), finding(Edit(2, 5, 2, 8, "baz"))])
    assert (fixed, count) == ("a = bar(1)\nb = baz(2)\n", 2)


def test_overlapping_fixes_are_deferred_not_merged() -> None:
    source = "x = foo(bar(1))\n"
    outer = finding(Edit(1, 5, 1, 16, "qux(0)"))
    inner = finding(Edit(1, 9, 1, 15, "zap"))
    fixed, count = apply_fixes(source, [outer, inner])
    assert (fixed, count) == ("x = qux(0)\n", 1)


def test_unsafe_fixes_are_not_applied() -> None:
    source = "x = foo()\n"
    assert apply_fixes(source, [finding(Edit(1, 5, 1, 8, "bar"), applicable=False)]) == (source, 0)


def test_multi_line_insertions_follow_the_file_line_endings() -> None:
    source = "x = 1\r\ny = 2\r\n"
    fixed, _ = apply_fixes(source, [finding(Edit(2, 1, 2, 1, "import os\n"))])
    assert fixed == "x = 1\r\nimport os\r\ny = 2\r\n"


def test_verify_judges_text_libcst_refuses_by_what_python_says() -> None:
    verify("import torch\ndef f():\n\\\n    return 1\n")  # a lone continuation line: valid Python
    with pytest.raises(FixError, match="invalid Python"):
        verify("x = 1\n\\\n")  # a continuation into the end of the file: not Python


def test_verify_rejects_broken_output() -> None:
    verify("x = 1\n")
    with pytest.raises(FixError, match="invalid Python"):
        verify("x = (\n")


def test_atomic_write_keeps_permissions_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "train.py"
    target.write_text("old\n")
    target.chmod(0o750)
    atomic_write(str(target), b"new\n")
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_atomic_write_that_cannot_replace_leaves_the_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    target.mkdir()  # a folder where the file should go: the rename fails
    with pytest.raises(OSError):
        atomic_write(str(target), b"new\n")
    assert target.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_unified_diff_names_both_sides() -> None:
    text = unified_diff("t.py", "a\n", "b\n")
    assert text.startswith("--- a/t.py\n+++ b/t.py\n")
    assert "-a\n+b\n" in text
