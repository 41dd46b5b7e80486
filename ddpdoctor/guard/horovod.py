"""The guard under Horovod: `horovod.torch`'s collectives and DistributedOptimizer, watched like torch's.

Installed by the import hook when the rank imports `horovod.torch` (never imported otherwise). A
rank says hello as soon as its launcher's environment names it (HOROVOD_RANK under horovodrun's
gloo controller, OMPI_COMM_WORLD_RANK or PMI_RANK under MPI), so that a rank stuck before or in
`hvd.init()` is seen; after `hvd.init()` it is the rank Horovod made it.

What takes a place in the sequence of collectives that every rank must run alike: each call of
`hvd.allreduce`/`allgather`/`broadcast`/`alltoall`/`reducescatter`/`barrier` (their in-place, async
and grouped forms are one operation each: a rank that calls `allreduce_async_` where another calls
`allreduce` is not at odds with it), `broadcast_parameters`, `broadcast_optimizer_state`,
`broadcast_object`, `allgather_object`, and one "gradient allreduce" per
`DistributedOptimizer.synchronize()` (which `step()` runs), in its place when backward starts its
first gradient's allreduce, at the line of that backward. Only the names
users call through `horovod.torch` are wrapped: Horovod's own modules keep their originals, so the
per-parameter allreduces the optimizer starts in backward are not counted one by one.

`hvd.join()` is the one point where the ranks' sequences meet again after uneven inputs (the ranks
that joined shadow the others' allreduces): it starts a new stretch of sequence numbers, the same on
every rank, and it counts as a Join entry (GRD005 is then silent, as under torch's Join).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
import types
from typing import Any, Callable, Optional

from ddpdoctor.guard import frames, rank
from ddpdoctor.guard.options import GuardOptions
from ddpdoctor.guard.patches import _debug, _tensor_type, parameter_index

TARGET = "horovod.torch"
# The collectives a rank may call through `horovod.torch`, and the operation each one is.
OPERATIONS = {
    **{name: "allreduce" for name in ("allreduce", "allreduce_", "allreduce_async", "allreduce_async_")},
    **{name: "grouped_allreduce" for name in ("grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
                                              "grouped_allreduce_async_")},
    "sparse_allreduce_async": "sparse_allreduce",
    **{name: "allgather" for name in ("allgather", "allgather_async")},
    **{name: "grouped_allgather" for name in ("grouped_allgather", "grouped_allgather_async")},
    **{name: "broadcast" for name in ("broadcast", "broadcast_", "broadcast_async", "broadcast_async_")},
    **{name: "alltoall" for name in ("alltoall", "alltoall_async")},
    **{name: "reducescatter" for name in ("reducescatter", "reducescatter_async")},
    **{name: "grouped_reducescatter" for name in ("grouped_reducescatter", "grouped_reducescatter_async")},
    "barrier": "barrier",
    "broadcast_parameters": "broadcast_parameters",
    "broadcast_optimizer_state": "broadcast_optimizer_state",
    "broadcast_object": "broadcast_object",
    "allgather_object": "allgather_object",
}
# Where ranks legitimately pass different shapes (allgather's first dimension, alltoall's splits):
# only the dtype is compared.
_SHAPES_MAY_DIFFER = frozenset({"allgather", "grouped_allgather", "alltoall", "sparse_allreduce"})
_REDUCING = frozenset({"allreduce", "grouped_allreduce", "reducescatter", "grouped_reducescatter"})
OPTIMIZER_OP = "hvd.DistributedOptimizer gradient allreduce"
# Each hvd.join() starts the sequence anew at the next multiple of this (every rank calls it once).
JOIN_STRIDE = 1 << 32
# Async handles waiting for hvd.synchronize, bounded: a handle never synchronized is forgotten.
MAX_HANDLES = 4096
# The launchers' variables that name a rank before hvd.init(): rank, size, local rank, local size.
LAUNCH_ENV = (("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"),
              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"))
_MARK = "__ddpdoctor_guard__"
_handles: dict[Any, tuple[str, int]] = {}
_depth = 0  # >0 inside a wrapped call: what it calls in turn is not another collective


def watch() -> None:
    """Patch horovod.torch now if it is already imported, else as soon as it is."""
    from ddpdoctor.guard.hooks import after_import

    after_import(TARGET, patch)


def launch_ids(environ: Optional[dict[str, str]] = None) -> tuple[Optional[int], Optional[int], Optional[int],
                                                                  Optional[int]]:
    """(rank, size, local rank, local size) as the launcher set them, else Nones."""
    env = os.environ if environ is None else environ
    for names in LAUNCH_ENV:
        values = [_int(env.get(name)) for name in names]
        if values[0] is not None and values[1] is not None:
            return values[0], values[1], values[2], values[3]
    return None, None, None, None


def _int(text: Optional[str]) -> Optional[int]:
    if text is None or not text.strip().isdigit():
        return None
    value = int(text)
    return value if value < 1 << 20 else None


def patch(hvd: Any) -> None:
    """The import hook's entry: wrap what users call through `horovod.torch`."""
    if getattr(hvd, _MARK, False) or not callable(getattr(hvd, "init", None)):
        return  # patched already, or a Horovod without its MPI/gloo library (nothing runs)
    setattr(hvd, _MARK, True)
    frames.also_skip(os.path.dirname(os.path.dirname(os.path.abspath(hvd.__file__))))
    for name, operation in OPERATIONS.items():
        function = getattr(hvd, name, None)
        if callable(function):
            setattr(hvd, name, _wrap_collective(hvd, operation, function))
    for name, wrap in (("init", _wrap_init), ("synchronize", _wrap_synchronize), ("join", _wrap_join),
                       ("DistributedOptimizer", _wrap_optimizer)):
        function = getattr(hvd, name, None)
        if callable(function):
            setattr(hvd, name, wrap(hvd, function))
    options = GuardOptions.from_env()
    if options is not None:
        number, world, _, _ = launch_ids()
        rank.start_early(options, number, world)


