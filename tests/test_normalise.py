"""The rewrite of valid Python that libcst's tokenizer refuses, asked directly: what the text
becomes, and how findings (and their fix edits) on the rewritten text map back to the original."""

from __future__ import annotations

from ddpdoctor.findings import Edit, Finding, Fix, Severity
from ddpdoctor.lint import normalise


def finding(line: int, column: int, end_column: int, edit: Edit) -> Finding:
    return Finding(
        "AMP001", "n", Severity.INFO, "m", "t.py", line, column, line, end_column, Fix("f", True, (edit,))
    )


def test_a_form_feed_in_the_indentation_is_dropped_and_shifts_that_line() -> None:
    text = "def f():\n\x0c    x = 1\n    y = 2\n"
    normalised = normalise.for_libcst(text)
    assert normalised is not None
    assert (normalised.text, normalised.shifts) == ("def f():\n    x = 1\n    y = 2\n", {2: 1})
    moved = finding(2, 5, 10, Edit(2, 5, 2, 10, "z"))
    kept = finding(3, 5, 10, Edit(3, 5, 3, 10, "z"))
    restored = normalised.restore([moved, kept])
    assert [(f.column, f.end_column) for f in restored] == [(6, 11), (5, 10)]
    assert [(e.column, e.end_column) for f in restored for e in f.fix.edits] == [(6, 11), (5, 10)]  # type: ignore[union-attr]


def test_a_lone_continuation_line_becomes_a_blank_line() -> None:
    normalised = normalise.for_libcst("def f():\n\\\n    return 1\n")
    assert normalised is not None and normalised.text == "def f():\n \n    return 1\n" and normalised.shifts == {}


def test_text_without_either_corner_is_left_alone() -> None:
    assert normalise.for_libcst("def f():\n    return 1\n") is None
