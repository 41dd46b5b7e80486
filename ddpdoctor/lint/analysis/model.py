"""One module's semantic model: bindings, values per path, loops, calls, functions and the branch
conditions each statement runs under — recorded in one cheap pass, queried by everything above.

What the model answers:

- what an expression names, with import aliases resolved (`qualify`): `dist.barrier`,
  `torch.distributed.barrier` and `from torch.distributed import barrier` are all
  `torch.distributed.barrier` (star imports of torch modules included);
- every call with its context (`calls`, `calls_named`, `method_calls`): the enclosing function and
  class, the loops around it, the `with` blocks around it and the branch conditions that guard it;
- assignments and where a value came from (`reaching_values`, `origin_calls`, `const_value`,
  `leaf_values`), following variables, `self.` attributes across methods, helper functions'
  `return`s, function parameters through their call sites in this module, and argparse defaults;
- positions, computed lazily (libcst's PositionProvider costs about one more pass over the tree,
  so it is resolved only for files that produce a finding).

What it does not answer (the topic analyzers above it do): who runs a statement (`ranks`), which
device a value names (`devices`), whether the script is multi-process (`launch`), test suites
(`harness`), what a function does for its callers (`summaries`).

Why a hand-written walk rather than libcst's visitor or its scope/qualified-name metadata: on the
torch sources a bare `CSTVisitor` walk costs ~0.6x the parse and the scope metadata several times the
parse, while walking only statement and expression fields (skipping whitespace and token nodes)
costs ~0.05x. The rules need far less than full scope analysis, so we record just that, once.
"""

from __future__ import annotations

import bisect
import builtins
import re
import os.path
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional, Sequence, TypeVar, Union, cast

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from ddpdoctor.lint.analysis.imports import MemoCycle, ProjectSources
from ddpdoctor.lint.analysis.syntax import (
    UNKNOWN,
    Expr,
    canonical,
    child_fields,
    contains,
    dotted_name,
    exits,
    literal_int,
    walk,
)

# Methods that return (a view of) their receiver for the purposes of "where did this come from".
PASS_THROUGH_METHODS = frozenset(
    {"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train", "eval", "requires_grad_",
     "to_empty", "share_memory"}
)

# How deep value-following goes before it gives up (and the rule stays silent).
MAX_DEPTH = 6
# How many distinct value-following questions one module may ask before every further one
# answers "unknown": a hard ceiling on analysis time for pathological files.
STEP_BUDGET = 200_000
# Names no star import of a project module can be what a call means (`print(...)`, `len(...)`).
_BUILTIN_NAMES = frozenset(dir(builtins))
_BUILTINS = frozenset(dir(builtins))
# How many distinct paths one value may arrive by before following it gives up.
MAX_ROUTES = 64
_IN_PROGRESS = object()
T = TypeVar("T")

# Callables whose for-loop iterates their (first) argument: `for i, batch in enumerate(loader)`,
# `metric_logger.log_every(loader, print_freq, header)` (torchvision / DETR / MAE references).
ITERATION_WRAPPERS = frozenset({"enumerate", "iter", "tqdm", "islice", "zip", "reversed", "log_every"})


# --------------------------------------------------------------------------------------------- model


@dataclass(eq=False)
class Function:
    name: str
    qualname: str  # "Trainer.fit" or "main"
    node: Union[cst.FunctionDef, cst.Lambda]
    klass: Optional[str]
    params: list[str]
    order: int
    end_order: int = 0
    parent: Optional["Function"] = None
    returns: list[Expr] = field(default_factory=list)
    generator: bool = False  # it yields: its loops run as the caller draws from it
    calls: list["Call"] = field(default_factory=list)
    # Names its body declares `global`: its assignments to them rebind the module's variable.
    global_names: set[str] = field(default_factory=set)


@dataclass(eq=False)
class Loop:
    node: Union[cst.For, cst.While]
    order: int
    end_order: int
    function: Optional[Function]
    target_names: tuple[str, ...]  # for-loop targets, dotted
    iter: Optional[Expr]  # the for-loop's iterable (None for while)
    guards: tuple["Guard", ...] = ()  # the branch conditions the loop itself runs under


@dataclass(eq=False)
class Guard:
    """A condition a statement runs under. `negated` is True in an `else` or after an early exit."""

    test: Expr
    negated: bool
    order: int
    function: Optional[Function]


@dataclass(eq=False)
class Context:
    function: Optional[Function]
    klass: Optional[str]
    loops: tuple[Loop, ...]
    guards: tuple[Guard, ...]
    withs: tuple[Expr, ...]  # the context-manager expressions around, outermost first


@dataclass(eq=False)
class Call:
    node: cst.Call
    order: int
    ctx: Context
    name: Optional[str]  # import-resolved qualified name of the callee, when it is an import
    dotted: Optional[str]  # the callee as written, e.g. "self.model.module"
    statement: cst.CSTNode
    # What `**kwargs` carries, when the model could read it whole (a literal dict or `dict(...)`,
    # then `.update(...)` and `kwargs["k"] = v`): keyword -> value. None when there is no `**` or it
    # cannot be read.
    star_keywords: Optional[dict[str, Expr]] = None

    @property
    def function(self) -> Optional[Function]:
        return self.ctx.function

    @property
    def loops(self) -> tuple[Loop, ...]:
        return self.ctx.loops

    @property
    def attr(self) -> Optional[str]:
        func = self.node.func
        if isinstance(func, cst.Attribute):
            return func.attr.value
        if isinstance(func, cst.Name):
            return func.value
        return None

    @property
    def receiver(self) -> Optional[Expr]:
        func = self.node.func
        return func.value if isinstance(func, cst.Attribute) else None

    @property
    def args(self) -> Sequence[cst.Arg]:
        return self.node.args

    def arg(self, position: Optional[int] = None, keyword: Optional[str] = None) -> Optional[Expr]:
        """The expression passed at `position` (positional) or as `keyword=`, also through a
        `**kwargs` the model could read (`star_keywords`)."""
        written = self.written_arg(position, keyword)
        if written is None and keyword is not None and self.star_keywords is not None:
            return self.star_keywords.get(keyword)
        return written

    def written_arg(self, position: Optional[int] = None, keyword: Optional[str] = None) -> Optional[Expr]:
        """The expression written in the call itself at `position` or as `keyword=`."""
        if keyword is not None:
            for arg in self.node.args:
                if arg.keyword is not None and arg.keyword.value == keyword:
                    return arg.value
        if position is not None:
            positional = [a for a in self.node.args if a.keyword is None and not a.star]
            if position < len(positional):
                return positional[position].value
        return None

    def has_star_args(self) -> bool:
        """`*args`, or a `**kwargs` whose content is not known: anything may arrive through it."""
        return any(a.star == "*" or (a.star == "**" and self.star_keywords is None) for a in self.node.args)


@dataclass(eq=False)
class Assignment:
    target: str  # dotted: "model", "self.model", "args.lr"
    value: Optional[Expr]  # None when not knowable (tuple unpacking, for-targets, parameters)
    kind: str  # "assign" | "augassign" | "annassign" | "for" | "with" | "param" | "unpack" | "subscript"
    order: int
    ctx: Context
    node: cst.CSTNode
    # `a, b = f()`: the unpacked expression and this target's position in it.
    unpacked: Optional[tuple[Expr, int]] = None

    @property
    def function(self) -> Optional[Function]:
        return self.ctx.function


@dataclass(eq=False)
class SubscriptStore:
    """`x[key] = value` / `x[key] *= value`: e.g. `param_group["lr"] = lr * hvd.size()`."""

    target: Expr
    key: Optional[Expr]
    value: Expr
    op: Optional[str]
    order: int
    ctx: Context


@dataclass(frozen=True, eq=False)
class Route:
    """One way a value reaches a use: the final expression, where it is evaluated, and the
    assignments and call sites it passes through on the way (nearest the use first)."""

    value: Expr
    order: int
    function: Optional[Function]
    via: tuple[Union["Call", "Assignment"], ...] = ()

    def key(self) -> tuple[int, ...]:
        return (id(self.value), self.order, id(self.function), *map(id, self.via))

    def through(self, step: Union["Call", "Assignment"]) -> "Route":
        return Route(self.value, self.order, self.function, (step, *self.via))


# ------------------------------------------------------------------------------------------ builder


