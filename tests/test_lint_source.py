"""`lint_source`, the in-memory entry point (stdin and the public API): it honours the settings'
per-file ignores for the path it is given, applies unsafe fixes only when asked, and reports bytes
it cannot decode as one DDP999 at the offending byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint import isolation
from ddpdoctor.lint.engine import lint_bytes, lint_source

FIXES = Path(__file__).resolve().parent.parent / "fixtures" / "fixes"
AMP = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"


def test_per_file_ignores_apply_to_the_path_given() -> None:
    settings = Settings(select=("AMP001",), per_file_ignores=(("tests/*", ("AMP001",)),))
    assert [f.code for f in lint_source(AMP, "train.py", settings).findings] == ["AMP001"]
    assert lint_source(AMP, "tests/test_amp.py", settings).findings == []


def test_unsafe_fixes_only_when_asked() -> None:
    source = (FIXES / "DDP001" / "conditional_sampler_not_applied.in.py").read_text()
    settings = Settings(select=("DDP001",))
    safe = lint_source(source, "train.py", settings, fix=True)
    assert safe.fixed_source in (None, source) and [f.code for f in safe.findings] == ["DDP001"]
    unsafe = lint_source(source, "train.py", settings, fix=True, unsafe_fixes=True)
    assert unsafe.fixed_source is not None and ".set_epoch(epoch)" in unsafe.fixed_source
    assert unsafe.findings == []


@pytest.mark.parametrize(
    "data, line, column, message",
    [
        (b"import torch\nx = 1\ny = '\xff'\n", 3, 6, "cannot decode as utf-8: invalid byte 0xff"),
        (b"x = 1\n\n\xfe = 1\n", 3, 1, "cannot decode as utf-8: invalid byte 0xfe"),
        (b"# -*- coding: latin-9000 -*-\nx = 1\n", 1, 1, "cannot decode: unknown encoding: latin-9000"),
    ],
    ids=["third-line", "first-column", "unknown-coding-cookie"],
)
def test_undecodable_bytes_are_one_ddp999_at_the_byte(data: bytes, line: int, column: int, message: str) -> None:
    (finding,) = lint_source(data, "t.py", Settings(select=("DDP999",))).findings
    assert (finding.code, finding.path, finding.line, finding.column) == ("DDP999", "t.py", line, column)
    assert finding.message == message


def test_lint_bytes_gives_up_past_its_limits() -> None:
    data = b"import torch\nscaler = torch.cuda.amp.GradScaler()\n" * 400
    codes = frozenset({"AMP001", "DDP999"})
    big = lint_bytes(data, "t.py", codes, limits=isolation.Limits(max_bytes=1000))
    assert [(f.code, f.path, f.message) for f in big.findings] == [
        ("DDP999", "t.py", "larger than 0.00095 MB: skipped (see max-file-size)")
    ]
    assert not big.transient  # the same file is as large on the next run: cacheable
    slow = lint_bytes(data, "t.py", codes, limits=isolation.Limits(timeout_s=0.001))
    assert [(f.code, f.path, f.message) for f in slow.findings] == [
        ("DDP999", "t.py", "analysis exceeded its time budget (0.001 s)")
    ]
    assert slow.transient  # a time budget may pass on a quieter machine: never cached
    assert lint_bytes(data, "t.py", frozenset({"AMP001"}), limits=isolation.Limits(max_bytes=1000)).findings == []
