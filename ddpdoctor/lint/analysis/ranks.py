"""Who runs this: all ranks, rank 0 only, the other ranks, a subset, only a single-process run.

Real trainers spell rank checks many ways (`args.rank == 0`, `dist.get_rank() == 0`,
`is_main_process()`, `args.local_rank in [-1, 0]`, `hvd.rank() == 0`, `master_process = ddp_rank == 0`,
`if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0`) and single-process
checks as many (`world_size == 1`, `not args.distributed`, `local_rank == -1`,
`'RANK' not in os.environ`, `not dist.is_initialized()`). This module reads them all and answers one
question for any statement, so every rule gets the same answer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import libcst as cst

from ddpdoctor.lint.analysis.conditions import Located as _Located
from ddpdoctor.lint.analysis.conditions import route_reaches, site_reaches
from ddpdoctor.lint.analysis.launch import (
    DDP_CLASS,
    DEEPSPEED_INIT_CALLS,
    HOROVOD_INIT_CALLS,
    INIT_PROCESS_GROUP,
    LOCAL_RANK_ENV,
    NODE_INDEX_ENV,
    NODE_INDEX_NAMES,
    PROCESS_GROUP_CALLS,
    SPAWN_CALLS,
    env_copy_key,
    env_key,
    runs_in_module,
)
from ddpdoctor.lint.analysis.model import MAX_DEPTH, Assignment, Call, Context, Function, Guard, ModuleModel, Route
from ddpdoctor.lint.analysis.reads import value_reads
from ddpdoctor.lint.analysis.syntax import (
    MIRRORED_OPERATORS,
    bool_literal,
    dotted_name,
    flatten_boolean,
    is_zero_literal,
    last_segment,
    literal_int,
    literal_ints,
    names_in,
    walk,
)

GLOBAL_RANK_CALLS = frozenset(
    {
        "torch.distributed.get_rank",
        "horovod.torch.rank",
        "horovod.tensorflow.rank",
        "horovod.keras.rank",
        "horovod.tensorflow.keras.rank",
    }
)
# get_global_rank(group, group_rank) maps the group rank it is given to a global rank: this process's
# own only when it is given this process's group rank, not a constant source such as 0.
GROUP_TO_GLOBAL_RANK = "torch.distributed.get_global_rank"
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

# Variables a launcher sets in every process it starts; their absence means a plain `python train.py`.
LAUNCHER_ENV = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
GLOBAL_RANK_ENV = frozenset({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "GLOBAL_RANK"})

# Boolean-valued names/attributes/calls that mean "this is the main process".
MAIN_PROCESS_NAMES = frozenset(
    {
        "is_master", "is_main_process", "master_process", "is_main", "is_rank0", "is_rank_zero",
        "is_global_zero", "is_local_master", "is_primary", "is_local_main_process", "is_chief",
        "is_master_process", "main_process", "is_main_rank", "is_root", "rank_zero", "is_world_process_zero",
        "is_local_process_zero", "is_master_rank",
        "should_save",  # the HF TrainingArguments flag: the process that writes checkpoints
    }
)



def rank_kind(
    model: ModuleModel,
    expr: Optional[cst.BaseExpression],
    order: int,
    function: Optional[Function],
    depth: int = 0,
) -> Optional[str]:
    """"global" for a global rank, "local" for a local rank (or a rank reduced modulo the GPU
    count), "spawn" for the process index `mp.spawn` passes as a worker's first parameter, else
    None. Follows variables; when it cannot, trusts what a variable is called (`args.local_rank`,
    `self.rank`) — right for recognising rank tests such as `if args.rank == 0:`."""
    if expr is None:
        return None
    key = ("rank_kind", id(expr), order, id(function))
    return model.memoized(key, lambda: _rank(model, expr, order, function, depth, trust_names=True), None)


def rank_source(
    model: ModuleModel,
    expr: Optional[cst.BaseExpression],
    order: int,
    function: Optional[Function],
    depth: int = 0,
) -> Optional[str]:
    """Like `rank_kind`, but only from where the value comes from, never from what a variable is
    called, and only when every source agrees. For rules that must not guess (device indices)."""
    if expr is None:
        return None
    key = ("rank_source", id(expr), order, id(function))
    return model.memoized(key, lambda: _rank(model, expr, order, function, depth, trust_names=False), None)


def _rank(
    model: ModuleModel,
    expr: cst.BaseExpression,
    order: int,
    function: Optional[Function],
    depth: int,
    trust_names: bool,
) -> Optional[str]:

    if depth > MAX_DEPTH:
        return None
    recurse = rank_kind if trust_names else rank_source
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo):
        # `rank % torch.cuda.device_count()`: whatever the rank was, the result is a local index.
        return "local" if rank_kind(model, expr.left, order, function, depth + 1) is not None else None
    key = env_key(model, expr)
    if key is None:
        key = env_copy_key(model, expr, order, function)
    if key is not None:
        if key in LOCAL_RANK_ENV:
            return "local"
        if key in GLOBAL_RANK_ENV:
            return "global"
        return None
    if isinstance(expr, cst.Call):
        return _rank_of_call(model, expr, depth, recurse, order, function)
    name = dotted_name(expr)
    if name is None:
        return None
    last = last_segment(name)
    if last == "process_index":  # Accelerate
        return "global"
    if last == "local_process_index":
        return "local"
    if _spawn_index(model, name, function):
        return "spawn"
    if trust_names:
        # Follow the variable first: `rank = int(os.environ["LOCAL_RANK"])` is a local rank.
        for value in model.reaching_values(expr, order, function):
            if value is not expr:
                kind = recurse(model, value, order, function, depth + 1)
                if kind is not None:
                    return kind
        if last.endswith("local_rank") or last == "localrank":
            return "local"
        if last == "rank" or last.endswith("_rank") and last not in ("node_rank", "group_rank", "num_rank", "machine_rank"):
            return "global"
        if _names_own_device(model, name, function):
            return "local"
        return None
    kinds: set[Optional[str]] = set()
    for value, v_order, v_function in model.leaf_values(expr, order, function):
        if value is expr:
            kinds.add(_unpacked_rank(model, expr, v_order, v_function, depth, recurse))
        else:
            kinds.add(recurse(model, value, v_order, v_function, depth + 1))
    return kinds.pop() if len(kinds) == 1 else None


def _names_own_device(model: ModuleModel, name: str, function: Optional[Function]) -> bool:
    """`name` is what the script itself hands DDP as its one device (`device_ids=[name]`) or pins
    with `torch.cuda.set_device(name)`: the GPU each process trains on, i.e. its local rank as the
    script means it (`self.gpu_index` passed in by a launcher in another module, which the value
    following cannot see). A test `name == 0` is then the per-node main process. Read by the same
    spelling in the same scope: the same function for a plain variable, the same class for a
    `self.` attribute, the module for any other attribute (`args.gpu`)."""
    return (name, _spelling_scope(name, function)) in _own_device_names(model)


def _own_device_names(model: ModuleModel) -> frozenset[tuple[str, Optional[str]]]:
    def compute() -> frozenset[tuple[str, Optional[str]]]:
        out: set[tuple[str, Optional[str]]] = set()
        for call in model.calls_named(DDP_CLASS, "torch.cuda.set_device"):
            if call.name == DDP_CLASS:
                ids = call.arg(1, "device_ids")
                if not isinstance(ids, (cst.List, cst.Tuple)) or len(ids.elements) != 1:
                    continue
                device: Optional[cst.BaseExpression] = ids.elements[0].value
            else:
                device = call.arg(0, "device")
            spelled = dotted_name(device)
            if spelled is not None:
                out.add((spelled, _spelling_scope(spelled, call.function)))
        return frozenset(out)

    return model.memoized(("own_device_names",), compute, frozenset())


def _spelling_scope(name: str, function: Optional[Function]) -> Optional[str]:
    """Where a dotted name means the same thing: its class for `self.x`, its function for a plain
    variable, the module (None) for other attributes."""
    if name.startswith("self."):
        while function is not None and function.klass is None:
            function = function.parent
        return f"class {function.klass}" if function is not None else None
    if "." not in name:
        return f"function {function.qualname}" if function is not None else None
    return None


def _unpacked_rank(
    model: ModuleModel,
    expr: cst.BaseExpression,
    order: int,
    function: Optional[Function],
    depth: int,
    recurse: "Callable[..., Optional[str]]",
) -> Optional[str]:
    """`rank, world_size = setup()`: the kind of what `setup` returns in that position, through
    this module's functions or another project module's (`return int(os.environ["RANK"]), ...`)."""
    kinds: set[Optional[str]] = set()
    for call, index in model.unpacked_from(expr, order, function):
        found = model.returned_functions(call)
        if not found:
            return None
        for owner, helper in found:
            for returned in helper.returns:
                if not isinstance(returned, cst.Tuple) or len(returned.elements) <= index:
                    return None
                element = returned.elements[index].value
                kinds.add(recurse(owner, element, helper.end_order, helper, depth + 1))
    return kinds.pop() if len(kinds) == 1 else None


def _rank_of_call(
    model: ModuleModel,
    expr: cst.Call,
    depth: int,
    recurse: "Callable[..., Optional[str]]",
    order: int,
    function: Optional[Function],
) -> Optional[str]:

    name = model.qualify(expr.func)
    if name in GLOBAL_RANK_CALLS:
        return "global"
    if name in LOCAL_RANK_CALLS:
        return "local"
    if name == GROUP_TO_GLOBAL_RANK:
        mapping = model.call_of(expr)
        given = mapping.arg(1, "group_rank") if mapping is not None else None
        return "global" if given is not None and recurse(model, given, order, function, depth + 1) else None
    if name is None or not name.startswith(("torch.", "horovod.")):
        last = last_segment(dotted_name(expr.func) or name or "")
        if last in GLOBAL_RANK_HELPERS:
            return "global"
        if last in LOCAL_RANK_HELPERS:
            return "local"
        if last == "int" and expr.args:
            return recurse(model, expr.args[0].value, order, function, depth + 1)
    call = model.call_of(expr)
    if call is not None:
        # The module's own helper: what it returns. A literal return is the single-process
        # fallback of `get_rank()`-style helpers (`return 0`), not a different kind of rank.
        returned: set[Optional[str]] = set()
        for helper in model.resolve_local_function(call):
            for value in helper.returns:
                if not isinstance(value, cst.Integer):
                    returned.add(recurse(model, value, helper.end_order, helper, depth + 1))
        if len(returned) == 1:
            return returned.pop()
    return None


def _spawn_index(model: ModuleModel, name: str, function: Optional[Function]) -> bool:
    """True when `name` is the first parameter of a function handed to `mp.spawn`: the index of
    the spawned process on this node."""

    if function is None or "." in name or not function.params or function.params[0] != name:
        return False
    for call in model.calls_named("torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"):
        target = call.arg(0, "fn")
        if target is not None and dotted_name(target) == function.name:
            return True
    return False


def is_main_process_predicate(model: ModuleModel, expr: cst.BaseExpression, order: int, function: Optional[Function], depth: int = 0) -> bool:
    """`is_main_process()`, `args.is_master`, `trainer.is_global_zero` (by name), or a call of a
    project helper, whatever its name, that answers "am I the main process": `primary()` whose
    body is `if not dist.is_initialized(): return True` then `return get_rank() == 0`."""
    target = expr.func if isinstance(expr, cst.Call) else expr
    name = dotted_name(target)
    if name is None:
        return False
    if last_segment(name) in MAIN_PROCESS_NAMES:
        return True
    if not isinstance(expr, cst.Call) or expr.args or depth > MAX_DEPTH:
        return False
    call = model.call_of(expr)
    if call is None:
        return False
    helpers = model.returned_functions(call)
    return bool(helpers) and all(_answers_main_process(other, helper, depth + 1) for other, helper in helpers)


def _answers_main_process(model: ModuleModel, helper: Function, depth: int) -> bool:
    """The helper's body is early `return True` under single-process tests, then one `return`
    of a rank-0 test (`get_rank() == 0`, `not is_initialized() or get_rank() == 0`). Anything
    else in it (other statements, other returns) and it is not taken for a main-process test."""
    node = helper.node
    if not isinstance(node, cst.FunctionDef) or not isinstance(node.body, cst.IndentedBlock) or helper.params:
        return False
    statements = [s for s in node.body.body if not _is_docstring(s)]
    if not statements:
        return False
    for statement in statements[:-1]:
        if not (isinstance(statement, cst.If) and statement.orelse is None and _returns_literal(statement.body, "True")
                and is_single_process_test(model, statement.test)):
            return False
    last = statements[-1]
    if not (isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 and isinstance(last.body[0], cst.Return)):
        return False
    value = last.body[0].value
    return value is not None and classify_rank_test(model, value, helper.end_order, helper, depth=depth) == "rank0"


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.SimpleString))


def _returns_literal(block: cst.BaseSuite, literal: str) -> bool:
    """`return True` as the whole body of an `if` (on its own line or after the colon)."""
    body = block.body if isinstance(block, (cst.IndentedBlock, cst.SimpleStatementSuite)) else ()
    if len(body) != 1:
        return False
    line = body[0]
    small = line.body[0] if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else line
    return isinstance(small, cst.Return) and isinstance(small.value, cst.Name) and small.value.value == literal


_DISTRIBUTED_PREDICATES = frozenset({"is_initialized", "is_available", "is_dist_avail_and_initialized", "is_distributed"})
# The operator of a comparison's negation (`not a > b` is `a <= b`), for reading `else` branches.
# The comparison that holds exactly when the key does not (the `else` side of `if a OP b:`).
_NEGATION_PAIRS: tuple[tuple[type, type], ...] = (
    (cst.GreaterThan, cst.LessThanEqual),
    (cst.GreaterThanEqual, cst.LessThan),
    (cst.NotEqual, cst.Equal),
    (cst.In, cst.NotIn),
    (cst.IsNot, cst.Is),
)
NEGATED_OPERATORS: dict[type, type] = {
    **dict(_NEGATION_PAIRS), **{second: first for first, second in _NEGATION_PAIRS}
}
# What a distributed switch compared with a literal says: `args.dist == "OFF"`,
# `cfg.ddp != "on"`, `args.distributed is False`, and mmcv's `args.launcher == "none"`.
_SWITCH_OFF = frozenset({"off", "none", "false", "no", "0", "disable", "disabled", ""})
_SWITCH_ON = frozenset({"on", "true", "yes", "1", "enable", "enabled"})


def _flag_name(test: cst.BaseExpression) -> Optional[str]:
    """The lower-case name of a bare flag: `args.distributed` -> "distributed", a string key of a
    config dict `cfg["horovod"]` / `cfg.get("horovod")` -> "horovod"; None for anything else."""
    name = dotted_name(test)
    if name is not None:
        return last_segment(name).lower()
    key: Optional[cst.BaseExpression] = None
    if isinstance(test, cst.Subscript) and len(test.slice) == 1 and isinstance(test.slice[0].slice, cst.Index):
        key = test.slice[0].slice.value
    elif (isinstance(test, cst.Call) and isinstance(test.func, cst.Attribute) and test.func.attr.value == "get"
          and test.args and test.args[0].keyword is None):
        key = test.args[0].value
    if isinstance(key, cst.SimpleString):
        value = key.evaluated_value
        return value.lower() if isinstance(value, str) else None
    return None


def _is_distributed_switch(flag: str) -> bool:
    """A flag name that switches distributed training on: `distributed`, `use_ddp`, `dist`."""
    return any(word in flag for word in ("distributed", "ddp", "multiprocessing")) or flag in ("dist", "is_dist")


def _switch_position(left: cst.BaseExpression, right: cst.BaseExpression) -> Optional[str]:
    """"off" or "on" when `left` is a distributed switch (or mmcv's `launcher` option, whose
    "none" is the one-process run) and `right` a literal naming a position; None otherwise."""
    flag = _flag_name(left)
    if flag is None or not (_is_distributed_switch(flag) or flag == "launcher"):
        return None
    literal: Optional[str] = None
    if isinstance(right, cst.SimpleString):
        literal = str(right.evaluated_value).strip().lower()
    elif isinstance(right, cst.Name) and right.value in ("True", "False", "None"):
        literal = right.value.lower()
    elif (number := literal_int(right)) is not None:
        literal = str(number)
    if literal in _SWITCH_OFF:
        return "off"
    if literal in _SWITCH_ON and flag != "launcher":  # `launcher == "pytorch"`: its else may be SLURM
        return "on"
    return None


def _only_horovod_launches(model: ModuleModel) -> bool:
    """Horovod is this module's only way of starting several processes (no process group, spawn,
    DDP wrap or DeepSpeed of its own)."""
    return bool(model.calls_named(*HOROVOD_INIT_CALLS)) and not model.calls_named(
        INIT_PROCESS_GROUP, DDP_CLASS, *SPAWN_CALLS, *DEEPSPEED_INIT_CALLS
    )


def _only_fsdp_launches(model: ModuleModel, flag: str) -> bool:
    """The FSDP flag `flag` is this module's only way of running several processes: no DDP wrap,
    spawn, Horovod or DeepSpeed, and a process group created here only under that flag (or in a
    helper this module does not call, such as the `setup()` other scripts call under it). Then
    `if cfg.enable_fsdp: ... else:` has the plain one-process run on its other side, as in the
    llama-recipes training utilities; where DDP is the alternative (`FSDP(model) if args.fsdp else
    DDP(model)`), or the group is created on every path, it does not."""
    if model.calls_named(DDP_CLASS, *SPAWN_CALLS, *DEEPSPEED_INIT_CALLS, *HOROVOD_INIT_CALLS):
        return False
    return all(
        not runs_in_module(model, init.function)
        or any(not guard.negated and _flag_name(guard.test) == flag for guard in init.ctx.guards)
        for init in model.calls_named(INIT_PROCESS_GROUP)
    )


def is_single_process_test(model: ModuleModel, test: cst.BaseExpression, negated: bool = False) -> bool:
    """True for a branch condition (its `else` side when `negated`) that holds only when the job is a
    single process: `not args.distributed`, `not dist.is_initialized()`, `args.local_rank == -1`,
    `world_size == 1`, `"RANK" not in os.environ`, the `else` of `if world_size > 1:` /
    `if args.local_rank != -1:` / `if "RANK" in os.environ:`. `args.gpu is not None` is NOT one of
    them: it is true in distributed runs too."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return is_single_process_test(model, test.expression, not negated)
    if isinstance(test, cst.BooleanOperation):
        # `a and b` holds only if both do; `not (a or b)` only if neither does.
        if isinstance(test.operator, cst.And) and not negated:
            return any(is_single_process_test(model, side, False) for side in (test.left, test.right))
        if isinstance(test.operator, cst.And) and negated:
            # The `else` of `if dist.is_available() and args.distributed:` is `not a or not b`: one
            # process only if every operand's negation means one process.
            return all(is_single_process_test(model, side, True) for side in flatten_boolean(test))
        if isinstance(test.operator, cst.Or) and negated:
            return any(is_single_process_test(model, side, True) for side in (test.left, test.right))
        if isinstance(test.operator, cst.Or) and not negated:
            # The Hugging Face idiom `if args.local_rank == -1 or args.no_cuda:`: one process, or a
            # run without GPUs, where the distributed choices rules look at (devices, saving from
            # one process of a node) do not arise. Every operand must be one of the two.
            operands = flatten_boolean(test)
            return any(is_single_process_test(model, op) for op in operands) and all(
                is_single_process_test(model, op) or _is_no_gpu_test(model, op) for op in operands
            )
        return False
    if isinstance(test, cst.Call) and last_segment(dotted_name(test.func) or "") != "get":
        callee = model.qualify(test.func) or dotted_name(test.func) or ""
        # `not torch.cuda.is_available()` says there is no GPU, not that there is one process.
        return negated and last_segment(callee) in _DISTRIBUTED_PREDICATES and not callee.startswith("torch.cuda.")
    flag = _flag_name(test)
    if flag is not None:
        if _is_distributed_switch(flag):
            return negated
        # `if cfg["horovod"]: ... else:` in a script that Horovod alone makes multi-process: the
        # other side is the plain one-process run. (Where DDP is the alternative, it is not.)
        if "horovod" in flag and _only_horovod_launches(model):
            return negated
        if "fsdp" in flag and _only_fsdp_launches(model, flag):
            return negated
        return False
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    operator = target.operator
    if negated:
        flipped = NEGATED_OPERATORS.get(type(operator))
        if flipped is None:
            return False
        operator = flipped()
    right = target.comparator
    switch = _switch_position(test.left, right)
    if switch is not None:
        # `args.dist == "OFF"` / `args.distributed is False`; the `else` of `if args.dist == "ON":`.
        if isinstance(operator, (cst.Equal, cst.Is)):
            return switch == "off"
        return isinstance(operator, (cst.NotEqual, cst.IsNot)) and switch == "on"
    if isinstance(test.left, cst.SimpleString) and isinstance(operator, cst.NotIn):
        # `"RANK" not in os.environ`: no launcher set this process up.
        return model.qualify(right) == "os.environ" and str(test.left.evaluated_value) in LAUNCHER_ENV
    last = last_segment(dotted_name(test.left) or "").lower()  # `RANK == -1` (yolov5) as well
    if isinstance(test.left, cst.Call) and not test.left.args:
        # `dist.get_world_size() == 1`; the early exit `if dist.get_world_size() != 1: raise ...`
        # leaves the rest of its function to a one-process run.
        last = last_segment(model.qualify(test.left.func) or dotted_name(test.left.func) or "").lower()
    if last.endswith("rank") and isinstance(operator, cst.Equal):
        return literal_int(right) == -1
    if "world_size" in last or last in ("num_gpus", "n_gpus", "num_processes"):
        value = literal_int(right)
        return (isinstance(operator, (cst.Equal, cst.LessThanEqual)) and value == 1) or (
            isinstance(operator, cst.LessThan) and value == 2
        )
    return False


