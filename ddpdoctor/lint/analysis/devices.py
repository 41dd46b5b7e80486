"""Which GPU a process uses: the calls that pin it, the arguments that name a device, the idiom of
one visible GPU per process, and what each device value says about the index."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import libcst as cst

from ddpdoctor.lint.analysis.harness import in_test_case
from ddpdoctor.lint.analysis.launch import DDP_CLASS, GPU_COUNT, INIT_PROCESS_GROUP, runs_in_module
from ddpdoctor.lint.analysis.model import MAX_DEPTH, Assignment, Call, Function, ModuleModel, mentions
from ddpdoctor.lint.analysis.ranks import NEGATED_OPERATORS, Runs, rank_source, who_runs
from ddpdoctor.lint.analysis.syntax import MIRRORED_OPERATORS, dotted_name, literal_int, names_in, walk

BARRIER = "torch.distributed.barrier"
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


def device_pin_calls(model: ModuleModel, within: Optional[Function] = None) -> list[Call]:
    """Calls that pin this process's device: `torch.cuda.set_device(x)`, `with torch.cuda.device(x)`,
    `torch.accelerator.set_device_index(x)`, `init_process_group(..., device_id=x)`,
    `dist.barrier(device_ids=[x])`, or a helper whose name says it does (`utils.set_device(...)`,
    `init_distributed_device(args)`); only where they run (not in a helper nothing here calls).
    With `within`, the calls in that function's body (it is called from another module)."""
    out: list[Call] = []
    for call in model.calls if within is None else within.calls:
        if within is None and not runs_in_module(model, call.function):
            continue  # a `def set_device(...)` helper that nothing here calls pins nothing
        if call.name in DEVICE_PIN_CALLS:
            out.append(call)
        elif call.name == INIT_PROCESS_GROUP and call.arg(keyword="device_id") is not None:
            out.append(call)
        elif call.name == BARRIER and call.arg(keyword="device_ids") is not None:
            out.append(call)  # `dist.barrier(device_ids=[local_rank])` names this process's GPU
        elif call.attr is not None and _PIN_HELPER.match(call.attr) and not (call.name or "").startswith("torch."):
            out.append(call)
    return out


def visible_devices_writes(model: ModuleModel, within: Optional[Function] = None) -> list[cst.CSTNode]:
    """Where the script sets `CUDA_VISIBLE_DEVICES` itself (`os.environ["CUDA_VISIBLE_DEVICES"] =
    str(local_rank)`, `os.environ.setdefault(...)`, `env["CUDA_VISIBLE_DEVICES"] = ...` for a child
    process, `os.putenv(...)`). A process that sees one GPU finds it at index 0, so `cuda:0` is then
    its own device. With `within`, only in that function's body (it is called from another module)."""
    out: list[cst.CSTNode] = []
    for store in model.subscript_stores:
        if within is not None and store.ctx.function is not within:
            continue
        if isinstance(store.key, cst.SimpleString) and store.key.evaluated_value in VISIBLE_DEVICES_KEYS:
            out.append(store.value)
    for call in model.calls_named("os.environ.setdefault", "os.putenv"):
        key = call.arg(0)
        if within is not None and call.function is not within:
            continue
        if isinstance(key, cst.SimpleString) and key.evaluated_value in VISIBLE_DEVICES_KEYS:
            out.append(call.node)
    for call in model.method_calls("update"):
        if within is not None and call.function is not within:
            continue
        for arg in call.args:
            if isinstance(arg.value, cst.Dict):
                for element in arg.value.elements:
                    key = getattr(element, "key", None)
                    if isinstance(key, cst.SimpleString) and key.evaluated_value in VISIBLE_DEVICES_KEYS:
                        out.append(call.node)
            elif arg.keyword is not None and arg.keyword.value in VISIBLE_DEVICES_KEYS:
                out.append(call.node)
    return out


