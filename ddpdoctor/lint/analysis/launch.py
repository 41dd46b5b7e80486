"""Launch evidence in one place: is this script one of several processes, and what the launcher
tells each of them through the environment.

torchrun / `torch.distributed.launch` / elastic agents, `mp.spawn`, Horovod (`hvd.init()`),
DeepSpeed (`deepspeed.init_distributed()`, `deepspeed.initialize()`, the `deepspeed` launcher) and
SLURM all start N copies of a script; the checkpoint, sampler and device rules only make sense there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis.launchfiles import MULTI_NODE, Launch, multi_process_launch, node_verdict, project_launches
from ddpdoctor.lint.analysis.launchfiles import UNKNOWN as UNKNOWN_LAUNCH
from ddpdoctor.lint.analysis.model import MAX_DEPTH, UNKNOWN, Assignment, Call, Function, ModuleModel
from ddpdoctor.lint.analysis.syntax import dotted_name, walk

INIT_PROCESS_GROUP = "torch.distributed.init_process_group"
DDP_CLASS = "torch.nn.parallel.DistributedDataParallel"
HOROVOD_INIT_CALLS = frozenset(
    {"horovod.torch.init", "horovod.tensorflow.init", "horovod.keras.init", "horovod.tensorflow.keras.init"}
)
# The number of Horovod workers (and its per-node and cross-node factors).
HOROVOD_SIZE_CALLS = frozenset(
    f"{module}.{function}" for module in ("horovod.torch",) for function in ("size", "local_size", "cross_size")
)
GPU_COUNT = "torch.cuda.device_count"
SPAWN_CALLS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
# Words one of which a multi-process script's source contains (the engine's cheap pre-filter).
LAUNCH_WORDS = (
    "init_process_group", "DistributedDataParallel", "horovod", "deepspeed", "spawn", "start_processes",
    "elastic_launch",
)
# DeepSpeed sets up torch.distributed itself; its launcher (`deepspeed train.py`) starts one process per GPU.
DEEPSPEED_INIT_CALLS = frozenset({"deepspeed.init_distributed", "deepspeed.initialize"})
ELASTIC_LAUNCH_CALLS = frozenset(
    {"torch.distributed.launcher.api.elastic_launch", "torch.distributed.launcher.elastic_launch",
     "torch.distributed.run.main", "torch.distributed.run.run"}
)


def multiprocess_evidence(model: ModuleModel) -> Optional[Call]:
    """The call that makes this a multi-process training script, or None.

    `init_process_group` with a world size that is not provably 1 and a backend that is not torch's
    single-process `fake` one; without any init in this file, wrapping in DDP, `hvd.init()`,
    `deepspeed.init_distributed()` / `deepspeed.initialize()` (the DeepSpeed launcher), `mp.spawn`
    or an elastic launch. A script whose every init is `world_size=1` or `backend="fake"` (or that
    is linted with --world-size 1) is a single process."""
    if model.world_size == 1:
        return None
    inits = model.calls_named(INIT_PROCESS_GROUP)
    if inits:
        for call in inits:
            if is_fake_backend(model, call):
                continue
            world = call.arg(3, "world_size")
            if world is None or model.const_value(world, call.order, call.function) != 1:
                return call
            if _one_only_by_option_default(model, world, call) and launched_as_several(model):
                return call
        return None
    for names in (
        (DDP_CLASS,), tuple(HOROVOD_INIT_CALLS), tuple(DEEPSPEED_INIT_CALLS), tuple(SPAWN_CALLS),
        tuple(ELASTIC_LAUNCH_CALLS),
    ):
        # A DDP wrap left in a helper nothing in the script calls (its call, and the init, commented
        # out) is no sign that the script runs as several processes. In a library module the
        # helper's callers are elsewhere, so there it still counts.
        calls = [call for call in model.calls_named(*names) if not dead_in_script(model, call.function)]
        if calls:
            return calls[0]
    return None


def is_script(model: ModuleModel) -> bool:
    """The module has a top-level `if __name__ == "__main__":`: a program of its own, whose
    functions run when it calls them, not a library whose callers live in other files."""
    return model.memoized(
        ("is_script",),
        lambda: any(isinstance(statement, cst.If) and _is_main_guard(statement.test) for statement in model.module.body),
        False,
    )


def _is_main_guard(test: cst.BaseExpression) -> bool:
    """`__name__ == "__main__"`, either way round."""
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)):
        return False
    sides = (test.left, test.comparisons[0].comparator)
    names = {dotted_name(side) for side in sides}
    strings = {side.evaluated_value for side in sides if isinstance(side, cst.SimpleString)}
    return "__name__" in names and "__main__" in strings


def dead_in_script(model: ModuleModel, function: Optional[Function]) -> bool:
    """`function` is a helper of a script that the script never calls nor hands on: dead code
    (its call commented out). In a library module its callers may be in other files: not dead."""
    return function is not None and is_script(model) and not runs_in_module(model, function)


def _one_only_by_option_default(model: ModuleModel, world: cst.BaseExpression, call: Call) -> bool:
    """`world_size=args.world_size` whose 1 is the command-line option's default: what the
    launch passes decides, not the default."""
    return any(
        (dotted_name(leaf) or "").count(".") == 1 and model.argparse_default(dotted_name(leaf) or "") is not None
        for leaf in [world, *(v for v, _, _ in model.leaf_values(world, call.order, call.function))]
    )


def launched_as_several(model: ModuleModel) -> Optional[str]:
    """Why the script runs as several processes whatever its options' defaults say, or None: it
    reads its local rank from the launcher's environment (`os.environ["LOCAL_RANK"]`), or a launch
    file of the project runs it with a launcher or several processes (the file and line)."""
    for key, node in env_reads(model):
        if key in LOCAL_RANK_ENV:
            return f"it reads {key} from the launcher (line {model.line_of(node)})"
    several = multi_process_launch(launches(model))
    return f"{several.where()} starts it with {several.launcher}" if several is not None else None


# The launcher's per-node process index (also in ranks, which sits above this module).
LOCAL_RANK_ENV = frozenset({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})


def launches(model: ModuleModel) -> list[Launch]:
    """The launch lines of the project's launch files that run this module's file (shell scripts,
    SLURM batch files, Makefiles, YAML/JSON configs, README commands). Empty without a project."""
    return model.memoized(
        ("launch-file-launches",), lambda: project_launches(model.project, Path(model.path)), []
    )


def launch_file_nodes(model: ModuleModel) -> tuple[str, Optional[Launch]]:
    """What the project's launch files say of the node count this script runs on, and the launch
    relied on: launchfiles.MULTI_NODE (some launch spans nodes), launchfiles.SINGLE_NODE (every launch
    stays on one node), launchfiles.UNKNOWN (no launch of it found, or one whose node count is not
    written down)."""
    return node_verdict(launches(model))


def launch_file_processes(model: ModuleModel) -> tuple[str, Optional[Launch]]:
    """The same question for processes, the one rules ask when one process is the only safe case:
    (launchfiles.MULTI_NODE, launch) when some launch spans nodes; ("one process", launch) when every
    launch is a single process on a single node; ("several processes", launch) when one starts
    several (or uses a launcher); (launchfiles.UNKNOWN, None) otherwise."""
    found = launches(model)
    verdict, launch = node_verdict(found)
    if verdict == MULTI_NODE:
        return verdict, launch
    if found and all(f.one_process for f in found):
        return ONE_PROCESS, found[0]
    several = multi_process_launch(found)
    if several is not None:
        return SEVERAL_PROCESSES, several
    return UNKNOWN_LAUNCH, None


ONE_PROCESS = "one process"

SEVERAL_PROCESSES = "several processes"


def single_node_rendezvous(model: ModuleModel) -> bool:
    """Every process group this module creates meets on the loopback interface, so the job cannot
    span nodes: there the global rank is the local rank and the GPU count the world size."""
    inits = model.calls_named(INIT_PROCESS_GROUP)
    return bool(inits) and all(is_loopback_rendezvous(model, init) for init in inits)


def is_fake_backend(model: ModuleModel, init: Call) -> bool:
    """`init_process_group("fake", ...)`: torch's FakeProcessGroup, one process simulating the
    whole world (tracing and sharding tools)."""
    backend = model.const_value(init.arg(0, "backend"), init.order, init.function)
    return isinstance(backend, str) and backend.lower() == "fake"


def may_create_nccl_group(model: ModuleModel, init: Call) -> bool:
    """Whether this `init_process_group` call creates an NCCL group on a GPU run, as far as the
    module can tell: a backend naming NCCL (on either arm of `"gloo" if cpu else "nccl"`, or as
    the argparse default of the option passed), or no backend at all, which since torch 2.0 gives
    every CUDA tensor an NCCL group ("cuda:nccl,cpu:gloo"). A backend the module cannot read, and
    `**kwargs` that may carry one, are not."""
    if init.has_star_args():
        return False
    backend = init.arg(0, "backend")
    if backend is None:
        return True
    values = [_backend_name(model, leaf) for leaf, _, _ in model.leaf_values(backend, init.order, init.function)]
    if any(value is None for value in values):
        # An argparse option or an unknown variable: try its literal value (argparse default).
        value = model.const_value(backend, init.order, init.function)
        if value is UNKNOWN:
            value = _option_default(model, backend)
        return isinstance(value, str) and "nccl" in value.lower()
    # `"gloo" if args.cpu else "nccl"`: the run that takes the NCCL arm needs its device pinned.
    return any("nccl" in value.lower() for value in values if value is not None)


def _option_default(model: ModuleModel, expr: cst.BaseExpression) -> object:
    """The argparse default of `self.args.dist_backend` / `cfg.args.backend`: the namespace
    reached through an attribute, which `const_value` does not follow."""
    name = dotted_name(expr)
    if name is None or name.count(".") < 2:
        return UNKNOWN
    default = model.argparse_default("args." + name.rsplit(".", 1)[-1])
    if default is None:
        return UNKNOWN
    return model.const_value(default, 0, None)


def _backend_name(model: ModuleModel, expr: cst.BaseExpression) -> Optional[str]:
    """`"nccl"`, `dist.Backend.NCCL` → "NCCL"; None for anything else."""
    if isinstance(expr, cst.SimpleString):
        return str(expr.evaluated_value)
    name = model.qualify(expr)
    if name is not None and name.startswith("torch.distributed.Backend."):
        return name.rsplit(".", 1)[-1]
    return None


# Rendezvous addresses on this machine's loopback interface: every rank is on this node.
LOOPBACK_URLS = ("tcp://127.", "tcp://localhost:", "tcp://[::1]:")


def is_loopback_rendezvous(model: ModuleModel, init: Call) -> bool:
    """`init_method` names the loopback interface on every path: `"tcp://127.0.0.1:29500"`,
    `f"tcp://localhost:{port}"`, `"tcp://127.0.0.1:%d" % port`, `"tcp://127.0.0.1:" + str(port)`,
    `"tcp://127.0.0.1:{}".format(port)`, directly or through variables. Such a job cannot span nodes."""
    method = init.arg(1, "init_method")
    if method is None:
        return False
    leaves = model.leaf_values(method, init.order, init.function)
    prefixes = [_literal_prefix(leaf) for leaf, _, _ in leaves]
    return bool(prefixes) and all(p is not None and p.startswith(LOOPBACK_URLS) for p in prefixes)


def _literal_prefix(expr: cst.BaseExpression) -> Optional[str]:
    """The text a string expression certainly starts with, or None."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(expr, cst.ConcatenatedString):  # `"tcp://" "127.0.0.1:29500"`
        head = _literal_prefix(expr.left)
        if head is None or not isinstance(expr.left, cst.SimpleString):
            return head
        return head + (_literal_prefix(expr.right) or "")
    if isinstance(expr, cst.FormattedString):
        first = expr.parts[0] if expr.parts else None
        return first.value if isinstance(first, cst.FormattedStringText) else None
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Modulo, cst.Add)):
        return _literal_prefix(expr.left)  # `"tcp://127.0.0.1:%d" % port`, `"tcp://127.0.0.1:" + port`
    if (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "format"):
        return _literal_prefix(expr.func.value)
    return None