_NO_GPU_FLAGS = frozenset({"no_cuda", "cpu", "use_cpu", "cpu_only", "force_cpu"})


def _is_no_gpu_test(model: ModuleModel, test: cst.BaseExpression) -> bool:
    """`args.no_cuda`, `args.cpu`, `not torch.cuda.is_available()`: the run has no GPU."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = test.expression
        return isinstance(inner, cst.Call) and model.qualify(inner.func) == "torch.cuda.is_available"
    name = dotted_name(test)
    return name is not None and last_segment(name).lower() in _NO_GPU_FLAGS


def classify_rank_test(
    model: ModuleModel,
    test: cst.BaseExpression,
    order: int,
    function: Optional[Function],
    negated: bool = False,
    depth: int = 0,
) -> Optional[str]:
    """What a branch condition says about which ranks run the branch.

    "rank0": only the main process (or a single-process run); "nonzero": only the other ranks;
    "subset": some other specific rank(s); None: not a rank condition (or undecidable).
    `negated` classifies the `else` side (De Morgan is applied through `and`/`or`/`not`)."""

    if depth > MAX_DEPTH:
        return None
    flip = {"rank0": "nonzero", "nonzero": "rank0", "subset": "subset"}

    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return classify_rank_test(model, test.expression, order, function, not negated, depth + 1)

    if isinstance(test, cst.BooleanOperation):
        is_and = isinstance(test.operator, cst.And)
        if negated:
            is_and = not is_and  # De Morgan
        operands = flatten_boolean(test)
        kinds = [classify_rank_test(model, op, order, function, negated, depth + 1) for op in operands]
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
                if is_single_process_test(model, op, negated):
                    continue
                return None
            if result is None:
                result = kind
            elif result != kind:
                result = "subset"
        return result

    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        kind = _classify_comparison(model, test, order, function, depth)
        if kind is None:
            return None
        return flip[kind] if negated else kind

    # A bare predicate: `is_main_process()`, `args.is_master`, `master_process`, or a variable
    # bound to a rank comparison (`is_master = rank == 0`).
    if is_main_process_predicate(model, test, order, function, depth):
        return "nonzero" if negated else "rank0"
    name = dotted_name(test)
    if name is not None:
        for value in model.reaching_values(test, order, function):
            if value is test or not isinstance(value, (cst.Comparison, cst.BooleanOperation, cst.UnaryOperation)):
                continue
            kind = classify_rank_test(model, value, order, function, negated, depth + 1)
            if kind is not None:
                return kind
        if not negated and flag_raising_guards(model, test, order, function, depth + 1):
            return "rank0"
    return None


def flag_raising_guards(
    model: ModuleModel, test: cst.BaseExpression, order: int, function: Optional[Function], depth: int = 0
) -> tuple[Guard, ...]:
    """The rank conditions under which a boolean flag is set, when it is only ever set on the main
    process: `default_gpu = False`, then `default_gpu = True` under `if dist.get_rank() == 0:` and in
    the single-process `else:` (the ViLBERT family). Every assignment that reaches `test` must be a
    literal True or False, and each True must be decided rank 0 or single-process by its own
    branches, and at least one of them by a rank-0 condition; then `if default_gpu:` holds on the
    main process only. Returns those rank-0 conditions; empty when the name is no such flag (a
    parameter, a computed value, a True set on every rank, or one set only where the job is a
    single process)."""
    if depth > MAX_DEPTH:
        return ()
    name = dotted_name(test)
    if name is None:
        return ()
    assignments = model.reaching_assignments(name, order, function)
    values = [bool_literal(a.value) for a in assignments]
    if True not in values or None in values:
        return ()
    deciding: list[Guard] = []
    for assignment, value in zip(assignments, values):
        if not value:
            continue
        decided = decided_by_guards(model, assignment.ctx.guards, depth + 1)
        if decided is None or decided.runs not in (Runs.RANK0, Runs.SINGLE):
            return ()
        if decided.runs is Runs.RANK0 and decided.guard is not None:
            deciding.append(decided.guard)
    return tuple(deciding)



def _classify_comparison(
    model: ModuleModel, test: cst.Comparison, order: int, function: Optional[Function], depth: int
) -> Optional[str]:
    target = test.comparisons[0]
    operator = target.operator
    left, right = test.left, target.comparator
    # Normalise `0 == rank` to `rank == 0`.
    if is_zero_literal(left) and not is_zero_literal(right):
        left, right = right, left
        if type(operator) in MIRRORED_OPERATORS:
            operator = MIRRORED_OPERATORS[type(operator)]()
    is_rank = rank_kind(model, left, order, function, depth + 1) is not None
    if not is_rank and isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
        is_rank = rank_kind(model, left.left, order, function, depth + 1) is not None
    if not is_rank:
        return None
    if isinstance(operator, (cst.In, cst.NotIn)):
        values = literal_ints(right)
        if values is None:
            return None
        nonneg = [v for v in values if v >= 0]
        if nonneg == [0]:
            return "rank0" if isinstance(operator, cst.In) else "nonzero"
        return "subset"
    if isinstance(operator, (cst.Is, cst.IsNot)):
        return None
    if is_zero_literal(right):
        if isinstance(operator, (cst.Equal, cst.LessThanEqual)):
            return "rank0"
        if isinstance(operator, (cst.NotEqual, cst.GreaterThan)):
            return "nonzero"
        return None
    if literal_ints(cst.List([cst.Element(right)])) == [-1]:
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



# ------------------------------------------------------------------------------- who runs this


class Runs(str, enum.Enum):
    """Which processes of the job execute a statement."""

    ALL = "all"  # every rank (as far as the analysis can tell: no rank or single-process check around it)
    RANK0 = "rank0"  # only the main process (or a single-process run, where it is the main process)
    NONZERO = "nonzero"  # only the ranks other than 0
    SUBSET = "subset"  # some other specific rank(s)
    SINGLE = "single"  # only a run that is not distributed at all
    NODE0 = "node0"  # every process of the first node: a test of the node index (`if args.nr == 0:`)
    UNKNOWN = "unknown"  # undecidable: a helper nobody here calls, a check on an id we cannot trace


@dataclass(frozen=True)
class WhoRuns:
    runs: Runs
    guard: Optional[Guard] = None  # the branch condition that decided, when one did
    via: Optional[Call] = None  # the call of the helper around which that condition sits

    @property
    def some_ranks(self) -> bool:
        """Only rank 0, only the others, or a subset: not every rank of a distributed run."""
        return self.runs in (Runs.RANK0, Runs.NONZERO, Runs.SUBSET)


# Counters that are routinely compared with zero (`if epoch % 10 == 0`, `if step == 0`): not ranks.
_COUNTER_WORDS = ("epoch", "step", "iter", "batch", "idx", "count", "len", "num", "size")


def who_runs(model: ModuleModel, item: _Located) -> WhoRuns:
    """Which processes run `item` (a call, an assignment, a loop): the branch conditions around it,
    early exits before it (`if rank != 0: return`), and, when none decides, the call sites of the
    function it is in (a helper only called under `if is_main_process():` runs on rank 0 only; the
    target of `mp.spawn` runs on every rank)."""
    return _memo_who_runs(model, item) or WhoRuns(Runs.UNKNOWN)


def _memo_who_runs(model: ModuleModel, item: _Located) -> Optional[WhoRuns]:
    """None while the same question is being answered further up (a cycle of helpers calling each
    other) or past the module's step budget: that call site then tells nothing."""
    return model.memoized(("who_runs", id(item)), lambda: _who_runs(model, item), None)


