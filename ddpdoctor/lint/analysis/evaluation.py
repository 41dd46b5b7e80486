"""Evaluation on data split across ranks, and whether its score is combined across them.

With a DistributedSampler (or a dataset that takes its own rank's share) each rank evaluates only
its 1/world_size of the validation set. A score computed from those batches alone is this rank's
shard's score: rank 0's number is logged as the result, a best checkpoint is chosen by it, a
ReduceLROnPlateau steps on it (and on another value on every other rank). The score becomes the
whole set's only when the per-rank sums, counts or predictions are combined: `dist.all_reduce`,
`all_gather`, Horovod's `allreduce`, Accelerate's `gather_for_metrics` / `reduce`, torchmetrics'
`compute()` (which syncs), or a project helper that does one of these (`reduce_tensor`,
`synchronize_between_processes`, mmcv's `collect_results`).

Two facts for the rules: `unreduced_evaluations` (an evaluation loop over a split loader whose
result leaves its function, or is logged, with no such combination on the way) and
`shard_local_score` (a value that is such an evaluation's result).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis.model import MAX_DEPTH, Call, Function, Guard, Loop, ModuleModel, SubscriptStore, mentions
from ddpdoctor.lint.analysis.ranks import Runs, who_runs
from ddpdoctor.lint.analysis.sharding import DATA_LOADER, loader_split_across_ranks
from ddpdoctor.lint.analysis.summaries import decorated_no_grad, linked_method, mentions_rank, under_no_grad
from ddpdoctor.lint.analysis.syntax import contains, dotted_name, last_segment, walk

# Collectives that combine a value across the ranks.
REDUCING_CALLS = frozenset(
    {
        f"torch.distributed.{name}"
        for name in (
            "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "reduce", "gather",
            "gather_object", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
        )
    }
    | {f"horovod.torch.{name}" for name in ("allreduce", "allreduce_", "allgather", "allgather_object", "grouped_allreduce")}
)
# Words in the name of a library method or a project helper that combines values across processes:
# Accelerate's `gather` / `gather_for_metrics` / `reduce`, `reduce_tensor`, `all_reduce_mean`,
# `synchronize_between_processes`, `sync_metrics`, mmcv's `collect_results_gpu`. A name that only
# sounds like it (`functools.reduce`) makes the analysis answer "reduced": silence, never a finding.
# (`synchronize()` alone is a barrier: it combines nothing.)
REDUCING_WORDS = ("reduce", "gather", "synchronize_between", "sync_", "collect")
# torchmetrics' Metric.compute() syncs its state across processes before computing.
METRIC_LIBRARIES = ("torchmetrics", "ignite.metrics")
# Context managers under which no gradient is recorded: an evaluation pass.
# Function names that say "this evaluates".
EVAL_WORDS = ("eval", "valid", "test", "infer")
# Calls that report a score.
REPORTING_CALLS = frozenset({"print", "info", "log", "add_scalar", "add_scalars", "log_metrics", "log_dict"})
# Calls that write what the loop accumulated to a file, after it: the evaluation's output. (Inside the
# loop a write is a per-sample output, and into a per-rank file a deliberate shard, merged later.)
DUMPING_CALLS = frozenset({"dump", "write"})
# How many helper calls deep a reduction is looked for.
HELPER_DEPTH = 3


@dataclass(frozen=True, eq=False)
class ShardEvaluation:
    """An evaluation loop over data split across ranks, in `function`, drawing from `loader`."""

    loop: Loop
    loader: Call
    function: Optional[Function]  # None: a loop of the script's module-level code
    returned: bool  # its function returns a value (the score leaves it); else it only reports one
    main_process_only: bool  # only the main process runs it (on its own shard all the same)


def unreduced_evaluations(model: ModuleModel) -> list[ShardEvaluation]:
    """Evaluation loops over a loader split across ranks whose function returns or reports a score,
    with no combination across ranks in the loop, after it in its function (helpers included), nor
    in a caller after the call."""
    return model.memoized(("unreduced-evaluations",), lambda: _unreduced_evaluations(model), [])


def _unreduced_evaluations(model: ModuleModel) -> list[ShardEvaluation]:
    out: list[ShardEvaluation] = []
    for loop in model.loops:
        function = loop.function
        if not is_evaluation_loop(model, loop):
            continue
        if any(contains(other, loop.order) for other in model.loops if other.function is function and other is not loop
               and is_evaluation_loop(model, other)):
            continue  # the outer evaluation loop is the one (a loop over the items of a batch inside)
        loaders = [c for c in model.loop_sources(loop) if c.name == DATA_LOADER]
        if not loaders or not all(loader_split(model, loader) for loader in loaders):
            continue
        results = loop_results(model, loop)
        returned = function is not None and bool(results) and any(
            _mentions_results(model, value, function.end_order, function, results) for value in function.returns
        )
        if not returned and not _reports_from(model, loop):
            continue
        if reduced_from(model, loop):
            continue
        inside = model.calls_of_within(function, loop)
        rank0 = bool(inside) and who_runs(model, inside[0]).runs is Runs.RANK0
        out.append(ShardEvaluation(loop, loaders[0], function, returned, rank0))
    return out


def is_evaluation_loop(model: ModuleModel, loop: Loop) -> bool:
    """A loop that computes no gradient (no `backward` in it or its helpers) and evaluates: it runs
    under `torch.no_grad()` / `inference_mode()` (a `with` or a decorator), after `model.eval()` in
    its function, or in a function named for evaluating (`validate`, `evaluate`, `test`)."""
    function = loop.function
    inside = model.calls_within(loop)
    if any(call.attr in ("backward", "step", "zero_grad") for call in inside):
        return False
    if any(under_no_grad(call) for call in inside):
        return True
    if function is None:
        # A script's module-level code: only `with torch.no_grad():` says "this evaluates" (a
        # `model.eval()` somewhere above, or the module's name, says nothing about this loop).
        return False
    if decorated_no_grad(function):
        return True
    if any(call.attr == "eval" and not call.args and call.order < loop.order for call in function.calls):
        return True
    return any(word in function.name.lower() for word in EVAL_WORDS)


def _reports_from(model: ModuleModel, loop: Loop) -> bool:
    """A call in the loop or after it, in its function, that logs, prints or dumps what the loop
    accumulated (`print(total / n)`, `logger.info(... mIoU)`, `json.dump(predictions, f)`), or a
    best score kept from it after the loop (`if mIoU > self.best_pred: self.best_pred = mIoU`). A
    progress line that mentions none of the loop's results (`print("done")`) is no score."""
    function = loop.function
    results = loop_results(model, loop)
    if not results:
        return False
    for call in model.calls:
        if call.function is not function or call.order <= loop.order:
            continue
        written = last_segment(call.dotted or call.name or "")
        if written in DUMPING_CALLS:
            if call.order < loop.end_order:
                continue
            if any(_per_rank(model, arg.value, call.order, function) for arg in call.args):
                continue
            if call.receiver is not None and _per_rank(model, call.receiver, call.order, function):
                continue
        elif written not in REPORTING_CALLS:
            continue
        if any(_mentions_results(model, arg.value, call.order, function, results) for arg in call.args):
            return True
    return any(
        a.function is function and a.order > loop.order and "best" in last_segment(a.target).lower()
        and a.value is not None and _mentions_results(model, a.value, a.order, function, results)
        for a in model.assignments
    )