def _guard() -> Optional[rank.RankGuard]:
    guard = rank.current
    return guard if guard is not None and guard.joined and not guard.closed else None


def _wrap_init(hvd: Any, init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def hvd_init(*args: Any, **kwargs: Any) -> Any:
        options = GuardOptions.from_env()
        early = rank.current if rank.current is not None and not rank.current.closed else None
        started = time.monotonic()
        if early is not None and not early.joined:
            # Waiting in Horovod's rendezvous is waiting for the other ranks: a stall like any other.
            path, line = frames.user_frame(sys._getframe(1))
            early.inflight = ("init", early.record("init", "hvd.init", "", path, line), started)
        try:
            result = init(*args, **kwargs)
        finally:
            if early is not None:
                early.after_wait(started)
        if options is not None:
            try:
                guard = rank.start_as(options, hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
                if guard is not None:
                    # hvd.init() registered Horovod's shutdown at exit, which ends the other ranks' waits
                    # (and horovodrun then kills this one): the rank's last word must be sent before it.
                    atexit.unregister(guard.close)
                    atexit.register(guard.close)
            except Exception as error:  # noqa: BLE001 - never break the user's job
                _debug(error)
        return result

    return hvd_init


def _waited(guard: rank.RankGuard, key: str, seq: int, call: Callable[[], Any]) -> Any:
    """call(), in flight at (key, seq) while it waits for the other ranks."""
    started = time.monotonic()
    if seq >= 0:
        guard.inflight = (key, seq, started)
    try:
        return call()
    finally:
        guard.after_wait(started)


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], name: str, index: int) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if 0 <= index < len(args) else None


def _tensors(value: Any, tensor_type: type) -> list[Any]:
    if isinstance(value, tensor_type):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, tensor_type)]
    return []


