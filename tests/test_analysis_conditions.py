"""Path conditions (`analysis/conditions.py`): one test seen twice, within a function and across a
call. The statement asked about is the call `target()`; the call site asked about is the one call
of the helper named in each test."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import Call, ModuleModel, Runs, build_analysis, conditions, who_runs

PRELUDE = """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
"""


def model_of(source: str) -> ModuleModel:
    return build_analysis(cst.parse_module(PRELUDE + textwrap.dedent(source)))


def only_call(model: ModuleModel, dotted: str) -> Call:
    calls = [c for c in model.calls if c.dotted == dotted]
    assert len(calls) == 1, f"the snippet must call {dotted}() exactly once"
    return calls[0]


def direct_call_reaches_target(source: str) -> bool:
    """Whether the one call `worker(...)` can get to `target()` inside `worker`."""
    model = model_of(source)
    site, sink = only_call(model, "worker"), only_call(model, "target")
    assert sink.function is not None
    return conditions.site_reaches(model, site, sink.function, sink.ctx.guards)


LAUNCHER = """
def worker(index, cfg=None, settings=None):
    {body}
if cfg.machines > 1:
    mp.spawn(worker, args=(cfg,), nprocs=4)
else:
    {call}
"""


@pytest.mark.parametrize(
    ("body", "call", "reaches"),
    [
        # the callee tests what the caller passes, the caller sits on the other side of that test
        ("if cfg.machines > 1:\n        target()", "worker(0, cfg)", False),
        ("if not cfg.machines > 1:\n        pass\n    else:\n        target()", "worker(0, cfg)", False),
        # the argument is spelled differently at the call site: substituted before comparing
        ("if settings.machines > 1:\n        target()", "worker(0, settings=cfg)", False),
        # the same side of the test: the call does reach it
        ("if not cfg.machines > 1:\n        target()", "worker(0, cfg)", True),
        # another test altogether
        ("if cfg.use_cuda:\n        target()", "worker(0, cfg)", True),
        # another object passed: the callee's `cfg` is not the caller's
        ("if cfg.machines > 1:\n        target()", "worker(0, other)", True),
        # the parameter rebound before the test: it no longer holds what the caller passed
        ("cfg = load()\n    if cfg.machines > 1:\n        target()", "worker(0, cfg)", True),
        # one of its attributes assigned before the test
        ("cfg.machines = 2\n    if cfg.machines > 1:\n        target()", "worker(0, cfg)", True),
        # the test reads a local of the callee, which the caller cannot see
        ("machines = cfg.machines\n    if machines > 1:\n        target()", "worker(0, cfg)", True),
        # an attribute the callee assigns, even after the test (a loop may bring it round again)
        ("if cfg.machines > 1:\n        target()\n    cfg.machines = 1", "worker(0, cfg)", True),
        # a conjunction is compared whole: the caller ruling out one part proves nothing here
        ("if cfg.machines > 1 and torch.cuda.is_available():\n        target()", "worker(0, cfg)", True),
    ],
)
def test_a_call_site_under_the_opposite_of_the_callees_test_does_not_reach_it(body: str, call: str, reaches: bool) -> None:
    assert direct_call_reaches_target(LAUNCHER.format(body=body, call=call)) is reaches


def test_the_callers_condition_must_still_hold_at_the_call() -> None:
    # `cfg` is rebound between the caller's test and the call: the `else:` no longer describes it.
    source = """
    def worker(index, cfg):
        if cfg.machines > 1:
            target()
    if cfg.machines > 1:
        pass
    else:
        cfg = reload()
        worker(0, cfg)
    """
    assert direct_call_reaches_target(source) is True


@pytest.mark.parametrize(
    ("test", "call", "reaches"),
    [
        ("not final", "worker(final=True)", False),
        ("final", "worker(final=False)", False),
        ("final", "worker()", False),  # the literal default
        ("final", "worker(final=True)", True),
        ("final", "worker(final=flag)", True),  # not a literal: either way
    ],
)
def test_a_literal_flag_fixed_the_other_way_does_not_reach_it(test: str, call: str, reaches: bool) -> None:
    source = f"""
    def worker(final=False):
        if {test}:
            target()
    {call}
    """
    assert direct_call_reaches_target(source) is reaches


def test_a_helper_only_reachable_from_its_rank0_call_site_runs_on_rank0() -> None:
    # The second call site sits under `not cfg.final`, the opposite of the helper's own test, so it
    # never gets to target(): only the rank-0 call does.
    source = """
    def write(cfg):
        if cfg.final:
            target()
    if dist.get_rank() == 0:
        write(cfg)
    if not cfg.final:
        write(cfg)
    """
    model = model_of(source)
    assert who_runs(model, only_call(model, "target")).runs is Runs.RANK0


def test_a_route_through_a_call_that_cannot_reach_the_sink_cannot_happen() -> None:
    source = """
    def worker(index, cfg):
        if cfg.machines > 1:
            device = index
            target(device)
    if cfg.machines > 1:
        mp.spawn(worker, args=(cfg,), nprocs=4)
    else:
        worker(0, cfg)
    """
    model = model_of(source)
    sink = only_call(model, "target")
    routes = model.routes(sink.arg(0), sink.order, sink.function)
    assert [model.code_of(r.value) for r in routes] == ["0"]
    # the path passes the assignment `device = index` (in the branch) and then the call site
    assert [type(step).__name__ for step in routes[0].via] == ["Assignment", "Call"]
    assert conditions.route_reaches(model, routes[0], sink) is False


def test_a_route_through_a_call_on_the_same_side_happens() -> None:
    source = """
    def worker(index, cfg):
        if cfg.machines > 1:
            target(index)
    if cfg.machines > 1:
        worker(0, cfg)
    """
    model = model_of(source)
    sink = only_call(model, "target")
    (route,) = model.routes(sink.arg(0), sink.order, sink.function)
    assert conditions.route_reaches(model, route, sink) is True


@pytest.mark.parametrize(
    ("first", "second", "exclusive"),
    [
        ("if scaler is not None:", "if scaler is None:", True),
        ("if scaler is not None:", "if scaler is not None:", False),
        ("if args.amp:", "if not args.amp:", True),
        ("if not args.amp:", "if not not args.amp:", True),
        ("if args.amp:", "if args.fp16:", False),
    ],
)
def test_two_tests_of_one_flag_in_a_function(first: str, second: str, exclusive: bool) -> None:
    source = f"""
    def step(args, scaler):
        {first}
            first()
        {second}
            second()
    """
    model = model_of(source)
    assert conditions.exclusive(model, only_call(model, "first"), only_call(model, "second")) is exclusive


def test_a_flag_reassigned_between_two_tests_is_not_the_same_condition() -> None:
    source = """
    def step(args):
        if args.amp:
            first()
        args.amp = decide()
        if not args.amp:
            second()
    """
    model = model_of(source)
    assert conditions.exclusive(model, only_call(model, "first"), only_call(model, "second")) is False


def test_a_namespace_rebound_between_two_tests_is_not_the_same_flag() -> None:
    source = """
    def step(args):
        if args.amp:
            first()
        args = reload()
        if not args.amp:
            second()
    """
    model = model_of(source)
    assert conditions.exclusive(model, only_call(model, "first"), only_call(model, "second")) is False


def test_the_condition_text_folds_negation_and_is_none() -> None:
    model = model_of("x = 1\n")
    test = cst.parse_expression("not (scaler is None)")
    assert conditions.condition(model, test, False) == ("scaler is not None", True)
    assert conditions.condition(model, cst.parse_expression("flag"), True) == ("flag", False)
