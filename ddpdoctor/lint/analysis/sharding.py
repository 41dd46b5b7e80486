"""Data split across ranks: which datasets, loaders and loop items each rank holds alone.

Without a DistributedSampler, data is still split when the dataset takes its own share: a class
whose `__init__` slices a (seeded) permutation of the whole set by `dist.get_rank()` and
`dist.get_world_size()`, an IterableDataset whose `__iter__` keeps every `world_size`-th item from
`rank` on, a generator method that yields this rank's slice. Two rules need the fact: a shuffling
DataLoader over such a dataset shuffles only this rank's shard (DDP006 stays silent), and a loop
over it that `torch.save`s each item under the item's own name writes files no other rank writes
(DDP008 stays silent), unlike a checkpoint named after the epoch, which every rank writes.

"Partitions by rank" is read from what the code does, never from what it is called: a subscript
whose index derives from the rank and which mentions the world size (`items[rank::world_size]`,
`rows[rank * per : (rank + 1) * per]` with `per = len(rows) // world_size`,
`np.array_split(xs, world_size)[rank]`), `range(rank, n, world_size)` / `islice(it, rank, None,
world_size)`, `ds.shard(num_shards=..., index=rank)`, and `i % world_size == rank`. It is looked for
in a function's body and in the helpers it calls, a few calls deep, across the project's modules.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis.launch import env_key
from ddpdoctor.lint.analysis.model import MAX_DEPTH, Call, Function, ModuleModel, mentions
from ddpdoctor.lint.analysis.summaries import mentions_rank
from ddpdoctor.lint.analysis.syntax import Expr, dotted_name, last_segment, names_in, walk

DATA_LOADER = "torch.utils.data.DataLoader"

WORLD_SIZE_CALLS = frozenset(
    {
        "torch.distributed.get_world_size",
        "horovod.torch.size",
        "horovod.tensorflow.size",
        "horovod.keras.size",
        "horovod.tensorflow.keras.size",
    }
)
# A project's own helper, called by its bare name (`utils.get_world_size()`).
WORLD_SIZE_HELPERS = frozenset({"get_world_size", "world_size"})
WORLD_SIZE_ENV = frozenset({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
# What a variable holding the process count is called, when where it comes from cannot be followed.
WORLD_SIZE_NAMES = frozenset({"world_size", "num_replicas", "num_processes", "nranks", "num_ranks", "n_ranks"})

# Calls that pick every k-th item from an offset: `range(rank, n, world_size)`.
STRIDED_CALLS = frozenset({"range", "islice"})
# Library calls that take one rank's share of a dataset given the rank: Hugging Face datasets'
# `ds.shard(num_shards=world_size, index=rank)` and `split_dataset_by_node(ds, rank, world_size)`.
SHARD_CALLS = frozenset({"shard", "split_dataset_by_node"})
# The methods a DataLoader calls on a map-style or iterable dataset: where a dataset takes its share.
DATASET_METHODS = frozenset({"__init__", "__iter__", "__getitem__", "__getitems__", "__len__"})
# Words in a dataset's construction that say it is already split per rank (`shard(rank)`,
# `Subset(ds, indices[rank::world_size])`, webdataset's `split_by_node`): the spelling is evidence
# enough when nothing can be followed, and a rule that trusts it can only stay silent.
SHARD_WORDS = ("rank", "world_size", "num_replicas", "shard", "split_by_node", "num_shards")
# How many calls deep a function's helpers are searched for the partition.
HELPER_DEPTH = 3


def is_world_size(model: ModuleModel, node: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    """`dist.get_world_size()`, `hvd.size()`, `os.environ["WORLD_SIZE"]`, a `get_world_size()` helper,
    or a variable called so (`args.world_size`, `self.num_replicas`)."""
    if env_key(model, node) in WORLD_SIZE_ENV:
        return True
    if isinstance(node, cst.Call):
        name = model.qualify(node.func)
        if name in WORLD_SIZE_CALLS:
            return True
        return (name is None or not name.startswith("torch.")) and last_segment(dotted_name(node.func) or "") in WORLD_SIZE_HELPERS
    name = dotted_name(node)
    return name is not None and last_segment(name).lower().endswith(tuple(WORLD_SIZE_NAMES))


def mentions_world_size(model: ModuleModel, expr: Optional[cst.CSTNode], order: int, function: Optional[Function]) -> bool:
    return mentions(model, expr, order, function, is_world_size)


# ------------------------------------------------------------------------------ functions, classes


def partitions_by_rank(model: ModuleModel, function: Function, depth: int = 0) -> bool:
    """True when `function`, or a helper it calls (this module's or another project module's, a few
    calls deep), takes one rank's share of a collection (see the module docstring)."""
    key = ("partitions-by-rank", id(function))
    return model.memoized(key, lambda: _partitions_by_rank(model, function, depth), False)


