"""node_positions: libcst's PositionProvider run without the wrapper's extra visit (the editor
server pays for positions on every edit of a file with findings)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from ddpdoctor.lint.analysis.model import node_positions

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_node_positions_are_libcsts_own_for_every_fixture() -> None:
    paths = sorted(FIXTURES.rglob("*.py"))
    assert len(paths) > 100
    for path in paths:
        module = cst.parse_module(path.read_text(encoding="utf-8"))
        expected = dict(MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider))
        assert node_positions(module) == expected, path


def test_node_positions_fall_back_to_the_wrapper_if_the_direct_call_yields_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = cst.parse_module("import torch\nx = torch.zeros(1)\n")
    expected = dict(MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider))
    generate = PositionProvider._gen_impl
    calls: list[str] = []

    def first_call_does_nothing(self: PositionProvider, tree: cst.Module) -> None:
        # As if libcst's generator had moved elsewhere: the first (direct) call fills nothing.
        calls.append("direct" if not calls else "wrapper")
        if len(calls) > 1:
            generate(self, tree)

    monkeypatch.setattr(PositionProvider, "_gen_impl", first_call_does_nothing)
    assert node_positions(module) == expected
    assert calls == ["direct", "wrapper"]