def describe(call: Call) -> str:
    """How a message names the evidence: "init_process_group", "hvd.init()", ..."""
    name = call.name or ""
    if name == INIT_PROCESS_GROUP:
        return "init_process_group"
    if name == DDP_CLASS:
        return "DistributedDataParallel"
    if name in HOROVOD_INIT_CALLS:
        return "hvd.init()"
    if name in DEEPSPEED_INIT_CALLS:
        return f"{name}()"
    if name in SPAWN_CALLS:
        return "mp.spawn"
    return f"{call.dotted or name}()"


def env_reads(model: ModuleModel) -> list[tuple[str, cst.CSTNode]]:
    """Every environment variable the module reads, with the node that reads it:
    `os.environ["X"]`, `os.environ.get("X")`, `os.getenv("X")` and `"X" in os.environ`. Walks the
    tree, so call it only once a rule has a candidate finding."""

    def is_store(node: cst.CSTNode) -> bool:
        # `os.environ["RANK"] = str(rank)` sets the variable; it is not read here.
        return isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Subscript)

    out: list[tuple[str, cst.CSTNode]] = []
    for node in walk(model.module, skip=is_store):
        if isinstance(node, (cst.Subscript, cst.Call)):
            key = env_key(model, node)
            if key is not None:
                out.append((key, node))
        elif isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            target = node.comparisons[0]
            if (
                isinstance(target.operator, (cst.In, cst.NotIn))
                and isinstance(node.left, cst.SimpleString)
                and model.qualify(target.comparator) == "os.environ"
            ):
                out.append((str(node.left.evaluated_value), node))
    return out