def _partitions_by_rank(model: ModuleModel, function: Function, depth: int) -> bool:
    if _takes_a_share(model, function):
        return True
    if depth >= HELPER_DEPTH:
        return False
    for call in function.calls:
        for helper in model.resolve_local_function(call):
            if helper is not function and partitions_by_rank(model, helper, depth + 1):
                return True
        linked = model.linked_function(call)
        if linked is not None and partitions_by_rank(linked[0], linked[1], depth + 1):
            return True
    return False


def _takes_a_share(model: ModuleModel, function: Function) -> bool:
    """The partition in the function's own body. Values are read as at the function's end: the
    body's names are mostly assigned once before the slice that uses them."""
    nested = (cst.FunctionDef, cst.ClassDef)
    return any(
        _share_node(model, node, function.end_order, function)
        for node in walk(function.node.body, skip=lambda n: isinstance(n, nested))
    )


def _share_node(model: ModuleModel, node: cst.CSTNode, at: int, function: Optional[Function]) -> bool:
    """One node that takes a rank's share: a subscript by the rank that mentions the world size, a
    stride from the rank by the world size, a library shard call given the rank, a modulo test."""
    if isinstance(node, cst.Subscript):
        return any(mentions_rank(model, element.slice, at, function) for element in node.slice) and mentions_world_size(
            model, node, at, function
        )
    if isinstance(node, cst.Call):
        last = last_segment(dotted_name(node.func) or "")
        arguments = [arg.value for arg in node.args]
        if last in STRIDED_CALLS:
            return any(mentions_rank(model, a, at, function) for a in arguments[:2]) and any(
                mentions_world_size(model, a, at, function) for a in arguments[1:]
            )
        return last in SHARD_CALLS and any(mentions_rank(model, a, at, function) for a in arguments)
    return isinstance(node, cst.Comparison) and _modulo_picks_rank(model, node, at, function)


def _modulo_picks_rank(model: ModuleModel, node: cst.Comparison, at: int, function: Optional[Function]) -> bool:
    """`i % world_size == rank` / `rank != idx % world_size`: every world_size-th item, from rank on."""
    if len(node.comparisons) != 1 or not isinstance(node.comparisons[0].operator, (cst.Equal, cst.NotEqual)):
        return False
    sides = (node.left, node.comparisons[0].comparator)
    for this, other in (sides, sides[::-1]):
        if (
            isinstance(this, cst.BinaryOperation) and isinstance(this.operator, cst.Modulo)
            and mentions_world_size(model, this.right, at, function)
            and mentions_rank(model, other, at, function)
        ):
            return True
    return False


def class_partitions_by_rank(model: ModuleModel, klass: str) -> bool:
    """True when a class of `model` takes one rank's share in a method the DataLoader calls
    (`__init__`, `__iter__`, `__getitem__`, `__len__`), or in a helper that method calls."""
    return any(
        partitions_by_rank(model, method) for method in model.class_methods(klass) if method.name in DATASET_METHODS
    )


