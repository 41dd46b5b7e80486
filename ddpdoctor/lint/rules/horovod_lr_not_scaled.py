"""HVD001 horovod-lr-not-scaled: the optimizer wrapped by `hvd.DistributedOptimizer` keeps the
single-GPU learning rate although the effective batch grew `hvd.size()` times."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import Call, dotted_name, launch, syntax
from ddpdoctor.lint.rules.base import Rule

HVD_MODULES = ("horovod.torch",)
DISTRIBUTED_OPTIMIZER = tuple(f"{m}.DistributedOptimizer" for m in HVD_MODULES)
SIZE_CALLS = launch.HOROVOD_SIZE_CALLS
ADASUM = frozenset(f"{m}.Adasum" for m in HVD_MODULES)


class HorovodLrNotScaled(Rule):
    """
    Valid:
        optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size())
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    Invalid:
        optimizer = optim.SGD(model.parameters(), lr=0.01)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    """

    code = "HVD001"
    checks_test_suites = False
    trigger_words = ("DistributedOptimizer",)

    def check(self) -> None:
        wrappers = self.model.calls_named(*DISTRIBUTED_OPTIMIZER)
        if not wrappers or self._scaled_later() or launch.batch_divided_among_workers(self.model, SIZE_CALLS):
            return  # a per-worker batch = global batch / workers keeps the global batch: no scaling due
        for wrapper in wrappers:
            op = wrapper.arg(keyword="op")
            if op is not None and launch.mentions_names(self.model, op, ADASUM):
                continue  # Adasum needs no (or only a local_size) scaling: not this rule's business
            inner = wrapper.arg(0, "optimizer")
            if inner is None:
                continue
            for constructor in self._constructors(inner, wrapper):
                lr = self._lr_argument(constructor)
                if lr is None and constructor.has_star_args():
                    continue  # `optim.SGD(params, **cfg.optim)`: the lr may be in there
                if lr is not None and (
                    launch.scaling_by(self.model, lr, SIZE_CALLS, constructor.order, constructor.function)
                    != launch.UNSCALED
                ):
                    continue  # scaled, or not known to be unscaled
                written = f"lr={self.model.code_of(lr)}" if lr is not None else "the default learning rate"
                if lr is not None and dotted_name(lr) is not None:
                    # Say where a variable's value came from: `lr=lr (args.base_lr)`.
                    leaves = {self.model.code_of(v) for v, _, _ in self.model.leaf_values(lr, constructor.order, constructor.function)}
                    leaves.discard(self.model.code_of(lr))
                    if len(leaves) == 1:
                        written += f" ({leaves.pop()})"
                self.report(
                    lr if lr is not None else constructor.node,
                    f"The optimizer wrapped by hvd.DistributedOptimizer at line {self.line(wrapper.node)} uses "
                    f"{written}, not scaled by hvd.size(): gradients are averaged over hvd.size() times "
                    f"more samples, so training runs with a learning rate too small for the global batch. "
                    f"Use lr=<base lr> * hvd.size() (or scale it in a warmup schedule).",
                    fix=self._fix(lr) if lr is not None else None,
                )

    def _fix(self, lr: cst.BaseExpression) -> Optional[Fix]:
        """`lr=X` -> `lr=X * hvd.size()`, Horovod's documented linear scaling, written with the
        module's own top-level Horovod import (no fix without one). Scripts that use Adasum are not
        reported at all, so the Adasum form (`hvd.local_size()` on GPUs) is never needed here. Only a
        suggestion where the script also sets `param_group["lr"]` itself."""
        size = self.model.spelling("horovod.torch.size")
        if size is None:
            return None
        scaled = f"{syntax.as_left_factor(lr, self.model.code_of(lr))} * {size}()"
        # A hand-written schedule that stores `param_group["lr"] = ...` (unscaled, or the rule would
        # not fire) overwrites the constructor's rate: scaling only the constructor would not do.
        resets = any(
            isinstance(store.key, cst.SimpleString) and store.key.evaluated_value == "lr"
            for store in self.model.subscript_stores
        )
        return Fix(f"scale the learning rate: `{scaled}`", applicable=not resets, edits=(self.replace(lr, scaled),))

    def _constructors(self, inner: cst.BaseExpression, wrapper: Call) -> list[Call]:
        """The optimizer constructor calls that `inner` comes from."""
        out = []
        for origin in self.model.origin_calls(inner, wrapper.order, wrapper.function):
            name = origin.name or ""
            if name.startswith("torch.optim.") and not name.startswith("torch.optim.lr_scheduler") and name[12:13].isupper():
                out.append(origin)
        return out

    def _lr_argument(self, constructor: Call) -> Optional[cst.BaseExpression]:
        return constructor.arg(1, "lr")

    def _scaled_later(self) -> bool:
        """`param_group["lr"] = base * hvd.size() * adj` (Horovod's imagenet warmup), or an LR
        scheduler whose arguments multiply by hvd.size()."""
        for store in self.model.subscript_stores:
            key = store.key
            if isinstance(key, cst.SimpleString) and key.evaluated_value == "lr":
                if launch.mentions_calls(self.model, store.value, SIZE_CALLS, store.order, store.ctx.function):
                    return True
        for call in self.model.calls:
            if call.name and call.name.startswith("torch.optim.lr_scheduler."):
                if any(launch.mentions_calls(self.model, a.value, SIZE_CALLS, call.order, call.function) for a in call.args):
                    return True
        return False

