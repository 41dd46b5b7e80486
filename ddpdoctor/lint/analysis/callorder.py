"""In which order statements run across functions: a class's methods as its constructor and its
users call them, and module helpers as their callers call them.

The model numbers everything in source order (`order`), which is the order things run in only
inside one function. Across methods it is not: a model holder's `__init__` may call
`self.load_from_ckpt()`, which calls `self.load_model()`, which converts the networks to
SyncBatchNorm, and only then wrap them in DDP; the conversion is written below the wrap but runs
before it. This module answers "may this statement run before that one?" by placing each one on
the ways it is entered:

- an **entry** is a function nothing here calls (run by a launcher, a framework or another module),
  the module body, or a class's `__init__` (each object is constructed once);
- a function this module calls is entered through each of its call sites (`self.m()`, `helper()`,
  `trainer.fit()` on an object built here), transitively up to `MAX_DEPTH` calls;
- two statements entered from the same entry run in the order of the first pair of call sites (or
  statements) where their ways in part, unless a loop around both can repeat them;
- a method of a class entered from outside the class's construction runs on an object already
  constructed, so after everything its `__init__` (and what that calls) does to `self`.

Anything else is unknown and answers "may run before", so a rule asking it stays as it was without
this fact: a function also named where it is not called (handed on as a callback, a property, a
string for `getattr`, a variable of the same name), a call by the same name that resolves to no
function here (`super().load()`), a method whose namesake in another class is called (dispatch may
run it instead), a generator or coroutine (its body runs when drawn or awaited, not when called), a method Python
calls by itself (`forward`, `__call__`, other dunders), a cycle, and more than `MAX_ENTRIES` ways in.
It deliberately stops at the module's edge: a public method that this module calls only from
`__init__` is taken to run only there, although another module could call it again later.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Union

import libcst as cst

from ddpdoctor.lint.analysis.model import MAX_DEPTH, Assignment, Call, Function, ModuleModel
from ddpdoctor.lint.analysis.syntax import contains, dotted_name, walk

# How many ways into one function are followed before its place counts as unknown.
MAX_ENTRIES = 32

# What Python calls by itself, not through a call written here (a module's `forward` runs when
# the module object is called; `__init__` is handled as the construction entry).
IMPLICIT = frozenset({"forward"})

# A statement: anything the model numbers with its function (a call, an assignment).
Item = Union[Call, Assignment]
# One way into a function: the call sites from an entry down to it, outermost first (empty when
# the function is itself an entry).
Way = tuple[Call, ...]


def ways_in(model: ModuleModel, function: Optional[Function]) -> Optional[list[Way]]:
    """Every way `function` is entered, as chains of call sites from an entry; None when some way
    cannot be known (see the module docstring). The module body (None) and a class's `__init__`
    are entries; so is a function nothing here calls."""
    if function is None:
        return [()]
    return model.memoized(("ways_in", id(function)), lambda: _ways_in(model, function), None)


def _ways_in(model: ModuleModel, function: Function) -> Optional[list[Way]]:
    if _is_constructor(function):
        return [()]
    if not _runs_when_called(function) or not _every_use_is_a_known_call(model, function):
        return None
    sites = model.callers(function)
    if not sites:
        return [()]
    out: list[Way] = []
    for site in sites:
        outer = ways_in(model, site.function)
        if outer is None:
            return None
        for way in outer:
            if len(way) >= MAX_DEPTH:
                return None
            out.append((*way, site))
        if len(out) > MAX_ENTRIES:
            return None
    return out


def may_run_before(model: ModuleModel, first: Item, then: Item) -> bool:
    """True unless `first` provably never runs before `then` (on the same object, when both are in
    one class's methods): every way `then` is entered reaches it before every way `first` is
    entered reaches `first`. Unknown answers True."""
    first_ways = ways_in(model, first.function)
    then_ways = ways_in(model, then.function)
    if first_ways is None or then_ways is None:
        return True
    return any(
        _precedes(model, (*way_a, first), (*way_b, then)) for way_a in first_ways for way_b in then_ways
    )


def _precedes(model: ModuleModel, path_a: tuple[Item, ...], path_b: tuple[Item, ...]) -> bool:
    """May the last item of `path_a` run before the last item of `path_b`, each reached through
    the call sites before it (from its entry, outermost first)?"""
    entry_a, entry_b = path_a[0].function, path_b[0].function
    if entry_a is not entry_b:
        return _by_construction(path_a, path_b)
    for step_a, step_b in zip(path_a, path_b):
        if step_a is step_b:
            if step_a.ctx.loops:
                return True  # a call site in a loop: its callee runs again after the other item
            continue
        function = step_a.function
        if step_b.function is not function:
            return True  # one call site that may reach several functions: no common frame
        if isinstance(step_a, Call) and isinstance(step_b, Call) and step_a.statement is step_b.statement:
            return True  # nested calls run inside out, not in the order they are numbered
        if any(loop.function is function and contains(loop, step_a.order) and contains(loop, step_b.order) for loop in model.loops):
            return True  # a loop around both: the next round runs `a` after this round's `b`
        return step_a.order < step_b.order
    return True  # one path is a prefix of the other: the same statement, order unknown


def _by_construction(path_a: tuple[Item, ...], path_b: tuple[Item, ...]) -> bool:
    """Two items entered from different entries: ordered only when both act on one object of one
    class, one during its construction and the other in a method called on the finished object."""
    klass = _class_of(path_a[-1].function)
    if klass is None or klass != _class_of(path_b[-1].function):
        return True
    phase_a, phase_b = _phase(path_a, klass), _phase(path_b, klass)
    if phase_a == "after" and phase_b == "construction":
        return False
    return True


def _phase(path: tuple[Item, ...], klass: str) -> Optional[str]:
    """"construction" when the path enters the class through its `__init__`, "after" when through
    another instance method (it needs an object, so the object exists), None otherwise."""
    for step in path:
        method = _outermost(step.function)
        if method is None or method.klass != klass:
            continue
        if _is_constructor(method):
            return "construction"
        return "after" if _is_instance_method(method) else None
    return None


def _class_of(function: Optional[Function]) -> Optional[str]:
    """The class whose method `function` is, or is nested in."""
    method = _outermost(function)
    return method.klass if method is not None else None


def _outermost(function: Optional[Function]) -> Optional[Function]:
    while function is not None and function.parent is not None:
        function = function.parent
    return function


def _is_constructor(function: Function) -> bool:
    return function.klass is not None and function.name == "__init__" and function.parent is None


def _decorators(function: Function) -> list[str]:
    node = function.node
    if not isinstance(node, cst.FunctionDef):
        return []
    return [dotted_name(d.decorator) or "" for d in node.decorators]


def _is_instance_method(function: Function) -> bool:
    return bool(function.params) and not any(
        name in ("staticmethod", "classmethod") for name in _decorators(function)
    )


def _runs_when_called(function: Function) -> bool:
    """Its body runs at its call sites: not a generator or coroutine (run when drawn or awaited),
    not a method Python calls by itself."""
    node = function.node
    if not isinstance(node, cst.FunctionDef) or node.asynchronous is not None or function.generator:
        return False
    name = function.name
    return name not in IMPLICIT and not (name.startswith("__") and name.endswith("__"))


def _every_use_is_a_known_call(model: ModuleModel, function: Function) -> bool:
    """Every identifier in the module spelled like the function is the name of a `def` or of a
    call that cannot reach it unseen: nothing hands it on (`Thread(target=self.load)`,
    `@property`, `getattr(self, "load")`), and every call by that name is one of its known call
    sites, a call of an import (`torch.load`), or, for a plain function, a call resolved to a
    namesake in another scope. For a method, a call resolved to a namesake method may still reach
    it (`self.setup()` in a base class runs a subclass's override), and `super().load()` or
    `x.load()` on an object whose class is not built here may too. Comments and docstrings do not
    count; a variable or keyword of the same name makes the answer a conservative no."""
    name = function.name
    namesakes = model.functions_named(name)
    calls = [call for call in model.calls if call.attr == name]
    if _identifier_uses(model).get(name, 0) != len(namesakes) + len(calls):
        return False
    mine = {id(site) for site in model.callers(function)}
    others = {
        id(site) for namesake in namesakes
        if namesake is not function and (function.klass is None or namesake.klass is None)
        for site in model.callers(namesake)
    }
    return all(call.name is not None or id(call) in mine or id(call) in others for call in calls)


def _identifier_uses(model: ModuleModel) -> Counter[str]:
    """How often each identifier is written in the module (names, attributes, `def` names,
    keywords), and each string literal that could name an attribute (`getattr(obj, "load")`)."""

    def compute() -> Counter[str]:
        uses: Counter[str] = Counter()
        for node in walk(model.module):
            if isinstance(node, cst.Name):
                uses[node.value] += 1
            elif isinstance(node, cst.SimpleString):
                value = node.evaluated_value
                if isinstance(value, str) and value.isidentifier():
                    uses[value] += 1
        return uses

    return model.memoized(("identifier_uses",), compute, Counter())
