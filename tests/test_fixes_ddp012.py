"""DDP012's suggested fix: add `map_location=` to the `torch.load` call.

The edit names the local device the script already holds in a variable (`device`, or the local
rank pinned by `torch.cuda.set_device(gpu)`), else `"cpu"`. It is offered with `applicable=False`
(a script may mean to restore onto the saved devices), so `--fix` leaves the file alone; applied as
if accepted, each `fixtures/fixes/DDP012/NAME.py` must become `NAME.fixed.py`, and lint clean.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source
from ddpdoctor.lint.fixes import apply_fixes, verify

FIXES = Path(__file__).resolve().parent.parent / "fixtures" / "fixes" / "DDP012"
INPUTS = sorted(p for p in FIXES.glob("*.py") if not p.name.endswith(".fixed.py"))
SETTINGS = Settings(select=("DDP012",))


def test_there_are_cases_for_each_kind_of_device() -> None:
    fixed = [p.with_name(p.stem + ".fixed.py").read_text(encoding="utf-8") for p in INPUTS]
    assert any("map_location=device" in text for text in fixed)
    assert any('map_location=f"cuda:{gpu}"' in text for text in fixed)
    assert any('map_location="cpu"' in text for text in fixed)


@pytest.mark.parametrize("source_path", INPUTS, ids=lambda p: p.name)
def test_fix_is_offered_but_not_applied_by_fix_mode(source_path: Path) -> None:
    source = source_path.read_text(encoding="utf-8")
    findings = lint_source(source, str(source_path), SETTINGS).findings
    assert [f.code for f in findings] == ["DDP012"]
    fix = findings[0].fix
    assert fix is not None and not fix.applicable and len(fix.edits) == 1
    assert fix.description.startswith("pass map_location=")
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