def _per_rank(model: ModuleModel, expr: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    """A file (handle) whose path names the rank: `open(f"preds_{rank}.json", "w")`, also bound by
    `with open(...) as handle:`, which value-following does not enter."""
    if mentions_rank(model, expr, order, function):
        return True
    name = dotted_name(expr)
    return name is not None and any(
        a.value is not None and mentions_rank(model, a.value, a.order, a.function)
        for a in model.reaching_assignments(name, order, function)
    )


# Methods that add to a collection in place: a loop that calls one accumulates into its receiver.
ACCUMULATING_METHODS = frozenset({"append", "extend", "update", "add", "add_", "insert"})


def loop_results(model: ModuleModel, loop: Loop) -> frozenset[str]:
    """What an evaluation loop accumulates: the names assigned in it (`total += ...`, `hits[k] = ...`)
    and the receivers of in-place additions (`predictions.append(...)`, `meter.update(...)`), apart
    from its own loop variables."""
    names = {
        a.target for a in model.assignments
        if a.function is loop.function and contains(loop, a.order) and a.kind in ("assign", "augassign", "annassign", "subscript", "unpack")
    }
    for call in model.calls_of_within(loop.function, loop):
        if call.attr in ACCUMULATING_METHODS:
            receiver = dotted_name(call.receiver) if call.receiver is not None else None
            if receiver is not None:
                names.add(receiver)
    return frozenset(names - set(loop.target_names))


def _mentions_results(
    model: ModuleModel, expr: cst.BaseExpression, order: int, function: Optional[Function], results: frozenset[str]
) -> bool:
    def test(model: ModuleModel, node: cst.BaseExpression, at: int, inside: Optional[Function]) -> bool:
        name = dotted_name(node)
        return name is not None and (name in results or name.split(".")[0] in results)

    return mentions(model, expr, order, function, test)


def loader_split(model: ModuleModel, loader: Call) -> bool:
    """The loader's items differ from rank to rank (`sharding.loader_split_across_ranks`), or its
    `sampler=` / `batch_sampler=` comes from a project helper that returns a DistributedSampler on
    some path (`make_data_sampler(ds, shuffle, distributed)`), also wrapped in a batch sampler built
    by another helper (`make_batch_data_sampler(sampler, batch_size)`)."""
    if loader_split_across_ranks(model, loader):
        return True
    for sampler in (loader.arg(3, "sampler"), loader.arg(4, "batch_sampler")):
        if sampler is not None and _distributed_sampler(model, sampler, loader.order, loader.function, 0):
            return True
    return False


def _distributed_sampler(
    model: ModuleModel, expr: cst.BaseExpression, order: int, function: Optional[Function], depth: int
) -> bool:
    if depth > 3:
        return False
    for origin in model.origin_calls(expr, order, function):
        if "distributedsampler" in (origin.name or origin.dotted or "").lower().replace("_", ""):
            return True
        for owner, helper in model.returned_functions(origin):
            if owner is model:
                continue  # this module's helpers are already followed by origin_calls
            if any(_distributed_sampler(owner, value, at, inside, depth + 1)
                   for value, at, inside in owner.return_sites(helper)):
                return True
        if "sampler" in (origin.dotted or "").lower():
            # A sampler factory handed the script's distributed switch (`make_data_sampler(ds, False,
            # args.distributed)`, when its module cannot be read: a star import).
            if any(last_segment(dotted_name(arg.value) or "") == "distributed" for arg in origin.args):
                return True
            # A sampler built around another one: the inner one decides whose items it yields.
            if any(_distributed_sampler(model, arg.value, origin.order, origin.function, depth + 1) for arg in origin.args):
                return True
    return False


def reduces(model: ModuleModel, call: Call, depth: int = 0) -> bool:
    """The call combines values across processes: a collective, a library method or project helper
    named for it, torchmetrics' `compute()`, or a helper (this module's or another project module's)
    that makes such a call."""
    if call.name in REDUCING_CALLS:
        return True
    written = last_segment(call.dotted or call.name or "").lower()
    if any(word in written for word in REDUCING_WORDS):
        return True
    if call.attr == "compute" and any(model.uses_module(library) for library in METRIC_LIBRARIES):
        return True
    if depth >= HELPER_DEPTH:
        return False
    for helper in [*model.resolve_local_function(call), *instance_methods(model, call)]:
        if any(reduces(model, inner, depth + 1) for inner in helper.calls):
            return True
    if model.may_link(call):
        linked = model.linked_function(call)
        if linked is not None:
            other, helper = linked
            if any(reduces(other, inner, depth + 1) for inner in helper.calls):
                return True
    method = linked_method(model, call)
    if method is not None:
        # `self.metric.update(...)` on another module's class whose method all-reduces its counts.
        other, helper, _ = method
        return any(reduces(other, inner, depth + 1) for inner in helper.calls)
    return False


def instance_methods(model: ModuleModel, call: Call) -> list[Function]:
    """`meter.update(x)` where `meter = Meter(...)` and `Meter` is a class of this module: its
    `update` (defined in the class's own body)."""
    receiver = call.receiver
    if receiver is None or call.attr is None:
        return []
    out: list[Function] = []
    for origin in model.origin_calls(receiver, call.order, call.function):
        klass = origin.dotted
        if klass is not None and "." not in klass:
            out.extend(m for m in model.class_methods(klass) if m.name == call.attr)
    return out


def reduced_from(model: ModuleModel, loop: Loop) -> bool:
    """Some combination across ranks runs in the loop or after it: in its function, or, after the
    call, in a function that calls it (one level up, and one more)."""
    function = loop.function
    if function is None:
        # Module-level code: what runs after the loop in the script, helpers included.
        return any(call.function is None and call.order > loop.order and reduces(model, call) for call in model.calls)
    if any(call.order > loop.order and reduces(model, call) for call in function.calls):
        return True
    return _reduced_by_callers(model, function, 0)


def _reduced_by_callers(model: ModuleModel, function: Function, depth: int) -> bool:
    """A caller combines what the evaluation returned: a reducing call after the call site, in the
    caller, given the call itself (`reduce_tensor(validate(...))`) or a name bound to its result
    (`acc = validate(...)` then `acc = reduce_tensor(acc)`); or its own caller does the same with
    what the caller returned. A reduction of something else (another evaluation's counts, the
    training loss) does not count."""
    if depth > 1:
        return False
    for site in model.callers(function):
        caller = site.function
        names = _result_names(model, site)
        for call in model.calls:
            if call.function is not caller or call is site:
                continue
            nested = any(node is site.node for arg in call.args for node in walk(arg.value))
            if (not nested and call.order < site.order) or not reduces(model, call):
                continue
            if nested:
                return True
            if any(dotted_name(node) in names for arg in call.args for node in walk(arg.value)
                   if isinstance(node, (cst.Name, cst.Attribute))):
                return True
        if caller is not None and caller is not function and _returns_result(model, caller, names, site) \
                and _reduced_by_callers(model, caller, depth + 1):
            return True
    return False


def _result_names(model: ModuleModel, site: Call) -> set[str]:
    """The names a call's result is bound to: `acc = f()`, `loss, acc = f()`."""
    return {
        a.target for a in model.assignments
        if a.value is site.node or (a.unpacked is not None and a.unpacked[0] is site.node)
    }


def _returns_result(model: ModuleModel, caller: Function, names: set[str], site: Call) -> bool:
    return any(
        node is site.node or (isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) in names)
        for value in caller.returns for node in walk(value)
    )