def _who_runs(model: ModuleModel, item: _Located) -> WhoRuns:
    decided = decided_by_guards(model, item.ctx.guards)
    if decided is not None:
        return decided
    function = item.function
    if function is None:
        return WhoRuns(Runs.ALL)
    if function.parent is None and function.name in spawn_targets(model):
        return WhoRuns(Runs.ALL)
    answers: list[tuple[Call, WhoRuns]] = []
    for site in model.callers(function):
        if site.function is not function and site_reaches(model, site, function, item.ctx.guards):
            answer = _memo_who_runs(model, site)
            if answer is not None:
                answers.append((site, answer))
    if not answers:
        return WhoRuns(Runs.UNKNOWN)
    # Called on both sides of the same test (`if get_rank() == src: send(...) else: receive(...)`,
    # both calling one `broadcast()` wrapper): every rank gets here, whichever side it takes.
    sides = {(id(answer.guard.test), answer.guard.negated) for _, answer in answers if answer.guard is not None}
    if any((test, not negated) in sides for test, negated in sides):
        return WhoRuns(Runs.ALL)
    kinds = {answer.runs for _, answer in answers}
    for runs in (Runs.ALL, Runs.UNKNOWN):
        if runs in kinds:
            return WhoRuns(runs)
    if len(kinds) == 2 and Runs.SINGLE in kinds:
        kinds.discard(Runs.SINGLE)  # the main process of a distributed run, or the only process
    if len(kinds) != 1:
        return WhoRuns(Runs.ALL)  # rank 0 on one path, the others on another: every rank gets here
    runs = kinds.pop()
    site, answer = next((s, a) for s, a in answers if a.runs is runs)
    return WhoRuns(runs, answer.guard, site)


