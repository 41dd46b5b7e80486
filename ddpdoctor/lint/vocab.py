"""The distributed-training vocabulary the analysis layer understands: what a rank is, what a
rank-0 check looks like, what "not distributed" looks like.

Real trainers spell these many ways (`args.rank == 0`, `dist.get_rank() == 0`, `is_main_process()`,
`args.local_rank in [-1, 0]`, `hvd.rank() == 0`, `master_process = ddp_rank == 0`,
`if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0`), so this lives in one
place and every rule reads the same answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

if TYPE_CHECKING:
    from ddpdoctor.lint.facts import Function, ModuleFacts

GLOBAL_RANK_CALLS = frozenset(
    {
        "torch.distributed.get_rank",
        "horovod.torch.rank",
        "horovod.tensorflow.rank",
        "horovod.keras.rank",
        "horovod.tensorflow.keras.rank",
        "torch.distributed.get_global_rank",
    }
)
LOCAL_RANK_CALLS = frozenset(
    {
        "horovod.torch.local_rank",
        "horovod.tensorflow.local_rank",
        "horovod.keras.local_rank",
        "horovod.tensorflow.keras.local_rank",
        "torch.distributed.get_node_local_rank",
    }
)
# Helpers of the module's own or a utils module, called by their bare name.
GLOBAL_RANK_HELPERS = frozenset({"get_rank", "get_global_rank", "get_world_rank", "global_rank"})
LOCAL_RANK_HELPERS = frozenset({"get_local_rank", "local_rank"})

GLOBAL_RANK_ENV = frozenset({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "GLOBAL_RANK"})
LOCAL_RANK_ENV = frozenset({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})

# Boolean-valued names/attributes/calls that mean "this is the main process".
MAIN_PROCESS_NAMES = frozenset(
    {
        "is_master", "is_main_process", "master_process", "is_main", "is_rank0", "is_rank_zero",
        "is_global_zero", "is_local_master", "is_primary", "is_local_main_process", "is_chief",
        "is_master_process", "main_process", "is_main_rank", "is_root", "rank_zero", "is_world_process_zero",
        "is_local_process_zero", "is_master_rank",
    }
)


def _last_segment(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def env_key(facts: "ModuleFacts", expr: cst.BaseExpression) -> Optional[str]:
    """`os.environ["X"]`, `os.environ.get("X", d)`, `os.getenv("X")` -> "X" (through int()/str())."""
    if isinstance(expr, cst.Call) and _call_name(facts, expr) in ("int", "str", "builtins.int"):
        if expr.args:
            return env_key(facts, expr.args[0].value)
        return None
    if isinstance(expr, cst.Subscript):
        base = facts.qualify(expr.value) or ""
        if base in ("os.environ",) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
            key = expr.slice[0].slice.value
            if isinstance(key, cst.SimpleString):
                return str(key.evaluated_value)
    if isinstance(expr, cst.Call):
        name = _call_name(facts, expr)
        if name in ("os.environ.get", "os.getenv") and expr.args:
            key = expr.args[0].value
            if isinstance(key, cst.SimpleString):
                return str(key.evaluated_value)
    return None


def _call_name(facts: "ModuleFacts", call: cst.Call) -> Optional[str]:
    qualified = facts.qualify(call.func)
    if qualified:
        return qualified
    if isinstance(call.func, cst.Name):
        return call.func.value
    return None


def rank_kind(
    facts: "ModuleFacts",
    expr: Optional[cst.BaseExpression],
    order: int,
    function: Optional["Function"],
    depth: int = 0,
) -> Optional[str]:
    """"global" for a global rank, "local" for a local rank (or a rank reduced modulo the GPU
    count), "spawn" for the process index `mp.spawn` passes as a worker's first parameter,
    else None. Follows variables a few levels deep."""
    from ddpdoctor.lint.facts import MAX_DEPTH, dotted_name

    if expr is None or depth > MAX_DEPTH:
        return None
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo):
        if rank_kind(facts, expr.left, order, function, depth + 1) is not None:
            return "local"
        return None
    key = env_key(facts, expr)
    if key is not None:
        if key in LOCAL_RANK_ENV:
            return "local"
        if key in GLOBAL_RANK_ENV:
            return "global"
        return None
    if isinstance(expr, cst.Call):
        name = facts.qualify(expr.func)
        if name in GLOBAL_RANK_CALLS:
            return "global"
        if name in LOCAL_RANK_CALLS:
            return "local"
        dotted = dotted_name(expr.func)
        if dotted is not None and name is None or (name and not name.startswith(("torch.", "horovod."))):
            last = _last_segment(dotted or name or "")
            if last in GLOBAL_RANK_HELPERS:
                return "global"
            if last in LOCAL_RANK_HELPERS:
                return "local"
        if name in ("int",) or (isinstance(expr.func, cst.Name) and expr.func.value == "int"):
            if expr.args:
                return rank_kind(facts, expr.args[0].value, order, function, depth + 1)
        return None
    name = dotted_name(expr)
    if name is None:
        return None
    last = _last_segment(name)
    # Accelerate's attributes.
    if last == "process_index":
        return "global"
    if last == "local_process_index":
        return "local"
    spawn = _spawn_index(facts, name, function)
    if spawn:
        return "spawn"
    # Follow the variable first: `rank = int(os.environ["LOCAL_RANK"])` is a local rank.
    for value in facts.reaching_values(expr, order, function):
        if value is expr:
            continue
        kind = rank_kind(facts, value, order, function, depth + 1)
        if kind is not None:
            return kind
    if last.endswith("local_rank") or last in ("local_rank", "localrank"):
        return "local"
    if last == "rank" or last.endswith("_rank") and last not in ("node_rank", "group_rank", "num_rank"):
        if last.startswith("local"):
            return "local"
        return "global"
    return None


def _spawn_index(facts: "ModuleFacts", name: str, function: Optional["Function"]) -> bool:
    """True when `name` is the first parameter of a function handed to `mp.spawn`: the index of
    the spawned process on this node."""
    if function is None or "." in name or not function.params or function.params[0] != name:
        return False
    for call in facts.calls_named("torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"):
        target = call.arg(0, "fn")
        if target is not None and dotted_name(target) == function.name:
            return True
    return False


def is_main_process_predicate(facts: "ModuleFacts", expr: cst.BaseExpression, order: int, function: Optional["Function"], depth: int = 0) -> bool:
    from ddpdoctor.lint.facts import dotted_name

    target = expr.func if isinstance(expr, cst.Call) else expr
    name = dotted_name(target)
    if name is None:
        return False
    if _last_segment(name) in MAIN_PROCESS_NAMES:
        return True
    return False


def _is_zero_literal(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.evaluated_value == 0


def _literal_ints(node: cst.BaseExpression) -> Optional[list[int]]:
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        values = []
        for element in node.elements:
            value = element.value
            if isinstance(value, cst.Integer):
                values.append(int(value.evaluated_value))
            elif (
                isinstance(value, cst.UnaryOperation)
                and isinstance(value.operator, cst.Minus)
                and isinstance(value.expression, cst.Integer)
            ):
                values.append(-int(value.expression.evaluated_value))
            else:
                return None
        return values
    return None


def is_not_distributed_test(facts: "ModuleFacts", test: cst.BaseExpression, negated: bool = False) -> bool:
    """True for tests that hold only when the job is a single process: `not args.distributed`,
    `not dist.is_initialized()`, `args.local_rank == -1`, `world_size == 1`, `args.gpu is not None`
    is NOT one of them (it is true in distributed runs too)."""
    from ddpdoctor.lint.facts import dotted_name

    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return is_not_distributed_test(facts, test.expression, not negated)
    if isinstance(test, cst.Call):
        name = facts.qualify(test.func) or dotted_name(test.func) or ""
        if _last_segment(name) in ("is_initialized", "is_available", "is_dist_avail_and_initialized", "is_distributed"):
            return negated
        return False
    name = dotted_name(test)
    if name is not None:
        last = _last_segment(name).lower()
        if any(word in last for word in ("distributed", "ddp", "multiprocessing")) or last in ("dist", "is_dist"):
            return negated
        return False
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not negated:
        left = dotted_name(test.left) or ""
        target = test.comparisons[0]
        operator = target.operator
        right = target.comparator
        last = _last_segment(left)
        if last.endswith("rank") and isinstance(operator, cst.Equal):
            ints = _literal_ints(cst.List([cst.Element(right)]))
            return ints == [-1]
        if "world_size" in last or last in ("num_gpus", "n_gpus", "num_processes"):
            if isinstance(right, cst.Integer):
                value = int(right.evaluated_value)
                return (isinstance(operator, cst.Equal) and value == 1) or (
                    isinstance(operator, cst.LessThanEqual) and value == 1
                ) or (isinstance(operator, cst.LessThan) and value == 2)
    return False


def classify_rank_test(
    facts: "ModuleFacts",
    test: cst.BaseExpression,
    order: int,
    function: Optional["Function"],
    negated: bool = False,
    depth: int = 0,
) -> Optional[str]:
    """What a branch condition says about which ranks run the branch.

    "rank0": only the main process (or a single-process run); "nonzero": only the other ranks;
    "subset": some other specific rank(s); None: not a rank condition (or undecidable).
    `negated` classifies the `else` side (De Morgan is applied through `and`/`or`/`not`)."""
    from ddpdoctor.lint.facts import MAX_DEPTH, dotted_name

    if depth > MAX_DEPTH:
        return None
    flip = {"rank0": "nonzero", "nonzero": "rank0", "subset": "subset"}

    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return classify_rank_test(facts, test.expression, order, function, not negated, depth + 1)

    if isinstance(test, cst.BooleanOperation):
        is_and = isinstance(test.operator, cst.And)
        if negated:
            is_and = not is_and  # De Morgan
        operands = _flatten_boolean(test)
        kinds = [classify_rank_test(facts, op, order, function, negated, depth + 1) for op in operands]
        if is_and:
            # All must hold: one rank-specific operand restricts the whole branch to those ranks.
            for preferred in ("rank0", "nonzero", "subset"):
                if preferred in kinds:
                    return preferred
            return None
        # Any may hold: rank-specific only if every operand is (or holds only without distribution).
        result: Optional[str] = None
        for op, kind in zip(operands, kinds):
            if kind is None:
                if is_not_distributed_test(facts, op, negated):
                    continue
                return None
            if result is None:
                result = kind
            elif result != kind:
                result = "subset"
        return result

    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        kind = _classify_comparison(facts, test, order, function, depth)
        if kind is None:
            return None
        return flip[kind] if negated else kind

    # A bare predicate: `is_main_process()`, `args.is_master`, `master_process`, or a variable
    # bound to a rank comparison (`is_master = rank == 0`).
    if is_main_process_predicate(facts, test, order, function):
        return "nonzero" if negated else "rank0"
    name = dotted_name(test)
    if name is not None:
        for value in facts.reaching_values(test, order, function):
            if value is test or not isinstance(value, (cst.Comparison, cst.BooleanOperation, cst.UnaryOperation)):
                continue
            kind = classify_rank_test(facts, value, order, function, negated, depth + 1)
            if kind is not None:
                return kind
    return None


def _flatten_boolean(test: cst.BooleanOperation) -> list[cst.BaseExpression]:
    operator_type = type(test.operator)
    out: list[cst.BaseExpression] = []
    for side in (test.left, test.right):
        if isinstance(side, cst.BooleanOperation) and type(side.operator) is operator_type and not side.lpar:
            out.extend(_flatten_boolean(side))
        else:
            out.append(side)
    return out


def _classify_comparison(
    facts: "ModuleFacts", test: cst.Comparison, order: int, function: Optional["Function"], depth: int
) -> Optional[str]:
    target = test.comparisons[0]
    operator = target.operator
    left, right = test.left, target.comparator
    # Normalise `0 == rank` to `rank == 0`.
    if _is_zero_literal(left) and not _is_zero_literal(right):
        left, right = right, left
        mirrored = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan,
                    cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual}
        if type(operator) in mirrored:
            operator = mirrored[type(operator)]()
    is_rank = rank_kind(facts, left, order, function, depth + 1) is not None
    if not is_rank and isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
        is_rank = rank_kind(facts, left.left, order, function, depth + 1) is not None
    if not is_rank:
        return None
    if isinstance(operator, (cst.In, cst.NotIn)):
        values = _literal_ints(right)
        if values is None:
            return None
        nonneg = [v for v in values if v >= 0]
        if nonneg == [0]:
            return "rank0" if isinstance(operator, cst.In) else "nonzero"
        return "subset"
    if isinstance(operator, (cst.Is, cst.IsNot)):
        return None
    if _is_zero_literal(right):
        if isinstance(operator, (cst.Equal, cst.LessThanEqual)):
            return "rank0"
        if isinstance(operator, (cst.NotEqual, cst.GreaterThan)):
            return "nonzero"
        return None
    if isinstance(right, cst.Integer):
        value = int(right.evaluated_value)
        if value == -1:
            return None  # "not distributed", handled by the caller
        if value == 1 and isinstance(operator, cst.LessThan):
            return "rank0"
        if value == 1 and isinstance(operator, cst.GreaterThanEqual):
            return "nonzero"
    if isinstance(operator, (cst.Equal, cst.NotEqual)):
        return "subset"
    return None