def shard_local_score(
    model: ModuleModel, expr: Optional[cst.BaseExpression], order: int, function: Optional[Function]
) -> Optional[ShardEvaluation]:
    """The unreduced evaluation a value comes from: the result of a call of its function
    (`val_loss = validate(...)`, `loss, acc = validate(...)`), or a value accumulated in the loop of
    an evaluation in the same function (`total += loss.item()` in it, `val_loss = total / n`
    after). None when it comes from no such evaluation."""
    evaluations = unreduced_evaluations(model)
    if expr is None or not evaluations:
        return None
    found: list[ShardEvaluation] = []

    def test(model: ModuleModel, node: cst.BaseExpression, at: int, inside: Optional[Function]) -> bool:
        if isinstance(node, cst.Call):
            call = model.call_of(node)
            if call is None:
                return False
            for helper in model.resolve_local_function(call):
                found.extend(e for e in evaluations if e.function is helper and e.returned)
            return bool(found)
        name = dotted_name(node)
        if name is None:
            return False
        for assignment in model.reaching_assignments(name, at, inside):
            if assignment.unpacked is not None:
                source = model.call_of(assignment.unpacked[0])
                if source is not None and test(model, source.node, source.order, source.function):
                    return True
            found.extend(e for e in evaluations if e.function is assignment.function and contains(e.loop, assignment.order))
        return bool(found)

    if mentions(model, expr, order, function, test, depth=MAX_DEPTH - 3):
        return found[0]
    return None


