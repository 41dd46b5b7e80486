"""What a function does for its callers, so a call can be judged where it is made: in this module
or, through `ModuleModel.linked_function`, in another module of the project.

A finding that spans modules is reported at the call in the module that imports the other half
(the helper, linted alone, cannot know who calls it): `save_checkpoint(...)` in train.py runs a
`torch.save` on every rank; `run_epoch(model, loader)` draws from a loader whose sampler nobody
reseeds; `clip_gradients(model)` clips gradients a GradScaler still scales. Each summary is
computed on demand and memoised with its module's model.

This is the one place cross-module questions are answered: a rule never links a call to another
module itself; it asks a query here (`called_unguarded_save`, `called_epoch_setter`,
`trainer_drawn_params`, `called_divergent_exits`, `stale_holders`, `rewritten_before`, ...).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import libcst as cst

from ddpdoctor.lint.analysis.devices import device_pin_calls, visible_devices_writes
from ddpdoctor.lint.analysis.divergence import Divergence, Exit, divergent_condition, exits, reaches_collective_after
from ddpdoctor.lint.analysis.collectives import collective_name
from ddpdoctor.lint.analysis.launch import HOROVOD_SIZE_CALLS, INIT_PROCESS_GROUP, mentions_calls, may_create_nccl_group, runs_in_module
from ddpdoctor.lint.analysis.model import MAX_DEPTH, Call, Expr, Function, Guard, Loop, ModuleModel, mentions
from ddpdoctor.lint.analysis.ranks import decided_by_guards, rank_kind
from ddpdoctor.lint.analysis.stepping import clears_before, conditional_step
from ddpdoctor.lint.analysis.syntax import contains, dotted_name, last_segment, mentions_identifier

SAVE = "torch.save"
# Buffers: a save into one writes no file.
IN_MEMORY = frozenset({"io.BytesIO", "io.StringIO"})


def param_name(model: ModuleModel, function: Function, expr: Optional[cst.CSTNode]) -> Optional[str]:
    """The parameter of `function` that `expr` is (a plain name never rebound in the function)."""
    name = dotted_name(expr)
    if name is None or "." in name or name not in function.params:
        return None
    if any(a.function is function and a.kind != "param" for a in model.assignments_to(name)):
        return None
    return name


def argument_for(call: Call, function: Function, param: str) -> Optional[Expr]:
    """The expression a call passes for `param` of `function`."""
    index = function.params.index(param)
    if function.klass is not None and function.params[0] in ("self", "cls"):
        index -= 1
    return call.arg(index if index >= 0 else None, param)


def _is_rank(model: ModuleModel, node: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    return rank_kind(model, node, order, function) is not None


def mentions_rank(
    model: ModuleModel, expr: Optional[cst.CSTNode], order: int, function: Optional[Function], depth: int = 0
) -> bool:
    """True when an expression (a path) is built from a rank, following variables: per-rank files."""
    return mentions(model, expr, order, function, _is_rank, depth)


def unguarded_save(model: ModuleModel, function: Function) -> Optional[tuple[Call, Optional[str]]]:
    """A `torch.save` in `function`'s body that runs on whichever ranks call it (no rank check
    inside decides), with the parameter that names its file when one does (the caller's argument
    then tells whether the file is per rank). None when every save is guarded or per rank."""
    for call in model.calls_named(SAVE):
        if call.function is not function or decided_by_guards(model, call.ctx.guards) is not None:
            continue
        path = call.arg(1, "f")
        if path is None:
            continue
        param = param_name(model, function, path)
        if param is None and mentions_rank(model, path, call.order, call.function):
            continue
        if model.origin_names(path, call.order, call.function) & IN_MEMORY:
            continue  # `torch.save(obj, io.BytesIO())`: serialising, not writing a checkpoint
        return call, param
    return None


def called_unguarded_save(model: ModuleModel, call: Call) -> Optional[tuple[ModuleModel, Function, Call, Optional[Expr]]]:
    """A call of another project module's function that runs a `torch.save` on whichever ranks
    call it (`save_checkpoint(state, path)` in utils/checkpoint.py): that module's model, the
    function, the save, and what the call passes for the parameter that names the file (None when
    the file is not named by a parameter). None when it saves nothing unguarded, or when the path
    parameter is given no argument here."""
    if (call.name or "").startswith("torch."):
        return None
    linked = model.linked_function(call)
    if linked is None:
        return None
    other, helper = linked
    found = unguarded_save(other, helper)
    if found is None:
        return None
    save, path_param = found
    if path_param is None:
        return other, helper, save, None
    path = argument_for(call, helper, path_param)
    return (other, helper, save, path) if path is not None else None


def drawn_params(model: ModuleModel, function: Function) -> dict[str, Call]:
    """The parameters a training loop in `function` draws its batches from (`for x, y in
    tqdm(loader):` with a backward in the loop), each with that backward."""
    out: dict[str, Call] = {}
    for backward, iterated in _training_draws(model, [function]):
        name = param_name(model, function, iterated)
        if name is not None:
            out.setdefault(name, backward)
    return out


def drawn_attributes(model: ModuleModel, method: Function) -> frozenset[str]:
    """The `self.` attributes a training loop in `method` draws its batches from (`for batch in
    self.train_loader:` with a backward in the loop); also in the methods of its class that it calls
    on `self` (one level: `self._run_batches()`)."""
    methods = [method] + [
        helper
        for call in method.calls
        if call.receiver is not None and dotted_name(call.receiver) == "self"
        for helper in model.class_methods(method.klass or "")
        if helper.name == call.attr and helper is not method
    ]
    out: set[str] = set()
    for _, iterated in _training_draws(model, methods):
        name = dotted_name(iterated)
        if name is not None and name.startswith("self.") and name.count(".") == 1:
            out.add(name)
    return frozenset(out)


def _training_draws(model: ModuleModel, functions: list[Function]) -> Iterator[tuple[Call, Expr]]:
    """What the training loops of `functions` iterate (through `enumerate`, `tqdm`, `iter`), each
    with the loop's backward: a for-loop is a training loop when a backward runs in it, directly or
    in a helper it calls."""
    for loop in model.loops:
        if loop.function not in functions or loop.iter is None:
            continue
        backward = next((c for c in model.calls_within(loop, depth=2) if c.attr == "backward"), None)
        if backward is None:
            continue
        for iterated in model.iterated_exprs(loop.iter):
            yield backward, iterated


def constructor(model: ModuleModel, klass: str) -> Optional[Function]:
    """The `__init__` a top-level class of this module defines in its own body."""
    return next((f for f in model.class_methods(klass) if f.name == "__init__"), None)


def constructor_stores(model: ModuleModel, klass: str) -> dict[str, str]:
    """The `self.` attributes a class's `__init__` sets to one of its parameters as given
    (`self.train_loader = train_dl`), attribute -> parameter, leaving out any attribute that another
    method (or `__init__` itself, again) also assigns: it may not hold the argument when it is read."""
    init = constructor(model, klass)
    if init is None:
        return {}
    out: dict[str, str] = {}
    for assignment in model.assignments:
        if assignment.function is not init or assignment.kind != "assign" or not assignment.target.startswith("self."):
            continue
        param = param_name(model, init, assignment.value)
        if param is not None and len(model.assignments_to(assignment.target)) == 1:
            out[assignment.target] = param
    return out


def class_sets_epoch(model: ModuleModel, klass: str) -> bool:
    """Some method of the class calls `set_epoch` on something: whichever sampler it reseeds, its
    caller cannot tell it is not the one it handed over."""
    return any(call.attr == "set_epoch" for method in model.class_methods(klass) for call in method.calls)


DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
DATA_LOADER = "torch.utils.data.DataLoader"


def shuffles(model: ModuleModel, sampler: Call) -> bool:
    """A `DistributedSampler(...)` that shuffles for sure: `shuffle` absent (default True) or a value
    that is True; an undecidable `shuffle=args.shuffle` does not count."""
    if sampler.has_star_args():
        return False
    shuffle = sampler.arg(3, "shuffle")
    if shuffle is None:
        return True
    return model.const_value(shuffle, sampler.order, sampler.function) is True


def returned_shuffled_loaders(model: ModuleModel, function: Function) -> dict[Optional[int], Call]:
    """What `function` hands back that is a `DataLoader` drawing from a shuffling
    `DistributedSampler` built in this module (`get_loaders(opt)` returning `train_loader,
    train_sampler, val_loader`): the position in the returned tuple (None for the value returned
    whole), with the sampler. Its caller iterates that loader, and must reseed that sampler."""

    def compute() -> dict[Optional[int], Call]:
        out: dict[Optional[int], Call] = {}
        if any(call.attr == "set_epoch" for call in function.calls):
            return out  # `epoch_loader(bs, epoch)` reseeds what it builds: a loader rebuilt each epoch
        for returned, at, inside in model.return_sites(function):
            parts: list[tuple[Optional[int], Expr]] = [(None, returned)]
            if isinstance(returned, (cst.Tuple, cst.List)):
                parts = [(i, e.value) for i, e in enumerate(returned.elements) if not isinstance(e, cst.StarredElement)]
            for position, part in parts:
                for loader in model.origin_calls(part, at, inside):
                    if loader.name != DATA_LOADER:
                        continue
                    for sampler in model.loader_samplers(loader):
                        if sampler.name == DISTRIBUTED_SAMPLER and shuffles(model, sampler):
                            out.setdefault(position, sampler)
        return out

    return model.memoized(("returned_shuffled_loaders", id(function)), compute, {})


def epoch_set_params(model: ModuleModel, function: Function) -> set[str]:
    """The parameters `function` calls `set_epoch` on: `p.set_epoch(e)`, `p.sampler.set_epoch(e)`."""
    out: set[str] = set()
    for call in function.calls:
        if call.attr != "set_epoch" or call.receiver is None:
            continue
        receiver = call.receiver
        if isinstance(receiver, cst.Attribute) and receiver.attr.value in ("sampler", "batch_sampler"):
            receiver = receiver.value
        name = param_name(model, function, receiver)
        if name is not None:
            out.add(name)
    return out


# ------------------------------------------------------------------ loaders and trainers of other project modules


def linked_method(model: ModuleModel, call: Call) -> Optional[tuple[ModuleModel, Function, Call]]:
    """`trainer.train_epoch(...)` where `trainer` was built here by `Trainer(...)`, a class that
    another project module defines: that module's model, the method (defined in the class's own
    body; an inherited one is not followed) and the constructor call. None otherwise."""
    if model.project is None or call.attr is None or call.receiver is None:
        return None

    def compute() -> Optional[tuple[ModuleModel, Function, Call]]:
        assert call.receiver is not None
        for origin in model.origin_calls(call.receiver, call.order, call.function):
            written = dotted_name(origin.node.func)
            found = model.project_class(written) if written is not None else None
            if found is None or found[0] is model:
                continue
            other, klass = found
            for method in other.class_methods(klass):
                if method.name == call.attr:
                    return other, method, origin
        return None

    return model.memoized(("linked_method", id(call)), compute, None)


def returned_by_project_helper(
    model: ModuleModel, expr: Expr, order: int, function: Optional[Function], depth: int = 0
) -> Optional[tuple[ModuleModel, Function, Optional[int], str]]:
    """`train_loader` bound by `train_loader, sampler, val = get_loaders(opt)` (or `train_loader =
    build_loader(opt)`, or `data.train_loader()` on an object of another module's class: a getter)
    where the call is of another project module's function: that module's model, the function, the
    position in its returned tuple (None when the value is bound whole) and the name bound to it,
    seen through an iteration wrapper (`progress = tqdm(train_loader)`). None when the name has
    another assignment that may reach here."""
    name = dotted_name(expr)
    if name is None:
        return None
    assignments = model.reaching_assignments(name, order, function)
    if len(assignments) != 1:
        return None
    (assignment,) = assignments
    position: Optional[int] = None
    value = assignment.value
    if assignment.unpacked is not None:
        value, position = assignment.unpacked
    elif assignment.kind != "assign":
        return None
    call = model.call_of(value) if isinstance(value, cst.Call) else None
    if call is None:
        return None
    if position is None and depth < MAX_DEPTH:
        # `progress = tqdm(train_loader)`: what the wrapper iterates.
        wrapped = model.iterated_exprs(value)
        if len(wrapped) == 1 and wrapped[0] is not value:
            return returned_by_project_helper(model, wrapped[0], assignment.order, assignment.function, depth + 1)
    linked = model.linked_function(call)
    if linked is None and call.attr is not None and call.receiver is not None:
        method = linked_method(model, call)
        linked = (method[0], method[1]) if method is not None else None
    if linked is None:
        return None
    return linked[0], linked[1], position, name


def helper_built_shuffled_loader(
    model: ModuleModel, expr: Expr, order: int, function: Optional[Function]
) -> Optional[tuple[ModuleModel, Function, Call, str]]:
    """The loader `expr` (where it is evaluated) is one that another project module's function
    built on a shuffling DistributedSampler and handed back (`train_loader, train_sampler,
    val_loader = get_loaders(opt)`): that module's model, the function, the sampler and the name
    bound here."""
    built = returned_by_project_helper(model, expr, order, function)
    if built is None:
        return None
    other, helper, position, name = built
    sampler = returned_shuffled_loaders(other, helper).get(position)
    return (other, helper, sampler, name) if sampler is not None else None


def drawn_arguments(model: ModuleModel, call: Call) -> list[tuple[Function, Expr]]:
    """What a call of another project module's function passes for the parameters its training
    loop draws batches from (`run_epoch(model, optimizer, train_loader)`): that function with each
    such argument."""
    if not model.may_link(call):
        return []  # cheap test first: linking reads and parses the other module
    linked = model.linked_function(call)
    if linked is None:
        return []
    other, helper = linked
    out: list[tuple[Function, Expr]] = []
    for param in drawn_params(other, helper):
        argument = argument_for(call, helper, param)
        if argument is not None:
            out.append((helper, argument))
    return out


def called_epoch_setter(model: ModuleModel, call: Call) -> Optional[tuple[Function, frozenset[str]]]:
    """The function of another project module that `call` invokes, when it calls `set_epoch` on some
    of its parameters (`data.start_epoch(loader, epoch)`), with those parameters."""
    linked = model.linked_function(call)
    if linked is None:
        return None
    params = epoch_set_params(*linked)
    return (linked[1], frozenset(params)) if params else None


def trainer_sets_epoch(model: ModuleModel, call: Call) -> bool:
    """`trainer.run_epoch(epoch)` on an object of another project module's class that calls
    set_epoch somewhere (it may well be the sampler of the loader its constructor was given)."""
    method = linked_method(model, call)
    return method is not None and class_sets_epoch(method[0], method[1].klass or "")


def trainer_drawn_params(model: ModuleModel, call: Call) -> Optional[tuple[Call, Function, list[str]]]:
    """`trainer.train_epoch(epoch)` on an object of another project module's class whose method's
    training loop draws from a loader the constructor was given (`Trainer(model, train_dl=loader)`
    whose `__init__` keeps it as `self.train_dataloader`, which `train_epoch` iterates): the
    constructor call, the class's `__init__` and the constructor parameters drawn from."""
    linked = linked_method(model, call)
    if linked is None:
        return None
    other, method, built = linked
    init = constructor(other, method.klass or "")
    if init is None:
        return None
    stored = constructor_stores(other, method.klass or "")
    params = [param for attribute in drawn_attributes(other, method) if (param := stored.get(attribute)) is not None]
    return (built, init, params) if params else None


def gradients_cleared_before(model: ModuleModel, backward: Call, loop: Union[Loop, Function]) -> bool:
    """A `zero_grad()` (of any optimizer or model) runs in the same iteration of `loop` as
    `backward`, before it, under no condition the backward does not share: what earlier iterations'
    backwards left is discarded, so nothing accumulates across iterations, whatever condition the
    optimizer step sits under (a GAN's generator stepped every `n_critic` iterations)."""
    return bool(clears_before(model, backward, loop))


def accumulation_guard(model: ModuleModel, backward: Call, loop: Union[Loop, Function]) -> Optional[Guard]:
    """The accumulation condition the optimizer step of `backward`'s iteration runs under, when
    gradients do accumulate across iterations of `loop`: not in the `else:` of `if
    accumulation_steps > 1:` (one backward per step), and no `zero_grad()` before every backward
    (nothing carries over)."""
    if any(_without_accumulation(guard) for guard in backward.ctx.guards):
        return None
    if gradients_cleared_before(model, backward, loop):
        return None
    step, guard = conditional_step(model, backward, loop)
    return guard if step is not None else None


def _without_accumulation(guard: Guard) -> bool:
    """A branch that runs only when the accumulation count is 1: `if accum_steps == 1:`,
    `if grad_accum <= 1:`, or the `else:` of `if accumulation_steps > 1:`."""
    test = guard.test
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    name = dotted_name(test.left) or ""
    if "accum" not in name.rsplit(".", 1)[-1].lower():
        return False
    target = test.comparisons[0]
    if not (isinstance(target.comparator, cst.Integer) and target.comparator.evaluated_value == 1):
        return False
    operator = type(target.operator)
    if guard.negated:
        return operator in (cst.GreaterThan, cst.NotEqual)
    return operator in (cst.Equal, cst.LessThanEqual)


def accumulating_param(model: ModuleModel, function: Function) -> Optional[tuple[str, Guard]]:
    """The parameter of `function` whose model a loop of it runs forward and backward on, with the
    optimizer stepping only under an accumulation condition; and that condition. None in a module
    that uses `no_sync` anywhere (it controls when DDP synchronises)."""
    if model.method_calls("no_sync"):
        return None
    for backward in model.method_calls("backward"):
        if backward.function is not function or not backward.loops:
            continue
        loop = backward.loops[-1]
        guard = accumulation_guard(model, backward, loop)
        if guard is None:
            continue
        for call in model.calls_within(loop, depth=0):
            param = param_name(model, function, call.node.func)
            if param is not None:
                return param, guard
    return None


def called_accumulation(model: ModuleModel, call: Call) -> Optional[tuple[ModuleModel, str, Guard, Expr]]:
    """A call of another project module's function whose loop accumulates gradients on the model
    it is given (`train_one_epoch(model, loader, optimizer, accum_steps=8)`): that module's model,
    the parameter, the accumulation condition there, and what the call passes for it."""
    linked = model.linked_function(call)
    if linked is None:
        return None
    other, function = linked
    found = accumulating_param(other, function)
    if found is None:
        return None
    param, guard = found
    argument = argument_for(call, function, param)
    return (other, param, guard, argument) if argument is not None else None


# Gradient clipping (`torch.nn.utils.clip_grad_norm` is the deprecated spelling without `_`).
CLIPS = frozenset(
    {"torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_", "torch.nn.utils.clip_grad_norm"}
)


@dataclass(frozen=True)
class Clipping:
    """What a function does to the gradients its caller hands it: the first gradient clip in its body,
    the parameters whose gradients it clips, and whether a `GradScaler.unscale_` runs in the body
    before that clip (then the clip sees true gradients whatever the caller's backward was)."""

    clip: Call
    params: frozenset[str]  # `clip_grad_norm_(model.parameters(), ...)` / `clip_grad_value_(params, ...)`
    unscales_first: bool


def clipping(model: ModuleModel, function: Function) -> Optional[Clipping]:
    """The gradient clipping `function` does in its own body, or None when it clips nothing.
    Called after `scaler.scale(loss).backward()`, a function whose clip is not preceded by an
    `unscale_` clips gradients still multiplied by the loss scale."""
    clips = [c for c in function.calls if c.name in CLIPS]
    if not clips:
        return None
    first = clips[0]
    params: set[str] = set()
    for clip in clips:
        target = clip.arg(0, "parameters")
        if isinstance(target, cst.Call) and isinstance(target.func, cst.Attribute) and target.func.attr.value == "parameters":
            target = target.func.value  # `model.parameters()` clips `model`'s gradients
        name = param_name(model, function, target)
        if name is not None:
            params.add(name)
    unscales_first = any(c.attr == "unscale_" and c.order < first.order for c in function.calls)
    return Clipping(first, frozenset(params), unscales_first)


def unscales(model: ModuleModel, function: Function, depth: int = 0) -> bool:
    """`function` calls `GradScaler.unscale_` in its body, directly or through a helper of its own
    module (a few calls deep): called between a scaled backward and a clip, it unscales the gradients."""
    for call in function.calls:
        if call.attr == "unscale_":
            return True
        if depth < 2 and any(unscales(model, helper, depth + 1) for helper in model.resolve_local_function(call)):
            return True
    return False


def local_or_linked(model: ModuleModel, call: Call) -> list[tuple[ModuleModel, Function]]:
    """The functions of this module a call may invoke (`helper()`, `self.helper()`), else the
    top-level function of another project module it calls: the callees the gradient-scaling queries
    follow (narrower than `callees`, which also follows project classes' methods)."""
    local = model.resolve_local_function(call)
    if local:
        return [(model, f) for f in local]
    linked = model.linked_function(call)
    return [linked] if linked is not None else []


def clipping_callees(model: ModuleModel, call: Call) -> list[tuple[ModuleModel, Function, Clipping]]:
    """The functions `call` may invoke (this module's, else another project module's) whose body
    clips gradients before any `unscale_`, each with its clipping."""
    out: list[tuple[ModuleModel, Function, Clipping]] = []
    for other, function in local_or_linked(model, call):
        found = clipping(other, function)
        if found is not None and not found.unscales_first:
            out.append((other, function, found))
    return out


def call_unscales(model: ModuleModel, call: Call) -> bool:
    """`scaler.unscale_(opt)`, or a helper of this module or another project module that calls it."""
    if call.attr == "unscale_":
        return True
    if any(unscales(model, helper) for helper in model.resolve_local_function(call)):
        return True
    linked = model.linked_function(call) if not (call.name or "").startswith("torch.") else None
    return linked is not None and unscales(*linked)


# ------------------------------------------------------------------ process groups and collectives in other modules


def called_unpinned_group(model: ModuleModel, call: Call) -> Optional[tuple[ModuleModel, Call]]:
    """A call of another project module's function that creates an NCCL process group without
    pinning the GPU in its body (`dist_utils.setup()`): that module's model and the
    `init_process_group` call."""
    if not model.may_link(call):
        return None  # cheap test first: linking reads and parses the other module
    linked = model.linked_function(call)
    if linked is None:
        return None
    other, function = linked
    if device_pin_calls(other, function) or visible_devices_writes(other, function):
        return None
    for init in function.calls:
        if init.name == INIT_PROCESS_GROUP and may_create_nccl_group(other, init):
            return other, init
    return None


def called_collectives(model: ModuleModel, call: Call) -> list[tuple[ModuleModel, Call, str]]:
    """The collectives that the body of the other project module's function `call` invokes runs
    under no rank check of its own, in order, each with its module's model and its name."""
    if (call.name or "").startswith(("torch.", "horovod.")) or not model.may_link(call):
        return []
    linked = model.linked_function(call)
    if linked is None:
        return []
    other, function = linked
    out: list[tuple[ModuleModel, Call, str]] = []
    for inner in function.calls:
        name = collective_name(inner)
        if name is not None and not decided_by_guards(other, inner.ctx.guards):
            out.append((other, inner, name))
    return out


def called_divergent_exits(model: ModuleModel, call: Call) -> list[tuple[ModuleModel, Exit, Call, Divergence]]:
    """The exits (`return`, `break`, `continue`, `raise`) of the other project module's function
    `call` invokes that some ranks only take, before a collective or a backward that the others
    go on to (`train_one_epoch(model, loader)` whose loop breaks on a per-rank NaN check): each
    with that module's model, the collective it skips and why it diverges, in source order."""
    if not model.may_link(call):
        return []  # cheap test first: linking reads and parses the other module
    linked = model.linked_function(call)
    if linked is None:
        return []
    other, function = linked
    out: list[tuple[ModuleModel, Exit, Call, Divergence]] = []
    for exit in exits(other):
        if exit.function is not function:
            continue
        after = reaches_collective_after(other, exit)
        why = divergent_condition(other, exit) if after is not None else None
        if after is not None and why is not None:
            out.append((other, exit, after, why))
    return out


# ------------------------------------------------------------------ effects: what a call does for its caller

# The facts a caller may need from a project function, whatever module it lives in.
BACKWARD = "runs backward"
PINS_GPU = "pins this process's GPU"
BROADCASTS_PARAMETERS = "broadcasts the model's parameters"
BROADCASTS_OPTIMIZER = "broadcasts the optimizer's state"
SCALES_LR = "scales the learning rate by the number of workers"
WRITES_LR = "writes an optimizer's learning rate"
READS_WORKER_COUNT = "reads the number of Horovod workers"
# How many calls deep effects are followed (local helpers, other modules' functions, project classes).
EFFECT_DEPTH = 4

HVD = "horovod.torch"
HVD_BROADCAST_PARAMETERS = f"{HVD}.broadcast_parameters"
HVD_BROADCAST_OPTIMIZER_STATE = f"{HVD}.broadcast_optimizer_state"
# Other ways a script hands rank 0's weights to everyone: a broadcast of the state dict or the
# parameters themselves, or Horovod Elastic's state object, which broadcasts on every (re)start.
HVD_OTHER_BROADCASTS = frozenset(
    f"{HVD}.{name}" for name in ("broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object")
)
HVD_ELASTIC_PREFIX = f"{HVD}.elastic."
MODEL_WORDS = ("state_dict", "parameters", "named_parameters", "model", "net", "params")


def own_effects(model: ModuleModel, function: Optional[Function]) -> frozenset[str]:
    """What the statements of `function` (the module's top level for None) do themselves, not
    counting the functions they call."""
    calls = [c for c in model.calls if c.function is function] if function is None else function.calls
    out: set[str] = set()
    for call in calls:
        name = call.name or ""
        if call.attr == "backward":
            out.add(BACKWARD)
        if name in HOROVOD_SIZE_CALLS:
            out.add(READS_WORKER_COUNT)
        if name == HVD_BROADCAST_PARAMETERS or name.startswith(HVD_ELASTIC_PREFIX):
            out.add(BROADCASTS_PARAMETERS)
        elif name in HVD_OTHER_BROADCASTS:
            argument = call.arg(0, "tensor") or call.arg(0, "obj")
            if argument is not None and mentions_identifier(argument, MODEL_WORDS):
                out.add(BROADCASTS_PARAMETERS)
        if name == HVD_BROADCAST_OPTIMIZER_STATE or name.startswith(HVD_ELASTIC_PREFIX):
            out.add(BROADCASTS_OPTIMIZER)
        if name.startswith("torch.optim.lr_scheduler.") and any(
            mentions_calls(model, a.value, HOROVOD_SIZE_CALLS, call.order, call.function) for a in call.args
        ):
            out.add(SCALES_LR)
    if function is not None and (
        device_pin_calls(model, within=function) or visible_devices_writes(model, within=function)
    ):
        out.add(PINS_GPU)
    for store in model.subscript_stores:
        if store.ctx.function is not function:
            continue
        if isinstance(store.key, cst.SimpleString) and store.key.evaluated_value == "lr":
            out.add(WRITES_LR)
            if mentions_calls(model, store.value, HOROVOD_SIZE_CALLS, store.order, store.ctx.function):
                out.add(SCALES_LR)
    return frozenset(out)


def effects(model: ModuleModel, function: Function, depth: int = 0) -> frozenset[str]:
    """What calling `function` does for its caller: its own statements' effects and those of the
    functions it calls, in its module (`self._pin()`, `helper()`), in other project modules
    (`dist_utils.setup()`) and in project classes (`Trainer(...).fit()`, inherited methods
    included), up to EFFECT_DEPTH calls deep. Memoised per function; a cycle counts what was seen."""

    def compute() -> frozenset[str]:
        out = set(own_effects(model, function))
        if depth < EFFECT_DEPTH:
            for call in function.calls:
                out |= call_effects(model, call, depth + 1)
        return frozenset(out)

    return model.memoized(("effects", id(function), depth), compute, frozenset())


def call_effects(model: ModuleModel, call: Call, depth: int = 0) -> frozenset[str]:
    """What a call does for the code around it: the effects of every project function it may
    invoke (empty for a call into torch or an installed package)."""
    out: set[str] = set()
    for other, function in callees(model, call):
        out |= effects(other, function, depth)
    return frozenset(out)


def callees(model: ModuleModel, call: Call) -> list[tuple[ModuleModel, Function]]:
    """The project functions a call may invoke, each with its module's model: this module's
    functions (`helper()`, `self.helper()`), another project module's top-level function, a method
    of a project class the receiver was built from (looked up through the class's bases, across
    modules), and a project class's `__init__` for a constructor call."""
    out: list[tuple[ModuleModel, Function]] = [(model, f) for f in model.resolve_local_function(call)]
    if out:
        return out
    if call.attr is not None and call.receiver is not None:
        function = call.function
        if dotted_name(call.receiver) == "self" and function is not None and function.klass is not None:
            # `self.setup_distributed()` defined by a base class, in this module or another.
            inherited = method_of(model, function.klass, call.attr)
            return [inherited] if inherited is not None else []
        if model.project is None:
            return out
        method = linked_method(model, call)
        if method is not None:
            return [(method[0], method[1])]
        for origin in model.origin_calls(call.receiver, call.order, call.function):
            written = dotted_name(origin.node.func)
            found = model.project_class(written) if written is not None else None
            inherited = method_of(found[0], found[1], call.attr) if found is not None else None
            if inherited is not None:
                return [inherited]
    if model.project is None or not model.may_link(call):
        return out
    linked = model.linked_function(call)
    if linked is not None:
        return [linked]
    written = dotted_name(call.node.func)
    found = model.project_class(written) if written is not None else None
    if found is not None and found[0] is not model:
        init = constructor(found[0], found[1])
        if init is not None:
            return [(found[0], init)]
    return out


def method_of(model: ModuleModel, klass: str, name: str, depth: int = 0) -> Optional[tuple[ModuleModel, Function]]:
    """The method `name` of the class `klass` (a top-level class of `model`'s module): defined in
    its own body, else inherited from its bases as Python's lookup finds it (first base first),
    through project classes in this module or another, a few classes deep."""
    own = next((f for f in model.class_methods(klass) if f.name == name), None)
    if own is not None:
        return model, own
    node = model.classes.get(klass)
    if node is None or depth >= EFFECT_DEPTH:
        return None
    for base in node.bases:
        written = dotted_name(base.value)
        found = model.project_class(written) if written is not None else None
        if found is None or found == (model, klass):
            continue
        inherited = method_of(found[0], found[1], name, depth + 1)
        if inherited is not None:
            return inherited
    return None


def module_effects(model: ModuleModel, every_function: bool = False) -> frozenset[str]:
    """What this module does where its code runs: its own statements' effects and those of every
    project function called there, in any module. Only in functions that run here (a `def
    pin_gpu()` nothing calls pins nothing), unless `every_function` (a rule that stays silent on
    any sign of the effect: the module may be imported and its functions called elsewhere)."""

    def compute() -> frozenset[str]:
        out: set[str] = set(own_effects(model, None))
        for function in model.functions:
            if every_function or runs_in_module(model, function):
                out |= own_effects(model, function)
        for call in model.calls:
            if every_function or runs_in_module(model, call.function):
                out |= call_effects(model, call, 1)
        return frozenset(out)

    return model.memoized(("module_effects", every_function), compute, frozenset())


def runs_backward(model: ModuleModel, call: Call) -> bool:
    """The call is a `.backward()`, or a project function (any module) that runs one: a loop
    calling `train_step(model, optimizer, batch)` from `engine.py` trains."""
    return call.attr == "backward" or BACKWARD in call_effects(model, call, 1)


# ------------------------------------------------------------------ holders of a module that was wrapped later


# Context managers and decorators under which no gradient is recorded (by their last name).
NO_GRAD = ("no_grad", "inference_mode")


def under_no_grad(call: Call) -> bool:
    """The call runs inside `with torch.no_grad():` / `inference_mode()` in its own function."""
    return any(last_segment(dotted_name(w.func if isinstance(w, cst.Call) else w) or "") in NO_GRAD for w in call.ctx.withs)


def decorated_no_grad(function: Function) -> bool:
    """`@torch.no_grad()` / `@torch.inference_mode()` on the function."""
    node = function.node
    if not isinstance(node, cst.FunctionDef):
        return False
    for decorator in node.decorators:
        target = decorator.decorator
        written = dotted_name(target.func if isinstance(target, cst.Call) else target)
        if written is not None and last_segment(written) in NO_GRAD:
            return True
    return False


def forwarded_attributes(model: ModuleModel, klass: str, name: str, depth: int = 0) -> frozenset[str]:
    """The `self.` attributes whose forward the method `name` of the class `klass` (a top-level class
    of `model`'s module; inherited methods found through its bases, across modules) runs:
    `self.net(x)`, `self.net.forward(x)`, also through the class's methods it calls on `self`
    (`self._noise_loss(x)`), a few calls deep. `name` "__call__" on a class that does not define it
    is its `forward` (an `nn.Module` subclass). A forward under `torch.no_grad()` (a `with` or a
    decorator) does not count: it records no gradient to all-reduce."""
    found = method_of(model, klass, name)
    if found is None and name == "__call__":
        found = method_of(model, klass, "forward")
    if found is None:
        return frozenset()
    other, method = found

    def compute() -> frozenset[str]:
        out: set[str] = set()
        if decorated_no_grad(method):
            return frozenset()  # a forward that records no gradient needs no all-reduce
        for call in method.calls:
            if under_no_grad(call):
                continue
            written = dotted_name(call.node.func) or ""
            parts = written.split(".")
            if parts[0] != "self" or len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "forward"):
                continue
            out.add(parts[1])
            if len(parts) == 2 and depth < EFFECT_DEPTH and method.klass is not None:
                out |= forwarded_attributes(other, method.klass, parts[1], depth + 1)
        return frozenset(out)

    return other.memoized(("forwarded_attributes", id(method), depth), compute, frozenset())