def runs_in_module(model: ModuleModel, function: Optional[Function], depth: int = 0) -> bool:
    """False when `function` is a module-level helper this module never calls nor hands on
    (`mp.spawn(worker)`, `Process(target=worker)`), even through its callers: a utils module's
    `setup()` that other files call, after doing their own set-up. Methods count as running (their
    class is instantiated elsewhere), and so does anything undecidable."""
    if function is None or function.klass is not None or depth > 4:
        return True
    return model.memoized(("runs_in_module", id(function)), lambda: _runs_in_module(model, function, depth), True)


def _runs_in_module(model: ModuleModel, function: Function, depth: int) -> bool:
    if isinstance(function.node, cst.FunctionDef) and function.node.decorators:
        return True  # registered with a framework (`@hydra.main`, `@record`, a CLI command)
    if any(runs_in_module(model, site.function, depth + 1) for site in model.call_sites(function)):
        return True
    return function.name in _names_handed_on(model)


def _names_handed_on(model: ModuleModel) -> frozenset[str]:
    """Names passed as arguments somewhere (`mp.spawn(worker)`, `Process(target=worker)`)."""

    def compute() -> frozenset[str]:
        return frozenset(
            name for call in model.calls for arg in call.args if (name := dotted_name(arg.value)) is not None
        )

    return model.memoized(("names_handed_on",), compute, frozenset())


