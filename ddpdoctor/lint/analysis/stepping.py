"""How a training loop updates: which call steps an optimizer, under which accumulation condition
it steps, and which `zero_grad()` clears the gradients a backward adds to.

Gradient accumulation is a backward on every micro-batch and an optimizer step only under a
condition such as `(i + 1) % accum_steps == 0`; the gradients must then be cleared after the step
(or under the same condition), not before every backward, or the micro-batches that do not step
are thrown away. These are the facts both halves of that question need.
"""

from __future__ import annotations

import re
from typing import Optional, Union

import libcst as cst

from ddpdoctor.lint.analysis.conditions import exclusive
from ddpdoctor.lint.analysis.model import Call, Function, Guard, Loop, ModuleModel
from ddpdoctor.lint.analysis.syntax import Expr, contains, dotted_name, modulo_divisors, names_in


def is_optimizer_name(written: str) -> bool:
    """A name an optimizer goes by: `optimizer`, `self.optim`, `opt`, `opt_g`, `optD`,
    `actor_opt`, `solver`; not `scheduler`, `options`, `lr_scheduler`."""
    raw = written.rsplit(".", 1)[-1]
    words = [w.lower() for w in re.split(r"_|(?<=[a-z0-9])(?=[A-Z])", raw) if w]
    if any("sched" in w for w in words):
        return False
    return "opt" in words or "solver" in words or any("optim" in w for w in words)


def stepped_optimizer(call: Call) -> Optional[str]:
    """The optimizer an `optimizer.step()` / `self.opt.step()` / `scaler.step(optimizer)` steps, as
    written; None for any other `.step()` (a scheduler, an environment, a sampler)."""
    if call.attr != "step":
        return None
    receiver = dotted_name(call.receiver) or ""
    if receiver and is_optimizer_name(receiver):
        return receiver
    if "scaler" in receiver.rsplit(".", 1)[-1].lower() and call.args:
        argument = dotted_name(call.args[0].value) or ""
        if argument and is_optimizer_name(argument):
            return argument
    return None


def is_accumulation_test(model: ModuleModel, guard: Guard, at: Call) -> bool:
    """`(i + 1) % accum_steps == 0` (a modulo by something other than 1), or a test that reads an
    accumulation counter (`if step_in_accum == grad_accum_steps - 1:`)."""
    for divisor in modulo_divisors(guard.test):
        if model.const_value(divisor, at.order, at.function) != 1:
            return True
    return any("accum" in name.lower() for name in names_in(guard.test))


def conditional_step(model: ModuleModel, backward: Call, loop: Union[Loop, Function]) -> tuple[Optional[Call], Optional[Guard]]:
    """An optimizer step in the same iteration of `loop` as `backward` that runs only under an
    accumulation condition (`(i + 1) % accum_steps == 0`) which does not also guard the backward;
    with that condition. A step in the other branch of the backward's `if accum_steps > 1:` never
    runs in the same iteration, and does not count."""
    for call in model.calls_of_within(backward.function, loop):
        if call.receiver is None or call.attr != "step":  # `<anything>.step(...)`
            continue
        if stepped_optimizer(call) is None or exclusive(model, call, backward):
            continue
        for guard in call.ctx.guards:
            if guard.order < loop.order or guard in backward.ctx.guards:
                continue
            if is_accumulation_test(model, guard, call):
                return call, guard
    return None, None


def clears_before(model: ModuleModel, backward: Call, loop: Union[Loop, Function]) -> list[Call]:
    """The `zero_grad()` calls (of any optimizer or model) that run in the same iteration of `loop`
    as `backward`, before it, under no condition the backward does not share: what earlier
    iterations' backwards left is discarded, so nothing accumulates across iterations."""
    out: list[Call] = []
    for call in model.calls_of_within(backward.function, loop):
        if call.receiver is None or call.attr != "zero_grad" or call.order > backward.order:
            continue
        if all(guard in backward.ctx.guards for guard in call.ctx.guards if guard.order >= loop.order):
            out.append(call)
    return out


def clears_stepped_gradients(model: ModuleModel, clear: Call, step: Call, loop: Union[Loop, Function]) -> bool:
    """`clear` empties the gradients `step` applies: it is `zero_grad()` of the same optimizer, or
    of a model (or anything not an optimizer) while the loop steps one optimizer only."""
    stepped = stepped_optimizer(step)
    cleared = dotted_name(clear.receiver)
    if stepped is None or cleared is None:
        return False
    if cleared == stepped:
        return True
    if is_optimizer_name(cleared):
        return False  # another optimizer's zero_grad: a GAN's discriminator cleared, not the generator
    steps = {
        stepped_optimizer(c)
        for c in model.method_calls("step")
        if c.function is step.function and contains(loop, c.order)
    }
    return steps == {stepped}


