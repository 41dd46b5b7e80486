"""Files and folders that every rank of a distributed job writes at once.

Beyond `torch.save` (DDP008): a Hugging Face `save_pretrained`, `np.save`, a file opened for
writing (`json.dump` into it), a folder made after an exists check (`if not os.path.exists(d):
os.mkdir(d)`: between the check and the mkdir another rank makes it, and this one fails with
FileExistsError), a dataset constructed with `download=True`. When every rank runs one of these on
the same path, the writes interleave, one rank truncates what another is writing, or one rank
reads a half-written download.

Not a shared write: one under the main-process check (`ranks.who_runs`), a path that names the
rank or node, a per-item output of data split across ranks (`sharding.per_item_path`), a write
inside a rank-0-first block (`with accelerator.main_process_first():`,
`torch_distributed_zero_first(rank)`, or after the `if rank != 0: dist.barrier()` idiom),
`save_pretrained(..., is_main_process=...)`, a temporary or in-memory file, and code that runs in
the parent process before `mp.spawn` starts the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis.launch import (
    SPAWN_CALLS,
    dead_in_script,
    describe,
    env_reads,
    is_script,
    multiprocess_evidence,
)
from ddpdoctor.lint.analysis.model import Call, Function, ModuleModel, mentions
from ddpdoctor.lint.analysis.ranks import LAUNCHER_ENV, Runs, classify_rank_test, decided_by_guards, names_the_node, who_runs
from ddpdoctor.lint.analysis.sharding import per_item_path
from ddpdoctor.lint.analysis.summaries import IN_MEMORY, mentions_rank
from ddpdoctor.lint.analysis.syntax import dotted_name, flatten_boolean, last_segment, walk

NUMPY_WRITES = frozenset({"numpy.save", "numpy.savez", "numpy.savez_compressed", "numpy.savetxt"})
MKDIR_CALLS = frozenset({"os.mkdir", "os.makedirs"})
EXISTS_CALLS = frozenset({"os.path.exists", "os.path.isdir", "os.path.isfile"})
# pathlib's spelling of the same race: `if not out.exists(): out.mkdir(parents=True)`.
PATH_EXISTS_METHODS = frozenset({"exists", "is_dir"})
# Calls that start a process running a command (`[sys.executable, "train.py", f"--rank={i}"]`).
SUBPROCESS_CALLS = frozenset({"subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call"})
TEMP_PREFIXES = ("tempfile.",)
# Context managers that let the main process go first and the others follow (a barrier inside), or
# that let one process at a time in (`with FileLock(...):`, `with lock:`).
FIRST_WORDS = ("first", "lock")
# Calls that start the ranks and run a function in each, from a process that is not one of them.
LAUNCHER_CALLS = frozenset({*SPAWN_CALLS, "horovod.run", "horovod.spark.run", "horovod.spark.run_elastic"})
BARRIER = "torch.distributed.barrier"


@dataclass(frozen=True, eq=False)
class SharedWrite:
    call: Call
    path: Optional[cst.BaseExpression]
    what: str  # how a message names the write: "save_pretrained", "open(..., 'w')", ...
    kind: str  # "file", "mkdir" or "download"


def candidate_writes(model: ModuleModel) -> list[SharedWrite]:
    """Every call that writes a file or folder, whoever runs it."""
    out: list[SharedWrite] = []
    for call in model.calls:
        name = call.name or ""
        if call.attr == "save_pretrained" and call.receiver is not None:
            if call.arg(None, "is_main_process") is None and call.arg(None, "save_function") is None:
                out.append(SharedWrite(call, call.arg(0, "save_directory"), "save_pretrained", "file"))
        elif name in NUMPY_WRITES:
            out.append(SharedWrite(call, call.arg(0, "file"), last_segment(name).join(("np.", "")), "file"))
        elif call.dotted == "open" and call.name is None:
            mode = model.const_value(call.arg(1, "mode"), call.order, call.function)
            if isinstance(mode, str) and ("w" in mode or "x" in mode):
                out.append(SharedWrite(call, call.arg(0, "file"), f"open(..., {mode!r})", "file"))
        elif name in MKDIR_CALLS and _after_exists_check(model, call):
            exist_ok = call.arg(2, "exist_ok")
            if not (isinstance(exist_ok, cst.Name) and exist_ok.value == "True"):
                out.append(SharedWrite(call, call.arg(0, "path" if name == "os.mkdir" else "name"), last_segment(name).join(("os.", "")), "mkdir"))
        elif call.name is None and call.attr == "mkdir" and _after_path_exists_check(model, call):
            exist_ok = call.arg(2, "exist_ok")
            if not (isinstance(exist_ok, cst.Name) and exist_ok.value == "True"):
                out.append(SharedWrite(call, call.receiver, "Path.mkdir", "mkdir"))
        else:
            download = call.arg(None, "download")
            if isinstance(download, cst.Name) and download.value == "True":
                # The folder it downloads into: torchvision's `root`, the first argument.
                out.append(SharedWrite(call, call.arg(0, "root"), f"{call.dotted or name}(download=True)", "download"))
    return out


def launched_as_ranks(model: ModuleModel) -> Optional[tuple[cst.CSTNode, str]]:
    """Where the module shows it runs as one of several processes, with how a message names it: the
    launch evidence every rule uses (`init_process_group`, a DDP wrap, `hvd.init()`, `mp.spawn`), or
    else a read of a variable torchrun sets in each process (`LOCAL_RANK`, `WORLD_SIZE`): a Hugging
    Face Trainer script leaves the process group to the Trainer but reads them for its device map."""
    setup = multiprocess_evidence(model)
    if setup is not None:
        return setup.node, describe(setup)
    for key, node in env_reads(model):
        if key in LAUNCHER_ENV or key == "WORLD_SIZE":
            return node, f"it reads {key}"
    return None


def every_rank_writes(model: ModuleModel) -> list[SharedWrite]:
    """The writes of `candidate_writes` that every rank runs on one shared path (see the module
    docstring for what is left out)."""
    return [write for write in candidate_writes(model) if _shared(model, write)]


def _shared(model: ModuleModel, write: SharedWrite) -> bool:
    call = write.call
    if dead_in_script(model, call.function) or in_launcher_parent(model, call):
        return False
    runs = who_runs(model, call).runs
    if runs is Runs.UNKNOWN and decided_by_guards(model, call.ctx.guards) is None and launched(model, call.function):
        runs = Runs.ALL  # the body of the function a launcher runs in every worker
    if runs is not Runs.ALL or rank0_or_other_case(model, call):
        return False
    if rank_zero_first(model, call):
        return False
    path = write.path
    if path is not None:
        if mentions_rank(model, path, call.order, call.function) or names_the_node(model, path, call.order, call.function):
            return False
        if per_item_path(model, path, call.order, call.function):
            return False
        if model.origin_names(path, call.order, call.function) & IN_MEMORY:
            return False
        if mentions(model, path, call.order, call.function, _temporary):
            return False
    return True


def _temporary(model: ModuleModel, node: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    """A path made by `tempfile` (`mkdtemp()`, `NamedTemporaryFile().name`): private to the process."""
    return isinstance(node, cst.Call) and (model.qualify(node.func) or "").startswith(TEMP_PREFIXES)


def rank0_or_other_case(model: ModuleModel, call: Call) -> bool:
    """The call runs under `rank == 0 or <something else>` (`if torch.cuda.device_count() == 1 or
    dist.get_rank() == 0:`): the main process, plus a case the analysis cannot read, which the
    author wrote as an alternative to it, not as "every rank"."""
    for guard in call.ctx.guards:
        test = guard.test
        if guard.negated or not isinstance(test, cst.BooleanOperation) or not isinstance(test.operator, cst.Or):
            continue
        if any(classify_rank_test(model, side, guard.order, guard.function) == "rank0" for side in flatten_boolean(test)):
            return True
    return False


def _after_exists_check(model: ModuleModel, call: Call) -> bool:
    """The call runs under a test of whether the path exists (`if not os.path.exists(d):`)."""
    return any(
        isinstance(node, cst.Call) and model.qualify(node.func) in EXISTS_CALLS
        for guard in call.ctx.guards for node in walk(guard.test)
    )


def _after_path_exists_check(model: ModuleModel, call: Call) -> bool:
    """`out.mkdir()` under a test of `out.exists()` / `out.is_dir()` on the same path object."""
    receiver = call.receiver
    if receiver is None:
        return False
    path = model.code_of(receiver)
    return any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in PATH_EXISTS_METHODS and not node.args
        and model.code_of(node.func.value) == path
        for guard in call.ctx.guards for node in walk(guard.test)
    )


def rank_zero_first(model: ModuleModel, call: Call) -> bool:
    """The call runs after the main process has gone first: inside a `with` whose name says so
    (`main_process_first()`, `torch_distributed_zero_first(rank)`), or after a barrier that only the
    other ranks wait at (`if rank != 0: dist.barrier()`) earlier in the same function."""
    for context in call.ctx.withs:
        written = dotted_name(context.func if isinstance(context, cst.Call) else context) or ""
        if any(word in last_segment(written).lower() for word in FIRST_WORDS):
            return True
    return any(
        barrier.function is call.function and barrier.order < call.order
        and who_runs(model, barrier).runs is Runs.NONZERO
        for barrier in model.calls_named(BARRIER)
    )


def launched(model: ModuleModel, function: Optional[Function]) -> bool:
    """`function` is the one a launcher call of this module runs in every worker
    (`horovod.spark.run(train_fn)`, `mp.spawn(worker)`), or the entry point a script hands to a
    command-line framework (`fire.Fire(train)`), which every process the launcher starts runs."""
    if function is None or function.parent is not None or function.klass is not None:
        return False
    if any(dotted_name(launch.arg(0)) == function.name for launch in model.calls_named(*LAUNCHER_CALLS)):
        return True
    return is_script(model) and any(
        call.function is None and any(dotted_name(arg.value) == function.name for arg in call.args)
        for call in model.calls
    )


def in_launcher_parent(model: ModuleModel, call: Call) -> bool:
    """The call runs in the process that starts the ranks (`mp.spawn(worker)`,
    `horovod.spark.run(train_fn)`), not in the ranks: in the function that makes the launching call,
    or at module level, of a script whose ranks are started so."""
    launches = model.calls_named(*LAUNCHER_CALLS)
    function = call.function
    if launches:
        if function is None:
            return True
        if any(launch.function is function for launch in launches):
            return True
    # A launcher written by hand (NVIDIA's `multiproc.py`, waveglow's `distributed.py`): a function
    # that starts the Python interpreter once per worker, in a loop, is the parent of the ranks,
    # not one of them; the process group its module creates is created by the workers it starts.
    return function is not None and any(
        started.function is function and started.ctx.loops and _runs_python(model, started)
        for started in model.calls_named(*SUBPROCESS_CALLS)
    )


def _runs_python(model: ModuleModel, call: Call) -> bool:
    """The command a subprocess call runs starts with the Python interpreter (`sys.executable`,
    `"python"`), written in the call or in the list variable it is given."""
    command = call.arg(0, "args")
    if command is None:
        return False
    for value, _, _ in model.leaf_values(command, call.order, call.function):
        if isinstance(value, cst.BinaryOperation):
            value = value.left  # `[sys.executable] + args_list`
        if isinstance(value, (cst.List, cst.Tuple)) and value.elements:
            first = value.elements[0].value
            if isinstance(first, cst.Call) and dotted_name(first.func) == "str" and len(first.args) == 1:
                first = first.args[0].value  # `[str(sys.executable)] + args_list`
            if model.qualify(first) == "sys.executable":
                return True
            if isinstance(first, cst.SimpleString) and str(first.evaluated_value).startswith("python"):
                return True
    return False