def visible_devices_set_by_project_helper(model: ModuleModel) -> bool:
    """A function of another project module that this script calls (where the call runs) sets
    `CUDA_VISIBLE_DEVICES` in its own body: a `select_device(opt.device)` or `restrict_to_gpu(gpu)`
    helper in `utils/`. The same narrowing as the script's own write (`visible_devices_writes`),
    one call away. One level: the helper's own body, not what it calls in turn."""

    def compute() -> bool:
        for call in model.calls:
            # Cheap tests first: linking reads and parses the other module.
            if not model.may_link(call) or not runs_in_module(model, call.function):
                continue
            linked = model.linked_function(call)
            if linked is not None and visible_devices_writes(*linked):
                return True
        return False

    return model.memoized(("visible_devices_set_by_project_helper",), compute, False)


def one_visible_gpu_per_process(model: ModuleModel) -> bool:
    """The script sets `CUDA_VISIBLE_DEVICES` from this process's rank (`str(local_rank)`, or the
    rank's entry of a configured GPU list): each process then sees one GPU, its own, as `cuda:0`, so
    what was saved from `cuda:0` comes back on this process's GPU. A constant list (`"0,1,2,3"`)
    set for every process does not count."""
    for store in model.subscript_stores:
        key = store.key
        if isinstance(key, cst.SimpleString) and key.evaluated_value in VISIBLE_DEVICES_KEYS:
            if mentions(model, store.value, store.order, store.ctx.function, _from_rank):
                return True
    return False