def instantiated_classes(model: ModuleModel, call: Call) -> list[tuple[ModuleModel, str]]:
    """The project classes a call may construct, each with the model of its module: `Dataset(...)`
    for a class defined here or imported from the project, and `make_dataset(cfg)(...)` (or `cls =
    make_dataset(cfg)` then `cls(...)`) where the factory returns a class by name."""
    func = call.node.func
    written = dotted_name(func)
    if written is not None:
        found = model.project_class(written)
        if found is not None:
            return [found]
    factories = model.origin_calls(func, call.order, call.function)
    out: list[tuple[ModuleModel, str]] = []
    for factory in factories:
        for owner, helper in model.returned_functions(factory):
            for returned in helper.returns:
                name = dotted_name(returned)
                found = owner.project_class(name) if name is not None else None
                if found is not None:
                    out.append(found)
    return out


def _call_partitions(model: ModuleModel, call: Call, depth: int) -> bool:
    """The value of `call` is one rank's share: an instance of a class that partitions, the result
    of a method of one or of a function that does, or an item drawn with `next()` from such a
    generator."""
    if call.dotted in ("next", "iter") and call.name is None:
        first = call.arg(0)
        return first is not None and split_by_rank(model, first, call.order, call.function, depth + 1)
    if any(class_partitions_by_rank(owner, klass) for owner, klass in instantiated_classes(model, call)):
        return True
    for helper in model.resolve_local_function(call):
        if helper.name != "__init__" and partitions_by_rank(model, helper):
            return True
    linked = model.linked_function(call)
    if linked is not None and partitions_by_rank(*linked):
        return True
    receiver = call.receiver
    if receiver is None or call.attr is None:
        return False
    # `ds.load()` / `ds.batches()` on an instance of a project class: that method's own share.
    for built in model.origin_calls(receiver, call.order, call.function):
        for owner, klass in instantiated_classes(model, built):
            if any(partitions_by_rank(owner, m) for m in owner.class_methods(klass) if m.name == call.attr):
                return True
    return False


# ------------------------------------------------------------------------------------ values


def split_by_rank(model: ModuleModel, expr: Expr, order: int, function: Optional[Function], depth: int = 0) -> bool:
    """True when the data `expr` holds is already this rank's share (a dataset or the items of one):
    it comes from a class, method, function or generator that partitions by rank, or the way it is
    built names a rank or a shard (`Subset(ds, range(rank, n, world_size))`, `ds.shard(...)`)."""
    if depth > MAX_DEPTH:
        return False
    key = ("split-by-rank", id(expr), order, id(function))
    return model.memoized(key, lambda: _split_by_rank(model, expr, order, function, depth), False)


def _split_by_rank(model: ModuleModel, expr: Expr, order: int, function: Optional[Function], depth: int) -> bool:
    origins = model.origin_calls(expr, order, function)
    exprs: list[cst.BaseExpression] = [expr, *(c.node for c in origins)]
    for node in exprs:
        if any(word in last_segment(name).lower() for name in names_in(node) for word in SHARD_WORDS):
            return True
        if isinstance(node, cst.Call) and any(w in (dotted_name(node.func) or "").lower() for w in ("shard", "split_by_node")):
            return True
    return any(_call_partitions(model, origin, depth) for origin in origins)


def loader_split_across_ranks(model: ModuleModel, loader: Call) -> bool:
    """A `DataLoader(...)` whose items differ from rank to rank: it draws through a distributed
    sampler, or its dataset is this rank's share (`split_by_rank`)."""
    samplers = model.loader_samplers(loader)
    if any("distributed" in (s.name or s.dotted or "").lower() for s in samplers):
        return True
    dataset = loader.arg(0, "dataset")
    return dataset is not None and split_by_rank(model, dataset, loader.order, loader.function)