def env_key(model: ModuleModel, expr: cst.BaseExpression) -> Optional[str]:
    """`os.environ["X"]`, `os.environ.get("X", d)`, `os.getenv("X")` -> "X" (through int()/str())."""
    if isinstance(expr, cst.Call) and _call_name(model, expr) in ("int", "str", "builtins.int"):
        if expr.args:
            return env_key(model, expr.args[0].value)
        return None
    if isinstance(expr, cst.Subscript):
        base = model.qualify(expr.value) or ""
        if base in ("os.environ",) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
            key = expr.slice[0].slice.value
            if isinstance(key, cst.SimpleString):
                return str(key.evaluated_value)
    if isinstance(expr, cst.Call):
        name = _call_name(model, expr)
        if name in ("os.environ.get", "os.getenv") and expr.args:
            key = expr.args[0].value
            if isinstance(key, cst.SimpleString):
                return str(key.evaluated_value)
    return None


def _call_name(model: ModuleModel, call: cst.Call) -> Optional[str]:
    qualified = model.qualify(call.func)
    if qualified:
        return qualified
    if isinstance(call.func, cst.Name):
        return call.func.value
    return None



def env_copy_key(
    model: ModuleModel, expr: cst.BaseExpression, order: int, function: Optional[Function]
) -> Optional[str]:
    """`env["RANK"]` where `env` is a copy of the environment: `dict(os.environ)`,
    `os.environ.copy()`, or `{key: os.environ[key] for key in (...)}` (pytorch/examples)."""
    if not isinstance(expr, cst.Subscript) or len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
        return None
    key = expr.slice[0].slice.value
    if not isinstance(key, cst.SimpleString):
        return None
    leaves = model.leaf_values(expr.value, order, function)
    if not leaves:
        return None
    for value, _, _ in leaves:
        if isinstance(value, cst.DictComp):
            inner = value.value
            if not (isinstance(inner, cst.Subscript) and model.qualify(inner.value) == "os.environ"):
                return None
        elif isinstance(value, cst.Call):
            name = model.qualify(value.func) or ""
            is_copy = name == "os.environ.copy" or (
                isinstance(value.func, cst.Name) and value.func.value == "dict" and len(value.args) == 1
                and model.qualify(value.args[0].value) == "os.environ"
            )
            if not is_copy:
                return None
        else:
            return None
    return str(key.evaluated_value)