def _from_rank(model: ModuleModel, node: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    # Where the value comes from, never what it is called: `args.gpu` may be a list for every process.
    return rank_source(model, node, order, function) is not None


def pinned_on_import(model: ModuleModel) -> list[tuple[ModuleModel, Call]]:
    """The device pins that importing a project module runs: a `model/utils.py` whose top level does
    `torch.cuda.set_device(rank)` when the GPU count is above one, imported here for its `device`
    and `local_rank`. Importing it pins this process's GPU as surely as a call here would. Only the
    imported module's own top-level statements count (not its functions, nor what sits under
    `if __name__ == "__main__":`, which an import does not run); one level of imports. Each with
    the model of the module it is in. Empty without a project (stdin, snippets)."""
    project = model.project
    if project is None:
        return []
    out: list[tuple[ModuleModel, Call]] = []
    for path in project.imported_modules(Path(model.path)):
        other = model.project_model(path)
        if other is None or other is model:
            continue
        out.extend((other, call) for call in device_pin_calls(other) if _runs_on_import(call))
    return out


def _runs_on_import(call: Call) -> bool:
    """A module-level call outside the `if __name__ == "__main__":` block."""
    return call.function is None and not any("__name__" in names_in(guard.test) for guard in call.ctx.guards)


@dataclass(eq=False)
class DeviceArgument:
    """An argument that names a device: `set_device(x)`, `device_ids=[x]`, `.cuda(x)`, `.to(x)`,
    `torch.device(x)`, `device=x`, `map_location=x`."""

    call: Call
    expr: cst.BaseExpression
    where: str  # how a message names it: "torch.cuda.set_device()", "device_ids", ".to()", ...
    ints: bool  # a bare int here means a CUDA device index


def device_arguments(model: ModuleModel) -> list[DeviceArgument]:
    out: list[DeviceArgument] = []
    for call in model.calls:
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
    function: Optional[Function]
    index: Optional[int] = None
    via: tuple[Union[Call, Assignment], ...] = ()  # the path the value took (see `ModuleModel.routes`)


def device_indices(
    model: ModuleModel,
    expr: cst.BaseExpression,
    order: int,
    function: Optional[Function],
    ints: bool = True,
    depth: int = 0,
    via: tuple[Union[Call, Assignment], ...] = (),
) -> list[DeviceIndex]:
    """Every value a device argument may hold (followed through variables, `self.` attributes,
    parameters and `torch.device(...)`), classified as a hard-coded index, a computed index or
    neither, each with the path it took."""
    out: list[DeviceIndex] = []
    for route in model.routes(expr, order, function):
        path = (*via, *route.via)
        if depth > MAX_DEPTH:
            out.append(DeviceIndex("other", route.value, route.order, route.function, via=path))
        else:
            for index in _device_index_of(model, route.value, route.order, route.function, ints, depth, path):
                out.append(index if index.via else dataclasses.replace(index, via=path))
    return out


def _device_index_of(
    model: ModuleModel,
    value: cst.BaseExpression,
    order: int,
    function: Optional[Function],
    ints: bool,
    depth: int,
    via: tuple[Union[Call, Assignment], ...],
) -> list[DeviceIndex]:

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
    if isinstance(value, cst.Dict):
        # `map_location={"cuda:0": f"cuda:{rank}"}`: each saved device (a key: where the tensors were,
        # not a choice made here) is mapped to a value, the device they are loaded onto.
        targets = [
            index
            for element in value.elements if isinstance(element, cst.DictElement)
            for index in device_indices(model, element.value, order, function, ints, depth + 1, via)
        ]
        return targets or [DeviceIndex("other", value, order, function)]
    if isinstance(value, cst.Call):
        name = model.qualify(value.func)
        if name == "torch.device":
            call = model.call_of(value)
            index = call.arg(1, "index") if call is not None else None
            kind = call.arg(0, "type") if call is not None else None
            if index is not None:
                return device_indices(model, index, order, function, True, depth + 1, via)
            if kind is not None:
                return device_indices(model, kind, order, function, True, depth + 1, via)
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


# ------------------------------------------------------------- a machine with exactly one GPU
# A script that also runs on a one-GPU machine often says so: `if torch.cuda.device_count() == 1:`
# (every process then shares the only device, over gloo), `else:` each takes its own. GPU 0 named on
# that path is the only device there is, not a hard-coded choice among several.
DEVICE_COUNT_CALLS = frozenset({GPU_COUNT, "torch.accelerator.device_count"})
# `count OP bound` that holds only when the count is at most one.
_AT_MOST_ONE = ((cst.Equal, 1), (cst.LessThanEqual, 1), (cst.LessThan, 2))


def is_one_gpu_test(
    model: ModuleModel,
    test: cst.BaseExpression,
    order: int,
    function: Optional[Function],
    negated: bool = False,
    depth: int = 0,
) -> bool:
    """True for a branch condition (its `else` side when `negated`) that holds only on a machine
    with at most one GPU: `torch.cuda.device_count() == 1`, `< 2`, `<= 1`, `not count > 1`, the
    `else` of `count > 1`, through a variable holding the count (`n = torch.cuda.device_count()`)
    or the comparison (`single = n == 1`). A count not read from torch (`args.n_gpu == 1`, which
    the Hugging Face examples set to 1 in every distributed process) is not one."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return is_one_gpu_test(model, test.expression, order, function, not negated, depth + 1)
    if isinstance(test, cst.BooleanOperation):
        # `a and b` holds only if both do; the `else` of `a or b` only if neither does.
        if isinstance(test.operator, cst.And) is not negated:
            return any(is_one_gpu_test(model, side, order, function, negated, depth + 1) for side in (test.left, test.right))
        return False
    if isinstance(test, cst.Comparison):
        if len(test.comparisons) != 1:
            return False
        operator: type = type(test.comparisons[0].operator)
        left, right = test.left, test.comparisons[0].comparator
        if literal_int(left) is not None:
            left, right, operator = right, left, MIRRORED_OPERATORS.get(operator, type(None))
        if negated:
            operator = NEGATED_OPERATORS.get(operator, type(None))
        bound = literal_int(right)
        return any(operator is op and bound == value for op, value in _AT_MOST_ONE) and _is_device_count(
            model, left, order, function
        )
    if dotted_name(test) is not None:
        # A flag bound to the comparison, on every path that reaches the test.
        values = [v for v in model.reaching_values(test, order, function) if v is not test]
        return bool(values) and all(is_one_gpu_test(model, v, order, function, negated, depth + 1) for v in values)
    return False


def _is_device_count(model: ModuleModel, expr: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    """`torch.cuda.device_count()`, or a variable that holds it on every path."""
    leaves = model.leaf_values(expr, order, function)
    return bool(leaves) and all(
        isinstance(value, cst.Call) and model.qualify(value.func) in DEVICE_COUNT_CALLS for value, _, _ in leaves
    )


def names_the_only_gpu(model: ModuleModel, index: DeviceIndex, sink: Call) -> bool:
    """A hard-coded GPU 0 that reaches `sink` only on a path where this machine has one GPU: the
    sink itself, or a step of the value's path (the assignment, a call site), sits under a one-GPU
    condition. Then device 0 is the only device, which every process must share."""
    if index.kind != "literal" or index.index != 0:
        return False
    return any(
        is_one_gpu_test(model, guard.test, guard.order, guard.function, guard.negated)
        for step in (sink, *index.via)
        for guard in step.ctx.guards
    )


# ------------------------------------------------------------------ uses of the current CUDA device

# Object collectives stage the pickled object in a tensor on `torch.cuda.current_device()` when the
# group is NCCL (`_get_object_coll_device` answers the device type "cuda", no index; torch's
# docstrings: "it is the user's responsibility to ensure that this is set so that each rank has an
# individual GPU, via torch.cuda.set_device()"). The point-to-point and broadcast forms take a
# `device=` that overrides it.
OBJECT_COLLECTIVES = frozenset(
    f"torch.distributed.{name}"
    for name in ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
                 "send_object_list", "recv_object_list")
)
_OBJECT_COLLECTIVES_WITH_DEVICE = frozenset(
    f"torch.distributed.{name}" for name in ("broadcast_object_list", "send_object_list", "recv_object_list")
)
# `torch.cuda.X()` with no device argument acts on the current device, and opens a CUDA context
# there: `synchronize()` waits on GPU 0 (not on the rank's own work), `mem_get_info()` asks the
# driver about GPU 0, `current_device()` answers 0. Deliberately absent: `empty_cache()` (it empties
# the cache of every device), the allocator's counters (`memory_allocated()`, `max_memory_reserved()`:
# no context is opened, and the rank that usually logs them, rank 0, is on GPU 0 anyway),
# `torch.load` without `map_location` (it restores each tensor to the index it was saved from, not
# to the current device: another rule's business), `init_process_group` without `device_id`
# (NCCL communicators are created lazily under a guard for the device of the tensors involved).
CURRENT_DEVICE = "torch.cuda.current_device"
_CURRENT_DEVICE_QUERIES = frozenset({"torch.cuda.synchronize", "torch.cuda.mem_get_info"})


@dataclass(frozen=True)
class CurrentDeviceUse:
    """A place where the process relies on its current CUDA device: what lands there or is asked of
    it is GPU 0 in every rank unless the device is pinned (`torch.cuda.set_device`)."""

    call: Call
    what: str  # how a message names it: "bare .cuda()", "dist.barrier() without device_ids", ...


def current_device_uses(model: ModuleModel) -> list[CurrentDeviceUse]:
    """Where the module uses the current CUDA device implicitly, in the order written: a bare
    `.cuda()`, a `"cuda"` device without an index reaching `.to()`, `.cuda()`, `device=` of a torch
    call or `map_location=` (`torch.device("cuda")`, `"cuda" if available else "cpu"`, through
    variables), `torch.cuda.current_device()`, `torch.cuda.synchronize()` / `mem_get_info()` without
    a device, the object collectives (without `device=`), and `dist.barrier()` without `device_ids`
    (since torch 2.4 it allocates its one-element tensor on the current device, and before that it
    guessed the GPU from the global rank). Not counted: code that runs only on rank 0 (rank 0 is
    local rank 0 under every launcher, so GPU 0 is its own) or only in a single-process run, helpers
    nothing here runs, and unit-test classes."""

    def compute() -> list[CurrentDeviceUse]:
        out: list[CurrentDeviceUse] = []
        for call in model.calls:
            what = _current_device_use(model, call)
            if what is None or not runs_in_module(model, call.function) or in_test_case(call):
                continue
            if who_runs(model, call).runs in (Runs.RANK0, Runs.SINGLE):
                continue
            out.append(CurrentDeviceUse(call, what))
        return out

    return model.memoized(("current_device_uses",), compute, [])


def _current_device_use(model: ModuleModel, call: Call) -> Optional[str]:
    name = call.name
    if name == BARRIER:
        return None if call.arg(keyword="device_ids") is not None else "dist.barrier() without device_ids"
    if name in OBJECT_COLLECTIVES:
        if name in _OBJECT_COLLECTIVES_WITH_DEVICE and call.arg(keyword="device") is not None:
            return None
        return f"dist.{name.rsplit('.', 1)[-1]}()"
    if name == CURRENT_DEVICE:
        return f"{name}()"
    if name in _CURRENT_DEVICE_QUERIES:
        return None if call.arg(0, "device") is not None else f"{name}() without a device"
    if name is None and isinstance(call.node.func, cst.Attribute) and call.attr in ("cuda", "to"):
        expr = call.arg(0, "device")
        if expr is None:
            return "bare .cuda()" if call.attr == "cuda" else None
        if not _names_bare_cuda(model, expr, call):
            return None
        return f'.{call.attr}({_shown(model, expr)}) without a device index'
    for keyword in ("device", "map_location"):
        expr = call.arg(keyword=keyword)
        if expr is None or (keyword == "device" and not (name or "").startswith("torch.")):
            continue  # `device=` of a project function: where it is used decides
        if _names_bare_cuda(model, expr, call):
            return f"{keyword}={_shown(model, expr)} without a device index"
    return None


def _shown(model: ModuleModel, expr: cst.BaseExpression) -> str:
    """Short source text of an argument for a message (`device`, `"cuda"`), else `...`."""
    code = model.code_of(expr)
    return code if len(code) <= 40 and "\n" not in code else "..."


def _names_bare_cuda(model: ModuleModel, expr: cst.BaseExpression, call: Call) -> bool:
    """Some value of a device argument is the CUDA device type with no index (`"cuda"`,
    `torch.device("cuda")`), followed through variables and both arms of a conditional."""
    for index in device_indices(model, expr, call.order, call.function, ints=True):
        if index.kind == "other" and isinstance(index.node, cst.SimpleString) and index.node.evaluated_value == "cuda":
            return True
    return False


# ------------------------------------------------------------------ does the script use CUDA at all

_CUDA_STRING = re.compile(r"^(cuda|nccl)(:\d+)?$")


def uses_cuda(model: ModuleModel) -> bool:
    """The script puts something on a GPU: `.cuda()`, a `torch.cuda.*` call, `device_ids=`, a
    `"cuda"` / `"cuda:N"` / `f"cuda:{i}"` device or the NCCL backend. A gloo job on CPUs has none."""

    def compute() -> bool:
        if model.method_calls("cuda") or any((c.name or "").startswith("torch.cuda.") for c in model.calls):
            return True
        if any(arg.keyword is not None and arg.keyword.value == "device_ids" for c in model.calls for arg in c.args):
            return True
        for node in walk(model.module):
            if isinstance(node, cst.SimpleString) and _CUDA_STRING.match(str(node.evaluated_value)):
                return True
            if isinstance(node, cst.FormattedString) and node.parts and isinstance(node.parts[0], cst.FormattedStringText):
                if node.parts[0].value.startswith("cuda:"):
                    return True
        return False

    return model.memoized(("uses_cuda",), compute, False)


def local_device_expression(model: ModuleModel, call: Call) -> Optional[str]:
    """Source text naming this process's own GPU where `call` runs, for a fix to pass on: a plain
    variable bound before it in the same function, on every path, to `torch.device("cuda", i)` or
    `f"cuda:{i}"` with `i` a local rank; else the local rank pinned by `torch.cuda.set_device(i)`
    earlier in the same function and under no other condition. None when nothing is certain."""
    for assignment in model.assignments:
        if assignment.function is not call.function or assignment.order > call.order or assignment.kind != "assign":
            continue
        if assignment.value is None or "." in assignment.target:
            continue
        if model.reaching_assignments(assignment.target, call.order, call.function) != [assignment]:
            continue
        if assignment.ctx.guards != call.ctx.guards[: len(assignment.ctx.guards)]:
            continue  # bound under a condition the call does not share
        if _is_local_cuda_device(model, assignment.value, assignment.order, assignment.function):
            return assignment.target
    for pin in model.calls_named("torch.cuda.set_device"):
        if pin.function is not call.function or pin.order > call.order:
            continue
        if pin.ctx.guards != call.ctx.guards[: len(pin.ctx.guards)]:
            continue  # pinned under a condition the call does not share
        index = pin.arg(0, "device")
        name = dotted_name(index)
        if name is not None and rank_source(model, index, pin.order, pin.function) in ("local", "spawn"):
            return f'f"cuda:{{{name}}}"'
    return None


def _is_local_cuda_device(model: ModuleModel, value: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    if isinstance(value, cst.Call) and model.qualify(value.func) == "torch.device" and len(value.args) == 2:
        kind, index = value.args[0].value, value.args[1].value
        return (
            isinstance(kind, cst.SimpleString) and kind.evaluated_value == "cuda"
            and rank_source(model, index, order, function) in ("local", "spawn")
        )
    if isinstance(value, cst.FormattedString) and len(value.parts) == 2:
        text, field = value.parts
        return (
            isinstance(text, cst.FormattedStringText) and text.value == "cuda:"
            and isinstance(field, cst.FormattedStringExpression)
            and rank_source(model, field.expression, order, function) in ("local", "spawn")
        )
    return False



def written_index(model: ModuleModel, argument: DeviceArgument) -> Optional[cst.BaseExpression]:
    """The GPU index as written in the argument itself, not followed through variables: `X` in
    `f"cuda:{X}"`, `torch.device("cuda", X)`, `"cuda:{}".format(X)`, and the argument itself where a
    bare int means an index (`set_device(X)`, `device_ids=[X]`, `.cuda(X)`). None otherwise."""
    expr = argument.expr
    if isinstance(expr, cst.FormattedString):
        parts = expr.parts
        if (
            len(parts) == 2 and isinstance(parts[0], cst.FormattedStringText) and parts[0].value == "cuda:"
            and isinstance(parts[1], cst.FormattedStringExpression)
        ):
            return parts[1].expression
        return None
    if isinstance(expr, cst.Call):
        call = model.call_of(expr)
        if call is not None and call.name == "torch.device":
            kind = call.arg(0, "type")
            if isinstance(kind, cst.SimpleString) and kind.evaluated_value == "cuda":
                return call.arg(1, "index")
            return None
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value == "format" and len(expr.args) == 1:
            if isinstance(func.value, cst.SimpleString) and func.value.evaluated_value == "cuda:{}":
                return expr.args[0].value
    return expr if argument.ints else None


def index_replacement(node: cst.BaseExpression, local_rank: str) -> Optional[str]:
    """What replaces a hard-coded or global-rank index `node` so that it names the local rank: the
    expression itself for an int or a computed index, `f"cuda:{local_rank}"` for a `"cuda:N"`
    string (keeping its quotes). None for anything else."""
    if isinstance(node, cst.SimpleString):
        text = node.evaluated_value
        if not isinstance(text, str) or not _CUDA_INDEX.match(text) or node.prefix not in ("", "u", "U"):
            return None
        quote = node.quote
        if quote in local_rank:
            return None
        return f"f{quote}cuda:{{{local_rank}}}{quote}"
    return local_rank
