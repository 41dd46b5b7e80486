"""HVD002 horovod-broadcast-order: Horovod ranks that never receive rank 0's initial state."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.lint.analysis import Assignment, Call, ModuleModel, dotted_name, summaries
from ddpdoctor.lint.rules.base import Rule

HVD = summaries.HVD
INIT = f"{HVD}.init"
DISTRIBUTED_OPTIMIZER = f"{HVD}.DistributedOptimizer"
BROADCAST_OPTIMIZER_STATE = summaries.HVD_BROADCAST_OPTIMIZER_STATE


def first_scope_assignments(model: ModuleModel, target: str, call: Call) -> Optional[list[Assignment]]:
    """The assignments to `target` in the scope `call` runs in (its function, or its class's
    methods for `self.x`), or None when other scopes could provide the value."""
    candidates = model.assignments_to(target)
    if target.startswith("self."):
        function = call.function
        if function is None or function.klass is None:
            return None
        in_class = [a for a in candidates if a.function is not None and a.function.klass == function.klass]
        if any(a.function is not function for a in in_class):
            return None  # another method may have set it before this one runs
        return in_class
    if "." in target:
        return None
    local = [a for a in candidates if a.function is call.function]
    if call.function is not None and len(local) != len(candidates):
        return None  # also a global/closure variable somewhere else: undecidable
    return local


class HorovodBroadcastOrder(Rule):
    """
    Valid:
        hvd.init()
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    Invalid:
        hvd.init()
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    """

    code = "HVD002"
    trigger_words = ("broadcast_optimizer_state", "DistributedOptimizer")

    def check(self) -> None:
        for call in self.model.calls_named(BROADCAST_OPTIMIZER_STATE):
            self._check_optimizer_exists(call)
        self._check_parameters_broadcast()

    def _check_optimizer_exists(self, call: Call) -> None:
        optimizer = call.arg(0, "optimizer")
        target = dotted_name(optimizer)
        if target is None:
            return
        assignments = first_scope_assignments(self.model, target, call)
        if not assignments or any(a.order < call.order for a in assignments):
            return
        first = min(assignments, key=lambda a: a.order)
        self.report(
            call.node,
            f"hvd.broadcast_optimizer_state({target}) runs before `{target}` is created at line "
            f"{self.line(first.node)}: there is no optimizer state to broadcast yet. Broadcast after "
            f"building the optimizer (and after restoring a checkpoint).",
        )

    def _check_parameters_broadcast(self) -> None:
        if not self.model.calls_named(INIT):
            return
        wrappers = self.model.calls_named(DISTRIBUTED_OPTIMIZER)
        if not wrappers:
            return
        # Here or in a project function called here (`sync_start(model, optimizer)` in dist.py):
        # `hvd.broadcast_parameters`, a broadcast of the weights, or Horovod Elastic's state object.
        if summaries.BROADCASTS_PARAMETERS in summaries.module_effects(self.model, every_function=True):
            return
        wrapper = wrappers[0]
        self.report(
            wrapper.node,
            "This Horovod script never calls hvd.broadcast_parameters: each rank starts from its own "
            "randomly initialised (or separately restored) weights, and the averaged gradients then "
            "train replicas that disagree. Call hvd.broadcast_parameters(model.state_dict(), root_rank=0) "
            "after building the model (and hvd.broadcast_optimizer_state for the optimizer).",
        )