def decided_by_guards(model: ModuleModel, guards: Sequence[Guard], depth: int = 0) -> Optional[WhoRuns]:
    """A single-process condition anywhere around wins (that code never runs in the distributed
    job); otherwise the innermost rank condition."""
    for guard in guards:
        if is_single_process_test(model, guard.test, guard.negated) or _gpu_count_of_one_process(model, guard):
            return WhoRuns(Runs.SINGLE, guard)
    for guard in reversed(guards):
        kind = classify_rank_test(model, guard.test, guard.order, guard.function, guard.negated, depth)
        if kind is not None:
            return WhoRuns(Runs(kind), guard)
        if not guard.negated and tests_node_zero(model, guard.test, guard.order, guard.function):
            return WhoRuns(Runs.NODE0, guard)
    for guard in guards:
        if _looks_like_rank_test(guard.test):
            return WhoRuns(Runs.UNKNOWN, guard)
    return None


def _looks_like_rank_test(test: cst.BaseExpression) -> bool:
    """`<name> == 0`, `<name> in [-1, 0]` and the like on a variable not known as a rank (an
    `mp.spawn` index stored as `self.gpu_id`, say): perhaps a rank check, so undecidable."""
    stack: list[cst.BaseExpression] = [test]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.BooleanOperation):
            stack.extend((node.left, node.right))
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            stack.append(node.expression)
        elif isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            left, right = node.left, node.comparisons[0].comparator
            if isinstance(left, cst.Integer):
                left, right = right, left
            name = dotted_name(left)
            if name is None or any(word in last_segment(name).lower() for word in _COUNTER_WORDS):
                continue
            if is_zero_literal(right):
                return True
            if 0 in (literal_ints(right) or ()):
                return True
    return False


