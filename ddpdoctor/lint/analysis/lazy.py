"""Lazy modules: `nn.LazyLinear`, `nn.LazyConv2d`, ... hold `UninitializedParameter`s until their
first forward pass gives them a shape. `DistributedDataParallel` refuses such a module at
construction ("Modules with uninitialized parameters can't be used with DistributedDataParallel"),
so the question a rule asks is: which lazy layers does the value handed to a wrap still hold, and
has anything materialised them (a forward, a `load_state_dict`) before?

Followed: variables and helpers' returns (`ModuleModel.origin_calls`), the containers that hold
their arguments (`nn.Sequential(...)`, `nn.ModuleList([...])`), the transforms that hand back the
module they were given (`convert_sync_batchnorm`), and the constructor of a class of this module or
of another project module, a few classes deep. A class whose constructor runs `self(...)` or
`self.forward(...)` materialises itself.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis.callorder import may_run_before
from ddpdoctor.lint.analysis.model import Call, Function, ModuleModel
from ddpdoctor.lint.analysis.syntax import Expr, dotted_name

# Containers whose positional arguments (or the list / dict given to them) become submodules.
CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"})
# Calls that return the module they are given, changed in place or copied with the same layers.
TRANSFORMS = frozenset({"torch.nn.SyncBatchNorm.convert_sync_batchnorm", "copy.deepcopy", "torch.compile"})
# Methods that give a lazy module its shapes: a forward, or a state dict (its load hook materialises).
MATERIALISING = frozenset({"load_state_dict", "initialize_parameters", "forward"})
# How many nested classes and helpers are followed.
MAX_DEPTH = 4


def is_lazy_layer(name: Optional[str]) -> bool:
    """`torch.nn.LazyLinear`, `torch.nn.modules.conv.LazyConv2d`, ...; not the mixin itself."""
    if name is None or not name.startswith("torch.nn."):
        return False
    last = name.rsplit(".", 1)[-1]
    return last.startswith("Lazy") and last != "LazyModuleMixin"


def lazy_layers(model: ModuleModel, expr: Optional[Expr], order: int, function: Optional[Function]) -> list[tuple[ModuleModel, Call]]:
    """The lazy layer constructions the module value of `expr` may hold, each with the module model
    it is written in; empty when none, or when the value (or a class it is built from)
    materialises them before it is returned."""
    return _lazy_in_value(model, expr, order, function, 0)


def _lazy_in_value(
    model: ModuleModel, expr: Optional[Expr], order: int, function: Optional[Function], depth: int
) -> list[tuple[ModuleModel, Call]]:
    if expr is None or depth > MAX_DEPTH:
        return []
    out: list[tuple[ModuleModel, Call]] = []
    for origin in model.origin_calls(expr, order, function):
        out.extend(_lazy_in_call(model, origin, depth))
    return out


def _lazy_in_call(model: ModuleModel, call: Call, depth: int) -> list[tuple[ModuleModel, Call]]:
    name = call.name
    if is_lazy_layer(name):
        return [(model, call)]
    if name in CONTAINERS:
        out: list[tuple[ModuleModel, Call]] = []
        for arg in call.args:
            # `nn.ModuleList(layers)`: the list literal the name holds.
            held = model.reaching_values(arg.value, call.order, call.function) if dotted_name(arg.value) else []
            for value in [arg.value, *(v for v in held if isinstance(v, (cst.List, cst.Tuple, cst.Dict)))]:
                for part in _parts(value):
                    out.extend(_lazy_in_value(model, part, call.order, call.function, depth + 1))
        return out
    if name in TRANSFORMS:
        return _lazy_in_value(model, call.arg(0, "module"), call.order, call.function, depth + 1)
    if call.dotted is not None and not (name or "").startswith("torch."):
        # A class of this module (`Net()`), or one imported from the project (`models.Net`).
        return _lazy_in_class(model, call.dotted, depth)
    return []


def _parts(value: Expr) -> list[Expr]:
    """The elements of a literal list, tuple or dict (`nn.ModuleList([a, b])`), else the value."""
    if isinstance(value, (cst.List, cst.Tuple)):
        return [e.value for e in value.elements if not isinstance(e, cst.StarredElement)]
    if isinstance(value, cst.Dict):
        return [e.value for e in value.elements if isinstance(e, cst.DictElement)]
    return [value]


def _lazy_in_class(model: ModuleModel, written: str, depth: int) -> list[tuple[ModuleModel, Call]]:
    """The lazy layers a class's constructor builds into `self` (also through the classes it
    builds), for a class of this module or of another project module; none when the
    constructor itself runs a forward."""
    found = model.project_class(written) if not model.class_methods(written) else (model, written)
    if found is None:
        return []
    owner, klass = found
    init = next((f for f in owner.class_methods(klass) if f.name == "__init__"), None)
    if init is None or materialises_itself(owner, init):
        return []
    out: list[tuple[ModuleModel, Call]] = []
    for call in owner.calls:
        if call.function is not init:
            continue
        if is_lazy_layer(call.name):
            out.append((owner, call))
        elif call.dotted is not None and not (call.name or "").startswith("torch.") and call.dotted != written and depth < MAX_DEPTH:
            out.extend(_lazy_in_class(owner, call.dotted, depth + 1))
    return out


def materialises_itself(model: ModuleModel, init: Function) -> bool:
    """A constructor that runs its own forward on a sample (`self(torch.zeros(1, 3, 32, 32))`,
    `self.forward(x)`), or loads a state dict: its lazy layers have their shapes once it returns."""
    for call in init.calls:
        func = call.node.func
        if isinstance(func, cst.Name) and func.value == "self":
            return True
        if call.attr in MATERIALISING and dotted_name(call.receiver) == "self":
            return True
    return False


def materialised_before(model: ModuleModel, expr: Expr, at: Call) -> bool:
    """Something runs the module `expr` names (`model(sample)`, `model.forward(x)`,
    `model.load_state_dict(sd)`) before the call `at`: earlier in the same function, or in another
    function that may run before it (`callorder`: a helper that builds and probes the model; not
    a training function called after the wrap)."""
    origins = {id(c) for c in model.origin_calls(expr, at.order, at.function)}
    if not origins:
        return False
    for call in model.calls:
        if call is at:
            continue
        target: Optional[Expr]
        if call.attr in MATERIALISING and call.receiver is not None:
            target = call.receiver
        elif isinstance(call.node.func, (cst.Name, cst.Attribute)) and call.name is None:
            target = call.node.func
        else:
            continue
        if call.function is at.function and call.order >= at.order:
            continue
        if call.function is not at.function and not may_run_before(model, call, at):
            continue
        if origins & {id(c) for c in model.origin_calls(target, call.order, call.function)}:
            return True
    return False

