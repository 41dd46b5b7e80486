"""What a function does for its callers, asked directly: which parameter a training loop draws its
batches from, with the backward that makes it a training loop."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis import Function, ModuleModel, build_analysis, summaries


def test_drawn_params_name_each_parameter_with_its_loops_backward() -> None:
    model = build_analysis(
        cst.parse_module(
            textwrap.dedent(
                """
                def train(model, loader, extra):
                    for x in loader:
                        model(x).sum().backward()
                    for x, y in zip(loader, extra):
                        model(x, y).mean().backward()
                """
            )
        )
    )
    (train,) = model.functions
    drawn = summaries.drawn_params(model, train)
    assert {name: model.line_of(call.node) for name, call in drawn.items()} == {"loader": 4, "extra": 6}


def test_mentions_rank_anywhere_in_a_path_through_variables() -> None:
    model = build_analysis(
        cst.parse_module(
            textwrap.dedent(
                """\
                import torch.distributed as dist
                me = dist.get_rank()
                prefix = "out"
                target(f"ckpt_{me}_{prefix}.pt")
                target(f"{prefix}/ckpt_{me}.pt")
                target(f"{prefix}/ckpt.pt")
                """
            )
        )
    )
    calls = [c for c in model.calls if c.dotted == "target"]
    assert [summaries.mentions_rank(model, c.arg(0), c.order, c.function) for c in calls] == [True, True, False]


def test_mentions_reads_subscripts_and_takes_any_test() -> None:
    model = build_analysis(
        cst.parse_module(
            textwrap.dedent(
                """\
                import os
                folder = os.getcwd()
                target(f"{folder}/ckpt_{os.environ['RANK']}.pt")
                target(f"{folder}/ckpt_{os.environ['HOME']}.pt")
                """
            )
        )
    )
    first, second = (c for c in model.calls if c.dotted == "target")
    # The launcher's variable read by a subscript is a rank.
    assert summaries.mentions_rank(model, first.arg(0), first.order, first.function)
    assert not summaries.mentions_rank(model, second.arg(0), second.order, second.function)

    def is_cwd(model: ModuleModel, node: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
        return isinstance(node, cst.Call) and model.qualify(node.func) == "os.getcwd"

    # Any question of one node, asked through variables: the folder is the working directory.
    assert summaries.mentions(model, first.arg(0), first.order, first.function, is_cwd)
    assert not summaries.mentions(model, first.arg(0), first.order, first.function, lambda *_: False)
