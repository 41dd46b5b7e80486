"""Where the value a call builds is read: `preview = DataLoader(...)` and then every place that
names `preview`, each as the recorded step (a call or an assignment) it sits in, so that the layer
above can ask who runs each of them.

Deliberately syntactic and conservative: it answers only for a value bound once, whole, to a plain
variable or to a `self.` attribute, and only when every mention of that name in the code that can
see it sits inside a call, an assigned value or a `for`'s iterable. A mention anywhere else (a
condition, a `return` or `yield`, `obj.attr` on another object) is a place the value may
escape to, and the answer is None: unknown. A mention that only moves the value on (`loaders =
{"train": loader}`, `it = iter(loader)`) is a read where it is written: whichever process later draws
from the alias ran that statement first. Mentions in other modules (`runner.preview` after importing the
runner's module) are not seen."""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst

from ddpdoctor.lint.analysis.model import Assignment, Call, ModuleModel
from ddpdoctor.lint.analysis.syntax import walk

Reader = Union[Call, Assignment]


def value_reads(model: ModuleModel, call: Call) -> Optional[list[Reader]]:
    """The steps that read the value `call` builds, through the one name it is bound to, in
    source order; [] when nothing reads it; None when that cannot be told (see the module's
    docstring)."""
    return model.memoized(("value_reads", id(call)), lambda: _value_reads(model, call), None)


def _value_reads(model: ModuleModel, call: Call) -> Optional[list[Reader]]:
    bindings = [a for a in model.assignments if a.value is call.node]
    if len(bindings) != 1 or bindings[0].kind != "assign":
        return None
    binding = bindings[0]
    target = binding.target
    mentions: list[cst.BaseExpression]
    if "." not in target:
        scope: cst.CSTNode = binding.function.node if binding.function is not None else model.module
        mentions = [n for n in walk(scope) if isinstance(n, cst.Name) and n.value == target]
    elif target.count(".") == 1 and target.startswith("self."):
        attr = target.split(".", 1)[1]
        mentions = []
        for node in walk(model.module):
            if isinstance(node, cst.Attribute) and node.attr.value == attr:
                if not (isinstance(node.value, cst.Name) and node.value.value == "self"):
                    return None  # `runner.preview_loader` read on some other object: it escapes
                mentions.append(node)
    else:
        return None
    stores = _store_targets(model, target)
    reads = [node for node in mentions if id(node) not in stores]
    owners = _owners(model, {id(node) for node in reads})
    readers: dict[int, Reader] = {}
    for node in reads:
        owner = owners.get(id(node))
        if owner is None:
            return None
        readers[id(owner)] = owner
    return sorted(readers.values(), key=lambda reader: reader.order)


def _store_targets(model: ModuleModel, target: str) -> set[int]:
    """The nodes that bind `target` (the left-hand sides of its plain and annotated assignments)."""
    out: set[int] = set()
    for assignment in model.assignments_to(target):
        node = assignment.node
        if isinstance(node, cst.Assign):
            out.update(id(t.target) for t in node.targets)
        elif isinstance(node, cst.AnnAssign):
            out.add(id(node.target))
    return out


def _owners(model: ModuleModel, wanted: set[int]) -> dict[int, Reader]:
    """For each wanted node, the outermost recorded step whose expression holds it: a call (its
    callee and arguments), an assigned value, or the iterable of a `for` (owned by the loop's
    target binding, which runs where the loop starts)."""
    out: dict[int, Reader] = {}
    if not wanted:
        return out
    steps: list[tuple[cst.CSTNode, Reader]] = [(c.node, c) for c in model.calls]
    for assignment in model.assignments:
        if assignment.value is not None:
            steps.append((assignment.value, assignment))
        elif assignment.kind == "for" and isinstance(assignment.node, cst.For):
            steps.append((assignment.node.iter, assignment))
    # Outermost first: a mention in `next(iter(loader))` belongs to the statement's outer call,
    # which runs under the same conditions as the inner one.
    steps.sort(key=lambda step: step[1].order)
    for expression, step in steps:
        if len(out) == len(wanted):
            break
        for node in walk(expression):
            if id(node) in wanted and id(node) not in out:
                out[id(node)] = step
    return out
