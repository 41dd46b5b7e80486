"""The distributed-training vocabulary the analysis layer understands: what a rank is, what a
rank-0 check looks like, what "not distributed" looks like.

Real trainers spell these many ways (`args.rank == 0`, `dist.get_rank() == 0`, `is_main_process()`,
`args.local_rank in [-1, 0]`, `hvd.rank() == 0`, `master_process = ddp_rank == 0`,
`if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0`), so this lives in one
place and every rule reads the same answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import libcst as cst

if TYPE_CHECKING:
    from ddpdoctor.lint.facts import Function, ModuleFacts
    from ddpdoctor.lint.facts import Call

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
    count), "spawn" for the process index `mp.spawn` passes as a worker's first parameter, else
    None. Follows variables; when it cannot, trusts what a variable is called (`args.local_rank`,
    `self.rank`) — right for recognising rank tests such as `if args.rank == 0:`."""
    if expr is None:
        return None
    key = ("rank_kind", id(expr), order, id(function))
    return facts.memoized(key, lambda: _rank(facts, expr, order, function, depth, trust_names=True), None)


def rank_source(
    facts: "ModuleFacts",
    expr: Optional[cst.BaseExpression],
    order: int,
    function: Optional["Function"],
    depth: int = 0,
) -> Optional[str]:
    """Like `rank_kind`, but only from where the value comes from, never from what a variable is
    called, and only when every source agrees. For rules that must not guess (device indices)."""
    if expr is None:
        return None
    key = ("rank_source", id(expr), order, id(function))
    return facts.memoized(key, lambda: _rank(facts, expr, order, function, depth, trust_names=False), None)


def _rank(
    facts: "ModuleFacts",
    expr: cst.BaseExpression,
    order: int,
    function: Optional["Function"],
    depth: int,
    trust_names: bool,
) -> Optional[str]:
    from ddpdoctor.lint.facts import MAX_DEPTH, dotted_name

    if depth > MAX_DEPTH:
        return None
    recurse = rank_kind if trust_names else rank_source
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo):
        # `rank % torch.cuda.device_count()`: whatever the rank was, the result is a local index.
        return "local" if rank_kind(facts, expr.left, order, function, depth + 1) is not None else None
    key = env_key(facts, expr)
    if key is None:
        key = _env_copy_key(facts, expr, order, function)
    if key is not None:
        if key in LOCAL_RANK_ENV:
            return "local"
        if key in GLOBAL_RANK_ENV:
            return "global"
        return None
    if isinstance(expr, cst.Call):
        return _rank_of_call(facts, expr, depth, recurse, order, function)
    name = dotted_name(expr)
    if name is None:
        return None
    last = _last_segment(name)
    if last == "process_index":  # Accelerate
        return "global"
    if last == "local_process_index":
        return "local"
    if _spawn_index(facts, name, function):
        return "spawn"
    if trust_names:
        # Follow the variable first: `rank = int(os.environ["LOCAL_RANK"])` is a local rank.
        for value in facts.reaching_values(expr, order, function):
            if value is not expr:
                kind = recurse(facts, value, order, function, depth + 1)
                if kind is not None:
                    return kind
        if last.endswith("local_rank") or last == "localrank":
            return "local"
        if last == "rank" or last.endswith("_rank") and last not in ("node_rank", "group_rank", "num_rank"):
            return "global"
        return None
    kinds: set[Optional[str]] = set()
    for value, v_order, v_function in facts.leaf_values(expr, order, function):
        kinds.add(None if value is expr else recurse(facts, value, v_order, v_function, depth + 1))
    return kinds.pop() if len(kinds) == 1 else None