@dataclass(frozen=True)
class StaleHolder:
    """`self.objective = DenoisingObjective(self.model)` before `self.model =
    DistributedDataParallel(self.model)`: the holder keeps the raw module in `attribute`, so a forward
    run through it (`use`) bypasses the wrapper."""

    use: Call  # the call that runs the holder: `self.objective.loss(x)`, `self.objective(x)`
    holder: str  # `self.objective`
    built: Call  # `DenoisingObjective(self.model)`
    wrap: Call  # `DistributedDataParallel(self.model, ...)`
    wrapped: str  # `self.model`
    attribute: str  # the holder's attribute that keeps the raw module (`net`)


def stale_holders(model: ModuleModel, wrapper_names: tuple[str, ...]) -> list[StaleHolder]:
    """Calls that run a forward through a holder object built from a module before the module's
    name was rebound to a wrapper (`wrapper_names`, DDP's qualified name): the holder is an object
    of a project class (any module) whose `__init__` keeps the argument in an attribute
    (`self.net = net`) that the called method runs (`self.net(x)`). Not when the holder is built
    after the wrap (it then holds the wrapper), rebuilt anywhere else, or its attribute is assigned
    anywhere in this module (`self.objective.net = self.model` after wrapping refreshes it)."""
    out: list[StaleHolder] = []
    for wrap in model.calls_named(*wrapper_names):
        inner = wrap.arg(0, "module")
        while isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value in ("cuda", "to"):
            inner = inner.func.value  # `DDP(model.cuda())` wraps the very object `model` names
        wrapped = dotted_name(inner)
        if wrapped is None or not any(a.target == wrapped for a in model.assignments_of(wrap.node)):
            continue  # not `model = DDP(model)`: the old name still means the raw module, on purpose
        for built in model.scope_calls(wrap.function):
            if built.order >= wrap.order or not any(dotted_name(a.value) == wrapped for a in built.args):
                continue
            holders = [a for a in model.assignments_of(built.node) if a.kind in ("assign", "annassign")]
            written = dotted_name(built.node.func)
            found = model.project_class(written) if written is not None and len(holders) == 1 else None
            if found is None:
                continue
            holder = holders[0].target
            if len(model.assignments_to(holder)) != 1:
                continue  # rebuilt somewhere: it may be rebuilt from the wrapper
            init = method_of(found[0], found[1], "__init__")  # its own, or a base class's
            if init is None or init[1].klass is None:
                continue
            kept = [
                attribute[len("self."):]
                for attribute, param in constructor_stores(init[0], init[1].klass).items()
                if dotted_name(argument_for(built, init[1], param)) == wrapped
            ]
            kept = [k for k in kept if not model.assignments_to(f"{holder}.{k}")]
            if not kept:
                continue
            for use in _holder_runs(model, holder, built, wrap):
                method = "__call__" if use.receiver is None else use.attr or ""
                forwarded = forwarded_attributes(found[0], found[1], method)
                for attribute in kept:
                    if attribute in forwarded:
                        out.append(StaleHolder(use, holder, built, wrap, wrapped, attribute))
                        break
    return out