def spawn_targets(model: ModuleModel) -> frozenset[str]:
    """Names of the functions handed to `mp.spawn`: each spawned process runs them."""

    def compute() -> frozenset[str]:
        names = set()
        for call in model.calls_named(*SPAWN_CALLS):
            name = dotted_name(call.arg(0, "fn"))
            if name is not None:
                names.add(name)
        return frozenset(names)

    return model.memoized(("spawn_targets",), compute, frozenset())


def group_created_under_guard(model: ModuleModel, answer: WhoRuns, item: Call) -> bool:
    """The condition that decided `answer` (who runs `item`) also guards the creation of the default
    process group, earlier in the same block: `if sub_rank == 0: init_process_group(...); ...
    all_reduce(t)`, where only the leaders of MPI sub-communicators join the torch group. Every
    member of that group entered the branch, so a collective there is run by all of its members."""
    guard = answer.guard
    if guard is None:
        return False
    place = answer.via if answer.via is not None else item
    return any(
        setup.function is place.function
        and setup.order < place.order
        and any(outer is guard for outer in setup.ctx.guards)
        for setup in model.calls_named(*PROCESS_GROUP_CALLS)
    )


def who_reads(model: ModuleModel, call: Call) -> WhoRuns:
    """Which processes use the value `call` builds: who runs each place that reads the name it is
    bound to (`reads.value_reads`). A preview `DataLoader` built on every rank but drawn from only
    under `if rank == 0 and epoch % plot_every == 0:` is read on rank 0 only. UNKNOWN when the reads
    cannot all be found or nothing reads it; ALL when the readers disagree (rank 0 in one place,
    every rank in another)."""
    readers = value_reads(model, call)
    if not readers:
        return WhoRuns(Runs.UNKNOWN)
    answers = [who_runs(model, reader) for reader in readers]
    kinds = {answer.runs for answer in answers}
    if len(kinds) == 2 and Runs.SINGLE in kinds:
        kinds.discard(Runs.SINGLE)  # the main process of a distributed run, or the only process
    if len(kinds) != 1:
        return WhoRuns(Runs.UNKNOWN if Runs.UNKNOWN in kinds else Runs.ALL)
    runs = kinds.pop()
    return next(answer for answer in answers if answer.runs is runs)


