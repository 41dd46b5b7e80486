"""Where ranks part ways: the exits of loops and functions, what each rank measures on its own,
what was reduced first, and what collective the ranks that stay go on to."""

from __future__ import annotations

import textwrap
from typing import Optional

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import ModuleModel, Runs, build_analysis, divergence

HEAD = """\
import os, sys, time
import torch
import torch.distributed as dist
"""


def _model(body: str) -> ModuleModel:
    return build_analysis(cst.parse_module(HEAD + textwrap.dedent(body)))


def _exit_lines(model: ModuleModel) -> list[tuple[int, str, int]]:
    return [(model.line_of(e.node), e.kind, len(e.loops)) for e in divergence.exits(model)]


def test_exits_are_found_with_their_loops_and_only_clean_process_exits_count() -> None:
    model = _model(
        """
        def f(xs):
            for x in xs:
                while x:
                    if x > 3:
                        break
                    continue
                if x:
                    sys.exit(0)
                sys.exit(2)
                os._exit(3)
                os._exit(0)
                try:
                    pass
                except KeyError:
                    continue
                raise ValueError(x)
            return xs
        """
    )
    assert _exit_lines(model) == [
        (9, "break", 2), (10, "continue", 2), (12, "exit", 1), (15, "exit", 1), (19, "continue", 1), (21, "return", 0),
    ]


def _divergence(body: str, line: int) -> Optional[divergence.Divergence]:
    model = _model(body)
    (exit,) = [e for e in divergence.exits(model) if model.line_of(e.node) == line]
    return divergence.divergent_condition(model, exit)


@pytest.mark.parametrize(
    ("test", "local"),
    [
        ("loss.item() > 5", True),
        ("kl > target", True),  # kl = (...).mean() above
        ("not torch.isfinite(loss)", True),
        ("time.time() - start > budget", True),
        ("epoch >= max_epochs", False),
        ("reduced > target", False),  # reduced = mpi_avg(kl)
        ("kl_sum.item() > target", False),  # dist.all_reduce(kl_sum) above
    ],
)
def test_conditions_on_values_measured_on_this_rank(test: str, local: bool) -> None:
    body = f"""
    def train(model, batches, target, budget, max_epochs):
        start = time.time()
        for epoch in range(100):
            loss = model(batches).sum()
            kl = (loss - 1).mean()
            reduced = mpi_avg(kl)
            kl_sum = kl.detach()
            dist.all_reduce(kl_sum)
            if {test}:
                break
            loss.backward()
    """
    found = _divergence(body, 14)
    assert (found is not None and found.measured is not None) is local


def test_a_rank_test_inside_the_loop_diverges_and_a_single_process_branch_does_not() -> None:
    rank = _divergence(
        """
        for step in range(10):
            if dist.get_rank() == 0:
                break
        """,
        7,
    )
    assert rank is not None and rank.runs == Runs.RANK0
    assert _divergence(
        """
        for step in range(10):
            if not dist.is_initialized():
                if step > 3:
                    break
        """,
        8,
    ) is None


@pytest.mark.parametrize(
    ("body", "line", "diverges"),
    [
        # The rank test is around the loop, not inside it: only rank 0 runs the loop, and leaving it is
        # decided by a value every rank shares (DDP009 speaks for collectives inside such a block).
        ("if dist.get_rank() == 0:\n    for x in range(9):\n        if x > 3:\n            break\n", 7, False),
        # A break or continue leaves only its innermost loop: a rank test in the outer loop is outside it.
        ("for epoch in range(3):\n    if dist.get_rank() == 0:\n        for x in range(9):\n            if x > 3:\n"
         "                break\n", 8, False),
        ("for epoch in range(3):\n    if dist.get_rank() == 0:\n        for x in range(9):\n            if x > 3:\n"
         "                continue\n            print(x)\n", 8, False),
        # A return leaves every loop around it: a rank test in the outer loop is inside.
        ("def f():\n    for epoch in range(3):\n        if dist.get_rank() == 0:\n            for x in range(9):\n"
         "                return x\n", 8, True),
        # The first statement of the loop, with nothing numbered between the loop and it, is inside.
        ("for x in range(9):\n    if dist.get_rank() == 1 and x == 2:\n        continue\n    print(x)\n", 6, True),
    ],
)
def test_a_condition_counts_where_it_is_nested_around_the_exit(body: str, line: int, diverges: bool) -> None:
    assert (_divergence(body, line) is not None) is diverges