# ------------------------------------------------------------------ process groups and several nodes

PROCESS_GROUP_CALLS = frozenset({INIT_PROCESS_GROUP, *HOROVOD_INIT_CALLS, *DEEPSPEED_INIT_CALLS})
# The index of the node (machine) a process runs on, not of the process: launcher variables, and
# the names scripts give it (`--node_rank`, the `-nr` of the classic multi-node spawn tutorial).
NODE_INDEX_ENV = frozenset({"GROUP_RANK", "NODE_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK"})
NODE_INDEX_NAMES = frozenset(
    {"node_rank", "nr", "node_id", "node_idx", "node_index", "group_rank", "machine_rank", "nodeid", "noderank"}
)
NODE_COUNT_ENV = frozenset({"SLURM_NNODES", "SLURM_JOB_NUM_NODES", "GROUP_WORLD_SIZE"})
NODE_COUNT_NAMES = frozenset({"nnodes", "nodes", "num_nodes", "n_nodes", "num_machines"})


def process_group_setup(model: ModuleModel) -> Optional[Call]:
    """The call that creates this script's process group: `init_process_group` with a world size
    not provably 1, `hvd.init()`, `deepspeed.init_distributed()` / `deepspeed.initialize()`. Unlike
    `multiprocess_evidence`, a DDP wrap or `mp.spawn` alone does not count (a script may spawn
    workers that are not ranks of one job)."""
    if model.world_size == 1:
        return None
    for call in model.calls_named(*PROCESS_GROUP_CALLS):
        if call.name == INIT_PROCESS_GROUP:
            world = call.arg(3, "world_size")
            if world is not None and model.const_value(world, call.order, call.function) == 1:
                continue
        return call
    return None


def multinode_evidence(model: ModuleModel) -> Optional[cst.CSTNode]:
    """Where the script shows it runs on several nodes: a node count or node index it reads from the
    launcher (`GROUP_RANK`, `SLURM_NNODES`), takes on the command line (`--nnodes`, `--nodes`,
    `-nr`) or assigns (`node_rank = ...`). Stricter than "could be started by torchrun": a script
    with none of these is taken to run on one node."""

    def compute() -> Optional[cst.CSTNode]:
        words = NODE_INDEX_NAMES | NODE_COUNT_NAMES
        for key, node in env_reads(model):
            if key in NODE_INDEX_ENV or key in NODE_COUNT_ENV:
                return node
        for call in model.method_calls("add_argument"):
            for arg in call.args:
                if not isinstance(arg.value, cst.SimpleString):
                    continue
                text = str(arg.value.evaluated_value)
                is_option = text.startswith("-") if arg.keyword is None else arg.keyword.value == "dest"
                if is_option and text.lstrip("-").replace("-", "_").lower() in words:
                    return call.node
        for assignment in model.assignments:
            if assignment.kind != "param" and assignment.target.rsplit(".", 1)[-1].lower() in words:
                return assignment.node
        return None

    return model.memoized(("multinode_evidence",), compute, None)



# ------------------------------------------------------------ values built from the number of workers

SCALED, UNSCALED, UNKNOWN_SCALING = "scaled", "unscaled", "unknown"


def mentions_calls(
    model: ModuleModel, node: Optional[cst.CSTNode], names: frozenset[str], order: int, function: Optional[Function],
    depth: int = 0,
) -> bool:
    """True when a call to one of `names` (`hvd.size()`) is part of an expression, followed through
    variables (`lr *= hvd.size()` included), helper parameters to their call sites, and the bodies of
    local functions it names (an `lr_lambda=warmup` scheduler function)."""
    if node is None or depth > MAX_DEPTH:
        return False
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call) and model.qualify(current.func) in names:
            return True
        if isinstance(current, (cst.Name, cst.Attribute)) and dotted_name(current) is not None:
            name = dotted_name(current) or ""
            for value in model.reaching_values(current, order, function):
                if value is not current and mentions_calls(model, value, names, order, function, depth + 1):
                    return True
            for value, v_order, v_function in model.leaf_values(current, order, function):
                if value is not current and mentions_calls(model, value, names, v_order, v_function, depth + 1):
                    return True
            if any(any(c.name in names for c in local.calls) for local in model.functions_named(name)):
                return True
            continue
        stack.extend(c for c in current.children if not isinstance(c, cst.BaseParenthesizableWhitespace))
    return False


