"""Where ranks part ways: the exits of a loop or function (`break`, `continue`, `return`,
`sys.exit()`) and whether the condition that takes them can come out differently on different
ranks, while the ranks that stay go on into a collective (the next DDP backward, an `all_reduce`).

A condition differs between ranks when it tests the rank itself (`if rank == 0:`) or reads a value
this rank measured on its own data and did not reduce: `loss.item()`, a tensor's `.mean()`, a
non-finite check, a wall-clock budget. It does not when the value went through a collective first
(`dist.all_reduce(kl)`, `kl = hvd.allreduce(kl)`, a project `mpi_avg(kl)`), or is one every rank
shares (the epoch counter, an option, a constant).

The model records calls and assignments, not the statements that leave a block, so exits are
found here by one walk over each function body, with the branch conditions around them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import libcst as cst

from ddpdoctor.lint.analysis.collectives import collective_name
from ddpdoctor.lint.analysis.model import Call, Function, Guard, Loop, ModuleModel, mentions
from ddpdoctor.lint.analysis.ranks import Runs, decided_by_guards
from ddpdoctor.lint.analysis.syntax import Expr, dotted_name
from ddpdoctor.lint.analysis.syntax import exits as always_leaves

# Calls that leave the process without an error: the launcher then waits for the other ranks,
# which wait in their next collective. (An exception or a non-zero exit status makes torchrun /
# mp.spawn tear the whole group down: the job fails, it does not hang.)
EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "builtins.exit", "builtins.quit", "os._exit"})
# Methods that turn this rank's tensors into a number or summarise them: what they return was
# measured on this rank's data.
MEASURING_METHODS = frozenset({"item", "tolist", "mean", "sum", "max", "min", "norm", "std", "var", "numpy"})
# Checks that read a value's finiteness: `torch.isfinite(loss)`, `math.isnan(loss_value)`.
FINITE_CHECKS = frozenset(
    {"torch.isfinite", "torch.isnan", "torch.isinf", "math.isnan", "math.isinf", "math.isfinite",
     "numpy.isnan", "numpy.isinf", "numpy.isfinite"}
)
# Clocks: each process reads its own.
CLOCKS = frozenset({"time.time", "time.perf_counter", "time.monotonic", "time.process_time"})
# Names of project helpers that average or gather a value across ranks (`mpi_avg`, `reduce_tensor`,
# `all_reduce_mean`, `sync_across_processes`): what they return is the same on every rank.
REDUCING_WORDS = ("reduce", "gather", "broadcast", "mpi_avg", "allreduce", "sync", "average_across")


@dataclass(frozen=True, eq=False)
class Exit:
    """One statement that leaves a loop iteration, a loop, a function or the process."""

    node: cst.CSTNode  # the `break` / `continue` / `return` statement, or the exit call
    kind: str  # "break" | "continue" | "return" | "exit"
    function: Optional[Function]
    guards: tuple[Guard, ...]  # the branch conditions around it inside its function, outermost first
    # Those of `guards` that are the negation of an earlier exit (`if bad: continue` ... here): a
    # divergence there belongs to that exit, and is reported there.
    after_exits: frozenset[int]
    loops: tuple[Loop, ...]  # the loops around it inside its function, outermost first
    order: int  # where it sits among the model's numbered statements
    # For each of `guards`, how many of `loops` are around it: whether a condition is inside the loop
    # an exit leaves is a fact of nesting, not of numbering (a loop's first `if`, with no call before
    # it, is numbered like the loop itself).
    guard_depths: tuple[int, ...] = ()


def exits(model: ModuleModel) -> list[Exit]:
    """Every exit in the module, found once."""
    return model.memoized(("divergence.exits",), lambda: _Walker(model).run(), [])


class _Walker:
    def __init__(self, model: ModuleModel) -> None:
        self.model = model
        self.out: list[Exit] = []
        self.after_exits: set[int] = set()
        self.depths: dict[int, int] = {}  # id(guard) -> how many loops are around it
        self.kept: list[Guard] = []  # keeps those guards alive, so that their ids stay theirs
        self.loops_by_node = {id(loop.node): loop for loop in model.loops}
        # The numbers of the numbered items (calls, assignments), to place a statement among them.
        self.item_orders = sorted([*(c.order for c in model.calls), *(a.order for a in model.assignments)])

    def run(self) -> list[Exit]:
        for function in self.model.functions:
            if isinstance(function.node, cst.FunctionDef):
                self.block(function.node.body, function, (), ())
        self.block(self.model.module, None, (), ())
        return self.out

    def order_at(self, node: cst.CSTNode) -> int:
        """One past every numbered item that starts before `node`'s end: values assigned up to
        there are the ones `node` sees. The model builds in source order and marks, for each `if`
        test and exit statement, the last number given by its end (ModuleModel.walk_marks)."""
        index = bisect.bisect_right(self.item_orders, self.model.walk_marks[id(node)])
        return (self.item_orders[index - 1] + 1) if index else 0

    def block(
        self, body: Union[cst.BaseSuite, cst.Module], function: Optional[Function],
        guards: tuple[Guard, ...], loops: tuple[Loop, ...],
    ) -> None:
        statements: list[cst.BaseStatement] = []
        if isinstance(body, (cst.IndentedBlock, cst.Module)):
            statements = list(body.body)
        elif isinstance(body, cst.SimpleStatementSuite):
            self.small_statements(body.body, function, guards, loops)
            return
        for statement in statements:
            self.statement(statement, function, guards, loops)
            if isinstance(statement, cst.If) and statement.orelse is None and always_leaves(statement.body):
                # `if not ok: continue` guards what follows it in the block, negated.
                after = Guard(statement.test, True, self.order_at(statement.test), function)
                self.after_exits.add(id(after))
                self.depths[id(after)] = len(loops)
                self.kept.append(after)
                guards = (*guards, after)

    def statement(
        self, statement: cst.BaseStatement, function: Optional[Function], guards: tuple[Guard, ...],
        loops: tuple[Loop, ...],
    ) -> None:
        if isinstance(statement, cst.SimpleStatementLine):
            self.small_statements(statement.body, function, guards, loops)
        elif isinstance(statement, cst.If):
            order = self.order_at(statement.test)
            self.block(statement.body, function, (*guards, self.guard(statement.test, False, order, function, loops)), loops)
            if statement.orelse is not None:
                negated = (*guards, self.guard(statement.test, True, order, function, loops))
                if isinstance(statement.orelse, cst.If):
                    self.statement(statement.orelse, function, negated, loops)
                else:
                    self.block(statement.orelse.body, function, negated, loops)
        elif isinstance(statement, (cst.For, cst.While)):
            loop = self.loops_by_node.get(id(statement))
            inner = (*loops, loop) if loop is not None else loops
            self.block(statement.body, function, guards, inner)
            if statement.orelse is not None:
                self.block(statement.orelse.body, function, guards, loops)
        elif isinstance(statement, (cst.With, cst.Try, cst.TryStar)):
            self.block(statement.body, function, guards, loops)
            if isinstance(statement, (cst.Try, cst.TryStar)):
                for handler in statement.handlers:
                    self.block(handler.body, function, guards, loops)
                for extra in (statement.orelse, statement.finalbody):
                    if extra is not None:
                        self.block(extra.body, function, guards, loops)
        # Nested functions and classes are walked as functions of their own.

    def small_statements(
        self, smalls: Sequence[cst.BaseSmallStatement], function: Optional[Function],
        guards: tuple[Guard, ...], loops: tuple[Loop, ...],
    ) -> None:
        for small in smalls:
            kind: Optional[str] = None
            node: cst.CSTNode = small
            if isinstance(small, cst.Break):
                kind = "break"
            elif isinstance(small, cst.Continue):
                kind = "continue"
            elif isinstance(small, cst.Return):
                kind = "return"
            elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                call = self.model.call_of(small.value)
                if call is not None and call.name in EXIT_CALLS and _clean_exit_status(call):
                    kind, node = "exit", small.value
            if kind is not None:
                after = frozenset(id(g) for g in guards if id(g) in self.after_exits)
                depths = tuple(self.depths[id(g)] for g in guards)
                self.out.append(Exit(node, kind, function, guards, after, loops, self.order_at(small), depths))

    def guard(
        self, test: Expr, negated: bool, order: int, function: Optional[Function], loops: tuple[Loop, ...]
    ) -> Guard:
        made = Guard(test, negated, order, function)
        self.kept.append(made)  # alive for the walk, so that its id stays its own
        self.depths[id(made)] = len(loops)
        return made


def _clean_exit_status(call: Call) -> bool:
    """`sys.exit()`, `sys.exit(0)`, `exit(None)`: the process ends as if it had succeeded."""
    status = call.arg(0, "status") if call.name != "os._exit" else call.arg(0, "n")
    if status is None:
        return True
    if isinstance(status, cst.Integer):
        return int(status.evaluated_value) == 0
    return isinstance(status, cst.Name) and status.value == "None"


def measured_here(model: ModuleModel, test: Expr, order: int, function: Optional[Function]) -> Optional[cst.CSTNode]:
    """The part of a condition that reads a value this rank measured on its own (`loss.item()`, a
    tensor's `.mean()`, `torch.isfinite(loss)`, `time.time()`), following variables; None when
    every value it reads is shared, or when anything it is built from went through a collective
    or a reducing helper (`kl = mpi_avg(kl)`, `dist.all_reduce(kl)` before the test)."""
    if mentions(model, test, order, function, _reduced):
        return None
    found: list[cst.CSTNode] = []

    def local(m: ModuleModel, node: cst.CSTNode, _at: int, _inside: Optional[Function]) -> bool:
        if not isinstance(node, cst.Call):
            return False
        call = m.call_of(node)
        if call is None:
            return False
        method = isinstance(node.func, cst.Attribute) and call.name is None and call.attr in MEASURING_METHODS
        if call.name in CLOCKS or call.name in FINITE_CHECKS or method:
            found.append(node)
            return True
        return False

    if mentions(model, test, order, function, local):
        return found[-1] if found else test
    return None


def _reduced(model: ModuleModel, node: cst.CSTNode, order: int, function: Optional[Function]) -> bool:
    """A collective (`hvd.allreduce(x)`) or a helper named for reducing across ranks (`mpi_avg(x)`);
    or a name that was handed to an in-place collective earlier in the function
    (`dist.all_reduce(kl)`, then `kl`)."""
    if isinstance(node, cst.Call):
        call = model.call_of(node)
        return call is not None and _is_reducing(call)
    name = dotted_name(node)
    if name is None:
        return False
    # `kl.item` reads `kl`: each dotted prefix is a value that may have been reduced in place.
    parts = name.split(".")
    prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return any(
        other.order < order and _reduces_in_place(other)
        and any(dotted_name(arg.value) in prefixes for arg in other.args)
        for other in model.scope_calls(function)
    )


def _reduces_in_place(call: Call) -> bool:
    """`dist.all_reduce(t)`, `dist.broadcast(t, 0)`, `hvd.allreduce_(t)`: the tensor handed over
    holds the reduced value afterwards (a helper such as `mpi_avg(t)` returns it instead)."""
    name = collective_name(call)
    if name is None:
        return False
    return name.startswith("torch.distributed.") or name.endswith("_")


def _is_reducing(call: Call) -> bool:
    if collective_name(call) is not None:
        return True
    written = (call.name or call.dotted or "").rsplit(".", 1)[-1].lower()
    return any(word in written for word in REDUCING_WORDS)


def reaches_collective_after(model: ModuleModel, exit: Exit) -> Optional[Call]:
    """What the ranks that do not take `exit` run next that needs every rank: a backward (DDP
    all-reduces in it) or a collective, in the loop the exit leaves or in a helper called there
    (for `break`: its next iterations; for `continue`: the rest of this iteration; for `return` /
    a process exit: any loop around it in its function); an explicit collective rather than a
    backward when there are both. None when nothing collective follows, e.g. a `return` from a
    helper that all ranks leave the same way."""
    if not exit.loops:
        return _after_in_function(model, exit) if exit.kind in ("return", "exit") else None
    loops = (exit.loops[-1],) if exit.kind in ("break", "continue") else exit.loops
    backward: Optional[Call] = None
    for loop in loops:
        for call in model.calls_of_within(exit.function, loop):
            if exit.kind == "continue" and call.order < exit.order:
                continue
            found = _collective_through(model, call, 0)
            if found is not None and found.attr != "backward":
                return found  # an explicit collective: whatever the model is wrapped in
            backward = backward or found
    return backward


def _after_in_function(model: ModuleModel, exit: Exit) -> Optional[Call]:
    """A `return` (or process exit) outside any loop of its function: what the rest of the function
    runs on the ranks that do not leave (a per-batch `train_step` that returns before its backward
    on a NaN loss)."""
    backward: Optional[Call] = None
    for call in model.scope_calls(exit.function):
        if call.order < exit.order:
            continue
        found = _collective_through(model, call, 0)
        if found is not None and found.attr != "backward":
            return found
        backward = backward or found
    return backward


def _collective_through(model: ModuleModel, call: Call, depth: int) -> Optional[Call]:
    """`call` itself when it is a backward or a collective, else one in a helper of this module it
    calls (two calls deep)."""
    if call.attr == "backward" or collective_name(call) is not None:
        return call
    if depth >= 2:
        return None
    for helper in model.resolve_local_function(call):
        for inner in helper.calls:
            found = _collective_through(model, inner, depth + 1)
            if found is not None:
                return found
    return None


@dataclass(frozen=True)
class Divergence:
    """Why an exit may be taken on some ranks only: the condition, and either who runs it (a rank
    test) or the rank-local value it reads."""

    guard: Guard
    runs: Optional[Runs]  # RANK0 / NONZERO / SUBSET for a rank test
    measured: Optional[cst.CSTNode]  # the rank-local value a condition reads


def divergent_condition(model: ModuleModel, exit: Exit) -> Optional[Divergence]:
    """The condition inside the loop an exit leaves (or, outside loops, in its function) that may
    hold on some ranks and not others; None when there is none, or when the exit only runs in a
    single-process run."""
    decided = decided_by_guards(model, exit.guards)
    if decided is not None and decided.runs == Runs.SINGLE:
        return None
    # The conditions inside the loop the exit leaves (its innermost for break / continue, any loop
    # around it for return / exit), or in its function when no loop is around it.
    depth = (len(exit.loops) if exit.kind in ("break", "continue") else 1) if exit.loops else 0
    inside = [
        guard for guard, around in zip(exit.guards, exit.guard_depths)
        if around >= depth and id(guard) not in exit.after_exits
    ]
    if decided is not None and decided.some_ranks and decided.guard in inside:
        return Divergence(decided.guard, decided.runs, None)
    for guard in reversed(inside):
        measured = measured_here(model, guard.test, guard.order, guard.function)
        if measured is not None:
            return Divergence(guard, None, measured)
    return None
