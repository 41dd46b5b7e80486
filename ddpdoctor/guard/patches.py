"""The wrappers the guard puts around torch in a rank.

Collectives (`torch.distributed.all_reduce`, ...) are wrapped as soon as torch.distributed is
imported, so that `from torch.distributed import all_reduce` in the user's script binds the wrapper;
they record nothing until the rank has a guard. The rest (DDP, the optimizer step, DataLoader,
autograd.backward, Join) is wrapped when the rank's guard starts, after init_process_group.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
import weakref
from typing import Any, Callable

from ddpdoctor.guard import frames, rank
from ddpdoctor.guard.options import GuardOptions

# The collectives every rank of a group must call in the same order with matching tensors.
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all", "all_to_all_single",
    "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "monitored_barrier",
)
# Where ranks legitimately pass different shapes (uneven all_gather/all_to_all splits, a gather or
# scatter list only on the root): only the operation and the first tensor's dtype are compared.
_SHAPES_MAY_DIFFER = frozenset({"all_gather", "all_to_all", "all_to_all_single", "gather", "scatter",
                                "reduce_scatter"})
_MARK = "__ddpdoctor_guard__"
_training_patched = False
_late_start_tried = False
# Every DDP model of this rank. The replica check's forward pre-hook is put on their modules only
# when a check is due, and takes itself off when it runs: a module with a hook takes torch's slower
# call path, which costs every step, not only the one in a hundred that is checked.
_models: "weakref.WeakSet[Any]" = weakref.WeakSet()
_HOOK = "_ddpdoctor_check"
_SEEN = "_ddpdoctor_seen"


def patch_collectives(dist: Any) -> None:
    if getattr(dist, _MARK, False):
        return
    setattr(dist, _MARK, True)
    tensor_type = _tensor_type()
    for name in COLLECTIVES:
        function = getattr(dist, name, None)
        if callable(function):
            setattr(dist, name, _wrap_collective(name, function, tensor_type))
    init = getattr(dist, "init_process_group", None)
    if callable(init):
        setattr(dist, "init_process_group", _wrap_init(init))
    destroy = getattr(dist, "destroy_process_group", None)
    if callable(destroy):
        setattr(dist, "destroy_process_group", _wrap_destroy(destroy))


def _tensor_type() -> type:
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", type(None))


def _wrap_init(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        global _late_start_tried
        options = GuardOptions.from_env()
        guard = _joining(options, kwargs) if options is not None else None
        started = time.monotonic()
        if guard is not None:
            # Waiting in the rendezvous is waiting for the other ranks: a stall like any other.
            path, line = frames.user_frame(sys._getframe(1))
            guard.inflight = ("init", guard.record("init", "init_process_group", "", path, line), started)
        try:
            result = init(*args, **kwargs)
        finally:
            if guard is not None:
                guard.after_wait(started)
        _late_start_tried = True  # one attempt per process: a guard that cannot be reached costs once
        if options is not None:
            try:
                rank.start(options)
            except Exception as error:  # noqa: BLE001 - never break the user's job
                _debug(error)
        return result

    return init_process_group


def _wrap_destroy(destroy: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        guard = rank.current
        if guard is not None and not args and not kwargs.get("group"):
            try:
                guard.check_replicas()  # the last optimizer step's result, while the job is still whole
                guard.flush()
            except Exception as error:  # noqa: BLE001 - never break the user's job
                _debug(error)
        return destroy(*args, **kwargs)

    return destroy_process_group


def _joining(options: GuardOptions, kwargs: dict[str, Any]) -> "rank.RankGuard | None":
    """The guard that says hello before the rendezvous: already there (started when torch.distributed
    was imported in a torchrun worker), or started now from the rank the call or the launcher names."""
    if rank.current is not None:
        return None if rank.current.joined or rank.current.closed else rank.current
    try:
        given = kwargs.get("rank"), kwargs.get("world_size")
        number, world = (given if all(isinstance(v, int) and v >= 0 for v in given)
                         else (rank.int_env("RANK"), rank.int_env("WORLD_SIZE")))
        return rank.start_early(options, number, world)
    except Exception as error:  # noqa: BLE001 - never break the user's job
        _debug(error)
        return None


def _group_index(function: Callable[..., Any]) -> int:
    return parameter_index(function, "group")


def parameter_index(function: Callable[..., Any], name: str) -> int:
    """The position of `name` among the function's parameters, -1 when it has none so named."""
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return -1
    return names.index(name) if name in names else -1


def _describe(value: Any, tensor_type: type) -> str:
    if isinstance(value, tensor_type):
        tensor: Any = value
        return f"{str(tensor.dtype).replace('torch.', '')}{list(tensor.shape)}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, tensor_type) for v in value):
        return f"{len(value)}x{_describe(value[0], tensor_type)}"
    return ""