class _Counter:
    """itertools.count(1) that also tells the last number it gave (`last`), so the builder can mark
    where a statement ends among the numbered items without numbering it."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0

    def __iter__(self) -> "_Counter":
        return self

    def __next__(self) -> int:
        self.last += 1
        return self.last


# The small statements whose place among the numbered items is marked (see ModuleModel.walk_marks).
_MARKED_SMALL = (cst.Break, cst.Continue, cst.Return, cst.Expr)


class _Builder:
    def __init__(self, model: "ModuleModel") -> None:
        self.model = model
        self.counter = _Counter()
        self.function: Optional[Function] = None
        self.klass: Optional[str] = None
        self.loops: list[Loop] = []
        self.guards: list[Guard] = []
        self.withs: list[Expr] = []
        self.statement_node: cst.CSTNode = model.module

    def context(self) -> Context:
        return Context(self.function, self.klass, tuple(self.loops), tuple(self.guards), tuple(self.withs))

    # ---- statements

    def block(self, statements: Sequence[cst.BaseStatement]) -> None:
        saved = len(self.guards)
        for statement in statements:
            self.statement(statement)
            if (
                isinstance(statement, cst.If)
                and statement.orelse is None
                and exits(statement.body)
            ):
                # `if rank != 0: return` guards everything after it in this block.
                self.guards.append(Guard(statement.test, True, next(self.counter), self.function))
        del self.guards[saved:]

    def suite(self, suite: cst.BaseSuite) -> None:
        if isinstance(suite, cst.IndentedBlock):
            self.block(suite.body)
        elif isinstance(suite, cst.SimpleStatementSuite):
            for small in suite.body:
                self.small(small, suite)

    def statement(self, statement: cst.BaseStatement) -> None:
        self.statement_node = statement
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                self.statement_node = statement
                self.small(small, statement)
        elif isinstance(statement, cst.If):
            self.expr(statement.test)
            self.model.walk_marks[id(statement.test)] = self.counter.last
            guard = Guard(statement.test, False, next(self.counter), self.function)
            self.guards.append(guard)
            self.suite(statement.body)
            self.guards.pop()
            if statement.orelse is not None:
                self.guards.append(Guard(statement.test, True, next(self.counter), self.function))
                if isinstance(statement.orelse, cst.If):
                    self.statement(statement.orelse)
                else:
                    self.suite(statement.orelse.body)
                self.guards.pop()
        elif isinstance(statement, cst.For):
            self.expr(statement.iter)
            targets = self.bind_target(statement.target, None, "for", statement)
            self.loop(statement, tuple(targets), statement.iter)
        elif isinstance(statement, cst.While):
            self.expr(statement.test)
            self.loop(statement, (), None)
        elif isinstance(statement, cst.FunctionDef):
            self.function_def(statement)
        elif isinstance(statement, cst.ClassDef):
            if self.function is None and self.klass is None:
                self.model.classes.setdefault(statement.name.value, statement)
            for decorator in statement.decorators:
                self.expr(decorator.decorator)
            for arg in statement.bases:
                self.expr(arg.value)
            saved_class, saved_function, saved_loops = self.klass, self.function, self.loops
            self.klass, self.function, self.loops = statement.name.value, None, []
            self.suite(statement.body)
            self.klass, self.function, self.loops = saved_class, saved_function, saved_loops
        elif isinstance(statement, cst.With):
            pushed = 0
            for item in statement.items:
                self.expr(item.item)
                if item.asname is not None:
                    self.bind_target(item.asname.name, item.item, "with", statement)
                self.withs.append(item.item)
                pushed += 1
            self.suite(statement.body)
            del self.withs[len(self.withs) - pushed:]
        elif isinstance(statement, (cst.Try, cst.TryStar)):
            self.suite(statement.body)
            for handler in statement.handlers:
                if handler.type is not None:
                    self.expr(handler.type)
                self.suite(handler.body)
            if statement.orelse is not None:
                self.suite(statement.orelse.body)
            if statement.finalbody is not None:
                self.suite(statement.finalbody.body)
        elif isinstance(statement, cst.Match):
            self.expr(statement.subject)
            for case in statement.cases:
                self.suite(case.body)
        else:  # anything new in the grammar: still find its calls
            self.expr(statement)

    def loop(self, node: Union[cst.For, cst.While], targets: tuple[str, ...], iterable: Optional[Expr]) -> None:
        loop = Loop(node, next(self.counter), 0, self.function, targets, iterable, tuple(self.guards))
        self.loops.append(loop)
        self.suite(node.body)
        self.loops.pop()
        loop.end_order = next(self.counter)
        self.model.loops.append(loop)
        if node.orelse is not None:
            self.suite(node.orelse.body)  # runs once, after the loop: not part of it

    def function_def(self, node: cst.FunctionDef) -> None:
        for decorator in node.decorators:
            self.expr(decorator.decorator)
        params = node.params
        all_params = [*params.posonly_params, *params.params, *params.kwonly_params]
        if isinstance(params.star_arg, cst.Param):
            all_params.append(params.star_arg)
        if params.star_kwarg is not None:
            all_params.append(params.star_kwarg)
        for param in all_params:
            if param.default is not None:
                self.expr(param.default)
        prefix = f"{self.function.qualname}.<locals>." if self.function else (f"{self.klass}." if self.klass else "")
        function = Function(
            name=node.name.value,
            qualname=prefix + node.name.value,
            node=node,
            klass=self.klass if self.function is None else None,
            params=[p.name.value for p in all_params],
            order=next(self.counter),
            parent=self.function,
        )
        self.model.functions.append(function)
        saved = (self.function, self.loops, self.guards, self.withs)
        self.function, self.loops, self.guards, self.withs = function, [], [], []
        for param in all_params:
            self.model._add_assignment(
                Assignment(param.name.value, param.default, "param", next(self.counter), self.context(), param)
            )
        self.suite(node.body)
        function.end_order = next(self.counter)
        self.function, self.loops, self.guards, self.withs = saved

    def small(self, small: cst.BaseSmallStatement, statement: cst.CSTNode) -> None:
        self._small(small, statement)
        if isinstance(small, _MARKED_SMALL):
            self.model.walk_marks[id(small)] = self.counter.last

    def _small(self, small: cst.BaseSmallStatement, statement: cst.CSTNode) -> None:
        if isinstance(small, cst.Assign):
            self.expr(small.value)
            for target in small.targets:
                self.bind_target(target.target, small.value, "assign", small)
        elif isinstance(small, cst.AnnAssign):
            if small.value is not None:
                self.expr(small.value)
                self.bind_target(small.target, small.value, "annassign", small)
        elif isinstance(small, cst.AugAssign):
            self.expr(small.value)
            self.expr(small.target)
            op = type(small.operator).__name__
            if isinstance(small.target, cst.Subscript):
                self.record_subscript_store(small.target, small.value, op)
            else:
                self.bind_target(small.target, small.value, "augassign", small)
        elif isinstance(small, cst.Return):
            if small.value is not None:
                self.expr(small.value)
                if self.function is not None:
                    self.function.returns.append(small.value)
        elif isinstance(small, cst.Import):
            for alias in small.names:
                full = dotted_name(alias.name)
                if full is None:
                    continue
                if alias.asname is not None:
                    local = dotted_name(alias.asname.name)
                    if local:
                        self.model.imports[local] = full
                else:
                    root = full.split(".")[0]
                    self.model.imports[root] = root
                    self.model.imported_modules.add(full)
        elif isinstance(small, cst.ImportFrom):
            module = dotted_name(small.module) if small.module is not None else None
            level = len(small.relative)
            if isinstance(small.names, cst.ImportStar):
                self.model.star_imports.append((module, level))
                return
            if level:
                for alias in small.names:
                    name = dotted_name(alias.name)
                    local = dotted_name(alias.asname.name) if alias.asname is not None else name
                    if name is not None and local:
                        self.model.relative_imports[local] = (module, level, name)
                return
            if module is None:
                return
            for alias in small.names:
                name = dotted_name(alias.name)
                if name is None:
                    continue
                local = dotted_name(alias.asname.name) if alias.asname is not None else name
                if local:
                    self.model.imports[local] = f"{module}.{name}"
        elif isinstance(small, cst.Global):
            if self.function is not None:
                self.function.global_names.update(item.name.value for item in small.names)
        else:
            self.expr(small)

    def bind_target(
        self,
        target: cst.CSTNode,
        value: Optional[Expr],
        kind: str,
        node: cst.CSTNode,
        unpacked: Optional[tuple[Expr, int]] = None,
    ) -> list[str]:
        if isinstance(target, (cst.Tuple, cst.List)):
            names: list[str] = []
            values: Optional[Sequence[Expr]] = None
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(target.elements):
                values = [el.value for el in value.elements]
            flat = not any(isinstance(e, cst.StarredElement) for e in target.elements)
            for index, element in enumerate(target.elements):
                inner_value = values[index] if values is not None else None
                inner_kind = kind if values is not None else ("unpack" if kind == "assign" else kind)
                source = (value, index) if values is None and value is not None and kind == "assign" and flat else None
                names.extend(self.bind_target(element.value, inner_value, inner_kind, node, source))
            return names
        if isinstance(target, cst.StarredElement):
            return self.bind_target(target.value, None, "unpack", node)
        if isinstance(target, cst.Subscript):
            if value is not None and kind in ("assign", "annassign"):
                self.record_subscript_store(target, value, None)
            self.expr(target)
            return []
        name = dotted_name(target)
        if name is None:
            self.expr(target)
            return []
        self.model._add_assignment(Assignment(name, value, kind, next(self.counter), self.context(), node, unpacked))
        return [name]

    def record_subscript_store(self, target: cst.Subscript, value: Expr, op: Optional[str]) -> None:
        key = None
        if len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index):
            key = target.slice[0].slice.value
        self.model.subscript_stores.append(
            SubscriptStore(target.value, key, value, op, next(self.counter), self.context())
        )

    # ---- expressions: find every call, in source order

    def expr(self, root: cst.CSTNode) -> None:
        stack: list[cst.CSTNode] = [root]
        pending: list[cst.CSTNode] = []
        while stack:
            node = stack.pop()
            # Calls in a lambda body are recorded in the enclosing context: good enough for rules.
            if isinstance(node, cst.Call):
                self.record_call(node)
            elif isinstance(node, cst.Yield) and self.function is not None:
                self.function.generator = True
            pending.clear()
            for name in child_fields(type(node)):
                value = getattr(node, name)
                if isinstance(value, cst.CSTNode):
                    pending.append(value)
                elif type(value) in (tuple, list):
                    pending.extend(v for v in value if isinstance(v, cst.CSTNode))
            # Reverse so that pop() visits children left to right (source order).
            stack.extend(reversed(pending))

    def record_call(self, node: cst.Call) -> None:
        dotted = dotted_name(node.func)
        call = Call(
            node=node,
            order=next(self.counter),
            ctx=self.context(),
            name=self.model.qualify(node.func),
            dotted=dotted,
            statement=self.statement_node,
        )
        self.model.calls.append(call)
        self.model._call_by_node[id(node)] = call
        if self.function is not None:
            self.function.calls.append(call)


# -------------------------------------------------------------------------------------------- model


class ModuleModel:
    """Everything the rules know about one module. Build with `ModuleModel.build(module)`."""

    def __init__(
        self,
        module: cst.Module,
        path: str = "<string>",
        world_size: Optional[int] = None,
        project: Optional[ProjectSources] = None,
    ) -> None:
        self.module = module
        self.path = path
        self.project = project  # the run's project modules; None for stdin and snippets
        self.world_size = world_size  # --world-size / config: the number of processes or GPUs
        self.imports: dict[str, str] = {}
        # `from <module> import *`, in order: (module, number of leading dots).
        self.star_imports: list[tuple[Optional[str], int]] = []
        # `from .<module> import name [as local]`: local -> (module, level, name).
        self.relative_imports: dict[str, tuple[Optional[str], int, str]] = {}
        self._star_table: Optional[dict[str, str]] = None
        self._reexports: dict[str, Optional[str]] = {}
        self._built = False
        self._star_fallback: Optional[str] = None
        self.imported_modules: set[str] = set()
        self.calls: list[Call] = []
        self.assignments: list[Assignment] = []
        self.subscript_stores: list[SubscriptStore] = []
        self.functions: list[Function] = []
        # The module's top-level classes by name (the first definition of each).
        self.classes: dict[str, cst.ClassDef] = {}
        self.loops: list[Loop] = []
        # id(node) -> the last number given when the build had walked past it (every call and
        # assignment up to the node's end has one at most this), for each `if` test and each
        # break / continue / return / expression statement: where such a statement sits among the
        # numbered items, without the cost of the module's source positions.
        self.walk_marks: dict[int, int] = {}
        self._assignments_by_target: dict[str, list[Assignment]] = {}
        self._call_by_node: dict[int, Call] = {}
        self._positions: Optional[dict[cst.CSTNode, CodeRange]] = None
        self._source_lines: Optional[list[str]] = None
        self._call_sites: Optional[dict[int, list[Call]]] = None
        self._callees: Optional[dict[int, list[Function]]] = None
        self._value_sites: Optional[dict[int, tuple[int, Optional[Function]]]] = None
        self._argparse: Optional[dict[str, list[Expr]]] = None
        self._top_imports: Optional[dict[str, str]] = None
        # Memo for the value-following queries. Recursive helpers otherwise make them exponential
        # (a parameter followed through every call site at every level), and a cycle would never end.
        self._memo: dict[tuple[object, ...], object] = {}
        self._steps = 0
        # Lookups over the lists above, each built once on first use (see `_index`): a question
        # asked per call site or per loop must not scan the whole module each time, or a file's
        # analysis grows with the square of its size.
        self._indexes: dict[str, object] = {}

    @classmethod
    def build(
        cls,
        module: cst.Module,
        path: str = "<string>",
        world_size: Optional[int] = None,
        project: Optional[ProjectSources] = None,
    ) -> "ModuleModel":
        model = cls(module, path, world_size, project)
        builder = _Builder(model)
        # Imports first: a later `import` still names what earlier calls in functions mean at run time.
        for statement in module.body:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, (cst.Import, cst.ImportFrom)):
                        builder.small(small, statement)
        builder.block(module.body)
        model._built = True
        if model.star_imports:
            # Names that arrive through a star import are known only now that local bindings are.
            for call in model.calls:
                call.name = model.qualify(call.node.func)
        for call in model.calls:
            if any(arg.star == "**" for arg in call.node.args):
                call.star_keywords = model._star_keywords(call)
        model._indexes.clear()  # call names may have changed above: index the final ones
        return model

    def _index(self, name: str, build: "Callable[[], T]") -> "T":
        """A lookup over the model's lists, built on its first use. While the model is still being
        built (its lists still growing) it is computed afresh and not kept."""
        if not self._built:
            return build()
        if name not in self._indexes:
            self._indexes[name] = build()
        return self._indexes[name]  # type: ignore[return-value]

    def _star_keywords(self, call: Call) -> Optional[dict[str, Expr]]:
        """What `f(**name)` passes, when `name` is one literal dict / `dict(k=v)` built in the same
        function and changed since only by `.update(k=v)` / `.update({...})` / `name["k"] = v`."""
        out: dict[str, Expr] = {}
        for arg in call.node.args:
            if arg.star != "**":
                continue
            name = dotted_name(arg.value)
            if name is None:
                return None
            found = self.reaching_assignments(name, call.order, call.function)
            if len(found) != 1 or found[0].kind != "assign" or found[0].function is not call.function:
                return None
            built = found[0]
            entries = _literal_keywords(built.value)
            if entries is None:
                return None
            out.update(entries)
            for update in self.method_calls("update"):
                if dotted_name(update.receiver) == name and update.function is call.function and built.order < update.order < call.order:
                    entries = {}
                    for item in update.args:
                        more = _literal_keywords(item.value) if item.keyword is None else {item.keyword.value: item.value}
                        if more is None or item.star:
                            return None
                        entries.update(more)
                    out.update(entries)
            for store in self.subscript_stores:
                if dotted_name(store.target) == name and store.ctx.function is call.function and built.order < store.order < call.order:
                    if not isinstance(store.key, cst.SimpleString) or store.op is not None:
                        return None
                    out[str(store.key.evaluated_value)] = store.value
        return out

    # ---- names

    def qualify(self, node: Optional[cst.CSTNode]) -> Optional[str]:
        """The import-resolved, canonical dotted name of a Name/Attribute, or None if not an import."""
        name = dotted_name(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        target = self.imports.get(head)
        if self.project is not None and target is not None and not target.startswith("torch"):
            target = self._reexported(head) or target
        if target is None and self.star_imports:
            target = self._through_star(head)
        if target is None:
            return None
        return canonical(f"{target}.{rest}" if rest else target)

    def _reexported(self, head: str) -> Optional[str]:
        """What a name imported from a project package means when the package's `__init__.py` only
        re-exports it (`from utils import DDP` where utils/__init__.py does `from
        torch.nn.parallel import DistributedDataParallel as DDP`): the import it is there. Only
        absolute imports (what a training script writes; a library's relative imports are many and
        rarely re-export torch) of packages' `__init__.py` (the hubs that re-export), each read once
        per run."""
        if head in self._reexports:
            return self._reexports[head]
        found: Optional[str] = None
        project = self.project
        if project is not None:
            for module, level, name in self._import_candidates(head):
                path = project.resolve(Path(self.path), module, level)
                if path is not None and path.name == "__init__.py" and str(path) != os.path.abspath(self.path):
                    found = _star_exports(project, path, 0).get(name)
                    if found is not None:
                        break
        self._reexports[head] = found
        return found

    def _through_star(self, head: str) -> Optional[str]:
        """What a name not bound here means when star imports may have brought it: the import it
        is in a project module imported with `*` (`from common import *` where common.py does
        `import torch.distributed as dist`), else a name of the torch module imported with `*`."""
        if not self._built or head in _BUILTINS:
            return None  # known only once every local binding is; builtins are never star-imported
        if head in self._assignments_by_target or any(f.name == head and f.parent is None for f in self.functions):
            return None
        if self._star_table is None:
            self._star_table = {}
            for module, level in self.star_imports:
                path = self.project.resolve(Path(self.path), module, level) if self.project is not None else None
                if path is not None:
                    project = self.project
                    assert project is not None
                    table = _star_exports(project, path, 0)
                    self._star_table.update(table)
                elif level == 0 and module is not None and (module == "torch" or module.startswith("torch.")):
                    self._star_fallback = module
        target = self._star_table.get(head)
        if target is None and self._star_fallback is not None:
            return f"{self._star_fallback}.{head}"
        return target

    def spelling(self, qualified: str) -> Optional[str]:
        """How code anywhere in this module can write the import-resolved name `qualified`: through a
        top-level import (`hvd.size` for horovod.torch.size under `import horovod.torch as hvd`), the
        shortest such spelling whose head nothing here rebinds; None when no top-level import reaches
        it. For fixes that insert a call: an import inside a function or a branch is not in scope
        everywhere."""
        spellings: dict[str, Optional[str]] = self._index("spellings", dict)  # asked once per fix
        if qualified not in spellings:
            spellings[qualified] = self._spelling(qualified)
        return spellings[qualified]

    def _spelling(self, qualified: str) -> Optional[str]:
        if self._top_imports is None:
            self._top_imports = _import_table(self.module)
        best: Optional[str] = None
        for local, target in self._top_imports.items():
            if qualified == target:
                candidate = local
            elif qualified.startswith(target + "."):
                candidate = local + qualified[len(target):]
            else:
                continue
            if local in self._assignments_by_target or self.functions_named(local):
                continue
            if canonical(self.qualify(cst.parse_expression(candidate)) or "") != canonical(qualified):
                continue
            if best is None or len(candidate) < len(best):
                best = candidate
        return best

    def uses_module(self, prefix: str) -> bool:
        return any(v == prefix or v.startswith(prefix + ".") for v in self.imports.values()) or any(
            m == prefix or m.startswith(prefix + ".") for m in self.imported_modules
        )

    # ---- calls

    def call_of(self, node: cst.CSTNode) -> Optional[Call]:
        return self._call_by_node.get(id(node))

    def calls_named(self, *names: str) -> list[Call]:
        """Calls whose callee resolves to one of the qualified names (canonical spellings)."""
        index: dict[Optional[str], list[Call]] = self._index("calls by name", lambda: _grouped(self.calls, lambda c: c.name))
        wanted: set[Optional[str]] = {canonical(n) for n in names}
        return _in_order(index, wanted)

    def method_calls(self, *attrs: str) -> list[Call]:
        """Calls `<anything>.attr(...)` — for methods on values whose type we cannot name."""
        index = self._index(
            "calls by method",
            lambda: _grouped(
                (c for c in self.calls if isinstance(c.node.func, cst.Attribute)),
                lambda c: c.node.func.attr.value,  # type: ignore[attr-defined]
            ),
        )
        return _in_order(index, set(attrs))

    def scope_calls(self, function: Optional[Function]) -> list[Call]:
        """The calls that `function`'s own body makes (the module's top level and class bodies for
        None), in source order; not those of functions defined inside it."""
        if function is not None:
            return function.calls
        return self._index("module calls", lambda: [c for c in self.calls if c.function is None])

    def calls_in_statement(self, statement: cst.CSTNode) -> list[Call]:
        """The calls made in one statement (a `Call.statement`), in source order."""
        index = self._index("calls by statement", lambda: _grouped(self.calls, lambda c: id(c.statement)))
        return index.get(id(statement), [])

    def loops_in(self, function: Optional[Function]) -> list[Loop]:
        """The loops of `function`'s own body (the module's top level for None), in `loops`' order."""
        index = self._index("loops by function", lambda: _grouped(self.loops, lambda loop: id(loop.function)))
        return index.get(id(function), [])

    def assignments_of(self, value: cst.CSTNode) -> list[Assignment]:
        """The assignments whose value is this very node (`sampler = DistributedSampler(ds)` for
        the call's node), in source order."""
        index = self._index(
            "assignments by value",
            lambda: _grouped((a for a in self.assignments if a.value is not None), lambda a: id(a.value)),
        )
        return index.get(id(value), [])

    def functions_named(self, name: str) -> list[Function]:
        return list(self._index("functions by name", lambda: _grouped(self.functions, lambda f: f.name)).get(name, ()))

    def call_sites(self, function: Function) -> list[Call]:
        """Calls in this module that invoke `function`: `f(...)`, `self.f(...)`, `cls.f(...)`,
        `Class.f(...)`, and `Class(...)` for `Class.__init__`."""
        if self._call_sites is None:
            self._call_sites = {}
            by_name: dict[str, list[Function]] = {}
            constructors: dict[str, list[Function]] = {}
            for fn in self.functions:
                by_name.setdefault(fn.name, []).append(fn)
                if fn.name == "__init__" and fn.klass is not None:
                    constructors.setdefault(fn.klass, []).append(fn)
            for call in self.calls:
                func = call.node.func
                if isinstance(func, cst.Name):
                    plain = [fn for fn in by_name.get(func.value, ()) if fn.klass is None]
                    for fn in plain:
                        if not self._shadowed(fn, plain, call):
                            self._call_sites.setdefault(id(fn), []).append(call)
                    for fn in constructors.get(func.value, ()):
                        self._call_sites.setdefault(id(fn), []).append(call)
                elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
                    owner = func.value.value
                    for fn in by_name.get(func.attr.value, ()):
                        if fn.klass is not None and (owner in ("self", "cls", fn.klass)):
                            if owner in ("self", "cls") and call.ctx.klass not in (None, fn.klass):
                                continue
                            self._call_sites.setdefault(id(fn), []).append(call)
        return self._call_sites.get(id(function), [])

    def _shadowed(self, fn: Function, namesakes: list[Function], call: Call) -> bool:
        """`call` cannot reach `fn`: a call running in `fn`'s own scope before the def reaches an
        earlier namesake; and `fn` is rebound when another `def` of the same name in the same scope,
        at the top level of that scope's body (not under an if, try, loop or with, where it might
        not run), comes after it, and before the call when the call runs in that scope in source
        order. A call from a function nested below that scope runs once the scope's body has
        finished, so any later such def wins."""
        if call.function is fn.parent and call.order < fn.order:
            # Not defined yet when the call runs: an earlier namesake is the one called.
            return any(g.parent is fn.parent and g.order < call.order for g in namesakes)
        rivals = [g for g in namesakes if g is not fn and g.parent is fn.parent and g.order > fn.order]
        rivals = [g for g in rivals if self._top_level_def(g)]
        if not rivals:
            return False
        if call.function is fn.parent:
            return any(g.order < call.order for g in rivals)
        scope = call.function
        while scope is not None and scope is not fn.parent:
            scope = scope.parent
        return scope is fn.parent

    def _top_level_def(self, fn: Function) -> bool:
        """The `def` is a statement of its scope's own body (the module's, or its function's)."""
        if fn.parent is None:
            body: Sequence[cst.CSTNode] = self.module.body
        else:
            outer = fn.parent.node
            if not isinstance(outer, cst.FunctionDef) or not isinstance(outer.body, cst.IndentedBlock):
                return False
            body = outer.body.body
        return any(statement is fn.node for statement in body)

    def callers(self, function: Function) -> list[Call]:
        """Every call in this module that may invoke `function`: `call_sites`, plus `trainer.fit()`
        where `trainer = Trainer(...)` was built here (a method called through an instance)."""
        sites = list(self.call_sites(function))
        if function.klass is None:
            return sites
        return sites + self._instance_calls(function.name).get(function.klass, [])

    def _instance_calls(self, method: str) -> dict[str, list[Call]]:
        """`trainer.<method>()` by the class whose instance `trainer` may hold because the module
        built it (`Trainer(...)`), for the classes that define `method`: each receiver is followed
        once per method name, not once per class that defines it."""
        by_name: dict[str, dict[str, list[Call]]] = self._index("instance calls", dict)
        if method in by_name:
            return by_name[method]
        classes = {fn.klass for fn in self.functions_named(method) if fn.klass is not None}
        index: dict[str, list[Call]] = {}
        for call in self.method_calls(method):
            receiver = call.receiver
            written = dotted_name(receiver) if receiver is not None else None
            if receiver is None or written in ("self", "cls"):
                continue
            built = {origin.dotted for origin in self.origin_calls(receiver, call.order, call.function)}
            for klass in sorted(k for k in classes if k != written and k in built):
                index.setdefault(klass, []).append(call)
        by_name[method] = index
        return index

    # ---- assignments and values

    def _add_assignment(self, assignment: Assignment) -> None:
        self.assignments.append(assignment)
        self._assignments_by_target.setdefault(assignment.target, []).append(assignment)

    def _scoped_assignments(
        self, target: str, function: Optional[Function], before: Optional[int] = None
    ) -> list[Assignment]:
        """The assignments to `target` made in `function`'s own body (the module's for None); with
        `before`, only those numbered below it."""
        def build() -> dict[tuple[str, int], tuple[list[Assignment], list[int]]]:
            # Numbered as they are added, so each scope's list is in source order (bisected below).
            index: dict[tuple[str, int], tuple[list[Assignment], list[int]]] = {}
            for a in self.assignments:
                scoped = index.setdefault((a.target, id(a.function)), ([], []))
                scoped[0].append(a)
                scoped[1].append(a.order)
            return index

        assignments, orders = self._index("assignments by scope", build).get((target, id(function)), ([], []))
        return assignments if before is None else assignments[: bisect.bisect_left(orders, before)]

    def _class_assignments(self, target: str, klass: Optional[str]) -> list[Assignment]:
        """The assignments to a `self.`/`cls.` attribute made in class `klass` (its body, or a
        method or a function nested in one), in source order."""
        def build() -> dict[tuple[str, Optional[str]], list[Assignment]]:
            index: dict[tuple[str, Optional[str]], list[Assignment]] = {}
            for a in self.assignments:
                if a.target.startswith(("self.", "cls.")):
                    for owner in dict.fromkeys((a.ctx.klass, _class_of(a))):
                        index.setdefault((a.target, owner), []).append(a)
            return index

        return self._index("assignments by class", build).get((target, klass), [])

    def _global_rebinds(self, target: str) -> list[Assignment]:
        """The assignments to `target` in functions that declare it `global`, in source order."""
        index = self._index(
            "global rebinds", lambda: _grouped((a for a in self.assignments if _binds_global(a)), lambda a: a.target)
        )
        return index.get(target, [])

    def assignments_to(self, target: str) -> list[Assignment]:
        return self._assignments_by_target.get(target, [])

    def reaching_assignments(self, target: str, order: int, function: Optional[Function]) -> list[Assignment]:
        """The assignments to `target` that the value at `order` (inside `function`) may come from.

        The last one before `order` in the same function (all of them when it sits in a branch,
        since the other branch may be the one that ran); then the enclosing function and the module
        for globals/closures, where a function that rebinds the global through `global x` adds its
        assignments (it may have run); for `self.x`, assignments in any method of the same class.
        """
        candidates = self.assignments_to(target)
        if not candidates:
            return []
        if target.startswith(("self.", "cls.")):
            klass = function.klass if function is not None else None
            parent = function.parent if function is not None else None
            while klass is None and parent is not None:
                klass, parent = parent.klass, parent.parent
            in_class = self._class_assignments(target, klass)
            # Earlier in the same method, source order decides; otherwise any other method may
            # have run first (we do not know the call order of methods).
            before = [a for a in in_class if a.function is function and a.order < order]
            if before:
                return _last_reaching(before)
            return [a for a in in_class if a.function is not function]
        scope: Optional[Function] = function
        if function is not None and target in function.global_names:
            # `global x` here: this body's own earlier rebinding decides, else the module's variable.
            own = self._scoped_assignments(target, function, before=order)
            if own:
                return _last_reaching(own)
            scope = None
        while True:
            # A body that declares the name `global` rebinds the module's variable: no local there.
            declared_global = scope is not None and target in scope.global_names
            local = [] if declared_global else self._scoped_assignments(target, scope)
            if scope is not function:
                before = local  # enclosing scope: any assignment may be the one seen at call time
            else:
                before = [] if declared_global else self._scoped_assignments(target, scope, before=order)
            if scope is None:
                # A function that rebinds the module's variable through `global` (a setter such as
                # `set_device_index(i)`) may have run before this read: its values reach here too,
                # beside the module's own (the setter may also never have run).
                rebound = list(self._global_rebinds(target))
                return (_last_reaching(before) if before else []) + rebound
            if before:
                return _last_reaching(before)
            if local:
                return []  # a local that is used before it is assigned: unknowable
            scope = scope.parent

    def reaching_values(self, expr: Expr, order: int, function: Optional[Function]) -> list[Expr]:
        """One level of value-following: what a variable expression may hold at `order`."""
        name = dotted_name(expr)
        if name is None:
            return [expr]
        assignments = self.reaching_assignments(name, order, function)
        out: list[Expr] = []
        for assignment in assignments:
            if assignment.value is not None:
                out.append(assignment.value)
            if assignment.kind == "param" and assignment.function is not None:
                out.extend(self.argument_values(assignment.function, name))
        return out

    def unpacked_from(self, expr: Expr, order: int, function: Optional[Function]) -> list[tuple[Call, int]]:
        """`rank, world = setup()`: for `rank`, [(the setup() call, 0)] when every assignment that
        reaches here unpacks a call; else []."""
        name = dotted_name(expr)
        if name is None:
            return []
        out: list[tuple[Call, int]] = []
        for assignment in self.reaching_assignments(name, order, function):
            if assignment.unpacked is None:
                return []
            source, index = assignment.unpacked
            call = self.call_of(source)
            if call is None:
                return []
            out.append((call, index))
        return out

    def unpacked_returns(self, expr: Expr, order: int, function: Optional[Function]) -> list[tuple[Expr, int, Function]]:
        """`_, loader = build(...)` where `build` is this module's function ending in `return ds, loader`:
        for `loader`, the element each such return puts at its position, with where it is evaluated
        (the helper's end). A return that is not a tuple (or list) of the unpacked length, or holds a
        starred element, says nothing and is skipped; another module's helper is not followed (its
        expressions belong to its own model)."""
        name = dotted_name(expr)
        if name is None:
            return []
        out: list[tuple[Expr, int, Function]] = []
        for assignment in self.reaching_assignments(name, order, function):
            if assignment.unpacked is None or not isinstance(assignment.node, cst.Assign):
                continue
            source, index = assignment.unpacked
            call = self.call_of(source)
            width = _unpacked_width(assignment.node)
            if call is None or width is None:
                continue
            for helper in self.resolve_local_function(call):
                for returned, at, inside in self.return_sites(helper):
                    if not isinstance(returned, (cst.Tuple, cst.List)) or len(returned.elements) != width:
                        continue
                    if any(isinstance(element, cst.StarredElement) for element in returned.elements):
                        continue
                    out.append((returned.elements[index].value, at, inside))
        return out

    def returned_functions(self, call: Call) -> list[tuple["ModuleModel", Function]]:
        """The functions whose `return`s a call's value comes from: this module's own, or another
        project module's."""
        local = [(self, fn) for fn in self.resolve_local_function(call)]
        if local:
            return local
        linked = self.linked_function(call)
        return [linked] if linked is not None else []

    def argument_at(self, site: Call, function: Function, param: str) -> Optional[Expr]:
        """What `site` (a call of `function`) passes for `param`: the argument written there, else the
        parameter's default when the call omits it. None when unknowable (`*args` / `**kwargs` at the
        site, no such parameter, no default)."""
        if param not in function.params:
            return None
        index = self._param_index(function, param)
        value = site.arg(position=index if index >= 0 else None, keyword=param)
        if value is not None:
            return value
        if site.has_star_args() or not isinstance(function.node, cst.FunctionDef):
            return None
        parameters = function.node.params
        for parameter in (*parameters.posonly_params, *parameters.params, *parameters.kwonly_params):
            if parameter.name.value == param:
                return parameter.default
        return None

    def argument_values(self, function: Function, param: str) -> list[Expr]:
        """The expressions passed for `param` at this module's call sites of `function`."""
        return [value for value, _ in self._argument_sites(function, param)]

    def memoized(self, key: tuple[object, ...], compute: "Callable[[], T]", unknown: "T") -> "T":
        """Run a value-following query once per key. A query that re-enters itself (a cycle) or
        runs past the module's step budget answers `unknown`, which makes the rules stay silent."""
        memo = self._memo
        if key in memo:
            value = memo[key]
            return unknown if value is _IN_PROGRESS else value  # type: ignore[return-value]
        self._steps += 1
        if self._steps > STEP_BUDGET:
            return unknown
        memo[key] = _IN_PROGRESS
        try:
            result = compute()
        except RecursionError:
            result = unknown
        memo[key] = result
        return result

    @staticmethod
    def return_sites(helper: Function) -> list[tuple[Expr, int, Function]]:
        """What a function returns, each with the point it is evaluated at (the function's end),
        for following a value out of a helper without re-deriving where its body stops."""
        return [(returned, helper.end_order, helper) for returned in helper.returns]

    def origin_calls(self, expr: Optional[Expr], order: int, function: Optional[Function], depth: int = 0) -> list[Call]:
        """The calls that may have produced the value of `expr`, following variables, helpers,
        conditional expressions and pass-through methods such as `.cuda()` and `.to(device)`."""
        if expr is None or depth > MAX_DEPTH:
            return []
        key = ("origin", id(expr), order, id(function))
        empty: list[Call] = []
        return list(self.memoized(key, lambda: self._origin_calls(expr, order, function, depth), empty))

    def _origin_calls(self, expr: Optional[Expr], order: int, function: Optional[Function], depth: int = 0) -> list[Call]:
        """The calls that may have produced the value of `expr`, following variables, helpers,
        conditional expressions and pass-through methods such as `.cuda()` and `.to(device)`."""
        if expr is None or depth > MAX_DEPTH:
            return []
        if isinstance(expr, cst.IfExp):
            return self.origin_calls(expr.body, order, function, depth + 1) + self.origin_calls(
                expr.orelse, order, function, depth + 1
            )
        if isinstance(expr, cst.BooleanOperation):
            return self.origin_calls(expr.left, order, function, depth + 1) + self.origin_calls(
                expr.right, order, function, depth + 1
            )
        if isinstance(expr, cst.Call):
            call = self.call_of(expr)
            if call is None:
                return []
            out = [call]
            if call.attr in PASS_THROUGH_METHODS and call.receiver is not None:
                out.extend(self.origin_calls(call.receiver, call.order, call.function, depth + 1))
            for helper in self.resolve_local_function(call):
                for returned, at, inside in self.return_sites(helper):
                    out.extend(self.origin_calls(returned, at, inside, depth + 1))
            return out
        if dotted_name(expr) is not None:
            out = []
            for value in self.reaching_values(expr, order, function):
                if value is expr:
                    continue
                node_order, node_function = self._where(value, order, function)
                out.extend(self.origin_calls(value, node_order, node_function, depth + 1))
            # `_, loader = build(...)`: the loader is whatever build's tuple returns hold there.
            for element, at, inside in self.unpacked_returns(expr, order, function):
                out.extend(self.origin_calls(element, at, inside, depth + 1))
            return out
        return []

    def _where(self, value: Expr, order: int, function: Optional[Function]) -> tuple[int, Optional[Function]]:
        """The order and function in which an assigned value was evaluated."""
        if self._value_sites is None:
            self._value_sites = {}
            for assignment in self.assignments:
                if assignment.value is not None:
                    self._value_sites.setdefault(id(assignment.value), (assignment.order, assignment.function))
            for fn in self.functions:
                for returned in fn.returns:
                    self._value_sites.setdefault(id(returned), (fn.end_order, fn))
            # Arguments at call sites (what `argument_values` hands back for a parameter) are
            # evaluated in the caller: without this, `train(train_loader)` would resolve
            # `train_loader` inside `train` itself, i.e. back to the parameter.
            for call in self.calls:
                for arg in call.node.args:
                    self._value_sites.setdefault(id(arg.value), (call.order, call.function))
        site = self._value_sites.get(id(value))
        if site is not None:
            return site
        evaluated = self.call_of(value)
        if evaluated is not None:
            return evaluated.order, evaluated.function
        return order, function

    def leaf_values(
        self, expr: Optional[Expr], order: int, function: Optional[Function], depth: int = 0
    ) -> list[tuple[Expr, int, Optional[Function]]]:
        """Every expression a value may finally be, each with the order and function it is evaluated
        in (`routes` without the paths)."""
        return [(route.value, route.order, route.function) for route in self.routes(expr, order, function, depth)]

    def routes(self, expr: Optional[Expr], order: int, function: Optional[Function], depth: int = 0) -> list[Route]:
        """Every expression a value may finally be, each with the path it takes to get here: the
        assignments and call sites it passes through. A caller that knows which processes run each
        step (`ranks.route_runs`) can then drop values that only arrive on paths the sink never sees.

        Follows plain variables, `self.` attributes, parameters through this module's call sites,
        their defaults where some call site omits the argument, and both arms of `a if c else b`.
        For a function nothing in this module calls (an entry point, or a library function another
        module calls) a parameter is its default and, besides, the parameter itself: a caller we
        cannot see may pass anything. What cannot be followed further (a name never
        assigned here such as an argparse attribute, a parameter without call sites, an augmented
        assignment, tuple unpacking, a loop target) comes back as the expression itself, so a rule
        asking "is every value a literal?" gets "no" and stays silent."""
        if expr is None:
            return []
        key = ("routes", id(expr), order, id(function))
        fallback = [Route(expr, order, function, ())]
        return list(self.memoized(key, lambda: self._routes(expr, order, function, depth), fallback))

    def _routes(self, expr: Expr, order: int, function: Optional[Function], depth: int) -> list[Route]:
        here = [Route(expr, order, function, ())]
        if depth > MAX_DEPTH:
            return here
        if isinstance(expr, cst.IfExp):
            return self.routes(expr.body, order, function, depth + 1) + self.routes(
                expr.orelse, order, function, depth + 1
            )
        name = dotted_name(expr)
        if name is None:
            return here
        assignments = self.reaching_assignments(name, order, function)
        if not assignments:
            return here
        out: list[Route] = []
        for assignment in assignments:
            if assignment.kind == "param" and assignment.function is not None:
                sources = self._argument_sites(assignment.function, name)
                if assignment.value is not None and self._default_used(assignment.function, name):
                    # The default, evaluated where the def runs.
                    out.extend(self.routes(assignment.value, assignment.order, assignment.function.parent, depth + 1))
                    if not self.call_sites(assignment.function):
                        # Nothing here calls it: another module (or a launcher) may well pass the
                        # argument, so the default is one value among unknown others.
                        out.extend(here)
                elif not sources:
                    out.extend(here)
                for value, site in sources:
                    out.extend(route.through(site) for route in self.routes(value, site.order, site.function, depth + 1))
            elif assignment.kind in ("assign", "annassign") and assignment.value is not None:
                out.extend(
                    route.through(assignment)
                    for route in self.routes(assignment.value, assignment.order, assignment.function, depth + 1)
                )
            else:
                out.extend(here)
        unique = list({route.key(): route for route in out}.values())
        # Paths multiply through helpers with many call sites; past a bound the value counts as not
        # followed (the expression itself), which keeps the rules silent rather than slow.
        return unique if len(unique) <= MAX_ROUTES else here

    def _default_used(self, function: Function, param: str) -> bool:
        """True when some call site in this module omits `param` (without `*args`/`**kwargs` that
        may carry it), or nothing here calls the function (an entry point, a callback)."""
        sites = self.call_sites(function)
        if not sites:
            return True
        index = self._param_index(function, param)
        return any(
            site.arg(position=index if index >= 0 else None, keyword=param) is None and not site.has_star_args()
            for site in sites
        )

    def _param_index(self, function: Function, param: str) -> int:
        index = function.params.index(param)
        if function.klass is not None and function.params and function.params[0] in ("self", "cls"):
            index -= 1
        return index

    def _argument_sites(self, function: Function, param: str) -> list[tuple[Expr, Call]]:
        """The expressions passed for `param` at this module's call sites of `function`, with the site."""
        if param not in function.params:
            return []
        index = self._param_index(function, param)
        out: list[tuple[Expr, Call]] = []
        for site in self.call_sites(function):
            value = site.arg(position=index if index >= 0 else None, keyword=param)
            if value is not None:
                out.append((value, site))
        return out

    def name_bound_to(self, call: Call) -> Optional[str]:
        """The variable a call's value is assigned to directly (`sampler = DistributedSampler(ds)`)."""
        bound = self.assignments_of(call.node)
        return bound[0].target if bound else None

    def loader_samplers(self, loader: Call) -> list[Call]:
        """The calls a `DataLoader(...)` may draw its order from: what its `sampler=` comes from,
        and the `sampler` inside a `batch_sampler=BatchSampler(sampler, ...)`."""
        out = self.origin_calls(loader.arg(3, "sampler"), loader.order, loader.function)
        for origin in self.origin_calls(loader.arg(4, "batch_sampler"), loader.order, loader.function):
            if origin.name == "torch.utils.data.BatchSampler":
                out = out + self.origin_calls(origin.arg(0, "sampler"), origin.order, origin.function)
        return out

    def unwrapped_at_construction(self, *names: str) -> list[tuple[Assignment, Call]]:
        """Assignments that keep only the inner module of a wrapper built on the same line:
        `model = DistributedDataParallel(model, ...).module`. The wrapper object itself is dropped,
        so nothing can ever call it. Each with the wrapper's call; `names` are its qualified names."""
        out: list[tuple[Assignment, Call]] = []
        for assignment in self.assignments:
            value = assignment.value
            if not isinstance(value, cst.Attribute) or value.attr.value != "module":
                continue
            inner = value.value
            wrap = self.call_of(inner) if isinstance(inner, cst.Call) else None
            if wrap is not None and wrap.name in names:
                out.append((assignment, wrap))
        return out

    def resolve_local_function(self, call: Call) -> list[Function]:
        """The module's own functions a call may invoke (`helper()`, `self.helper()`)."""
        if self._callees is None:
            self._callees = {}
            for fn in self.functions:
                for site in self.call_sites(fn):
                    self._callees.setdefault(id(site), []).append(fn)
        return self._callees.get(id(call), [])

    def origin_names(self, expr: Optional[Expr], order: int, function: Optional[Function]) -> set[str]:
        """Qualified names of the calls a value may come from, e.g. {"torch.utils.data.DistributedSampler"}."""
        return {c.name for c in self.origin_calls(expr, order, function) if c.name}

    def const_value(self, expr: Optional[Expr], order: int, function: Optional[Function], depth: int = 0) -> object:
        if expr is None or depth > MAX_DEPTH:
            return UNKNOWN
        key = ("const", id(expr), order, id(function))
        return self.memoized(key, lambda: self._const_value(expr, order, function, depth), UNKNOWN)

    def _const_value(self, expr: Optional[Expr], order: int, function: Optional[Function], depth: int = 0) -> object:
        """A literal value (int, float, str, bool, None) through variables and argparse defaults,
        or `UNKNOWN` when it cannot be decided. Rules stay silent on UNKNOWN."""
        if expr is None or depth > MAX_DEPTH:
            return UNKNOWN
        if isinstance(expr, cst.Integer):
            return int(expr.evaluated_value)
        if isinstance(expr, cst.Float):
            return float(expr.evaluated_value)
        if isinstance(expr, cst.SimpleString):
            return expr.evaluated_value
        if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[expr.value]
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            inner = self.const_value(expr.expression, order, function, depth + 1)
            return -inner if isinstance(inner, (int, float)) and not isinstance(inner, bool) else UNKNOWN
        if isinstance(expr, cst.BinaryOperation):
            left = self.const_value(expr.left, order, function, depth + 1)
            right = self.const_value(expr.right, order, function, depth + 1)
            if isinstance(left, int) and isinstance(right, int) and not isinstance(left, bool):
                op = type(expr.operator).__name__
                try:
                    return {
                        "Add": lambda: left + right, "Subtract": lambda: left - right,
                        "Multiply": lambda: left * right, "FloorDivide": lambda: left // right,
                    }[op]()
                except (KeyError, ZeroDivisionError):
                    return UNKNOWN
            return UNKNOWN
        name = dotted_name(expr)
        if name is None:
            return UNKNOWN
        values = self.reaching_values(expr, order, function)
        if not values and "." in name:
            default = self.argparse_default(name)
            if default is not None:
                return self.const_value(default, 0, None, depth + 1)
        results = set()
        for value in values:
            if value is expr:
                return UNKNOWN
            v_order, v_function = self._where(value, order, function)
            result = self.const_value(value, v_order, v_function, depth + 1)
            if result is UNKNOWN:
                return UNKNOWN
            results.add(result)
        if len(results) == 1:
            return results.pop()
        return UNKNOWN

    def argparse_default(self, dotted: str) -> Optional[Expr]:
        """`args.batch_size` -> the `default=` of `parser.add_argument("--batch-size", ...)`."""
        owner, _, attr = dotted.rpartition(".")
        if not owner or "." in owner:
            return None
        if self._argparse is None:
            self._argparse = self._collect_argparse_defaults()
        defaults = self._argparse.get(attr, [])
        # Two arguments with the same dest, or none: undecidable.
        return defaults[0] if len(defaults) == 1 else None

    def _collect_argparse_defaults(self) -> dict[str, list[Expr]]:
        table: dict[str, list[Expr]] = {}
        for call in self.method_calls("add_argument"):
            dest: Optional[str] = None
            explicit = call.arg(keyword="dest")
            if isinstance(explicit, cst.SimpleString):
                dest = str(explicit.evaluated_value)
            else:
                for arg in call.args:
                    if arg.keyword is None and isinstance(arg.value, cst.SimpleString):
                        flag = str(arg.value.evaluated_value)
                        if flag.startswith("--"):
                            dest = flag[2:].replace("-", "_")
                            break
                        if not flag.startswith("-"):
                            dest = flag
            if dest is not None:
                default = call.arg(keyword="default")
                if default is None:
                    # argparse's own defaults: False for store_true, True for store_false, else None.
                    action = call.arg(keyword="action")
                    action_name = action.evaluated_value if isinstance(action, cst.SimpleString) else None
                    default = cst.Name(
                        {"store_true": "False", "store_false": "True"}.get(str(action_name), "None")
                    )
                table.setdefault(dest, []).append(default)
        return table

    # ---- loops: what they iterate, what runs inside them

    def iterated_exprs(self, expr: Optional[Expr]) -> list[Expr]:
        """What a for-loop really iterates: `enumerate(loader)`, `tqdm(loader, ...)`, `iter(loader)`
        and `islice(loader, n)` -> [loader]; `zip(a, b)` -> [a, b]; anything else -> [expr]."""
        if expr is None:
            return []
        if isinstance(expr, cst.Call):
            name = self.qualify(expr.func) or dotted_name(expr.func) or ""
            last = name.rsplit(".", 1)[-1]
            if last in ITERATION_WRAPPERS and expr.args:
                if last == "zip":
                    return [e for arg in expr.args if not arg.star for e in self.iterated_exprs(arg.value)]
                first = expr.args[0]
                if first.keyword is None and not first.star:
                    return self.iterated_exprs(first.value)
        return [expr]

    def loop_items(self, loop: Loop) -> list[tuple[str, Expr]]:
        """The names a for-loop binds to the items it draws, each with the expression whose items
        they are: `for i, (x, y) in enumerate(loader)` -> [("x", loader), ("y", loader)] (the
        counter `i` is no item: it is the same on every process); `for a, b in zip(p, q)` -> a from
        p, b from q; `for batch in tqdm(loader)` -> batch from loader."""
        if not isinstance(loop.node, cst.For):
            return []
        return [(name, source) for name, source in self._items(loop.node.target, loop.node.iter)]

    def _items(self, target: cst.BaseExpression, iterable: Expr) -> list[tuple[str, Expr]]:
        if isinstance(iterable, cst.Call) and iterable.args:
            last = (self.qualify(iterable.func) or dotted_name(iterable.func) or "").rsplit(".", 1)[-1]
            args = [a for a in iterable.args if a.keyword is None and not a.star]
            elements = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else None
            if last == "enumerate" and args:
                # The pair (counter, item): only its second half is an item.
                return self._items(elements[1], args[0].value) if elements is not None and len(elements) == 2 else []
            if last == "zip":
                if elements is None or len(elements) != len(args) or len(args) != len(iterable.args):
                    return []
                return [item for element, arg in zip(elements, args) for item in self._items(element, arg.value)]
            if last in ITERATION_WRAPPERS and args and iterable.args[0] is args[0]:
                return self._items(target, args[0].value)
        return [(name, iterable) for name in _bound_names(target)]

    def loop_sources(self, loop: Loop) -> list[Call]:
        """The calls that may have produced what a loop draws from (see `loop_draws`)."""
        return [source for source, _ in self.loop_draws(loop)]

    def loop_draws(self, loop: Loop) -> list[tuple[Call, cst.CSTNode]]:
        """The calls that may have produced what a loop draws its items from, each with the node
        where the loop takes them: the for-loop's iterable, through `enumerate`/`tqdm`/`iter`,
        variables, `self.` attributes, helper returns and parameters (the `DataLoader(...)` behind
        `for i, (x, y) in enumerate(train_loader):`); `progress = tqdm(loader)` then
        `for x in progress:` (at the tqdm call); and `batches = iter(loader)` then `next(batches)`
        in the loop body (at the iter call)."""
        draws = self._index("loop draws", dict)
        if id(loop) not in draws:
            draws[id(loop)] = self._loop_draws(loop)
        return list(draws[id(loop)])

    def _loop_draws(self, loop: Loop) -> list[tuple[Call, cst.CSTNode]]:
        out: list[tuple[Call, cst.CSTNode]] = []
        if loop.iter is not None:
            for iterated in self.iterated_exprs(loop.iter):
                for origin in self.origin_calls(iterated, loop.order, loop.function):
                    out.append((origin, loop.iter))
                    out.extend((source, origin.node) for source in self._unwrapped(origin))
        nexts = self._index(
            "next() by loop",
            lambda: _grouped(
                (c for c in self.calls if c.dotted == "next" and c.name is None and c.loops and c.args),
                lambda c: id(c.loops[-1]),
            ),
        )
        for call in nexts.get(id(loop), ()):
            for origin in self.origin_calls(call.args[0].value, call.order, call.function):
                out.extend((source, origin.node) for source in self._unwrapped(origin))
        return out

    def loops_drawing(self, *sources: Call) -> list[Loop]:
        """The loops whose `loop_draws` include one of `sources`, in `loops`' order: a question
        asked per loader, answered from one pass over the module's loops."""
        def build() -> dict[int, list[tuple[int, Loop]]]:
            index: dict[int, list[tuple[int, Loop]]] = {}
            for position, loop in enumerate(self.loops):
                for drawn in {id(call): call for call, _ in self.loop_draws(loop)}:
                    index.setdefault(drawn, []).append((position, loop))
            return index

        index = self._index("loops drawing", build)
        found = {position: loop for source in sources for position, loop in index.get(id(source), ())}
        return [found[position] for position in sorted(found)]

    def drawn_from(self, expr: Expr, order: int, function: Optional[Function]) -> list[Call]:
        """The calls that a loop over `expr`, or `next(expr)`, may draw from: where its value comes
        from and, through `iter(...)`/`tqdm(...)`/`enumerate(...)`, what those wrap
        (`batches = iter(loader)` -> the iter call and the `DataLoader(...)`)."""
        out: list[Call] = []
        for iterated in self.iterated_exprs(expr):
            for origin in self.origin_calls(iterated, order, function):
                out.append(origin)
                out.extend(self._unwrapped(origin))
        return out

    def _unwrapped(self, wrapper: Call, depth: int = 0) -> list[Call]:
        """What `iter(x)` / `tqdm(x)` / `enumerate(x)` draws from: the calls behind `x`."""
        name = wrapper.name or wrapper.dotted or ""
        if name.rsplit(".", 1)[-1] not in ITERATION_WRAPPERS or depth > MAX_DEPTH:
            return []
        first = wrapper.arg(0)
        if first is None:
            return []
        out: list[Call] = []
        for origin in self.origin_calls(first, wrapper.order, wrapper.function):
            out.append(origin)
            out.extend(self._unwrapped(origin, depth + 1))
        return out

    def runs_at_most_once(self, loop: Loop) -> bool:
        """A `for` over `range(1)` / `range(0, 1)` (literal bounds only: `range(args.epochs)` with
        an argparse default of 1 is set on the command line): its body never runs a second time."""
        it = loop.iter
        if not isinstance(loop.node, cst.For) or not isinstance(it, cst.Call) or (self.qualify(it.func) or dotted_name(it.func)) != "range":
            return False
        bounds = [literal_int(arg.value) for arg in it.args]
        if not bounds or len(bounds) > 2 or any(b is None or arg.keyword or arg.star for b, arg in zip(bounds, it.args)):
            return False
        start, stop = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
        assert start is not None and stop is not None
        return stop - start <= 1

    def enclosing_loops(self, loop: Loop) -> list[Loop]:
        """The loops of the same function that contain `loop`, innermost first."""
        index: dict[int, tuple[Loop, ...]] = self._index("enclosing loops", dict)
        if id(loop) not in index:
            # One sweep over the function's loops in source order: their spans nest or are apart,
            # so the loops still open at a loop's start are exactly those around it.
            open_loops: list[Loop] = []
            for other in sorted(self.loops_in(loop.function), key=lambda each: each.order):
                while open_loops and not contains(open_loops[-1], other.order):
                    open_loops.pop()
                index[id(other)] = tuple(reversed(open_loops))
                open_loops.append(other)
        return list(index.get(id(loop), ()))

    def calls_within(self, loop: Union[Loop, Function], depth: int = 3) -> list[Call]:
        """Every call that runs while `loop` runs (or, for a function, while it runs): the calls in
        its body, plus, `depth` levels deep, the calls in this module's functions called from there
        (`train_one_epoch(epoch)`)."""
        seen: set[int] = set()
        out: list[Call] = []
        if isinstance(loop, Function):
            frontier = list(loop.calls)
        else:
            frontier = self.calls_inside(loop)
        for _ in range(depth + 1):
            next_frontier: list[Call] = []
            for call in frontier:
                if id(call) in seen:
                    continue
                seen.add(id(call))
                out.append(call)
                for helper in self.resolve_local_function(call):
                    next_frontier.extend(helper.calls)
            frontier = next_frontier
        return out

    def calls_inside(self, span: Union[Loop, Function], until: Optional[int] = None) -> list[Call]:
        """The calls made in a loop's body (by its own function, not by functions defined in it),
        or in a function's own body, in source order; with `until`, only those numbered below it."""
        function = span if isinstance(span, Function) else span.function
        end = span.end_order if until is None else min(span.end_order, until)
        return self._calls_between(function, span.order, end)

    def calls_of_within(self, function: Optional[Function], span: Union[Loop, Function]) -> list[Call]:
        """The calls `function`'s own body makes inside `span` (a loop, or a function), in source order:
        bisected when the span is in that body, else that body's calls filtered. Asked per backward, per
        exit or per loop, so it must not scan the module each time."""
        own = span if isinstance(span, Function) else span.function
        if own is function:
            return self.calls_inside(span)
        return [c for c in self.scope_calls(function) if contains(span, c.order)]

    def _calls_between(self, function: Optional[Function], start: int, end: int) -> list[Call]:
        """The calls of `function`'s own body numbered strictly between `start` and `end` (a loop's
        body), in source order; found by bisection, so asking per call site stays cheap."""
        calls = self.scope_calls(function)
        orders = self._index("scope call orders", dict)
        if id(function) not in orders:
            orders[id(function)] = [c.order for c in calls]
        numbers = orders[id(function)]
        return calls[bisect.bisect_right(numbers, start) : bisect.bisect_left(numbers, end)]

    def iteration(self, call: Call, depth: int = 3) -> Optional[Union[Loop, Function]]:
        """The body that one iteration of a loop runs `call` in: its innermost loop, or, when it is
        in no loop, its function if that is called from inside a loop (`self.train_step(batch)` in
        `for batch in loader:`): one call of the function is one iteration."""
        if call.loops:
            return call.loops[-1]
        function = call.function
        if function is not None and self._called_in_loop(function, depth):
            return function
        return None

    def _called_in_loop(self, function: Function, depth: int) -> bool:
        for site in self.callers(function):
            if site.function is function:
                continue
            if site.loops:
                return True
            if depth > 0 and site.function is not None and self._called_in_loop(site.function, depth - 1):
                return True
        return False

    # ---- the project's other modules

    def may_link(self, call: Call) -> bool:
        """A cheap first test for `linked_function`: the callee is written through a name this module
        imports from outside torch (`helper(...)`, `utils.helper(...)`), the only calls it can link.
        Reads no other module."""
        written = dotted_name(call.node.func)
        return self.project is not None and written is not None and (
            bool(self._import_candidates(written)) or self._may_come_from_star_import(written)
        )

    def _absolute_star_imports(self) -> bool:
        return any(not level and module is not None and not module.startswith("torch") for module, level in self.star_imports)

    def _may_come_from_star_import(self, written: str) -> bool:
        """A plain name this module neither defines, assigns nor imports by name, nor a builtin, in a
        module with an absolute star import (`from train_base import *` then `load_dicts(...)`). A
        library's relative star imports (`from .api import *`) are many and re-export its own API: not
        followed, as with re-exports."""
        return self._absolute_star_imports() and "." not in written and written not in self.imports and (
            written not in self._assignments_by_target and written not in _BUILTIN_NAMES
            and not any(f.name == written and f.parent is None for f in self.functions)
        )

    def linked_function(self, call: Call) -> Optional[tuple["ModuleModel", Function]]:
        """The function of another project module that `call` invokes, with that module's model:
        `save_checkpoint(...)` after `from utils.checkpoint import save_checkpoint` (or a relative
        import, or a `src/` layout), `data.start_epoch(...)` after `import data`. None without a
        project, for anything that is not a project module's top-level function, and for a module
        that cannot be read or parsed."""
        if self.project is None:
            return None
        key = ("linked", id(call))
        found = self.memoized(key, lambda: self._linked_function(call), None)
        return found

    def _linked_function(self, call: Call) -> Optional[tuple["ModuleModel", Function]]:
        written = dotted_name(call.node.func)
        if written is None:
            return None
        for other, name in self._imported_from(written):
            for function in other.functions:
                if function.name == name and function.parent is None and function.klass is None:
                    return other, function
        if self.project is not None and self._may_come_from_star_import(written):
            for module, level in self.star_imports:
                if level:
                    continue
                path = self.project.resolve(Path(self.path), module, level)
                star = self.project_model(path) if path is not None else None
                if star is None:
                    continue
                for function in star.functions:
                    if function.name == written and function.parent is None and function.klass is None:
                        return star, function
        return None

    def _imported_from(self, written: str) -> list[tuple["ModuleModel", str]]:
        """The project modules a name written here (`helper`, `utils.helper`) is imported from,
        each with the name it has there: `from .utils import helper`, `from pkg import utils` then
        `utils.helper`, `import pkg.utils as u` then `u.helper`. Empty without a project."""
        if self.project is None:
            return []
        out: list[tuple["ModuleModel", str]] = []
        for module, level, name in self._import_candidates(written):
            path = self.project.resolve(Path(self.path), module, level)
            other = self.project_model(path) if path is not None else None
            if other is not None:
                out.append((other, name))
        return out

    def _import_candidates(self, written: str) -> list[tuple[Optional[str], int, str]]:
        """Where the imports say a name written here comes from, before anything is resolved or read:
        (module, relative level, name there), for a name imported from outside torch."""
        head, _, rest = written.partition(".")
        candidates: list[tuple[Optional[str], int, str]] = []
        relative = self.relative_imports.get(head)
        if relative is not None:
            module, level, name = relative
            if not rest:
                candidates.append((module, level, name))
            elif "." not in rest:  # `from . import data` then `data.start_epoch()`
                candidates.append((f"{module}.{name}" if module else name, level, rest))
        else:
            qualified = self.imports.get(head)
            if qualified is not None and not qualified.startswith("torch"):
                full = f"{qualified}.{rest}" if rest else qualified
                module, _, name = full.rpartition(".")
                if module:
                    candidates.append((module, 0, name))
        return candidates

    def project_class(self, written: str, depth: int = 0) -> Optional[tuple["ModuleModel", str]]:
        """The project class a name written here means, with the model of the module that defines
        it: a top-level class of this module, else one imported from a project module, following
        re-exports (`from .dataset import *` in a package's `__init__.py`) a few modules deep."""
        if "." not in written and written in self.classes:
            return self, written
        if depth >= STAR_CHAIN_DEPTH or self.project is None:
            return None
        for other, name in self._imported_from(written):
            found = other.project_class(name, depth + 1)
            if found is not None:
                return found
        if "." in written or written in self._assignments_by_target or written in self.imports:
            return None
        for module, level in self.star_imports:
            path = self.project.resolve(Path(self.path), module, level)
            star = self.project_model(path) if path is not None else None
            found = star.project_class(written, depth + 1) if star is not None else None
            if found is not None:
                return found
        return None

    def class_methods(self, klass: str) -> list[Function]:
        """The methods a top-level class of this module defines in its own body."""
        return [f for f in self.functions if f.klass == klass and f.parent is None]

    def project_model(self, path: Path) -> Optional["ModuleModel"]:
        """The model of another project module, built once per run."""
        project = self.project
        if project is None:
            return None

        def build() -> Optional["ModuleModel"]:
            tree = project.parse(path)
            return None if tree is None else ModuleModel.build(tree, str(path), self.world_size, project)

        try:
            return project.memo(("model", path), build)
        except (MemoCycle, RecursionError):
            return None

    @property
    def shown_path(self) -> str:
        """The module's path as a message names it: relative to the working directory."""
        try:
            return os.path.relpath(self.path)
        except ValueError:  # another drive
            return self.path

    # ---- positions (lazy)

    def position(self, node: cst.CSTNode) -> CodeRange:
        if self._positions is None:
            self._positions = node_positions(self.module)
        return self._positions[node]

    def line_of(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line

    @property
    def source_lines(self) -> list[str]:
        """The module's lines (without line ends) as libcst counts them: CR LF, CR and LF each end
        one (str.splitlines would also split at form feeds). Generated once: a fix on
        every one of a file's N functions must not regenerate its code N times."""
        if self._source_lines is None:
            self._source_lines = re.split(r"\r\n|\r|\n", self.module.code)
        return self._source_lines

    def own_lines(self, call: Call) -> Optional[tuple[int, int, str]]:
        """(first line, last line, indentation) of the simple statement that holds `call`, when that
        statement starts its own line (not `if x: f()`, not after a `;` on the line, not a
        condition): where a fix can insert a statement just before or just after it."""
        statement = call.statement
        if not isinstance(statement, cst.SimpleStatementLine):
            return None
        position = self.position(statement)
        lines = self.source_lines
        if position.start.line > len(lines):
            return None
        indent = lines[position.start.line - 1][: position.start.column]
        if indent.strip():
            return None
        return position.start.line, position.end.line, indent

    def indentable_lines(self, call: Call) -> Optional[list[str]]:
        """The source lines (without line ends) of the simple statement that holds `call`, when it
        starts its own line and indenting every line keeps its meaning: no string literal spans
        lines inside it (indenting would change a triple-quoted string's text)."""
        lines = self.own_lines(call)
        if lines is None:
            return None
        first, last, _ = lines
        for node in walk(call.statement):
            if isinstance(node, (cst.SimpleString, cst.FormattedString)):
                position = self.position(node)
                if position.start.line != position.end.line:
                    return None
        return self.source_lines[first - 1 : last]

    def code_of(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)


# Whether one expression node (a call, a name, a subscript) is a value of the kind asked about.
NodeTest = Callable[[ModuleModel, cst.BaseExpression, int, Optional[Function]], bool]


def mentions(
    model: ModuleModel,
    expr: Optional[cst.CSTNode],
    order: int,
    function: Optional[Function],
    test: NodeTest,
    depth: int = 0,
) -> bool:
    """True when some part of an expression is a value `test` accepts, following variables, `self.`
    attributes and helper parameters (each value in its own scope): `f"{out}/ckpt_{me}.pt"` with
    `me = dist.get_rank()` mentions a rank."""
    if expr is None or depth > MAX_DEPTH:
        return False
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Call, cst.Subscript)) or (isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) is not None):
            assert isinstance(node, (cst.Call, cst.Subscript, cst.Name, cst.Attribute))
            if test(model, node, order, function):
                return True
            if isinstance(node, (cst.Name, cst.Attribute)):
                for value, v_order, v_function in model.leaf_values(node, order, function):
                    if value is not node and mentions(model, value, v_order, v_function, test, depth + 1):
                        return True
                continue
        stack.extend(child for child in node.children if not isinstance(child, cst.BaseParenthesizableWhitespace))
    return False