def _signature(hvd: Any, operation: str, args: tuple[Any, ...], kwargs: dict[str, Any], at: dict[str, int],
               tensor_type: type) -> str:
    """What must agree across ranks: dtypes and shapes, the reduce op, the root."""
    parts: list[str] = []
    tensors = _tensors(args[0] if args else kwargs.get("tensor", kwargs.get("tensors")), tensor_type)
    if operation in ("broadcast_parameters",):
        params = args[0] if args else kwargs.get("params")
        items = list(params.values() if isinstance(params, dict) else (p for _, p in params or ()))
        parts.append(f"{len(items)} tensor{'' if len(items) == 1 else 's'}")
    elif tensors:
        dtype = str(tensors[0].dtype).replace("torch.", "")
        if operation in _SHAPES_MAY_DIFFER:
            parts.append(dtype)
        elif len(tensors) == 1:
            parts.append(f"{dtype}{list(tensors[0].shape)}")
        else:
            parts.append(f"{len(tensors)}x{dtype}[{sum(t.numel() for t in tensors)}]")
    if operation in _REDUCING:
        parts.append(_reduce_op(hvd, _argument(args, kwargs, "op", at.get("op", -1)),
                                _argument(args, kwargs, "average", at.get("average", -1))))
    root = _argument(args, kwargs, "root_rank", at.get("root_rank", -1))
    if isinstance(root, int):
        parts.append(f"root {root}")
    name = _argument(args, kwargs, "name", at.get("name", -1))
    if isinstance(name, str):
        # Horovod pairs the ranks' calls by name: under different names they wait for each other forever.
        parts.append(f"name={name[:64]!r}")
    return ", ".join(parts)


def _reduce_op(hvd: Any, op: Any, average: Any) -> str:
    if op is None:
        return "Sum" if average is False else "Average"  # Horovod's default, and its old `average=False`
    for name in ("Average", "Sum", "Adasum", "Min", "Max", "Product"):
        if op == getattr(hvd, name, object()):
            return name
    return str(op)[:32]


def group_key(guard: rank.RankGuard, process_set: Any) -> str:
    """'W' for the global process set, else its ranks (as torch's subgroups are keyed)."""
    ranks = getattr(process_set, "ranks", None)
    if process_set is None or not isinstance(ranks, (list, tuple)) or len(ranks) == guard.world_size:
        return "W"
    return ",".join(str(int(r)) for r in sorted(ranks))