def _holder_runs(model: ModuleModel, holder: str, built: Call, wrap: Call) -> list[Call]:
    """The calls of the holder (`holder(x)`) or of a method of it (`holder.loss(x)`) that see the
    holder built by `built` after the wrap: anywhere in the class for a `self.` attribute, later
    in the same function for a variable."""
    out: list[Call] = []
    for call in model.calls:
        if call.receiver is not None:
            if dotted_name(call.receiver) != holder:
                continue
        elif call.dotted != holder:
            continue
        if holder.startswith("self."):
            if call.function is None or wrap.function is None or call.function.klass != wrap.function.klass:
                continue
            if call.function is wrap.function and call.order < wrap.order:
                continue
        elif call.function is not wrap.function or call.order < wrap.order:
            continue
        out.append(call)
    return out


# ------------------------------------------------------------------ who else writes a value a fix relies on

ANY_ATTRIBUTE = "*"  # `setattr(args, name, value)`, `vars(args).update(...)`: any attribute may change


def attribute_writes(model: ModuleModel, function: Function, depth: int = 0) -> frozenset[tuple[str, str]]:
    """The attributes of its parameters that calling `function` may rebind for its caller, as
    (parameter, attribute): `args.gpu = ...` on a parameter `args` (`self.device = ...` in a
    method), `setattr(args, ...)` and `vars(args).update(...)` (ANY_ATTRIBUTE), and what the project
    functions it hands a parameter on to write on it (`_adopt(args)`), in any module, up to
    EFFECT_DEPTH calls deep. A parameter handed to a call the analysis cannot follow is not counted
    here: `rewritten_before` asks that of the call it starts from."""

    def compute() -> frozenset[tuple[str, str]]:
        params = set(function.params)
        out: set[tuple[str, str]] = set()
        for assignment in model.assignments:
            if assignment.function is not function or assignment.kind not in ("assign", "annassign", "augassign", "unpack", "for", "with"):
                continue
            holder, _, attribute = assignment.target.partition(".")
            if attribute and holder in params:
                out.add((holder, attribute.partition(".")[0]))
        for call in function.calls:
            for param in params:
                if _writes_through(call, param):
                    out.add((param, ANY_ATTRIBUTE))
            if depth >= EFFECT_DEPTH:
                continue
            for other, callee in callees(model, call):
                for param in params:
                    for inner in _receiving(call, callee, param):
                        out.update((param, attribute) for written, attribute in attribute_writes(other, callee, depth + 1) if written == inner)
        return frozenset(out)

    return model.memoized(("attribute_writes", id(function), depth), compute, frozenset())