def route_runs(model: ModuleModel, route: Union[Route, Sequence[Union[Call, Assignment]]], sink: _Located) -> Runs:
    """Which processes a value reaches `sink` on: the sink's own answer, narrowed by every step of
    the value's path (an assignment in the single-process `else:`, a call site under rank 0). A
    literal that only arrives along a path where the job is one process is no multi-process bug."""
    steps = route.via if isinstance(route, Route) else route
    answers = {who_runs(model, sink).runs, *(who_runs(model, step).runs for step in steps)}
    for narrow in (Runs.SINGLE, Runs.RANK0, Runs.NONZERO, Runs.SUBSET, Runs.NODE0, Runs.UNKNOWN):
        if narrow in answers:
            return narrow
    return Runs.ALL


def reaches_several_processes(model: ModuleModel, route: Union[Route, Sequence[Union[Call, Assignment]]], sink: _Located) -> bool:
    """The value can arrive at `sink` along this path where more than one process runs it: the path
    can happen at all (`conditions.route_reaches`: no call site on it sits under a condition that
    rules out the sink's branch) and it is not narrowed to rank 0 or to a single-process run."""
    return route_reaches(model, route, sink) and route_runs(model, route, sink) not in (Runs.RANK0, Runs.SINGLE)


# ------------------------------------------------------------- which rank a condition tests

# "Main process" predicates that hold once per node (Accelerate, the HF Trainer, Lightning).
LOCAL_MAIN_PROCESS_NAMES = frozenset({"is_local_master", "is_local_main_process", "is_local_process_zero", "local_master"})