def _wrap_collective(hvd: Any, operation: str, function: Callable[..., Any]) -> Callable[..., Any]:
    at = {name: parameter_index(function, name) for name in ("op", "average", "root_rank", "name", "process_set")}
    is_async = function.__name__.endswith(("_async", "_async_"))
    tensor_type = _tensor_type()

    @functools.wraps(function)
    def collective(*args: Any, **kwargs: Any) -> Any:
        global _depth
        guard = _guard()
        if guard is None or _depth:
            return function(*args, **kwargs)
        try:
            signature = _signature(hvd, operation, args, kwargs, at, tensor_type)
            key = group_key(guard, _argument(args, kwargs, "process_set", at["process_set"]))
        except Exception as error:  # noqa: BLE001 - an argument the guard did not foresee: not recorded
            _debug(error)
            return function(*args, **kwargs)
        path, line = frames.user_frame(sys._getframe(1))
        seq = guard.record(key, f"hvd.{operation}", signature, path, line)
        _depth += 1
        try:
            # An async call only enqueues: its wait is in hvd.synchronize(handle).
            result = function(*args, **kwargs) if is_async else _waited(guard, key, seq,
                                                                        lambda: function(*args, **kwargs))
        finally:
            _depth -= 1
        if is_async and seq >= 0 and _hashable(result):
            # Its wait is in hvd.synchronize(handle): that is where it is in flight.
            if len(_handles) >= MAX_HANDLES:
                del _handles[next(iter(_handles))]
            _handles[result] = (key, seq)
        return result

    return collective


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _wrap_synchronize(hvd: Any, synchronize: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(synchronize)
    def hvd_synchronize(handle: Any, *args: Any, **kwargs: Any) -> Any:
        guard = _guard()
        position = _handles.pop(handle, None) if guard is not None and _hashable(handle) else None
        if guard is None or position is None:
            return synchronize(handle, *args, **kwargs)
        return _waited(guard, position[0], position[1], lambda: synchronize(handle, *args, **kwargs))

    return hvd_synchronize


def _wrap_join(hvd: Any, join: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(join)
    def hvd_join(*args: Any, **kwargs: Any) -> Any:
        guard = _guard()
        if guard is None:
            return join(*args, **kwargs)
        guard.joins += 1
        guard.joined_since_mark = True
        # Every rank calls join once: from here the ranks' sequences meet again, whatever the
        # joined ranks shadowed before it.
        guard.seq["W"] = (guard.seq.get("W", 0) // JOIN_STRIDE + 1) * JOIN_STRIDE
        path, line = frames.user_frame(sys._getframe(1))
        return _waited(guard, "W", guard.record("W", "hvd.join", "", path, line), lambda: join(*args, **kwargs))

    return hvd_join


def _wrap_optimizer(hvd: Any, factory: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(factory)
    def DistributedOptimizer(*args: Any, **kwargs: Any) -> Any:
        optimizer = factory(*args, **kwargs)
        try:
            _watch_optimizer(optimizer)
        except Exception as error:  # noqa: BLE001 - never break the user's job
            _debug(error)
        return optimizer

    return DistributedOptimizer


def _watch_optimizer(optimizer: Any) -> None:
    """One gradient allreduce per synchronize(), one optimizer step per step(), and the parameters it
    keeps in sync watched as a replica (GRD003)."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    named: dict[Any, str] = getattr(optimizer, "_parameter_names", None) or {}
    names = [named.get(p) or f"param{index}" for index, p in enumerate(params)]
    dtype = str(params[0].dtype).replace("torch.", "") if params else "?"
    summary = f"{len(params)} params, {dtype}[{sum(p.numel() for p in params)}]"
    process_set = getattr(optimizer, "process_set", None)
    originals = {name: getattr(optimizer, name) for name in ("synchronize", "step", "_allreduce_grad_async",
                                                              "_grouped_allreduce_grad_async") if hasattr(optimizer, name)}
    # This step's gradient allreduce: (group, seq) once its first gradient's allreduce started.
    started: list[tuple[str, int]] = []

    def begin(guard: rank.RankGuard) -> tuple[str, int]:
        # Its place in the sequence is taken where backward starts the first gradient's allreduce (in a
        # hook, on the autograd thread under CUDA: the line is the main thread's), as DDP's is at its
        # forward: a rank that dies in that backward has still reached it. At the backward's line.
        if not started:
            main = sys._current_frames().get(guard.main_ident or 0)
            path, line = guard.last_forward = frames.user_frame(main)
            key = group_key(guard, process_set)
            started.append((key, guard.record(key, OPTIMIZER_OP, summary, path, line)))
        return started[0]

    def gradient_allreduce(name: str) -> Callable[..., Any]:
        def start_allreduce(self: Any, *args: Any) -> Any:
            guard = _guard()
            if guard is not None:
                begin(guard)
            return originals[name](*args)

        return start_allreduce

    def synchronize(self: Any) -> Any:
        guard = _guard()
        if guard is None or (process_set is not None and not process_set.included()):
            return originals["synchronize"]()
        key, seq = begin(guard)
        started.clear()
        return _waited(guard, key, seq, originals["synchronize"])

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = originals["step"](*args, **kwargs)
        guard = _guard()
        if guard is not None:
            guard.on_step()
            if guard.hash_due is not None:
                guard.hash_due = None
                _hash_after_step(guard, names, params, frames.user_frame(sys._getframe(1)))
        return result

    # Bound methods on the instance: what step() and the gradient hooks call, and what an LR scheduler
    # re-wraps (it takes `optimizer.step.__func__`). torch's own step hooks fire twice for a
    # DistributedOptimizer (its class and the wrapped optimizer's both count): the guard counts this
    # step() once instead.
    wrappers = {"synchronize": synchronize, "step": step, "_allreduce_grad_async": gradient_allreduce(
        "_allreduce_grad_async"), "_grouped_allreduce_grad_async": gradient_allreduce("_grouped_allreduce_grad_async")}
    for name in originals:
        setattr(optimizer, name, types.MethodType(wrappers[name], optimizer))
    optimizer.__dict__["_ddpdoctor_counts_itself"] = True
    guard = rank.current
    if guard is not None:
        guard.watch_replica(optimizer, names, params)


def _hash_after_step(guard: rank.RankGuard, names: list[str], params: list[Any], site: tuple[str, int]) -> None:
    # Right after the step, every replica's parameters must be bit-identical (the same averaged
    # gradients, the same optimizer state).
    try:
        from ddpdoctor.guard.hashing import digests

        guard.end_hashed_at = guard.step
        guard.hashes.append({"step": guard.step, "kind": "step", "names": names, "values": digests(params),
                             "path": site[0], "line": site[1]})
    except Exception as error:  # noqa: BLE001
        _debug(error)


