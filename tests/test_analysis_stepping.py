"""How a training loop updates: the optimizer a step call steps, its accumulation condition, the
clears before a backward, which optimizer a clear empties, and update schedules."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from ddpdoctor.lint.analysis import Call, ModuleModel, build_analysis, stepping


def _model(body: str) -> ModuleModel:
    return build_analysis(cst.parse_module(textwrap.dedent(body)))


def _only(model: ModuleModel, attr: str, receiver: str) -> Call:
    (call,) = [c for c in model.method_calls(attr) if c.dotted == f"{receiver}.{attr}"]
    return call


@pytest.mark.parametrize(
    ("code", "stepped"),
    [
        ("optimizer.step()", "optimizer"),
        ("self.opt.step()", "self.opt"),
        ("scaler.step(self.optimizer)", "self.optimizer"),
        ("scheduler.step()", None),
        ("lr_optimizer_scheduler.step()", None),
        ("env.step(action)", None),
        ("scaler.step(model)", None),
        ("trainer.step(optimizer)", None),  # not a scaler: its argument is not what it steps
    ],
)
def test_stepped_optimizer(code: str, stepped: object) -> None:
    model = _model(code + "\n")
    (call,) = model.calls
    assert stepping.stepped_optimizer(call) == stepped


LOOP = """
for i, x in enumerate(data):
    {clear}
    model(x).sum().backward()
    if (i + 1) % {divisor} == 0:
        optimizer.step()
    {after}
"""


@pytest.mark.parametrize(
    ("clear", "divisor", "after", "found"),
    [
        ("optimizer.zero_grad()", "accum", "pass", True),
        ("optimizer.zero_grad()", "1", "pass", False),  # `% 1`: every iteration steps
        ("pass", "accum", "optimizer.zero_grad()", False),  # cleared after: accumulates
        ("if i % accum == 0: optimizer.zero_grad()", "accum", "pass", False),
    ],
)
def test_a_clear_before_every_backward_and_a_conditional_step(clear: str, divisor: str, after: str, found: bool) -> None:
    model = _model(LOOP.format(clear=clear, divisor=divisor, after=after))
    (backward,) = model.method_calls("backward")
    loop = model.loops[0]
    step, guard = stepping.conditional_step(model, backward, loop)
    clears = stepping.clears_before(model, backward, loop)
    assert (step is not None and bool(clears)) is found


def test_which_clear_empties_the_stepped_optimizer() -> None:
    model = _model(
        """
        for i, x in enumerate(data):
            opt_d.zero_grad()
            net.zero_grad()
            loss(x).backward()
            if i % 4 == 0:
                opt_g.step()
        """
    )
    loop = model.loops[0]
    step = _only(model, "step", "opt_g")
    assert not stepping.clears_stepped_gradients(model, _only(model, "zero_grad", "opt_d"), step, loop)
    assert stepping.clears_stepped_gradients(model, _only(model, "zero_grad", "net"), step, loop)


def test_another_optimizer_stepping_every_iteration_is_a_schedule() -> None:
    schedule = _model(
        """
        for i, x in enumerate(data):
            critic_opt.step()
            if i % 5 == 0:
                actor_opt.step()
        """
    )
    assert stepping.alternating_schedule(schedule, _only(schedule, "step", "actor_opt"), schedule.loops[0])
    both_accumulate = _model(
        """
        for i, x in enumerate(data):
            if i % 5 == 0:
                critic_opt.step()
            if i % 5 == 0:
                actor_opt.step()
        """
    )
    step = _only(both_accumulate, "step", "actor_opt")
    assert not stepping.alternating_schedule(both_accumulate, step, both_accumulate.loops[0])


@pytest.mark.parametrize(
    ("name", "optimizer"),
    [("optimizer", True), ("self.optim", True), ("opt_g", True), ("optD", True), ("actor_opt", True),
     ("g_optimizer", True), ("solver", True), ("scheduler", False), ("options", False),
     ("lr_scheduler", False), ("optim_scheduler", False), ("model", False)],
)
def test_optimizer_names(name: str, optimizer: bool) -> None:
    assert stepping.is_optimizer_name(name) is optimizer


HOROVOD = """
import horovod.torch as hvd
opt = hvd.DistributedOptimizer(base)
for x in data:
    {before}
    with {manager}:
        scaler.step(opt)
