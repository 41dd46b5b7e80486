"""The ENV catalog pages: format, and one page for every code `diagnose` can emit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpdoctor.catalog import load_catalog

SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "When to ignore", "References")
DIAGNOSE = Path(__file__).resolve().parents[2] / "ddpdoctor" / "env" / "diagnose.py"
ENV_PAGES = sorted(code for code, info in load_catalog().items() if info.kind == "env")


def test_every_emitted_code_has_a_page_and_every_page_is_emitted() -> None:
    emitted = set(re.findall(r'"(ENV\d{3})"', DIAGNOSE.read_text()))
    assert emitted == set(ENV_PAGES)
    assert {f"ENV{n:03d}" for n in range(1, 11)} <= emitted


@pytest.mark.parametrize("code", ENV_PAGES)
def test_page_format(code: str) -> None:
    info = load_catalog()[code]
    assert info.default_on and not info.fixable
    assert info.body.startswith(f"# {code} {info.name}\n")
    for title in SECTIONS:
        assert info.section(title), f"{code}: empty '## {title}'"
    for title in ("Example", "Use instead"):
        assert info.examples(title) == [], "python blocks on pages get linted; use console/text"
    assert re.search(r"```(console|text)\n", info.section("Example"))
    assert re.search(r"^- \[.+\]\(https://", info.section("References"), re.MULTILINE)