def _wrap_collective(name: str, function: Callable[..., Any], tensor_type: type) -> Callable[..., Any]:
    group_at = _group_index(function)

    @functools.wraps(function)
    def collective(*args: Any, **kwargs: Any) -> Any:
        guard = rank.current
        if (guard is None or not guard.joined) and not _late_start_tried:
            guard = _late_start()  # also when it said hello early but the group began another way
        if guard is None or guard.closed:
            return function(*args, **kwargs)
        group = kwargs.get("group") if "group" in kwargs else (args[group_at] if 0 <= group_at < len(args) else None)
        if name in _SHAPES_MAY_DIFFER:
            signature = next((str(getattr(a, "dtype")).replace("torch.", "") for a in args
                              if isinstance(a, tensor_type)), "")
        else:
            signature = ", ".join(filter(None, (_describe(a, tensor_type) for a in args)))
        path, line = frames.user_frame(sys._getframe(1))
        key = guard.group_key(group)
        seq = guard.record(key, name, signature, path, line)
        started = time.monotonic()
        if seq >= 0:
            guard.inflight = (key, seq, started)
        try:
            return function(*args, **kwargs)
        finally:
            guard.after_wait(started)

    return collective


def _late_start() -> "rank.RankGuard | None":
    """The process group was started without `torch.distributed.init_process_group` (a framework that
    calls distributed_c10d directly): become a guarded rank at the first collective instead."""
    global _late_start_tried
    _late_start_tried = True
    options = GuardOptions.from_env()
    dist = sys.modules.get("torch.distributed")
    if options is None or dist is None or not dist.is_initialized():
        return None
    try:
        return rank.start(options)
    except Exception as error:  # noqa: BLE001
        _debug(error)
        return None


def patch_training() -> None:
    """DDP, the optimizer step, DataLoader, autograd.backward and Join: once per process."""
    global _training_patched
    if _training_patched:
        return
    _training_patched = True
    for patch in (_patch_ddp, _patch_optimizer, _patch_backward, _patch_dataloader, _patch_join):
        try:
            patch()
        except Exception as error:  # noqa: BLE001 - a torch without this API: that check is off
            _debug(error)


