"""DDP002 syncbn-after-ddp: `convert_sync_batchnorm` applied to a model already wrapped in DDP."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from ddpdoctor.findings import Edit, Fix
from ddpdoctor.lint.analysis import Call, callorder, dotted_name
from ddpdoctor.lint.rules.base import Rule

DDP = "torch.nn.parallel.DistributedDataParallel"
CONVERT = "torch.nn.SyncBatchNorm.convert_sync_batchnorm"


class SyncBatchNormAfterDDP(Rule):
    """
    Valid:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = DDP(model, device_ids=[local_rank])
    Invalid:
        model = DDP(model, device_ids=[local_rank])
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    """

    code = "DDP002"
    trigger_words = ("convert_sync_batchnorm",)

    def check(self) -> None:
        for convert in self.model.calls_named(CONVERT):
            target = convert.arg(0, "module")
            if target is None:
                continue
            # A wrap that provably runs only after this conversion (the constructor converts in
            # a loading method it calls before it wraps) did not produce what is converted.
            wrappers = [
                call
                for call in self.model.origin_calls(target, convert.order, convert.function)
                if call.name == DDP and callorder.may_run_before(self.model, call, convert)
            ]
            if not wrappers:
                continue
            wrap = min(wrappers, key=lambda c: c.order)
            self.report(
                convert.node,
                f"SyncBatchNorm conversion runs on a model already wrapped in DistributedDataParallel "
                f"(wrapped at line {self.line(wrap.node)}): the documented order is the conversion first; "
                f"PyTorch before 1.9 fails at the first forward, and newer versions work only because the "
                f"layers are replaced in place. Call convert_sync_batchnorm before wrapping the model in DDP.",
                fix=self.fix(convert, wrap),
            )

    def fix(self, convert: Call, wrap: Call) -> Optional[Fix]:
        """`X = DDP(M, ...)` ... `X = convert(X)` becomes `X = DDP(convert(M), ...)`, the conversion
        statement removed: the conversion runs on the unwrapped model just before the wrap, and `X`
        ends up holding the same kind of object as before. Only for two plain assignments to the same
        target in the same function, under the same conditions and loops; applied when nothing in
        between calls anything with the model (what ran on the old BatchNorm layers there would
        run on the converted ones afterwards), otherwise shown as a suggestion."""
        wrapped = _assigned(wrap)
        converted = _assigned(convert)
        if wrapped is None or converted is None or wrapped != converted:
            return None
        if wrap.function is not convert.function or wrap.ctx.guards != convert.ctx.guards or wrap.loops != convert.loops:
            return None
        argument = wrap.arg(0, "module")
        lines = self.model.own_lines(convert)
        if argument is None or lines is None or convert.written_arg(0, "module") is None or len(convert.args) != 1:
            return None
        wrap_lines = self.model.own_lines(wrap)
        if wrap_lines is None:
            return None
        first, last, _ = lines
        callee = self.model.code_of(convert.node.func)
        text = f"{callee}({self.model.code_of(argument)})"
        # The conversion's comments (the lines right above it, its end-of-line comment) move with
        # it, above the wrap.
        statement = convert.statement
        assert isinstance(statement, cst.SimpleStatementLine)
        above: list[str] = []
        for line in reversed(statement.leading_lines):
            if line.comment is None:
                break
            above.insert(0, line.comment.value)
        trailing = statement.trailing_whitespace.comment
        moved = above + ([trailing.value] if trailing is not None else [])
        wrap_first, _, wrap_indent = wrap_lines
        edits = (
            *([Edit(wrap_first, 1, wrap_first, 1, "".join(f"{wrap_indent}{c}\n" for c in moved))] if moved else []),
            self.replace(argument, text),
            Edit(first - len(above), 1, last + 1, 1, ""),
        )
        between = [
            c for c in self.model.calls
            if c.function is wrap.function and wrap.order < c.order < convert.order and c.statement is not wrap.statement
        ]
        mention = re.compile(rf"(?<![\w.]){re.escape(wrapped)}(?!\w)")
        quiet = not any(mention.search(self.model.code_of(c.node)) for c in between)
        return Fix(f"convert before wrapping: `{text}`", applicable=quiet, edits=edits)


def _assigned(call: Call) -> Optional[str]:
    """The target of `target = <call>`, when the call is the whole value of a one-target assignment."""
    statement = call.statement
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or small.value is not call.node:
        return None
    return dotted_name(small.targets[0].target)