def _rank_of_call(
    facts: "ModuleFacts",
    expr: cst.Call,
    depth: int,
    recurse: "Callable[..., Optional[str]]",
    order: int,
    function: Optional["Function"],
) -> Optional[str]:
    from ddpdoctor.lint.facts import dotted_name

    name = facts.qualify(expr.func)
    if name in GLOBAL_RANK_CALLS:
        return "global"
    if name in LOCAL_RANK_CALLS:
        return "local"
    if name is None or not name.startswith(("torch.", "horovod.")):
        last = _last_segment(dotted_name(expr.func) or name or "")
        if last in GLOBAL_RANK_HELPERS:
            return "global"
        if last in LOCAL_RANK_HELPERS:
            return "local"
        if last == "int" and expr.args:
            return recurse(facts, expr.args[0].value, order, function, depth + 1)
    call = facts.call_of(expr)
    if call is not None:
        # The module's own helper: what it returns. A literal return is the single-process
        # fallback of `get_rank()`-style helpers (`return 0`), not a different kind of rank.
        returned: set[Optional[str]] = set()
        for helper in facts.resolve_local_function(call):
            for value in helper.returns:
                if not isinstance(value, cst.Integer):
                    returned.add(recurse(facts, value, helper.end_order, helper, depth + 1))
        if len(returned) == 1:
            return returned.pop()
    return None


def _spawn_index(facts: "ModuleFacts", name: str, function: Optional["Function"]) -> bool:
    """True when `name` is the first parameter of a function handed to `mp.spawn`: the index of
    the spawned process on this node."""
    from ddpdoctor.lint.facts import dotted_name  # local: facts imports this module

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
    if _literal_ints(cst.List([cst.Element(right)])) == [-1]:
        # `RANK != -1` (yolov5) / `args.local_rank == -1`: -1 parses as a unary minus, not an
        # Integer. It means "is (not) distributed", never a subset of ranks.
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


# ------------------------------------------------------------------------------------------ devices
# Which GPU a process uses: the calls that pin it, the arguments that name a device, the idiom of
# one visible GPU per process, and whether the script runs as several processes at all.

INIT_PROCESS_GROUP = "torch.distributed.init_process_group"
DDP_CLASS = "torch.nn.parallel.DistributedDataParallel"
HOROVOD_INIT_CALLS = frozenset(
    {"horovod.torch.init", "horovod.tensorflow.init", "horovod.keras.init", "horovod.tensorflow.keras.init"}
)
SPAWN_CALLS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})

# Calls that make a device the process's current one (a call or a `with` context).
DEVICE_PIN_CALLS = frozenset(
    {
        "torch.cuda.set_device",
        "torch.cuda.device",
        "torch.accelerator.set_device_index",
        "torch.accelerator.device_index",
    }
)
# Calls whose first argument is a CUDA device index (an int means that GPU).
DEVICE_INDEX_CALLS = DEVICE_PIN_CALLS
# Helpers of the project's own that, by their name, pick this process's device
# (`set_device(...)`, timm's `init_distributed_device(args)`, `setup_device(local_rank)`).
_PIN_HELPER = re.compile(r"^(set|setup|init|pin|select|assign)_?(\w*_)?(device|gpu|cuda)s?(_\w*)?$", re.IGNORECASE)
_CUDA_INDEX = re.compile(r"^cuda:(\d+)$")
_CUDA_PERCENT = re.compile(r"^cuda:%[dis]$")
VISIBLE_DEVICES_KEYS = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})


def device_pin_calls(facts: "ModuleFacts") -> list["Call"]:
    """Calls that pin this process's device: `torch.cuda.set_device(x)`, `with torch.cuda.device(x)`,
    `torch.accelerator.set_device_index(x)`, `init_process_group(..., device_id=x)`, or a helper
    whose name says it does (`utils.set_device(...)`, `init_distributed_device(args)`)."""
    out: list["Call"] = []
    for call in facts.calls:
        if call.name in DEVICE_PIN_CALLS:
            out.append(call)
        elif call.name == INIT_PROCESS_GROUP and call.arg(keyword="device_id") is not None:
            out.append(call)
        elif call.attr is not None and _PIN_HELPER.match(call.attr) and not (call.name or "").startswith("torch."):
            out.append(call)
    return out


