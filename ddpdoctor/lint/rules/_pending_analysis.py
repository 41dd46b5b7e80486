"""Facts the issue-11 rules need from the analysis layer, written against today's `facts`/`vocab`.

Transitional: each function here belongs in `ddpdoctor/lint/analysis/` (launch evidence, who runs
this, device values) and moves there when that package lands; the rules then import it from there.
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from ddpdoctor.lint import vocab
from ddpdoctor.lint.facts import MAX_DEPTH, Call, Function, Guard, ModuleFacts, dotted_name, walk

DEEPSPEED_INIT_CALLS = frozenset({"deepspeed.init_distributed", "deepspeed.initialize"})
PROCESS_GROUP_CALLS = frozenset({vocab.INIT_PROCESS_GROUP, *vocab.HOROVOD_INIT_CALLS, *DEEPSPEED_INIT_CALLS})

# ------------------------------------------------------------------------------------ launch evidence


def process_group_setup(facts: ModuleFacts) -> Optional[Call]:
    """The call that creates this script's process group (`init_process_group` with a world size not
    provably 1, `hvd.init()`, `deepspeed.init_distributed()` / `deepspeed.initialize()`), or None."""
    if facts.world_size == 1:
        return None
    for call in facts.calls_named(*PROCESS_GROUP_CALLS):
        if call.name == vocab.INIT_PROCESS_GROUP:
            world = call.arg(3, "world_size")
            if world is not None and facts.const_value(world, call.order, call.function) == 1:
                continue
        return call
    return None


def multiprocess_setup(facts: ModuleFacts) -> Optional[Call]:
    """`vocab.multiprocess_evidence`, which also knows DeepSpeed."""
    found = vocab.multiprocess_evidence(facts)
    if found is not None or facts.world_size == 1:
        return found
    calls = facts.calls_named(*DEEPSPEED_INIT_CALLS)
    return calls[0] if calls else None


_CUDA_STRING = re.compile(r"^(cuda|nccl)(:\d+)?$")


def uses_cuda(facts: ModuleFacts) -> bool:
    """The script puts something on a GPU: `.cuda()`, a `torch.cuda` call, a `"cuda"`/`"cuda:N"`
    device or the NCCL backend, `device_ids=`."""

    def compute() -> bool:
        if facts.method_calls("cuda") or any((c.name or "").startswith("torch.cuda.") for c in facts.calls):
            return True
        if any(arg.keyword is not None and arg.keyword.value == "device_ids" for c in facts.calls for arg in c.args):
            return True
        for node in walk(facts.module):
            if isinstance(node, cst.SimpleString) and _CUDA_STRING.match(str(node.evaluated_value)):
                return True
            if isinstance(node, cst.FormattedString) and node.start.lstrip("rRbBfF").startswith(("'cuda:", '"cuda:')):
                return True
        return False

    return facts.memoized(("uses_cuda",), compute, False)


# Names and launcher variables that hold the index of the node (machine), not of a process.
NODE_INDEX_NAMES = frozenset({"node_rank", "nr", "node_id", "node_idx", "node_index", "group_rank",
                              "machine_rank", "nodeid", "noderank"})
NODE_INDEX_ENV = frozenset({"GROUP_RANK", "NODE_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK"})
NODE_COUNT_NAMES = frozenset({"nnodes", "nodes", "num_nodes", "n_nodes", "num_machines", "world_nodes"})
NODE_COUNT_ENV = frozenset({"SLURM_NNODES", "SLURM_JOB_NUM_NODES", "GROUP_WORLD_SIZE"})


def node_index(facts: ModuleFacts, expr: Optional[cst.BaseExpression], order: int,
               function: Optional[Function], depth: int = 0) -> bool:
    """`args.nr`, `node_rank = int(os.environ["GROUP_RANK"])`, `SLURM_NODEID`: the node's index."""
    if expr is None or depth > MAX_DEPTH:
        return False
    key = vocab.env_key(facts, expr)
    if key is not None:
        return key in NODE_INDEX_ENV
    if isinstance(expr, cst.Call) and dotted_name(expr.func) == "int" and expr.args:
        return node_index(facts, expr.args[0].value, order, function, depth + 1)
    name = dotted_name(expr)
    if name is None:
        return False
    if name.rsplit(".", 1)[-1].lower() in NODE_INDEX_NAMES:
        return True
    return any(
        value is not expr and node_index(facts, value, v_order, v_function, depth + 1)
        for value, v_order, v_function in facts.leaf_values(expr, order, function)
    )


def multinode_evidence(facts: ModuleFacts) -> Optional[cst.CSTNode]:
    """Where the script shows it runs on several nodes: a node count or node index read from the
    command line (`--nnodes`, `--nodes`, `-nr`), the launcher (`GROUP_RANK`, `SLURM_NNODES`) or
    assigned (`node_rank = ...`). Stricter than "could be launched by torchrun"."""

    def compute() -> Optional[cst.CSTNode]:
        words = NODE_INDEX_NAMES | NODE_COUNT_NAMES
        for key, node in vocab.env_reads(facts):
            if key in NODE_INDEX_ENV or key in NODE_COUNT_ENV:
                return node
        for call in facts.method_calls("add_argument"):
            for arg in call.args:
                flag = arg.value
                if not isinstance(flag, cst.SimpleString):
                    continue
                text = str(flag.evaluated_value)
                is_option = text.startswith("-") if arg.keyword is None else arg.keyword.value == "dest"
                if is_option and text.lstrip("-").replace("-", "_").lower() in words:
                    return call.node
        for assignment in facts.assignments:
            if assignment.target.rsplit(".", 1)[-1].lower() in words and assignment.kind != "param":
                return assignment.node
        return None

    return facts.memoized(("multinode_evidence",), compute, None)