"""


@pytest.mark.parametrize(
    ("before", "manager", "synchronized", "skipped"),
    [
        ("opt.synchronize()", "opt.skip_synchronize()", True, True),
        ("opt.synchronize()", "autocast()", True, False),
        ("other.synchronize()", "other.skip_synchronize()", False, False),
        ("if check: opt.synchronize()", "opt.skip_synchronize()", False, True),
    ],
)
def test_horovod_synchronize_and_skip(before: str, manager: str, synchronized: bool, skipped: bool) -> None:
    model = _model(HOROVOD.format(before=before, manager=manager))
    step = _only(model, "step", "scaler")
    assert [c.name for c in stepping.horovod_optimizer_wraps(model, step.arg(0), step)] == [stepping.HOROVOD_OPTIMIZER]
    assert (stepping.synchronized_before(model, "opt", step) is not None) is synchronized
    assert stepping.under_skip_synchronize("opt", step) is skipped


def test_a_synchronize_in_the_previous_iteration_does_not_count() -> None:
    model = _model(
        """
        opt.synchronize()
        for x in data:
            scaler.step(opt)
        """
    )
    assert stepping.synchronized_before(model, "opt", _only(model, "step", "scaler")) is None


def test_a_helper_that_steps_only_when_due_names_the_callers_optimizer() -> None:
    model = _model(
        """
        def due(opt, i, every):
            if (i + 1) % every == 0:
                opt.step()
        def always(opt):
            opt.step()
        for i, x in enumerate(data):
            optimizer.zero_grad()
            loss(x).backward()
            due(optimizer, i, 4)
            always(other)
        """
    )
    (backward,) = model.method_calls("backward")
    found = stepping.helper_conditional_step(model, backward, model.loops[0])
    assert found is not None
    call, step, guard, optimizer = found
    assert (call.dotted, step.dotted, model.line_of(guard.test), optimizer) == ("due", "opt.step", 3, "optimizer")


def test_a_helper_that_synchronizes_the_optimizer_it_is_handed_counts() -> None:
    model = _model(
        """
        def wait(o):
            o.synchronize()
        def maybe(o, flag):
            if flag:
                o.synchronize()
        for x in data:
            wait(opt)
            maybe(other, True)
            scaler.step(opt)
            scaler.step(other)
        """
    )
    steps = [c for c in model.method_calls("step")]
    assert stepping.synchronized_before(model, "opt", steps[0]) is not None
    assert stepping.synchronized_before(model, "other", steps[1]) is None  # only under a condition of its own


def test_a_conditional_step_is_found_past_steps_of_other_functions() -> None:
    model = _model(
        """
        def warmup(opt):
            opt.step()
        for i, x in enumerate(data):
            model(x).sum().backward()
            if i % 4 == 0:
                optimizer.step()
        """
    )
    (backward,) = model.method_calls("backward")
    step, guard = stepping.conditional_step(model, backward, model.loops[0])
    assert step is not None and step.dotted == "optimizer.step"


def test_another_optimizer_under_a_plain_condition_still_makes_a_schedule() -> None:
    model = _model(
        """
        for i, x in enumerate(data):
            if ready:
                critic_opt.step()
            if i % 5 == 0:
                actor_opt.step()
        """
    )
    assert stepping.alternating_schedule(model, _only(model, "step", "actor_opt"), model.loops[0])


def _fixtures_with_backwards() -> list[str]:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "fixtures"
    return sorted(str(p) for code in ("DDP007", "DDP013", "HVD004", "AMP002") for p in (root / code).glob("*.py"))


@pytest.mark.parametrize("path", _fixtures_with_backwards())
def test_calls_of_within_is_the_scan_it_replaces(path: str) -> None:
    """For every backward and every loop around it (and its function), the lookup gives exactly the calls
    of the backward's own function inside that span, in source order, as scanning the module did."""
    from ddpdoctor.lint.analysis.syntax import contains

    model = build_analysis(cst.parse_module(open(path, encoding="utf-8").read()))
    backwards = [c for c in model.calls if c.attr == "backward"]
    assert backwards
    for backward in backwards:
        spans = [*backward.loops, *([backward.function] if backward.function is not None else [])]
        for span in spans:
            scanned = [c for c in model.calls if c.function is backward.function and contains(span, c.order)]
            assert model.calls_of_within(backward.function, span) == scanned
