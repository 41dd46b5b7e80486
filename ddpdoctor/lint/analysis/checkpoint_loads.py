"""Checkpoints restored without `map_location` by a function of another project module.

A script that calls `load_dicts(args, model)` from its `train_base.py` on every rank restores the
checkpoint that helper loads with a bare `torch.load(path)`: each process deserialises it onto the
GPU it was saved from (cuda:0), as if the load were written in the script. The helper's module, linted
alone, cannot know that every rank calls it; the script's call is where DDP012 reports it.

Only what the helper does itself is read: a `torch.load` in its own body, with no `map_location` (nor
`*args` / `**kwargs` that may carry one) and no rank check inside deciding who runs it, whose result
the same body hands to `load_state_dict` (directly, or through a variable and the keys of the loaded
dict). Deeper helpers, and loads whose result the helper returns, are not followed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis.launch import dead_in_script
from ddpdoctor.lint.analysis.model import Call, Function, ModuleModel
from ddpdoctor.lint.analysis.ranks import Runs, decided_by_guards, who_runs
from ddpdoctor.lint.analysis.summaries import callees
from ddpdoctor.lint.analysis.syntax import dotted_name, walk

LOAD = "torch.load"
RESTORE = "load_state_dict"
# Receivers whose state is plain numbers: nothing of theirs lands on a GPU.
NUMBERS_ONLY_WORDS = ("sched", "scaler")
# Reading a part of what was loaded: `ckpt["model"]`, `ckpt.get("model")`, `ckpt["model"].state_dict()`.
_PART_METHODS = frozenset({"get", "state_dict", "float", "half"})


@dataclass(frozen=True, eq=False)
class HelperLoad:
    """A call of this module (`site`) into another module's function that restores a checkpoint it
    loaded without `map_location` (`load`, in `module`)."""

    site: Call
    module: ModuleModel
    helper: Function
    load: Call


def bare_restoring_load(model: ModuleModel, function: Function) -> Optional[Call]:
    """The `torch.load` without `map_location` in `function`'s own body whose result the body
    restores with `load_state_dict`; None when there is none."""
    loads = [
        c for c in model.calls_named(LOAD)
        if c.function is function and c.arg(1, "map_location") is None and not c.has_star_args()
        and decided_by_guards(model, c.ctx.guards) is None
    ]
    if not loads:
        return None
    for restore in function.calls:
        if restore.attr != RESTORE or restore.receiver is None:
            continue
        if any(word in (dotted_name(restore.receiver) or "").lower() for word in NUMBERS_ONLY_WORDS):
            continue
        state = restore.arg(0, "state_dict")
        if state is None:
            continue
        written = {id(node) for node in walk(state)}
        origins = {id(c) for c in model.origin_calls(_loaded_value(state), restore.order, function)}
        for load in loads:
            if id(load.node) in written or id(load) in origins:
                return load
    return None


def _loaded_value(expr: cst.BaseExpression) -> cst.BaseExpression:
    """The loaded dict a state comes out of: `ckpt` for `ckpt["model"]`, `ckpt.get("model")`,
    `ckpt["model"].float().state_dict()`."""
    while True:
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
              and expr.func.attr.value in _PART_METHODS):
            expr = expr.func.value
        else:
            return expr


def helper_loads(model: ModuleModel) -> list[HelperLoad]:
    """Calls of this module, run by every rank, into a function of another project module that
    restores a checkpoint it loaded without `map_location`."""

    def compute() -> list[HelperLoad]:
        out: list[HelperLoad] = []
        for call in model.calls:
            if dead_in_script(model, call.function):
                continue
            for other, helper in callees(model, call):
                if other is model:
                    continue  # this module's own loads are read where they are written
                load = bare_restoring_load(other, helper)
                if load is not None and who_runs(model, call).runs is Runs.ALL:
                    out.append(HelperLoad(call, other, helper, load))
                    break
        return out

    return model.memoized(("helper_loads",), compute, [])
