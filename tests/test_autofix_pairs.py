"""Every autofix pair `fixtures/fixes/<CODE>/NAME.in.py` -> `NAME.out.py`, for every code.

`--fix` (only fixes marked applicable) must turn the input into exactly the output, the output must
re-parse, and a second run must change nothing. An `.out.py` equal to its `.in.py` states that the
fix is offered but must NOT be applied automatically.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from ddpdoctor.catalog import load_catalog
from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

FIXES = Path(__file__).resolve().parent.parent / "fixtures" / "fixes"
PAIRS = sorted(FIXES.glob("*/*.in.py"))


def expected(path: Path) -> str:
    return path.with_name(path.name.replace(".in.py", ".out.py")).read_text(encoding="utf-8")


def settings(path: Path) -> Settings:
    return Settings(select=(path.parent.name,))


def test_pairs_exist_for_every_autofixing_rule() -> None:
    codes = {p.parent.name for p in PAIRS}
    fixable = {code for code, info in load_catalog().items() if info.fixable and info.kind == "lint"}
    assert fixable >= {"AMP001", "AMP002", "DDP001", "DDP002", "DDP003", "DDP004", "DDP008", "DDP011", "HVD001", "HVD003"}
    assert fixable <= codes, f"fixable rules without fix pairs: {sorted(fixable - codes)}"
    for path in PAIRS:
        assert path.with_name(path.name.replace(".in.py", ".out.py")).is_file(), path


@pytest.mark.parametrize("path", PAIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fix_produces_exactly_the_expected_source(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    result = lint_source(source, str(path), settings(path), fix=True)
    assert result.error is None
    fixed = result.fixed_source if result.fixed_source is not None else source
    assert fixed == expected(path)
    cst.parse_module(fixed)


@pytest.mark.parametrize("path", PAIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_second_run_changes_nothing(path: Path) -> None:
    again = lint_source(expected(path), str(path), settings(path), fix=True)
    assert again.fixed_source is None and again.fixed == 0


@pytest.mark.parametrize("path", PAIRS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_unchanged_pairs_still_carry_a_suggested_fix(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    findings = lint_source(source, str(path), settings(path)).findings
    assert findings, "a fix pair must start from a real finding"
    if expected(path) == source:
        assert all(f.fix is None or not f.fix.applicable for f in findings)
        assert any(f.fix is not None for f in findings), "the fix should still be offered"
    else:
        assert any(f.fix is not None and f.fix.applicable for f in findings)
