"""Every labeled fixture yields exactly the codes its header names: a code missing or extra fails.

Header lines (in the first 10 lines of each fixtures/<CODE>/*.py):
    # expect: DDP001, DDP004        (or `# expect: none`)
    # world-size: 3                 (optional: the --world-size the script runs with)
Fixtures are linted with every rule selected (`ALL`), so an info rule firing where it should not
also fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
_EXPECT = re.compile(r"^#\s*expect:\s*(?P<codes>.*)$", re.MULTILINE)
_WORLD = re.compile(r"^#\s*world-size:\s*(?P<n>\d+)\s*$", re.MULTILINE)


def fixture_files() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*.py") if "fixes" not in p.relative_to(FIXTURES).parts)


def expected_codes(text: str) -> set[str]:
    head = "\n".join(text.splitlines()[:10])
    match = _EXPECT.search(head)
    if match is None:
        raise AssertionError("fixture lacks an '# expect: CODES' header line")
    raw = match.group("codes").strip()
    if raw.lower() == "none":
        return set()
    return {c.strip() for c in raw.split(",") if c.strip()}


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture_yields_exactly_its_codes(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    expected = expected_codes(text)
    head = "\n".join(text.splitlines()[:10])
    world = _WORLD.search(head)
    settings = Settings(select=("ALL",), world_size=int(world.group("n")) if world else None)
    result = lint_source(text, str(path), settings)
    found = {f.code for f in result.findings}
    details = "\n".join(f"  {f.line}:{f.column} {f.code} {f.message}" for f in result.findings)
    assert found == expected, f"expected {sorted(expected)}, got {sorted(found)}\n{details}"


def test_every_lint_rule_has_enough_fixtures() -> None:
    """At least two positives and two traps per code (the traps: files under fixtures/<CODE>/ that
    expect none of that code)."""
    from ddpdoctor.lint.rules.base import all_rules

    for code in all_rules():
        folder = FIXTURES / code
        files = sorted(folder.glob("*.py"))
        positives = [f for f in files if code in expected_codes(f.read_text(encoding="utf-8"))]
        traps = [f for f in files if code not in expected_codes(f.read_text(encoding="utf-8"))]
        assert len(positives) >= 2, f"{code}: needs at least two positive fixtures in {folder}"
        assert len(traps) >= 2, f"{code}: needs at least two trap fixtures in {folder}"
