"""Path conditions: are two branch conditions the same test, opposite tests, or unrelated?

Asked within one function (`if scaler is not None:` and, later, `if scaler is None:`) and across a
call: a callee's test of its own parameters, read as the caller's test of what it passes, against
the conditions the call site itself runs under. The script that launches `mp.spawn(main, ...)` under
`if args.nodes > 1:` and calls `main(0, args)` in the `else:` never runs `main`'s
`if args.nodes > 1:` branch with that literal 0: the two conditions are one test, seen from both
sides of the call.

The comparison is textual (after folding `not` and `is None` into the polarity), so it only ever
proves what the code states twice; anything it cannot read the same way stays "unrelated".
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence, Union

import libcst as cst

from ddpdoctor.lint.analysis.model import Assignment, Call, Context, Function, Guard, ModuleModel, Route
from ddpdoctor.lint.analysis.syntax import bool_literal, dotted_name, names_in


class Located(Protocol):
    """Anything that sits at a place in the code: a call, an assignment, a loop."""

    @property
    def ctx(self) -> Context: ...

    @property
    def function(self) -> Optional[Function]: ...


def condition(model: ModuleModel, test: cst.BaseExpression, negated: bool) -> tuple[str, bool]:
    """A branch condition as (text, polarity), with `not x` and `x is None` folded into the
    polarity of `x` / `x is not None`, so that `if scaler is not None:` and a later
    `if scaler is None:` are recognised as opposite conditions."""
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, negated = test.expression, not negated
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        if isinstance(target.operator, cst.Is):
            return f"{model.code_of(test.left)} is not {model.code_of(target.comparator)}", negated
        if isinstance(target.operator, cst.IsNot):
            return f"{model.code_of(test.left)} is not {model.code_of(target.comparator)}", not negated
    return model.code_of(test), not negated


def agreement(model: ModuleModel, guard: Guard, other: Guard) -> Optional[bool]:
    """True when two guards hold together, False when they cannot both hold, None when they are not
    the same condition: one test (its two sides), or two checks of one flag (`if scaler is not None:`
    and later `if scaler is None:` or `if scaler is not None:` again) that nothing reassigns between."""
    if guard.test is other.test:
        return guard.negated == other.negated
    text, polarity = condition(model, guard.test, guard.negated)
    other_text, other_polarity = condition(model, other.test, other.negated)
    if text != other_text or not not_reassigned(model, guard.test, guard.order, other.order):
        return None
    return polarity == other_polarity


def exclusive(model: ModuleModel, a: Located, b: Located) -> bool:
    """True when two statements sit in branches whose conditions cannot both hold: the two sides of
    one `if`, or `if args.amp:` ... `if not args.amp:` (the flag is not reassigned in between)."""
    return any(agreement(model, guard, other) is False for guard in a.ctx.guards for other in b.ctx.guards)


def not_reassigned(model: ModuleModel, test: cst.BaseExpression, start: int, end: int) -> bool:
    """No name read by the condition is assigned between the two points: neither `args.amp` nor
    `args` itself (a new namespace is a new flag)."""
    low, high = min(start, end), max(start, end)
    for name in names_in(test):
        parts = name.split(".")
        for prefix in (".".join(parts[: i + 1]) for i in range(len(parts))):
            if any(low < a.order < high for a in model.assignments_to(prefix)):
                return False
    return True


# ------------------------------------------------------------------------------ across a call


def site_reaches(model: ModuleModel, site: Call, function: Function, guards: Sequence[Guard]) -> bool:
    """False when `site` (a call of `function`) cannot get to a statement that runs under `guards`
    inside `function`:
    - a branch tests a flag parameter (`if save_cur:`, `elif not final:`) that the site fixes with a
      literal, or leaves at a literal default, that takes the other way: `save_checkpoint(...,
      save_cur=True)` never reaches the `else` save of the periodic checkpoint;
    - a branch tests what the site passes (`if args.nodes > 1:` with `args` handed over as is)
      and the site itself runs only where that test fails (`else: main(0, args)`)."""
    outer_guards = [outer for outer in site.ctx.guards if outer.function is site.function]
    outer_conditions: Optional[list[tuple[Guard, str, bool]]] = None  # read once, when first needed
    for guard in guards:
        if guard.function is not function:
            continue
        if _flag_fixed_the_other_way(model, site, function, guard):
            return False
        if not outer_guards:
            continue  # the call itself runs unconditionally: nothing to rule the branch out
        seen = model.memoized(
            ("caller_sees", id(site), id(guard)),
            lambda: _as_the_caller_sees_it(model, site, function, guard, outer_guards),
            None,
        )
        if seen is None:
            continue
        text, polarity = condition(model, seen, guard.negated)
        if outer_conditions is None:
            outer_conditions = [(outer, *condition(model, outer.test, outer.negated)) for outer in outer_guards]
        for outer, outer_text, outer_polarity in outer_conditions:
            if outer_text == text and outer_polarity != polarity and not_reassigned(model, outer.test, outer.order, site.order):
                return False
    return True


def route_reaches(model: ModuleModel, route: Union[Route, Sequence[Union[Call, Assignment]]], sink: Located) -> bool:
    """False when a value's path (`ModuleModel.routes`) cannot happen: one of its call sites is under a
    condition that rules out the branch, inside the called function, where the value travels on (the
    sink itself, or an assignment on the way to it)."""
    steps = route.via if isinstance(route, Route) else route
    places: list[Located] = [sink]
    for step in steps:
        if isinstance(step, Call):
            for place in places:
                callee = place.function
                if callee is None or callee is step.function or step not in model.call_sites(callee):
                    continue
                if not site_reaches(model, step, callee, place.ctx.guards):
                    return False
            places = [step]
        else:
            places.append(step)
    return True


def _flag_fixed_the_other_way(model: ModuleModel, site: Call, function: Function, guard: Guard) -> bool:
    test, holds_when = guard.test, not guard.negated
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, holds_when = test.expression, not holds_when
    if not isinstance(test, cst.Name) or test.value not in function.params:
        return False
    if not _reads_the_argument(model, test.value, guard, function):
        return False
    passed = bool_literal(model.argument_at(site, function, test.value))
    return passed is not None and passed is not holds_when


def _reads_the_argument(model: ModuleModel, param: str, guard: Guard, function: Function) -> bool:
    """The parameter still holds what the caller passed where the guard tests it (not rebound)."""
    return all(a.kind == "param" for a in model.reaching_assignments(param, guard.order, function))


def _as_the_caller_sees_it(
    model: ModuleModel, site: Call, function: Function, guard: Guard, outer_guards: Sequence[Guard]
) -> Optional[cst.BaseExpression]:
    """The guard's test with each parameter replaced by what `site` passes for it (`outer_guards`:
    the conditions around the site in its own function), or None when the
    test reads something the caller cannot see the same way: a local variable of `function`, a
    parameter it rebinds (or one of its attributes it assigns) anywhere in its body, an argument the
    site does not spell out, or nothing from the caller at all (a test of globals only says nothing
    new about this call site)."""
    replacements: dict[str, cst.BaseExpression] = {}
    for name in names_in(guard.test):
        root = name.split(".", 1)[0]
        if any(a.function is function and a.kind != "param" for target in {root, name} for a in model.assignments_to(target)):
            return None  # a local of the callee, or a parameter (or an attribute of one) that it rebinds
        if root not in function.params:
            continue  # a global or an import: the caller reads the same one
        passed = model.argument_at(site, function, root)
        if passed is None:
            return None
        replacements[root] = passed
    if not replacements:
        return None
    # Cheap first: rewriting the test builds new nodes, worth it only when some condition around the
    # call reads every argument put in (`args` for `if args.nodes > 1:` seen through `main(0, args)`).
    passed_names = {dotted_name(value) for value in replacements.values()}
    if None in passed_names:
        return None
    around = [set(names_in(outer.test)) for outer in outer_guards]
    if not any(all(any(n == p or n.startswith(f"{p}.") for n in names) for p in passed_names) for names in around):
        return None
    return guard.test.visit(_Substitute(replacements))  # type: ignore[return-value]


class _Substitute(cst.CSTTransformer):
    """Replace the names of parameters by the arguments passed for them, everywhere a name is read
    (not an attribute's or a keyword's own name)."""

    def __init__(self, replacements: dict[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.replacements = replacements

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.replacements.get(original_node.value, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)