# ------------------------------------------------------------------------------------ who runs this


def single_process_only(facts: ModuleFacts, call: Call, depth: int = 0) -> bool:
    """The call only runs when the job is one process: under `not args.distributed`, the `else` of
    `if args.distributed:`, `local_rank == -1`, `world_size == 1`, `not dist.is_initialized()`,
    or `if args.n_gpu > 1:` where the distributed path sets `n_gpu = 1`; or in a helper whose every
    call site is such a path."""
    if any(_single_process_guard(facts, guard) for guard in call.ctx.guards):
        return True
    function = call.function
    if function is None or depth > 3:
        return False
    sites = [s for s in facts.call_sites(function) if s.function is not function]
    return bool(sites) and all(single_process_only(facts, site, depth + 1) for site in sites)


def _single_process_guard(facts: ModuleFacts, guard: Guard) -> bool:
    test = guard.test
    if vocab.is_not_distributed_test(facts, test, guard.negated):
        return True
    if isinstance(test, cst.BooleanOperation):
        is_and = isinstance(test.operator, cst.And) != guard.negated
        if is_and:
            sides = (test.left, test.right)
            return any(_single_process_guard(facts, Guard(s, guard.negated, guard.order, guard.function)) for s in sides)
        return False
    if guard.negated or not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    # `if args.n_gpu > 1:` (legacy Hugging Face examples): the GPU count kept for DataParallel is
    # set to 1 on the distributed path, so the branch only runs in a single process.
    target = test.comparisons[0]
    bound = target.comparator
    if not (
        isinstance(bound, cst.Integer)
        and (isinstance(target.operator, cst.GreaterThan) and bound.evaluated_value == 1
             or isinstance(target.operator, cst.GreaterThanEqual) and bound.evaluated_value == 2)
    ) or dotted_name(test.left) is None:
        return False
    for value, _, _ in facts.leaf_values(test.left, guard.order, guard.function):
        if isinstance(value, cst.Integer) and value.evaluated_value == 1:
            return True
    return False


def runs_on_every_rank(facts: ModuleFacts, call: Call, depth: int = 0) -> bool:
    """True when some path from the script's entry points reaches `call` with no rank or
    single-process condition on it. A method with no caller here counts as reached (its class is
    used elsewhere; `__init__` through `Klass(...)`); a module-level helper nobody here calls does
    not (who calls it, and under which check, is unknown)."""
    from ddpdoctor.lint.rules.unguarded_checkpoint_save import _looks_like_rank_test, instance_call_sites, spawn_targets

    for guard in call.ctx.guards:
        if _single_process_guard(facts, guard) or _looks_like_rank_test(guard.test):
            return False
        if vocab.classify_rank_test(facts, guard.test, guard.order, guard.function, guard.negated) is not None:
            return False
    function = call.function
    if function is None or (function.parent is None and function.name in spawn_targets(facts)):
        return True
    if depth > 4:
        return False
    sites = facts.call_sites(function) + instance_call_sites(facts, function)
    if function.name == "__init__" and function.klass is not None:
        sites += [c for c in facts.calls if c.dotted == function.klass]
    sites = [s for s in sites if s.function is not function]
    if not sites:
        return function.klass is not None
    return any(runs_on_every_rank(facts, site, depth + 1) for site in sites)


# ------------------------------------------------------------------------------------ devices


def local_device_expression(facts: ModuleFacts, call: Call) -> Optional[str]:
    """Source text for this process's own device where `call` runs: a variable bound (in the same
    function, before the call, on every path) to `torch.device("cuda", i)` / `f"cuda:{i}"`, or the
    local rank pinned with `torch.cuda.set_device(i)` before it. None when nothing is certain."""
    for assignment in facts.assignments:
        if assignment.function is not call.function or assignment.order > call.order or assignment.kind != "assign":
            continue
        value = assignment.value
        if value is None or "." in assignment.target:
            continue
        if facts.reaching_assignments(assignment.target, call.order, call.function) != [assignment]:
            continue
        if _is_local_cuda_device(facts, value, assignment.order, assignment.function):
            return assignment.target
    for pin in facts.calls_named("torch.cuda.set_device"):
        index = pin.arg(0, "device")
        if pin.function is not call.function or pin.order > call.order or pin.ctx.guards != call.ctx.guards[: len(pin.ctx.guards)]:
            continue
        name = dotted_name(index)
        if name is not None and vocab.rank_source(facts, index, pin.order, pin.function) in ("local", "spawn"):
            return f'f"cuda:{{{name}}}"'
    return None


def _is_local_cuda_device(facts: ModuleFacts, value: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    if isinstance(value, cst.Call) and facts.qualify(value.func) == "torch.device" and len(value.args) == 2:
        kind, index = value.args[0].value, value.args[1].value
        return (
            isinstance(kind, cst.SimpleString) and kind.evaluated_value == "cuda"
            and vocab.rank_source(facts, index, order, function) in ("local", "spawn")
        )
    if isinstance(value, cst.FormattedString):
        parts = value.parts
        return (
            len(parts) == 2 and isinstance(parts[0], cst.FormattedStringText) and parts[0].value == "cuda:"
            and isinstance(parts[1], cst.FormattedStringExpression)
            and vocab.rank_source(facts, parts[1].expression, order, function) in ("local", "spawn")
        )
    return False