def mentions_names(model: ModuleModel, node: cst.CSTNode, names: frozenset[str]) -> bool:
    """True when an expression reads one of the import-resolved `names` (`op=hvd.Adasum`, also inside
    `hvd.Adasum if args.use_adasum else hvd.Average`)."""
    return any(model.qualify(current) in names for current in walk(node) if isinstance(current, (cst.Name, cst.Attribute)))


def scaling_by(
    model: ModuleModel, expr: cst.BaseExpression, names: frozenset[str], order: int, function: Optional[Function],
    depth: int = 0,
) -> str:
    """Whether a numeric value (a learning rate) is multiplied by one of the calls `names`: SCALED
    when such a call is part of it on some path, UNSCALED when the value is fully known (literals,
    argparse defaults used as they are) and has no such factor, UNKNOWN_SCALING otherwise (a config
    object, a function outside the project)."""
    if depth > MAX_DEPTH:
        return UNKNOWN_SCALING
    if mentions_calls(model, expr, names, order, function):
        return SCALED
    if isinstance(expr, (cst.Integer, cst.Float)):
        return UNSCALED
    if isinstance(expr, cst.UnaryOperation):
        return scaling_by(model, expr.expression, names, order, function, depth + 1)
    if isinstance(expr, cst.BinaryOperation):
        return _combine_scaling(
            scaling_by(model, expr.left, names, order, function, depth + 1),
            scaling_by(model, expr.right, names, order, function, depth + 1),
        )
    if isinstance(expr, cst.IfExp):
        # `base * hvd.size() if not args.use_adasum else base`: scaled on the sum/average path.
        return _combine_scaling(
            scaling_by(model, expr.body, names, order, function, depth + 1),
            scaling_by(model, expr.orelse, names, order, function, depth + 1),
        )
    if isinstance(expr, cst.Call):
        if dotted_name(expr.func) in ("float", "int") and len(expr.args) == 1:
            return scaling_by(model, expr.args[0].value, names, order, function, depth + 1)
        return UNKNOWN_SCALING
    if dotted_name(expr) is None:
        return UNKNOWN_SCALING
    verdicts = []
    for value, v_order, v_function in model.leaf_values(expr, order, function):
        value_name = dotted_name(value)
        if value_name is not None:
            # A name that cannot be followed further. `args.lr` straight from the command line is
            # the value the user typed; anything else (a config object) is unknown.
            known = "." in value_name and model.argparse_default(value_name) is not None
            verdicts.append(UNSCALED if known else UNKNOWN_SCALING)
        else:
            verdicts.append(scaling_by(model, value, names, v_order, v_function, depth + 1))
    if not verdicts:
        return UNKNOWN_SCALING
    result = verdicts[0]
    for verdict in verdicts[1:]:
        result = _combine_scaling(result, verdict)
    return result


def _combine_scaling(left: str, right: str) -> str:
    if SCALED in (left, right):
        return SCALED
    if UNKNOWN_SCALING in (left, right):
        return UNKNOWN_SCALING
    return UNSCALED


def batch_divided_among_workers(model: ModuleModel, worker_counts: frozenset[str]) -> Optional[Assignment]:
    """An assignment to a batch size that divides by the number of workers
    (`args.batch_size = int(args.batch_size / hvd.size())`) or by the node's GPU count
    (`batch_size // torch.cuda.device_count()`, one worker per GPU): the per-worker batch is a global
    batch shared among the workers, so the global batch stays what it was."""
    divisors = worker_counts | {GPU_COUNT}
    for assignment in model.assignments:
        if "batch" not in assignment.target.rsplit(".", 1)[-1].lower() or assignment.value is None:
            continue
        for node in walk(assignment.value):
            if (
                isinstance(node, cst.BinaryOperation)
                and isinstance(node.operator, (cst.Divide, cst.FloorDivide))
                and mentions_calls(model, node.right, divisors, assignment.order, assignment.function)
            ):
                return assignment
    return None
