"""The catalog pages: well-formed, one per rule, and their examples really lint as they claim."""

from __future__ import annotations

import pytest

from ddpdoctor.catalog import load_catalog
from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import PARSE_ERROR_CODE, SUPPRESSION_CODE, lint_source
from ddpdoctor.lint.rules.base import all_rules

CATALOG = load_catalog()
LINT_PAGES = sorted(code for code, info in CATALOG.items() if info.kind == "lint")
SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "When to ignore", "References")


def test_every_rule_class_has_a_page_and_every_lint_page_a_rule() -> None:
    rules = set(all_rules())
    pages = set(LINT_PAGES) - {PARSE_ERROR_CODE, SUPPRESSION_CODE}  # the engine's own, not rule classes
    assert rules == pages


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_page_has_every_section(code: str) -> None:
    info = CATALOG[code]
    for section in SECTIONS:
        assert info.section(section), f"{code}: missing or empty section '## {section}'"
    assert info.body.startswith(f"# {code} {info.name}"), f"{code}: first heading must be '# {code} {info.name}'"


@pytest.mark.parametrize("code", LINT_PAGES)
def test_bad_example_yields_the_code(code: str) -> None:
    info = CATALOG[code]
    examples = info.examples("Example")
    assert examples, f"{code}: no ```python block under '## Example'"
    for example in examples:
        settings = Settings(select=(code,), world_size=_world_size(example))
        codes = {f.code for f in lint_source(example, f"{code}_example.py", settings).findings}
        assert code in codes, f"{code}: the bad example does not trigger the rule:\n{example}"


@pytest.mark.parametrize("code", LINT_PAGES)
def test_fixed_example_is_clean(code: str) -> None:
    info = CATALOG[code]
    examples = info.examples("Use instead")
    assert examples, f"{code}: no ```python block under '## Use instead'"
    for example in examples:
        settings = Settings(select=("ALL",), world_size=_world_size(example))
        findings = [f for f in lint_source(example, f"{code}_fixed.py", settings).findings if f.code == code]
        assert not findings, f"{code}: the fixed example still triggers: {[f.message for f in findings]}"


def _world_size(example: str) -> int | None:
    for line in example.splitlines():
        if line.startswith("# world-size:"):
            return int(line.split(":", 1)[1])
    return None