def _writes_through(call: Call, holder: str) -> bool:
    """`setattr(holder, ...)`, `vars(holder).update(...)`, `holder.__dict__.update(...)`."""
    if call.dotted == "setattr" and call.args and dotted_name(call.args[0].value) == holder:
        return True
    receiver = call.receiver
    if call.attr == "update" and receiver is not None:
        if dotted_name(receiver) == f"{holder}.__dict__":
            return True
        if isinstance(receiver, cst.Call) and dotted_name(receiver.func) == "vars" and receiver.args:
            return dotted_name(receiver.args[0].value) == holder
    return False


def _receiving(call: Call, callee: Function, holder: str) -> list[str]:
    """The parameters of `callee` that `call` binds to the object named `holder`: an argument that
    is it (by position or keyword), or the receiver of a method call (`holder.setup()` binds `self`)."""
    out: list[str] = []
    receiver = dotted_name(call.receiver) if call.receiver is not None else None
    method = callee.klass is not None and bool(callee.params) and callee.params[0] in ("self", "cls")
    if receiver == holder and method:
        out.append(callee.params[0])
    for param in callee.params:
        argument = argument_for(call, callee, param) if not (method and param == callee.params[0]) else None
        if argument is not None and dotted_name(argument) == holder:
            out.append(param)
    return out