# Schedulers that step on a metric.
PLATEAU_SCHEDULERS = ("ReduceLROnPlateau",)
# Words in the name of an early-stopping object or helper (`early_stopping(val_loss, model)`,
# `stopper.step(metric)` on an `EarlyStopping(...)`).
EARLY_STOP_WORDS = ("early_stop", "earlystop", "early_stopping")


def metric_schedule_calls(model: ModuleModel) -> list[tuple[Call, str]]:
    """Calls that change the learning rate or decide to stop from a metric they are given:
    `scheduler.step(metric)` on a ReduceLROnPlateau, and an early-stopping object or helper called
    with one. Each with how a message names it."""
    out: list[tuple[Call, str]] = []
    for call in model.calls:
        if not call.args:
            continue
        receiver = call.receiver
        if call.attr == "step" and receiver is not None:
            origins = model.origin_calls(receiver, call.order, call.function)
            if any(last_segment(o.name or o.dotted or "") in PLATEAU_SCHEDULERS for o in origins):
                out.append((call, "ReduceLROnPlateau.step()"))
                continue
            if any(_early_stop_name(o.name or o.dotted or "") for o in origins):
                out.append((call, "the early-stopping check"))
                continue
        written = dotted_name(call.node.func) or ""
        if _early_stop_name(written):
            out.append((call, "the early-stopping check"))
            continue
        if receiver is None and dotted_name(call.node.func) is not None:
            origins = model.origin_calls(call.node.func, call.order, call.function)
            if any(_early_stop_name(o.name or o.dotted or "") for o in origins):
                out.append((call, "the early-stopping check"))
    return out


def _early_stop_name(written: str) -> bool:
    flat = last_segment(written).lower().replace("_", "")
    return any(word.replace("_", "") in flat for word in EARLY_STOP_WORDS)


def metric_driven_lr_changes(model: ModuleModel) -> list[tuple[SubscriptStore, Guard, ShardEvaluation]]:
    """`param_group["lr"] = ...` (or `*=`) under a condition on a shard-local score (`if val_loss >
    best: for g in optimizer.param_groups: g["lr"] *= 0.5`): a hand-written plateau schedule. Each
    with the deciding condition and the evaluation the score comes from."""
    if not unreduced_evaluations(model):
        return []
    out: list[tuple[SubscriptStore, Guard, ShardEvaluation]] = []
    for store in model.subscript_stores:
        if not (isinstance(store.key, cst.SimpleString) and store.key.evaluated_value == "lr"):
            continue
        for guard in store.ctx.guards:
            found = shard_local_score(model, guard.test, guard.order, guard.function)
            if found is not None:
                out.append((store, guard, found))
                break
    return out