def visible_devices_writes(facts: "ModuleFacts") -> list[cst.CSTNode]:
    """Where the script sets `CUDA_VISIBLE_DEVICES` itself (`os.environ["CUDA_VISIBLE_DEVICES"] =
    str(local_rank)`, `os.environ.setdefault(...)`, `env["CUDA_VISIBLE_DEVICES"] = ...` for a child
    process, `os.putenv(...)`). A process that sees one GPU finds it at index 0, so `cuda:0` is then
    its own device."""
    out: list[cst.CSTNode] = []
    for store in facts.subscript_stores:
        if isinstance(store.key, cst.SimpleString) and store.key.evaluated_value in VISIBLE_DEVICES_KEYS:
            out.append(store.value)
    for call in facts.calls_named("os.environ.setdefault", "os.putenv"):
        key = call.arg(0)
        if isinstance(key, cst.SimpleString) and key.evaluated_value in VISIBLE_DEVICES_KEYS:
            out.append(call.node)
    for call in facts.method_calls("update"):
        for arg in call.args:
            if isinstance(arg.value, cst.Dict):
                for element in arg.value.elements:
                    key = getattr(element, "key", None)
                    if isinstance(key, cst.SimpleString) and key.evaluated_value in VISIBLE_DEVICES_KEYS:
                        out.append(call.node)
            elif arg.keyword is not None and arg.keyword.value in VISIBLE_DEVICES_KEYS:
                out.append(call.node)
    return out


def multiprocess_evidence(facts: "ModuleFacts") -> Optional["Call"]:
    """The call that makes this a multi-process training script, or None.

    `init_process_group` with a world size that is not provably 1; without any init in this file,
    wrapping in DDP, `hvd.init()` or `mp.spawn`. A script whose every init is `world_size=1` (or that
    is linted with --world-size 1) is a single process."""
    if facts.world_size == 1:
        return None
    inits = facts.calls_named(INIT_PROCESS_GROUP)
    if inits:
        for call in inits:
            world = call.arg(3, "world_size")
            if world is None or facts.const_value(world, call.order, call.function) != 1:
                return call
        return None
    for names in ((DDP_CLASS,), tuple(HOROVOD_INIT_CALLS), tuple(SPAWN_CALLS)):
        calls = facts.calls_named(*names)
        if calls:
            return calls[0]
    return None


@dataclass(eq=False)
class DeviceArgument:
    """An argument that names a device: `set_device(x)`, `device_ids=[x]`, `.cuda(x)`, `.to(x)`,
    `torch.device(x)`, `device=x`, `map_location=x`."""

    call: "Call"
    expr: cst.BaseExpression
    where: str  # how a message names it: "torch.cuda.set_device()", "device_ids", ".to()", ...
    ints: bool  # a bare int here means a CUDA device index


def device_arguments(facts: "ModuleFacts") -> list[DeviceArgument]:
    out: list[DeviceArgument] = []
    for call in facts.calls:
        name = call.name
        if name in DEVICE_INDEX_CALLS:
            expr = call.arg(0, "device")
            if expr is not None:
                out.append(DeviceArgument(call, expr, f"{name}()", True))
            continue
        if name == DDP_CLASS:
            ids = call.arg(1, "device_ids")
            if isinstance(ids, (cst.List, cst.Tuple)):
                for element in ids.elements:
                    if not isinstance(element, cst.StarredElement):
                        out.append(DeviceArgument(call, element.value, "device_ids", True))
            output = call.arg(2, "output_device")
            if output is not None:
                out.append(DeviceArgument(call, output, "output_device", True))
            continue
        if name == "torch.device":
            expr = call.arg(0, "type")
            if expr is not None:
                out.append(DeviceArgument(call, expr, "torch.device()", True))
            index = call.arg(1, "index")
            if index is not None:
                out.append(DeviceArgument(call, index, "torch.device()", True))
            continue
        if name is None and isinstance(call.node.func, cst.Attribute) and call.attr in ("cuda", "to"):
            expr = call.arg(0, "device")
            if expr is not None:
                out.append(DeviceArgument(call, expr, f".{call.attr}()", True))
            continue
        for keyword in ("device", "map_location"):
            expr = call.arg(keyword=keyword)
            if expr is not None:
                ints = keyword == "device" and (name or "").startswith("torch.")
                out.append(DeviceArgument(call, expr, f"{keyword}=", ints))
    return out


