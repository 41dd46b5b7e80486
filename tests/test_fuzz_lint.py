"""A small, seeded fuzz run: generated and mutated programs never crash the linter, and a program
Python compiles never gets DDP999. The large run (>= 10,000 programs) is benchmarks/fuzz_lint.py."""

from __future__ import annotations

import random
import sys
import warnings
from pathlib import Path

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings

from ddpdoctor.config import Settings
from ddpdoctor.lint.engine import lint_source

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_programs import compiles, mutate, with_trigger  # noqa: E402

FIXTURES = sorted((Path(__file__).resolve().parent.parent / "fixtures").glob("*/*.py"))
ALL = Settings(select=("ALL",))


def check(source: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings from compile() on generated code
        valid = compiles(source)
        findings = lint_source(source, "fuzz.py", ALL).findings  # must not raise
    if valid:
        assert [f.message for f in findings if f.code == "DDP999"] == [], repr(source)


@settings(max_examples=30, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(hypothesmith.from_grammar())
def test_generated_programs(source: str) -> None:
    check(with_trigger(source))


@pytest.mark.parametrize("seed", range(4))
def test_mutated_fixtures(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(15):
        check(mutate(rng.choice(FIXTURES).read_text(encoding="utf-8"), rng))


@pytest.mark.parametrize(
    "source",
    [
        "class A(b=1, *c):\n    pass\n",  # libcst's grammar lacks a keyword before *args in bases
        "(w): int = 1\n",  # ... and a parenthesised annotated target
        "import torch\nscaler = torch.cuda.amp.GradScaler()\nclass A(b=1, *c):\n    pass\n",
    ],
)
def test_valid_python_libcst_refuses_gets_no_ddp999(source: str) -> None:
    compile(source, "t.py", "exec")
    assert [f.code for f in lint_source(source, "t.py", ALL).findings] == []


AMP_LINE = "scaler = torch.cuda.amp.GradScaler()"


@pytest.mark.parametrize(
    "source, line, column",
    [
        # A form feed in the indentation that opens a block (CPython resets the indent count there).
        (f"import torch\ndef f():\n\x0c    {AMP_LINE}\n", 3, 15),
        # A line holding only a backslash continuation before an indented line.
        (f"import torch\ndef f():\n\\\n    {AMP_LINE}\n", 4, 14),
    ],
    ids=["form-feed-indent", "lone-backslash-line"],
)
def test_valid_python_libcst_tokenizes_differently_is_analysed_at_the_right_place(
    source: str, line: int, column: int
) -> None:
    compile(source, "t.py", "exec")
    findings = lint_source(source, "t.py", Settings(select=("AMP001",))).findings
    assert [(f.code, f.line, f.column) for f in findings] == [("AMP001", line, column)]
    fixed = lint_source(source, "t.py", Settings(select=("AMP001",)), fix=True).fixed_source
    assert fixed == source.replace(AMP_LINE, 'scaler = torch.amp.GradScaler("cuda")')
