"""HVD001 horovod-lr-not-scaled: the optimizer wrapped by `hvd.DistributedOptimizer` keeps the
single-GPU learning rate although the effective batch grew `hvd.size()` times."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import MAX_DEPTH, Call, Function, ModuleModel, dotted_name, syntax, walk
from ddpdoctor.lint.rules.base import Rule

HVD_MODULES = ("horovod.torch",)
DISTRIBUTED_OPTIMIZER = tuple(f"{m}.DistributedOptimizer" for m in HVD_MODULES)
GPU_COUNT = "torch.cuda.device_count"
SIZE_CALLS = frozenset(f"{m}.{f}" for m in HVD_MODULES for f in ("size", "local_size", "cross_size"))
ADASUM = tuple(f"{m}.Adasum" for m in HVD_MODULES)

SCALED, UNSCALED, UNKNOWN = "scaled", "unscaled", "unknown"


def mentions_size(model: ModuleModel, node: Optional[cst.CSTNode], order: int, function: Optional[Function], depth: int = 0) -> bool:
    """True when `hvd.size()` (or local_size) appears in an expression, through variables and the
    bodies of local functions it names (an `lr_lambda=warmup` scheduler function)."""
    if node is None or depth > MAX_DEPTH:
        return False
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Call) and model.qualify(current.func) in SIZE_CALLS:
            return True
        name = dotted_name(current) if isinstance(current, (cst.Name, cst.Attribute)) else None
        if name is not None:
            # reaching_values also sees `lr *= hvd.size()`; leaf_values follows parameters to
            # their call sites in the right scope.
            for value in model.reaching_values(current, order, function):  # type: ignore[arg-type]
                if value is not current and mentions_size(model, value, order, function, depth + 1):
                    return True
            for value, v_order, v_function in model.leaf_values(current, order, function):  # type: ignore[arg-type]
                if value is not current and mentions_size(model, value, v_order, v_function, depth + 1):
                    return True
            for local in model.functions_named(name):
                if any(c.name in SIZE_CALLS for c in local.calls):
                    return True
            continue
        stack.extend(c for c in current.children if not isinstance(c, cst.BaseParenthesizableWhitespace))
    return False


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
        if not wrappers or self._scaled_later() or self._batch_divided():
            return
        for wrapper in wrappers:
            op = wrapper.arg(keyword="op")
            if op is not None and any(
                self.model.qualify(n) in ADASUM for n in _subexpressions(op)
            ):
                continue  # Adasum needs no (or only a local_size) scaling: not this rule's business
            inner = wrapper.arg(0, "optimizer")
            if inner is None:
                continue
            for constructor in self._constructors(inner, wrapper):
                lr = self._lr_argument(constructor)
                if lr is None and constructor.has_star_args():
                    continue  # `optim.SGD(params, **cfg.optim)`: the lr may be in there
                verdict = self._classify(lr, constructor.order, constructor.function) if lr is not None else UNSCALED
                if verdict != UNSCALED:
                    continue
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

    def _classify(self, expr: cst.BaseExpression, order: int, function: Optional[Function], depth: int = 0) -> str:
        """SCALED when hvd.size() is part of the value, UNSCALED when the value is fully known
        (literals, argparse defaults) and has no such factor, UNKNOWN otherwise (stay silent)."""
        if depth > MAX_DEPTH:
            return UNKNOWN
        if mentions_size(self.model, expr, order, function):
            return SCALED
        if isinstance(expr, (cst.Integer, cst.Float)):
            return UNSCALED
        if isinstance(expr, cst.UnaryOperation):
            return self._classify(expr.expression, order, function, depth + 1)
        if isinstance(expr, cst.BinaryOperation):
            return _combine(
                self._classify(expr.left, order, function, depth + 1),
                self._classify(expr.right, order, function, depth + 1),
            )
        if isinstance(expr, cst.IfExp):
            # `base * hvd.size() if not args.use_adasum else base`: scaled on the sum/average path.
            return _combine(
                self._classify(expr.body, order, function, depth + 1),
                self._classify(expr.orelse, order, function, depth + 1),
            )
        if isinstance(expr, cst.Call):
            if dotted_name(expr.func) in ("float", "int") and len(expr.args) == 1:
                return self._classify(expr.args[0].value, order, function, depth + 1)
            return UNKNOWN
        name = dotted_name(expr)
        if name is None:
            return UNKNOWN
        verdicts = []
        for value, v_order, v_function in self.model.leaf_values(expr, order, function):
            if dotted_name(value) is not None:
                # A name that cannot be followed further. `args.lr` straight from the command line
                # is the single-GPU value the user typed; anything else (a config object) is unknown.
                value_name = dotted_name(value) or ""
                known = "." in value_name and self.model.argparse_default(value_name) is not None
                verdicts.append(UNSCALED if known else UNKNOWN)
            else:
                verdicts.append(self._classify(value, v_order, v_function, depth + 1))
        if not verdicts:
            return UNKNOWN
        result = verdicts[0]
        for verdict in verdicts[1:]:
            result = _combine(result, verdict)
        return result

    def _batch_divided(self) -> bool:
        """`args.batch_size = int(args.batch_size / hvd.size())` (or `/ torch.cuda.device_count()`): the per-worker batch is the global
        batch divided among the workers, so the global batch (and the learning rate tuned for it)
        stays as it was and no scaling is due."""
        for assignment in self.model.assignments:
            if "batch" not in assignment.target.rsplit(".", 1)[-1].lower() or assignment.value is None:
                continue
            for node in walk(assignment.value):
                if (
                    isinstance(node, cst.BinaryOperation)
                    and isinstance(node.operator, (cst.Divide, cst.FloorDivide))
                    and (
                        mentions_size(self.model, node.right, assignment.order, assignment.function)
                        or self._counts_gpus(node.right, assignment.order, assignment.function)
                    )
                ):
                    return True
        return False

    def _counts_gpus(self, expr: cst.BaseExpression, order: int, function: Optional[Function]) -> bool:
        """`global_batch // torch.cuda.device_count()`: one worker per GPU of the node, so on the one
        node such a script is written for the per-worker batch is the global batch divided among the
        workers. (On several nodes the right multiplier would be the node count, not hvd.size(), so
        this rule's advice would be wrong either way: it stays silent.)"""
        return any(c.name == GPU_COUNT for c in self.model.origin_calls(expr, order, function))

    def _scaled_later(self) -> bool:
        """`param_group["lr"] = base * hvd.size() * adj` (Horovod's imagenet warmup), or an LR
        scheduler whose arguments multiply by hvd.size()."""
        for store in self.model.subscript_stores:
            key = store.key
            if isinstance(key, cst.SimpleString) and key.evaluated_value == "lr":
                if mentions_size(self.model, store.value, store.order, store.ctx.function):
                    return True
        for call in self.model.calls:
            if call.name and call.name.startswith("torch.optim.lr_scheduler."):
                if any(mentions_size(self.model, a.value, call.order, call.function) for a in call.args):
                    return True
        return False


def _combine(left: str, right: str) -> str:
    if SCALED in (left, right):
        return SCALED
    if UNKNOWN in (left, right):
        return UNKNOWN
    return UNSCALED


def _subexpressions(node: cst.CSTNode) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = []
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        out.append(current)
        if dotted_name(current) is None:
            stack.extend(current.children)
    return out