# How many re-export hops inside the project a name is followed through: `from x import *` (a package's
# `__init__.py` re-exporting its submodules with `*` is the usual one), and for a class also
# `from .x import Name`.
STAR_CHAIN_DEPTH = 3


def _star_exports(project: ProjectSources, path: Path, depth: int) -> dict[str, str]:
    """The imports `from <path's module> import *` brings: the module's own top-level imports and,
    as Python does, what its own star imports of project modules bring (`utils/transforms/__init__.py`
    doing `from .transforms import *`, where that module imports torch). Its own imports win."""

    def compute() -> dict[str, str]:
        tree = project.parse(path)
        if tree is None:
            return {}
        imports = _top_level_imports(tree)
        table = _public_imports(imports)
        if depth >= STAR_CHAIN_DEPTH:
            return table
        for module, level in imports.star_imports:
            inner = project.resolve(path, module, level)
            if inner is not None and inner != path:
                for name, target in _star_exports(project, inner, depth + 1).items():
                    table.setdefault(name, target)
        return table

    try:
        return project.memo(("star-exports", path), compute)
    except (MemoCycle, RecursionError):
        return {}


def _import_table(tree: Optional[cst.Module]) -> dict[str, str]:
    """The top-level imports of a module (local name -> qualified name): what `from it import *`
    hands on of them."""
    return _public_imports(_top_level_imports(tree)) if tree is not None else {}