def iterates_split_data(model: ModuleModel, expr: Expr, order: int, function: Optional[Function]) -> bool:
    """A loop over `expr` (or `next(expr)`) draws items no other rank draws: a DataLoader split
    across ranks, a collection that is this rank's share iterated directly, or part of an item
    already drawn from such data (`for name in batch["names"]`)."""
    key = ("iterates-split-data", id(expr), order, id(function))
    return model.memoized(key, lambda: _iterates_split_data(model, expr, order, function), False)


def _iterates_split_data(model: ModuleModel, expr: Expr, order: int, function: Optional[Function]) -> bool:
    drawn = model.drawn_from(expr, order, function)
    loaders = [c for c in drawn if c.name == DATA_LOADER]
    if loaders:
        return any(loader_split_across_ranks(model, loader) for loader in loaders)
    return any(
        _takes_its_share(model, iterated, order, function) or _part_of_split_item(model, iterated, order, function)
        for iterated in model.iterated_exprs(expr)
    )


def _takes_its_share(model: ModuleModel, expr: Expr, order: int, function: Optional[Function]) -> bool:
    """What a loop iterates directly is this rank's share, by what the code does (not by names: a
    loop over `range(world_size)` visits every rank's index on every rank): `range(rank, n,
    world_size)`, `files[rank::world_size]` (also through a variable), a dataset or helper that
    takes its share."""
    for value, at, inside in model.leaf_values(expr, order, function):
        if any(_share_node(model, node, at, inside) for node in walk(value)):
            return True
        if any(_call_partitions(model, origin, 0) for origin in model.origin_calls(value, at, inside)):
            return True
    return False


def _part_of_split_item(model: ModuleModel, expr: Expr, order: int, function: Optional[Function], depth: int = 0) -> bool:
    """`batch["names"]`, `batch.paths`, `names` after `names = batch["names"]`: taken from an item of
    split data by subscripts, attributes and plain assignments. Not anything computed from one: the
    items of `range(len(batch))` are counters, the same on every rank."""
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        expr = expr.value
    if not isinstance(expr, cst.Name) or depth > MAX_DEPTH:
        return False
    if _is_split_item(model, expr, order, function):
        return True
    return any(
        a.value is not None and a.kind in ("assign", "annassign")
        and _part_of_split_item(model, a.value, a.order, a.function, depth + 1)
        for a in model.reaching_assignments(expr.value, order, function)
    )


def _is_split_item(model: ModuleModel, node: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
    """`node` holds (part of) an item that a loop drew from data split across ranks: a name the
    loop target binds to the items, or `next(batches)` over such data."""
    if isinstance(node, cst.Call):
        call = model.call_of(node)
        first = call.arg(0) if call is not None and call.dotted == "next" and call.name is None else None
        return first is not None and iterates_split_data(model, first, order, function)
    name = dotted_name(node)
    if name is None:
        return False
    head = name.split(".", 1)[0]
    for assignment in model.reaching_assignments(head, order, function):
        if assignment.unpacked is not None and _part_of_split_item(
            model, assignment.unpacked[0], assignment.order, assignment.function
        ):
            return True  # `pixels, names = batch`
        if assignment.kind != "for":
            continue
        for loop in model.loops:
            if loop.node is not assignment.node:
                continue
            for bound, source in model.loop_items(loop):
                if bound == head and iterates_split_data(model, source, loop.order, loop.function):
                    return True
    return False


def per_item_path(model: ModuleModel, path: Optional[Expr], order: int, function: Optional[Function]) -> bool:
    """True when a file path is built from the items of data split across ranks (`out /
    f"{batch['name'][i]}.pt"` in a loop over a sharded dataset's loader): each rank writes files
    named after its own items, which no other rank writes. A path from the loop's counter, the
    epoch or a constant is the same on every rank and is not per item."""
    return path is not None and mentions(model, path, order, function, _is_split_item)