@dataclass(eq=False)
class DeviceIndex:
    """What one value of a device argument says about the GPU index.

    kind "literal": hard-coded (`0`, `"cuda:1"`, `torch.device("cuda", 0)`); `node` is the literal.
    kind "expr": computed; `node` is the index expression (`rank` in `f"cuda:{rank}"`).
    kind "other": no index (`"cuda"`, `"cpu"`, a dtype, a value that cannot be followed)."""

    kind: str
    node: cst.BaseExpression
    order: int
    function: Optional["Function"]
    index: Optional[int] = None


def device_indices(
    facts: "ModuleFacts",
    expr: cst.BaseExpression,
    order: int,
    function: Optional["Function"],
    ints: bool = True,
    depth: int = 0,
) -> list[DeviceIndex]:
    """Every value a device argument may hold (followed through variables, `self.` attributes,
    parameters and `torch.device(...)`), classified as a hard-coded index, a computed index or
    neither."""
    from ddpdoctor.lint.facts import MAX_DEPTH

    out: list[DeviceIndex] = []
    for value, v_order, v_function in facts.leaf_values(expr, order, function):
        if depth > MAX_DEPTH:
            out.append(DeviceIndex("other", value, v_order, v_function))
        else:
            out.extend(_device_index_of(facts, value, v_order, v_function, ints, depth))
    return out


def _device_index_of(
    facts: "ModuleFacts", value: cst.BaseExpression, order: int, function: Optional["Function"], ints: bool, depth: int
) -> list[DeviceIndex]:
    from ddpdoctor.lint.facts import dotted_name

    if isinstance(value, cst.Integer):
        if ints:
            return [DeviceIndex("literal", value, order, function, int(value.evaluated_value))]
        return [DeviceIndex("other", value, order, function)]
    if isinstance(value, cst.SimpleString):
        text = value.evaluated_value
        match = _CUDA_INDEX.match(text) if isinstance(text, str) else None
        if match:
            return [DeviceIndex("literal", value, order, function, int(match.group(1)))]
        return [DeviceIndex("other", value, order, function)]
    if isinstance(value, cst.FormattedString):
        parts = value.parts
        if (
            len(parts) == 2
            and isinstance(parts[0], cst.FormattedStringText)
            and parts[0].value == "cuda:"
            and isinstance(parts[1], cst.FormattedStringExpression)
        ):
            return [DeviceIndex("expr", parts[1].expression, order, function)]
        return [DeviceIndex("other", value, order, function)]
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Modulo):
        left = value.left
        if isinstance(left, cst.SimpleString) and _CUDA_PERCENT.match(str(left.evaluated_value)):
            right = value.right
            if isinstance(right, cst.Tuple) and len(right.elements) == 1:
                right = right.elements[0].value
            return [DeviceIndex("expr", right, order, function)]
    if isinstance(value, cst.Call):
        name = facts.qualify(value.func)
        if name == "torch.device":
            call = facts.call_of(value)
            index = call.arg(1, "index") if call is not None else None
            kind = call.arg(0, "type") if call is not None else None
            if index is not None:
                return device_indices(facts, index, order, function, True, depth + 1)
            if kind is not None:
                return device_indices(facts, kind, order, function, True, depth + 1)
            return [DeviceIndex("other", value, order, function)]
        func = value.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "format"
            and isinstance(func.value, cst.SimpleString)
            and func.value.evaluated_value == "cuda:{}"
            and len(value.args) == 1
        ):
            return [DeviceIndex("expr", value.args[0].value, order, function)]
    if ints or dotted_name(value) is not None:
        return [DeviceIndex("expr", value, order, function)]
    return [DeviceIndex("other", value, order, function)]