def test_an_exit_after_a_divergent_exit_is_that_exit_s_story() -> None:
    """`if rank == 1: continue` guards what follows it in the loop, negated: a later break on a shared
    value is not divergent because of it (the continue is the one reported)."""
    body = "for x in range(9):\n    if dist.get_rank() == 1:\n        continue\n    if x > 3:\n        break\n    print(x)\n"
    assert _divergence(body, 6) is not None
    assert _divergence(body, 8) is None


def test_a_measured_condition_names_what_was_measured() -> None:
    model = _model("for x in range(9):\n    loss = torch.ones(1).sum()\n    if loss.item() > 5:\n        break\n")
    (exit,) = divergence.exits(model)
    found = divergence.divergent_condition(model, exit)
    assert found is not None and found.runs is None
    assert found.measured is not None and model.code_of(found.measured) == "loss.item()"


def test_what_the_remaining_ranks_run_next() -> None:
    model = _model(
        """
        def sync(t):
            dist.all_reduce(t)
        for step in range(10):
            sync(step)
            if step > 2:
                continue
            print(step)
        for step in range(10):
            if step > 2:
                continue
            sync(step)
        """
    )
    first, second = divergence.exits(model)
    assert divergence.reaches_collective_after(model, first) is None  # the all_reduce came before
    found = divergence.reaches_collective_after(model, second)
    assert found is not None and found.name == "torch.distributed.all_reduce"


def test_a_return_outside_loops_meets_what_the_rest_of_its_function_runs() -> None:
    model = _model(
        """
        def step(model, x):
            loss = model(x).mean()
            if not torch.isfinite(loss):
                return
            loss.backward()
        def log(loss):
            if not torch.isfinite(loss):
                return
            print(loss)
        """
    )
    before_backward, before_print = divergence.exits(model)
    found = divergence.reaches_collective_after(model, before_backward)
    assert found is not None and found.attr == "backward"
    assert divergence.divergent_condition(model, before_backward) is not None
    assert divergence.reaches_collective_after(model, before_print) is None


def _order_by_positions(model: ModuleModel, node: cst.CSTNode) -> int:
    """The definition `order_at` implements, computed the slow way: one past the highest number of
    the calls and assignments that start before `node`'s end in the source."""
    end = model.position(node).end
    before = [
        item.order
        for item in (*model.calls, *model.assignments)
        if (model.position(item.node).start.line, model.position(item.node).start.column) <= (end.line, end.column)
    ]
    return max(before) + 1 if before else 0


def _fixture_sources() -> list[str]:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "fixtures"
    return sorted(str(p) for p in root.rglob("*.py"))


@pytest.mark.parametrize("path", _fixture_sources()[::3])
def test_statement_places_from_the_build_equal_those_from_source_positions(path: str) -> None:
    """The walker places `if` tests and exits among the numbered items from marks the build leaves,
    instead of the module's source positions (which cost a third of an analysis): on every third
    fixture, each place equals the one the positions give."""
    try:
        module = cst.parse_module(open(path, encoding="utf-8").read())
    except (cst.ParserSyntaxError, UnicodeDecodeError):
        pytest.skip("not a module libcst parses")
    model = build_analysis(module)
    walker = divergence._Walker(model)
    nodes: list[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> None:
            nodes.append(node.test)

        def visit_Break(self, node: cst.Break) -> None:
            nodes.append(node)

        def visit_Continue(self, node: cst.Continue) -> None:
            nodes.append(node)

        def visit_Return(self, node: cst.Return) -> None:
            nodes.append(node)

        def visit_Expr(self, node: cst.Expr) -> None:
            nodes.append(node)

    module.visit(Collect())
    for node in nodes:
        assert walker.order_at(node) == _order_by_positions(model, node), (path, model.line_of(node))