def rewritten_before(model: ModuleModel, name: str, order: int, function: Optional[Function]) -> Optional[Call]:
    """A call that may rebind the attribute `name` (`args.gpu`, `self.local_rank`) after the
    assignment that reaches `order` and before `order`, in `function`'s own body: it is handed the
    object that holds it (`adopt_slot(args)`, `self.setup()`) and either a project function it
    invokes (any module, base classes included) writes that attribute, or the analysis cannot follow
    it (neither torch's, Horovod's, a builtin, nor a project function). A fix that reads `name` there
    is certain only when this is None. None for a plain variable: no call rebinds a function's local."""
    holder, dot, attribute = name.rpartition(".")
    if not dot:
        return None
    reaching = model.reaching_assignments(name, order, function)
    if not reaching:
        return None
    start = min(a.order for a in reaching)
    prefixes = {holder, *(holder.rsplit(".", n)[0] for n in range(1, holder.count(".") + 1))}
    for call in model.scope_calls(function):
        if not start < call.order < order:
            continue
        receiver = dotted_name(call.receiver) if call.receiver is not None else None
        handed = {dotted_name(a.value) for a in call.args} | {receiver}
        if not handed & prefixes and not any(_writes_through(call, p) for p in prefixes):
            continue
        if _writes_through(call, holder) or (handed & prefixes) - {holder}:
            return call  # an enclosing object handed over (`self` for `self.cfg.gpu`): anything goes
        found = callees(model, call)
        if not found:
            if _harmless(call):
                continue
            return call
        for other, callee in found:
            written = attribute_writes(other, callee)
            if any((param, attribute) in written or (param, ANY_ATTRIBUTE) in written for param in _receiving(call, callee, holder)):
                return call
    return None


def _harmless(call: Call) -> bool:
    """A call into torch, Horovod or a builtin (`print(args)`, `isinstance(args, ...)`): it rebinds
    nothing of what it is handed."""
    return (call.name or "").split(".")[0] in ("torch", "horovod") or (call.name is None and call.dotted in _BUILTINS)


def handed_to_unfollowed(model: ModuleModel, names: frozenset[str]) -> Optional[Call]:
    """A call that runs here and is handed one of the variables `names` (`make_scheduler(optimizer,
    cfg)`) while the analysis cannot see what it does with it: the callee is neither torch's,
    Horovod's, a method of the value itself, nor a project function the summaries follow. What such a
    call does to the value (its learning rate, say) is unknown, so a fix that assumes nobody else
    writes it is not certain."""
    for call in model.calls:
        if not runs_in_module(model, call.function) or (call.receiver is not None and dotted_name(call.receiver) in names):
            continue
        if not any(dotted_name(arg.value) in names for arg in call.args):
            continue
        if _harmless(call):
            continue  # `print(optimizer)`, `isinstance(optimizer, ...)` write no rate
        if not callees(model, call):
            return call
    return None


_BUILTINS = frozenset(dir(builtins))