def _top_level_imports(tree: cst.Module) -> "ModuleModel":
    """A model of a module's top-level import statements alone (its `imports` and `star_imports`;
    nothing else is built, which keeps reading another module's exports cheap)."""
    model = ModuleModel(tree)
    builder = _Builder(model)
    for statement in tree.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    builder.small(small, statement)
    return model


def _public_imports(model: "ModuleModel") -> dict[str, str]:
    return {name: target for name, target in model.imports.items() if not name.startswith("_")}


def _literal_keywords(value: Optional[Expr]) -> Optional[dict[str, Expr]]:
    """`{"k": v}` or `dict(k=v)` -> {"k": v}; None for anything else."""
    if isinstance(value, cst.Dict):
        out: dict[str, Expr] = {}
        for element in value.elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                return None
            out[str(element.key.evaluated_value)] = element.value
        return out
    if isinstance(value, cst.Call) and dotted_name(value.func) == "dict":
        out = {}
        for arg in value.args:
            if arg.keyword is None or arg.star:
                return None
            out[arg.keyword.value] = arg.value
        return out
    return None


def _bound_names(target: cst.BaseExpression) -> list[str]:
    """The plain names an assignment target binds (`x`, `(x, (y, *rest))`); not attributes or
    subscripts, which store into an existing object."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _bound_names(element.value)]
    return []


def _unpacked_width(node: cst.Assign) -> Optional[int]:
    """How many names `a, b = ...` unpacks into (the last target of a chained assignment)."""
    target = node.targets[-1].target
    return len(target.elements) if isinstance(target, (cst.Tuple, cst.List)) else None


def _last_reaching(before: list[Assignment]) -> list[Assignment]:
    """The last assignment, plus earlier ones while the later ones sit under a condition (the
    branch may not have run)."""
    last = before[-1]
    result = [last]
    if not last.ctx.guards:
        return result
    for earlier in reversed(before[:-1]):
        result.append(earlier)
        if not earlier.ctx.guards:
            break
    return result


def _binds_global(assignment: Assignment) -> bool:
    """An assignment in a function to a name that function declares `global`: it rebinds the
    module's variable, not a local."""
    function = assignment.function
    return function is not None and assignment.target in function.global_names


