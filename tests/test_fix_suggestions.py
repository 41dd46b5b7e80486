"""Every suggested (not automatically applied) fix pair `fixtures/fixes/<CODE>/NAME.py` ->
`NAME.fixed.py`, for every code that has them.

A suggestion carries `applicable=False`: `--fix` must leave the file alone. Applied as if the user
accepted it (`--unsafe-fixes`), the input must become exactly `NAME.fixed.py`, which must compile
and lint clean of the code. Why each is only a suggestion:
- DDP010 (`X.module(args)` -> `X(args)`): the DDP forward also broadcasts buffers and expects a
  backward through its output, so a human should confirm it;
- DDP012 (add `map_location=`): a script may mean to restore onto the saved devices.
Pairs that `--fix` applies (`NAME.in.py` -> `NAME.out.py`) are checked by test_autofix_pairs.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source
from ddpdoctor.lint.fixes import apply_fixes, verify

FIXES = Path(__file__).resolve().parent.parent / "fixtures" / "fixes"
INPUTS = sorted(p for p in FIXES.glob("*/*.py") if p.with_name(p.stem + ".fixed.py").is_file())
# What each suggestion's description starts with: the user reads it before accepting.
DESCRIPTIONS = {"DDP010": "Call ", "DDP012": "pass map_location="}


def settings(path: Path) -> Settings:
    return Settings(select=(path.parent.name,))


def expected(path: Path) -> str:
    return path.with_name(path.stem + ".fixed.py").read_text(encoding="utf-8")


def test_suggestion_pairs_exist_for_the_rules_that_only_suggest() -> None:
    assert {p.parent.name for p in INPUTS} == set(DESCRIPTIONS)


def test_ddp012_covers_each_kind_of_device() -> None:
    fixed = [expected(p) for p in INPUTS if p.parent.name == "DDP012"]
    assert any("map_location=device" in text for text in fixed)
    assert any('map_location=f"cuda:{gpu}"' in text for text in fixed)
    assert any('map_location="cpu"' in text for text in fixed)


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_suggestion_is_offered_but_not_applied_by_fix_mode(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    findings = lint_source(source, str(path), settings(path)).findings
    assert [f.code for f in findings] == [path.parent.name]
    fix = findings[0].fix
    assert fix is not None and not fix.applicable and len(fix.edits) == 1
    assert fix.description.startswith(DESCRIPTIONS[path.parent.name])
    result = lint_source(source, str(path), settings(path), fix=True)
    assert result.fixed == 0 and result.fixed_source is None


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_accepted_suggestion_gives_the_expected_source(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    findings = lint_source(source, str(path), settings(path)).findings
    accepted = [dataclasses.replace(f, fix=dataclasses.replace(f.fix, applicable=True)) for f in findings if f.fix]
    fixed, applied = apply_fixes(source, accepted)
    assert applied == len(accepted) == 1
    verify(fixed)
    assert fixed == expected(path)
    assert not lint_source(fixed, str(path), settings(path)).findings
