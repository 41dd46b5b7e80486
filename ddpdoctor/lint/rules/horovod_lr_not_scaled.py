"""HVD001 horovod-lr-not-scaled: the optimizer wrapped by `hvd.DistributedOptimizer` keeps the
single-GPU learning rate although the effective batch grew `hvd.size()` times."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import Call, dotted_name, launch, summaries, syntax
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
                if lr is None and (constructor.has_star_args() or not (constructor.name or "").startswith("torch.optim.")):
                    continue  # `optim.SGD(params, **cfg.optim)`, or another optimizer's default: unknown
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
                    fix=self._fix(lr, wrapper) if lr is not None else None,
                )

    def _fix(self, lr: cst.BaseExpression, wrapper: Call) -> Optional[Fix]:
        """`lr=X` -> `lr=X * hvd.size()`, Horovod's documented linear scaling, written with the
        module's own top-level Horovod import (no fix without one). Scripts that use Adasum are not
        reported at all, so the Adasum form (`hvd.local_size()` on GPUs) is never needed here.
        Certain only when every writer of the learning rate was followed: only a suggestion where
        the script (or a project function it calls, in any module) also sets `param_group["lr"]`,
        or hands the optimizer to a call the analysis cannot follow (an installed package's
        scheduler factory may scale it too, and the fix would scale it twice)."""
        size = self.model.spelling("horovod.torch.size")
        if size is None:
            return None
        scaled = f"{syntax.as_left_factor(lr, self.model.code_of(lr))} * {size}()"
        # A hand-written schedule that stores `param_group["lr"] = ...` (unscaled, or the rule would
        # not fire) overwrites the constructor's rate: scaling only the constructor would not do.
        resets = summaries.WRITES_LR in summaries.module_effects(self.model, every_function=True)
        handed = {name for name in (self.model.name_bound_to(wrapper), dotted_name(wrapper.arg(0, "optimizer"))) if name}
        unfollowed = summaries.handed_to_unfollowed(self.model, frozenset(handed)) is not None
        return Fix(
            f"scale the learning rate: `{scaled}`", applicable=not resets and not unfollowed, edits=(self.replace(lr, scaled),)
        )

    def _constructors(self, inner: cst.BaseExpression, wrapper: Call) -> list[Call]:
        """The calls that built the optimizer `inner` comes from. An optimizer is known by what is
        done with it (handed to hvd.DistributedOptimizer), not by its name: `torch.optim.SGD`,
        `transformers.AdamW`, apex's `FusedAdam`, a project's `build_optimizer(...)` factory."""
        out = []
        for origin in self.model.origin_calls(inner, wrapper.order, wrapper.function):
            name = origin.name or dotted_name(origin.node.func) or ""
            if name.startswith("torch.optim."):
                if not name.startswith("torch.optim.lr_scheduler") and name[12:13].isupper():
                    out.append(origin)
            elif not name.startswith(("torch.", "horovod.")) and origin.attr != "DistributedOptimizer":
                out.append(origin)
        return out

    def _lr_argument(self, constructor: Call) -> Optional[cst.BaseExpression]:
        """The learning rate a constructor is given: `lr` (second positional for torch's optimizers
        and for other optimizer classes, which follow their signature); only by keyword for a
        factory function. None for a project factory that scales by the worker count itself."""
        name = constructor.name or dotted_name(constructor.node.func) or ""
        if summaries.READS_WORKER_COUNT in summaries.call_effects(self.model, constructor, 1):
            return None
        if name.startswith("torch.optim.") or name.rpartition(".")[2][:1].isupper():
            return constructor.arg(1, "lr")
        return constructor.arg(keyword="lr") or constructor.arg(keyword="learning_rate")

    def _scaled_later(self) -> bool:
        """`param_group["lr"] = base * hvd.size() * adj` (Horovod's imagenet warmup), or an LR
        scheduler whose arguments multiply by hvd.size(): here, or in a project function called
        here (`adjust_learning_rate(optimizer, epoch)` in schedule.py)."""
        return summaries.SCALES_LR in summaries.module_effects(self.model, every_function=True)