def alternating_schedule(model: ModuleModel, step: Call, loop: Union[Loop, Function]) -> bool:
    """Another optimizer steps in the same iteration under no accumulation condition: the
    conditional step is an update schedule (a GAN's generator every `n_critic` critic steps, TD3's
    delayed actor), not accumulation; what the skipped iterations' backwards computed for it was
    never meant to be summed."""
    stepped = stepped_optimizer(step)
    for other in model.method_calls("step"):
        if other is step or other.function is not step.function or not contains(loop, other.order):
            continue
        name = stepped_optimizer(other)
        if name is None or name == stepped:
            continue
        if not any(g.order >= loop.order and is_accumulation_test(model, g, other) for g in other.ctx.guards):
            return True
    return False


HOROVOD_OPTIMIZER = "horovod.torch.DistributedOptimizer"


def horovod_optimizer_wraps(model: ModuleModel, expr: Optional[Expr], at: Call) -> list[Call]:
    """The `hvd.DistributedOptimizer(...)` calls the optimizer `expr` may be, seen from `at`."""
    return [c for c in model.origin_calls(expr, at.order, at.function) if c.name == HOROVOD_OPTIMIZER]


def synchronized_before(model: ModuleModel, optimizer: str, at: Call) -> Optional[Call]:
    """An `optimizer.synchronize()` (Horovod: wait for the gradient all-reduces to finish) that runs
    before `at` in the same function, in the same iteration of the loops around `at`, under no
    condition `at` does not share; or a call there of a helper that synchronizes the optimizer it
    is handed."""
    for call in model.scope_calls(at.function):
        if call.order > at.order:
            break  # in source order
        if any(not contains(loop, call.order) for loop in at.loops):
            continue
        if not all(guard in at.ctx.guards for guard in call.ctx.guards):
            continue
        if call.attr == "synchronize" and dotted_name(call.receiver) == optimizer:
            return call
        if _synchronizes_argument(model, call, optimizer):
            return call  # `finish_allreduce(optimizer)`: a helper of this module that synchronizes it
    return None


def _synchronizes_argument(model: ModuleModel, call: Call, optimizer: str) -> bool:
    """`call` hands `optimizer` to a function of this module that calls `.synchronize()` on the
    parameter it arrives as, under no condition of its own."""
    for helper in model.resolve_local_function(call):
        for inner in helper.calls:
            if inner.attr != "synchronize" or inner.ctx.guards:
                continue
            param = dotted_name(inner.receiver)
            if param is None or param not in helper.params:
                continue
            argument = model.argument_at(call, helper, param)
            if argument is not None and dotted_name(argument) == optimizer:
                return True
    return False


def under_skip_synchronize(optimizer: str, at: Call) -> bool:
    """`at` runs inside `with optimizer.skip_synchronize():`, where Horovod's `step()` does not
    synchronize (all-reduce) a second time."""
    for manager in at.ctx.withs:
        if (
            isinstance(manager, cst.Call)
            and isinstance(manager.func, cst.Attribute)
            and manager.func.attr.value == "skip_synchronize"
            and dotted_name(manager.func.value) == optimizer
        ):
            return True
    return False


def helper_conditional_step(model: ModuleModel, backward: Call, loop: Union[Loop, Function]) -> Optional[tuple[Call, Call, Guard, str]]:
    """A call in the same iteration of `loop` as `backward` to a helper of this module that steps
    an optimizer only under an accumulation condition of its own (`amp.step_if_due(optimizer, i)`
    whose body runs `scaler.step(optimizer)` under `if i % self.accumulate == 0:`): the call, the
    step in the helper, its condition, and the optimizer as the caller names it."""
    for call in model.calls_of_within(backward.function, loop):
        if exclusive(model, call, backward):
            continue
        for helper in model.resolve_local_function(call):
            for inner in helper.calls:
                stepped = stepped_optimizer(inner)
                if stepped is None:
                    continue
                guard = next((g for g in inner.ctx.guards if g.function is helper and is_accumulation_test(model, g, inner)), None)
                if guard is None:
                    continue
                argument = model.argument_at(call, helper, stepped) if stepped in helper.params else None
                name = dotted_name(argument) if argument is not None else None
                if name is not None:
                    return call, inner, guard, name
    return None