def _patch_ddp() -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_init, original_forward = DDP.__init__, DDP.forward

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        guard = rank.current
        if guard is not None:
            try:
                _on_ddp(guard, self, frames.user_frame(sys._getframe(1)))
            except Exception as error:  # noqa: BLE001
                _debug(error)

    @functools.wraps(original_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        guard = rank.current
        if guard is not None and torch.is_grad_enabled() and self.require_backward_grad_sync:
            # DDP's gradient all-reduce runs in the backward that follows; it takes its place in the
            # sequence of collectives here, at the line of the forward call.
            path, line = guard.last_forward = frames.user_frame(sys._getframe(1))
            guard.forwards += 1
            # What this model's all-reduce is called and in which group: the same at every forward.
            known = self.__dict__.get(_SEEN)
            if known is None or known[0] is not guard:
                known = self.__dict__[_SEEN] = (guard, self.__dict__.get("_ddpdoctor_summary") or "gradients",
                                                guard.group_key(getattr(self, "process_group", None)))
            _, summary, key = known
            seq = guard.record(key, "DDP gradient all-reduce", summary, path, line)
            guard.pending_backward = (key, seq) if seq >= 0 else None
        return original_forward(self, *args, **kwargs)

    DDP.__init__ = __init__  # type: ignore[method-assign]
    DDP.forward = forward  # type: ignore[method-assign]


def _on_ddp(guard: rank.RankGuard, ddp: Any, site: tuple[str, int]) -> None:
    from ddpdoctor.guard import devices

    params = [p for p in ddp.module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    dtype = str(params[0].dtype).replace("torch.", "") if params else "?"
    ddp.__dict__["_ddpdoctor_summary"] = f"{len(params)} params, {dtype}[{numel}]"
    problem = devices.wrong_device(ddp.module, guard.local_rank, guard.local_world_size)
    if problem:
        guard.report_local("GRD007", problem, site[0], site[1])
    _models.add(ddp)
    if guard.hash_due is not None:
        _arm(ddp)
    # What DDP keeps in sync by all-reducing gradients: parameters that train and that it does not ignore.
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    synced = [(name, p) for name, p in ddp.module.named_parameters() if p.requires_grad and name not in ignored]
    guard.watch_replica(ddp, [name for name, _ in synced], [p for _, p in synced])


def _arm(ddp: Any) -> None:
    if _HOOK not in ddp.__dict__:
        ddp.__dict__[_HOOK] = ddp.module.register_forward_pre_hook(functools.partial(_hash_before_forward, ddp))


def _hash_before_forward(ddp: Any, module: Any, inputs: Any) -> None:
    # Inside DDP's forward, after it broadcast the buffers and before the module runs: the moment
    # when every replica's parameters and buffers must be bit-identical.
    handle = ddp.__dict__.pop(_HOOK, None)
    if handle is not None:
        handle.remove()  # torch runs the hooks from a copy of their list: removing one here is safe
    guard = rank.current
    if guard is None or guard.hash_due is None or guard.closed:
        return
    step, guard.hash_due = guard.hash_due, None
    try:
        from ddpdoctor.guard.hashing import digests

        names, tensors = _replicated_state(ddp)
        path, line = frames.user_frame(sys._getframe(1))  # the forward call that ran the check
        guard.hashes.append({"step": step, "names": names, "values": digests(tensors), "path": path,
                             "line": line})
    except Exception as error:  # noqa: BLE001
        _debug(error)


def _replicated_state(ddp: Any) -> tuple[list[str], list[Any]]:
    import torch

    names, tensors = [], []
    for name, parameter in ddp.module.named_parameters():
        names.append(name)
        tensors.append(parameter)
    syncs_buffers = bool(getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", True)))
    for module_name, module in ddp.module.named_modules():
        # Without buffer sync, BatchNorm's running statistics follow each rank's own data by design.
        local_stats = not syncs_buffers and isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is None or (local_stats and name in ("running_mean", "running_var")):
                continue
            names.append(f"{module_name}.{name}" if module_name else name)
            tensors.append(buffer)
    return names, tensors


def _patch_optimizer() -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        guard = rank.current
        if guard is not None and not optimizer.__dict__.get("_ddpdoctor_counts_itself"):  # Horovod's: horovod.py
            guard.on_step()
            if guard.hash_due is not None:
                for ddp in list(_models):
                    _arm(ddp)

    register_optimizer_step_post_hook(after_step)


def _patch_backward() -> None:
    import torch.autograd

    original = torch.autograd.backward

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        guard = rank.current
        if guard is None:
            return original(*args, **kwargs)
        pending, guard.pending_backward = guard.pending_backward, None
        started = time.monotonic()
        if pending is not None:
            guard.inflight = (pending[0], pending[1], started)
        try:
            return original(*args, **kwargs)
        finally:
            guard.backward_total += 1
            guard.after_wait(started)

    torch.autograd.backward = backward  # type: ignore[assignment]


def _patch_dataloader() -> None:
    from torch.utils.data import DataLoader, DistributedSampler
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original_iter, original_next = DataLoader.__iter__, _BaseDataLoaderIter.__next__

    @functools.wraps(original_iter)
    def __iter__(self: Any) -> Any:
        iterator = original_iter(self)
        guard = rank.current
        if guard is not None:
            path, line = frames.user_frame(sys._getframe(1))
            state = guard.loader_epoch(self, path, line)
            iterator.__dict__["_ddpdoctor_state"] = state
            sampler = self.sampler if isinstance(self.sampler, DistributedSampler) else getattr(
                self.batch_sampler, "sampler", None)
            if isinstance(sampler, DistributedSampler) and sampler.shuffle:
                # Epochs whose pass ran to its end: a peek (`next(iter(loader))`) is not an epoch.
                completed: set[int] = sampler.__dict__.setdefault("_ddpdoctor_epochs", set())
                if sampler.epoch in completed:
                    state.repeat_suspect = sampler.epoch
                state.sampler_epochs, state.sampler_epoch = completed, sampler.epoch
        return iterator

    original_set_epoch = DistributedSampler.set_epoch

    @functools.wraps(original_set_epoch)
    def set_epoch(self: Any, epoch: int) -> None:
        original_set_epoch(self, epoch)
        guard = rank.current
        if guard is not None and isinstance(epoch, int):
            guard.on_set_epoch(epoch, *frames.user_frame(sys._getframe(1)))

    DistributedSampler.set_epoch = set_epoch  # type: ignore[method-assign]

    @functools.wraps(original_next)
    def __next__(self: Any) -> Any:
        state = self.__dict__.get("_ddpdoctor_state")
        if state is None:
            return original_next(self)
        guard = rank.current
        try:
            batch = original_next(self)
        except StopIteration:
            if guard is not None:
                guard.on_loader_end(state)
            raise
        if guard is not None:
            guard.on_batch(state)
        return batch

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
    _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign]


def _patch_join() -> None:
    from torch.distributed.algorithms.join import Join

    original_enter, original_exit = Join.__enter__, Join.__exit__

    def __enter__(self: Any) -> Any:
        if rank.current is not None:
            rank.current.join_depth += 1
            rank.current.joins += 1
        return original_enter(self)

    def __exit__(self: Any, *exc: Any) -> Any:
        try:
            return original_exit(self, *exc)  # a rank that ran out of inputs shadows the others here
        finally:
            if rank.current is not None:
                rank.current.join_depth = max(0, rank.current.join_depth - 1)

    Join.__enter__ = __enter__  # type: ignore[method-assign]
    Join.__exit__ = __exit__  # type: ignore[method-assign]


def _debug(error: BaseException) -> None:
    if os.environ.get("DDPDOCTOR_DEBUG"):
        sys.stderr.write(f"ddpdoctor guard: {type(error).__name__}: {error}\n")