def _class_of(assignment: Assignment) -> Optional[str]:
    fn = assignment.function
    while fn is not None:
        if fn.klass is not None:
            return fn.klass
        fn = fn.parent
    return assignment.ctx.klass


def node_positions(module: cst.Module) -> dict[cst.CSTNode, CodeRange]:
    """Every node's position, as libcst's PositionProvider gives them. Its own generator is run
    directly: through MetadataWrapper.resolve, a visit of the whole tree for providers that
    batch (none here) comes first and costs a third of the time (the editor server pays this on
    every edit of a file with findings). Through the wrapper if libcst ever changes those parts
    (then the module itself, which always has a position, would be missing)."""
    provider = PositionProvider()
    try:
        provider._gen_impl(module)  # noqa: SLF001 - what MetadataWrapper.resolve calls
        computed = cast("dict[cst.CSTNode, CodeRange]", dict(provider._computed))
    except (AttributeError, NotImplementedError, TypeError):
        computed = {}
    if module in computed:
        return computed
    return dict(MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider))


K = TypeVar("K")
Item = TypeVar("Item")


def _grouped(items: "Iterable[Item]", key: "Callable[[Item], K]") -> "dict[K, list[Item]]":
    """Items by key, each list in the items' order."""
    out: dict[K, list[Item]] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def _in_order(index: "dict[K, list[Call]]", keys: "set[K]") -> list[Call]:
    """The calls under any of `keys`, in source order (each key's list already is)."""
    if len(keys) == 1:
        return list(index.get(next(iter(keys)), ()))
    return sorted((call for key in keys for call in index.get(key, ())), key=lambda call: call.order)
