"""DDP010's fix: `X.module(args)` / `X.module.forward(args)` -> `X(args)`.

The fix is offered with `applicable=False` (the DDP forward also broadcasts buffers and expects a
backward through its output, so a human should confirm it), which `--fix` does not apply. These
tests check that, and check the edit itself by applying it as if it were accepted: each
`fixtures/fixes/DDP010/NAME.py` must become `NAME.fixed.py`, and the result must lint clean of DDP010.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source
from ddpdoctor.lint.fixes import apply_fixes, verify

FIXES = Path(__file__).resolve().parent.parent / "fixtures" / "fixes" / "DDP010"
INPUTS = sorted(p for p in FIXES.glob("*.py") if not p.name.endswith(".fixed.py"))
SETTINGS = Settings(select=("DDP010",))


@pytest.mark.parametrize("source_path", INPUTS, ids=lambda p: p.name)
def test_fix_is_offered_but_not_applied_by_fix_mode(source_path: Path) -> None:
    source = source_path.read_text(encoding="utf-8")
    findings = lint_source(source, str(source_path), SETTINGS).findings
    assert [f.code for f in findings] == ["DDP010"]
    fix = findings[0].fix
    assert fix is not None and not fix.applicable and len(fix.edits) == 1
    result = lint_source(source, str(source_path), SETTINGS, fix=True)
    assert result.fixed == 0 and result.fixed_source is None


@pytest.mark.parametrize("source_path", INPUTS, ids=lambda p: p.name)
def test_accepted_fix_gives_the_expected_source(source_path: Path) -> None:
    source = source_path.read_text(encoding="utf-8")
    expected = source_path.with_name(source_path.stem + ".fixed.py").read_text(encoding="utf-8")
    findings = lint_source(source, str(source_path), SETTINGS).findings
    accepted = [dataclasses.replace(f, fix=dataclasses.replace(f.fix, applicable=True)) for f in findings if f.fix]
    fixed, applied = apply_fixes(source, accepted)
    assert applied == len(accepted) == 1
    verify(fixed)
    assert fixed == expected
    assert not lint_source(fixed, str(source_path), SETTINGS).findings