def env_reads(facts: "ModuleFacts") -> list[tuple[str, cst.CSTNode]]:
    """Every environment variable the module reads, with the node that reads it:
    `os.environ["X"]`, `os.environ.get("X")`, `os.getenv("X")` and `"X" in os.environ`. Walks the
    tree, so call it only once a rule has a candidate finding."""
    from ddpdoctor.lint.facts import walk

    def is_store(node: cst.CSTNode) -> bool:
        # `os.environ["RANK"] = str(rank)` sets the variable; it is not read here.
        return isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Subscript)

    out: list[tuple[str, cst.CSTNode]] = []
    for node in walk(facts.module, skip=is_store):
        if isinstance(node, (cst.Subscript, cst.Call)):
            key = env_key(facts, node)
            if key is not None:
                out.append((key, node))
        elif isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            target = node.comparisons[0]
            if (
                isinstance(target.operator, (cst.In, cst.NotIn))
                and isinstance(node.left, cst.SimpleString)
                and facts.qualify(target.comparator) == "os.environ"
            ):
                out.append((str(node.left.evaluated_value), node))
    return out


def runs_in_module(facts: "ModuleFacts", function: Optional["Function"], depth: int = 0) -> bool:
    """False when `function` is a module-level helper this module never calls nor hands on
    (`mp.spawn(worker)`, `Process(target=worker)`), even through its callers: a utils module's
    `setup()` that other files call, after doing their own set-up. Methods count as running (their
    class is instantiated elsewhere), and so does anything undecidable."""
    from ddpdoctor.lint.facts import dotted_name

    if function is None or function.klass is not None or depth > 4:
        return True
    if isinstance(function.node, cst.FunctionDef) and function.node.decorators:
        return True  # registered with a framework (`@hydra.main`, `@record`, a CLI command)
    sites = facts.call_sites(function)
    if any(runs_in_module(facts, site.function, depth + 1) for site in sites):
        return True
    for call in facts.calls:
        for arg in call.args:
            if dotted_name(arg.value) == function.name:
                return True
    return False


TEST_HARNESS_MODULES = ("unittest", "pytest", "torch.testing._internal", "horovod.common.util")


def is_test_module(facts: "ModuleFacts") -> bool:
    """True for a test suite rather than a training script: a file named like a test
    (`test_*.py`, `*_test.py`, `*_tests.py`, `conftest.py`) or one built on a test harness
    (unittest, pytest, torch's internal distributed test fixtures). Tests pin devices, ranks and
    learning rates per test case on purpose; rules about those choices stay silent there."""
    import os.path

    name = os.path.basename(facts.path)
    if name.startswith("test_") or name.endswith(("_test.py", "_tests.py")) or name == "conftest.py":
        return True
    return any(facts.uses_module(module) for module in TEST_HARNESS_MODULES)


def in_test_case(call: "Call") -> bool:
    """True inside a unit-test class (`class TestAllreduce(unittest.TestCase)`, `TorchTests`):
    test harnesses choose devices per test on purpose and are not training scripts."""
    function = call.function
    klass = call.ctx.klass
    while klass is None and function is not None:
        klass, function = function.klass, function.parent
    return klass is not None and (klass.startswith("Test") or klass.endswith(("Test", "Tests")))


def _env_copy_key(
    facts: "ModuleFacts", expr: cst.BaseExpression, order: int, function: Optional["Function"]
) -> Optional[str]:
    """`env["RANK"]` where `env` is a copy of the environment: `dict(os.environ)`,
    `os.environ.copy()`, or `{key: os.environ[key] for key in (...)}` (pytorch/examples)."""
    if not isinstance(expr, cst.Subscript) or len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
        return None
    key = expr.slice[0].slice.value
    if not isinstance(key, cst.SimpleString):
        return None
    leaves = facts.leaf_values(expr.value, order, function)
    if not leaves:
        return None
    for value, _, _ in leaves:
        if isinstance(value, cst.DictComp):
            inner = value.value
            if not (isinstance(inner, cst.Subscript) and facts.qualify(inner.value) == "os.environ"):
                return None
        elif isinstance(value, cst.Call):
            name = facts.qualify(value.func) or ""
            is_copy = name == "os.environ.copy" or (
                isinstance(value.func, cst.Name) and value.func.value == "dict" and len(value.args) == 1
                and facts.qualify(value.args[0].value) == "os.environ"
            )
            if not is_copy:
                return None
        else:
            return None
    return str(key.evaluated_value)