def node_index(model: ModuleModel, expr: Optional[cst.BaseExpression], order: int, function: Optional[Function], depth: int = 0) -> bool:
    """`args.nr`, `node_rank = int(os.environ["GROUP_RANK"])`, `SLURM_NODEID`: the index of the node,
    which every process of that node shares (so `== 0` holds on a whole node, not on one rank)."""
    if expr is None or depth > MAX_DEPTH:
        return False
    key = env_key(model, expr)
    if key is not None:
        return key in NODE_INDEX_ENV
    if isinstance(expr, cst.Call) and dotted_name(expr.func) == "int" and expr.args:
        return node_index(model, expr.args[0].value, order, function, depth + 1)
    name = dotted_name(expr)
    if name is None:
        return False
    if last_segment(name).lower() in NODE_INDEX_NAMES:
        return True
    return any(
        value is not expr and node_index(model, value, v_order, v_function, depth + 1)
        for value, v_order, v_function in model.leaf_values(expr, order, function)
    )


# Calls whose value names the machine: a path built from one is a per-node copy.
HOST_NAME_CALLS = frozenset({"socket.gethostname", "platform.node", "os.uname"})


def names_the_node(model: ModuleModel, expr: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    """The expression (a checkpoint path) holds the node index or the host name, followed through
    variables: a value that differs from node to node (each node writing its own file)."""
    values = [(expr, order, function)]
    if isinstance(expr, (cst.Name, cst.Attribute)):
        values += [v for v in model.leaf_values(expr, order, function) if v[0] is not expr]
    for value, v_order, v_function in values:
        for node in walk(value):
            if isinstance(node, (cst.Name, cst.Attribute)) and node_index(model, node, v_order, v_function):
                return True
            if isinstance(node, cst.Call) and (model.qualify(node.func) or "") in HOST_NAME_CALLS:
                return True
    return False


def tests_node_zero(model: ModuleModel, test: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    """`args.nr == 0`, `step % k == 0 and node_rank == 0`, `node_rank in [0]`: the node index
    compared with zero (a condition every process of node 0 passes)."""
    if isinstance(test, cst.BooleanOperation):
        return isinstance(test.operator, cst.And) and any(
            tests_node_zero(model, side, order, function) for side in (test.left, test.right)
        )
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    left, right = test.left, target.comparator
    if is_zero_literal(left):
        left, right = right, left
    zero = (isinstance(target.operator, cst.Equal) and is_zero_literal(right)) or (
        isinstance(target.operator, cst.In) and literal_ints(right) == [0]
    )
    return zero and node_index(model, left, order, function)


def guard_rank_kinds(model: ModuleModel, guard: Guard, depth: int = 0) -> frozenset[str]:
    """Which rank a rank condition compares: {"global"}, {"local"} (the local rank, an `mp.spawn`
    index, `rank % ngpus_per_node`, `is_local_main_process`), or both, leaving out single-process
    operands (`local_rank == -1`, `not args.distributed`). "unknown" when a part cannot be read."""
    return _rank_kinds(model, guard.test, guard.order, guard.function, depth)


def _rank_kinds(model: ModuleModel, test: cst.BaseExpression, order: int, function: Optional[Function], depth: int) -> frozenset[str]:
    if depth > MAX_DEPTH:
        return frozenset({"unknown"})
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _rank_kinds(model, test.expression, order, function, depth + 1)
    if isinstance(test, cst.BooleanOperation):
        out: set[str] = set()
        for side in flatten_boolean(test):
            if is_single_process_test(model, side) or is_single_process_test(model, side, True):
                continue
            if classify_rank_test(model, side, order, function, depth=depth + 1) is None and not _looks_like_rank_test(side):
                continue  # `epoch % save_every == 0` beside `rank == 0`: no rank in it
            out |= _rank_kinds(model, side, order, function, depth + 1)
        return frozenset(out)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        left = test.left if not isinstance(test.left, cst.Integer) else test.comparisons[0].comparator
        if isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Modulo):
            if rank_kind(model, left.left, order, function) is None:
                return frozenset({"unknown"})  # `step % k == 0`: a counter, not a rank
            return frozenset({"local"})  # `args.rank % ngpus_per_node == 0`: the first process of each node
        kind = rank_kind(model, left, order, function)
        if kind is None:
            return frozenset({"unknown"})
        if kind == "global":
            return frozenset({"global"})
        # "local" only when certain: the name says so, or every source of the value does. A rank
        # built up in steps (`args.rank = node * ngpus` then `args.rank += gpu`) is global.
        name = dotted_name(left)
        if name is not None and "local" in last_segment(name).lower():
            return frozenset({"local"})
        if rank_source(model, left, order, function) in ("local", "spawn"):
            return frozenset({"local"})
        return frozenset({"unknown"})
    name = dotted_name(test.func if isinstance(test, cst.Call) else test)
    if name is not None and not isinstance(test, cst.Call):
        # A flag bound to a rank test (`is_master = args.local_rank == 0`): what it compares, not its name.
        out = set()
        for value in model.reaching_values(test, order, function):
            if value is not test and isinstance(value, (cst.Comparison, cst.BooleanOperation, cst.UnaryOperation)):
                out |= _rank_kinds(model, value, order, function, depth + 1)
        # A flag raised under rank tests (`default_gpu = True` under `if rank == 0:`): what they compare.
        for guard in flag_raising_guards(model, test, order, function, depth + 1):
            out |= _rank_kinds(model, guard.test, guard.order, guard.function, depth + 1)
        if out:
            return frozenset(out)
    if name is not None and last_segment(name) in LOCAL_MAIN_PROCESS_NAMES:
        return frozenset({"local"})
    if is_main_process_predicate(model, test, order, function, depth):
        return frozenset({"global"})
    return frozenset({"unknown"})


def _gpu_count_of_one_process(model: ModuleModel, guard: Guard) -> bool:
    """`if args.n_gpu > 1:` in the legacy Hugging Face examples: the GPU count is the device count
    when `local_rank == -1` and set to 1 on the distributed path, so the branch (a DataParallel
    wrap, a `loss.mean()`) only runs in a single process. The count is followed to its values; when
    it cannot be (`args` handed to a helper), an assignment of a literal 1 to the same attribute
    anywhere in the module counts."""
    if guard.negated:
        return False
    return _above_one_but_set_to_one(model, guard.test, guard.order, guard.function)


def _above_one_but_set_to_one(model: ModuleModel, test: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    if isinstance(test, cst.BooleanOperation):
        return isinstance(test.operator, cst.And) and any(
            _above_one_but_set_to_one(model, side, order, function) for side in (test.left, test.right)
        )
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    bound = literal_int(target.comparator)
    above_one = (isinstance(target.operator, cst.GreaterThan) and bound == 1) or (
        isinstance(target.operator, cst.GreaterThanEqual) and bound == 2
    )
    name = dotted_name(test.left)
    if not above_one or name is None:
        return False
    leaves = model.leaf_values(test.left, order, function)
    if any(literal_int(value) == 1 for value, _, _ in leaves):
        return True
    if "." in name and all(value is test.left for value, _, _ in leaves):
        last = last_segment(name)
        return any(
            a.target.rsplit(".", 1)[-1] == last and a.value is not None and literal_int(a.value) == 1
            for a in model.assignments
        )
    return False


HOROVOD_INIT = "horovod.torch.init"


def local_rank_expression(model: ModuleModel, order: int, ctx: Context) -> Optional[str]:
    """Source text that holds this process's local rank at `order` (in `ctx`'s function, under its
    conditions), for a fix to use there; None when nothing is certain. In order of preference:

    - a variable or attribute (`local_rank`, `args.gpu`) bound before it in the same function, on
      every path that reaches it, to a value whose source is a local rank (LOCAL_RANK,
      `hvd.local_rank()`, `rank % device_count()`) or the mp.spawn index; the nearest wins;
    - the mp.spawn index parameter of the worker function itself;
    - `hvd.local_rank()` after `hvd.init()` in the same function, under no other condition.

    Never `args.local_rank` from argparse alone: under torchrun (no `--local-rank` argument) it
    keeps its default in every process. Never a value that falls back to a negative default
    (`os.environ.get("LOCAL_RANK", -1)`): a device index of -1 breaks the single-process run."""
    function = ctx.function
    found: list[tuple[int, str]] = []
    for assignment in model.assignments:
        if assignment.function is not function or assignment.order > order or assignment.value is None:
            continue
        if assignment.kind not in ("assign", "annassign"):
            continue
        if model.reaching_assignments(assignment.target, order, function) != [assignment]:
            continue
        if assignment.ctx.guards != ctx.guards[: len(assignment.ctx.guards)]:
            continue  # bound under a condition this point does not share
        if any(isinstance(n, cst.UnaryOperation) and isinstance(n.operator, cst.Minus) for n in walk(assignment.value)):
            continue
        if rank_source(model, assignment.value, assignment.order, function) in ("local", "spawn"):
            found.append((assignment.order, assignment.target))
    if found:
        return max(found)[1]
    if function is not None and function.params and _spawn_index(model, function.params[0], function):
        name = function.params[0]
        if all(a.kind == "param" for a in model.reaching_assignments(name, order, function)):
            return name
    local_rank = model.spelling("horovod.torch.local_rank")
    if local_rank is not None:
        for init in model.calls_named(HOROVOD_INIT):
            if init.function is function and init.order < order and init.ctx.guards == ctx.guards[: len(init.ctx.guards)]:
                return f"{local_rank}()"
    return None


def _tests_more_than_the_rank(model: ModuleModel, guard: Guard) -> bool:
    """`if rank == 0 and epoch % save_every == 0:` also tests a counter: it is not the script's
    test for "this is the main process", however it reads the rank."""
    if not isinstance(guard.test, cst.BooleanOperation):
        return False
    return any(
        classify_rank_test(model, side, guard.order, guard.function) is None
        and not is_single_process_test(model, side)
        and not is_single_process_test(model, side, True)
        for side in flatten_boolean(guard.test)
    )


def runs_on_global_rank0_only(model: ModuleModel, item: _Located) -> bool:
    """Only global rank 0 runs `item`: it sits under a test of the global rank (`if dist.get_rank()
    == 0:`, `if rank == 0 and epoch % k == 0:`), or in a helper called only there. Launchers give
    global rank 0 to the first process of the first node, whose local rank is 0 as well, so there
    the global rank is also the right GPU index. A test of the local rank (`if local_rank == 0:`,
    true once per node) does not count."""
    answer = who_runs(model, item)
    return answer.runs is Runs.RANK0 and answer.guard is not None and guard_rank_kinds(model, answer.guard) == frozenset({"global"})


def main_process_test(model: ModuleModel, at: Call) -> Optional[str]:
    """The script's own test for "this is the main process" (global rank 0), as written at one of
    its rank-0 branches, when the same text means the same thing at `at`: every name it reads is a
    top-level import, a module-level function, or a variable bound by the same assignments at both
    places (`rank == 0` from the same `rank = dist.get_rank()`). A branch in `at`'s own function is
    preferred; among the rest, the first. None when the script has no such test."""
    found = [
        (guard.function is not at.function, guard.order, model.code_of(guard.test))
        for guard in _main_process_guards(model)
        if all(_same_meaning(model, name, guard, at) for name in names_in(guard.test))
    ]
    return min(found)[2] if found else None


def _main_process_guards(model: ModuleModel) -> list[Guard]:
    """The script's rank-0 branches whose test is a plain test of the global rank (each once),
    found in one pass over its calls: `main_process_test` asks for them at every save."""

    def compute() -> list[Guard]:
        out: dict[int, Guard] = {}
        for call in model.calls:
            answer = who_runs(model, call)
            guard = answer.guard
            if answer.runs is not Runs.RANK0 or guard is None or guard.negated or answer.via is not None:
                continue
            if id(guard) in out:
                continue
            if guard_rank_kinds(model, guard) != frozenset({"global"}) or _tests_more_than_the_rank(model, guard):
                continue
            if flag_raising_guards(model, guard.test, guard.order, guard.function):
                continue  # a flag raised under `rank == 0` may stay False in the single-process run
            out[id(guard)] = guard
        return list(out.values())

    return model.memoized(("main process guards",), compute, [])


def _same_meaning(model: ModuleModel, name: str, guard: Guard, at: Call) -> bool:
    head = name.split(".")[0]
    if model.spelling(model.qualify(cst.Name(head)) or "") == head:
        return True
    if not model.assignments_to(head) and any(f.name == head and f.parent is None and f.klass is None for f in model.functions):
        return True
    if head in ("self", "cls") or guard.function is not at.function:
        return False
    here = model.reaching_assignments(head, at.order, at.function)
    return bool(here) and here == model.reaching_assignments(head, guard.order, guard.function)
