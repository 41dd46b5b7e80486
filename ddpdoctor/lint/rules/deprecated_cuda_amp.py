"""AMP001 deprecated-cuda-amp: `torch.cuda.amp.GradScaler` / `torch.cuda.amp.autocast`, deprecated
in favour of the device-generic `torch.amp.GradScaler("cuda")` and `torch.autocast("cuda")`."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Edit, Fix
from ddpdoctor.lint.analysis import Call
from ddpdoctor.lint.rules.base import Rule

GRAD_SCALER = "torch.cuda.amp.GradScaler"
AUTOCAST = "torch.cuda.amp.autocast"
# The replacement callee, after `<torch>.`.
REPLACEMENT = {GRAD_SCALER: "amp.GradScaler", AUTOCAST: "autocast"}
# `torch.cuda.amp.autocast(enabled, dtype, cache_enabled)` but `torch.autocast(device_type, dtype,
# enabled, cache_enabled)`: positional arguments must become keywords or they land in the wrong slot.
# GradScaler keeps its order (`torch.amp.GradScaler(device, init_scale, ...)`), so it needs nothing.
AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


class DeprecatedCudaAmp(Rule):
    """
    Valid:
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(images), target)
    Invalid:
        scaler = torch.cuda.amp.GradScaler()
        with torch.cuda.amp.autocast():
            loss = criterion(model(images), target)
    """

    code = "AMP001"
    trigger_words = ("GradScaler", "autocast")
    # Only the torch.cuda.amp spellings are deprecated, and every way to reach them names the
    # module: `torch.cuda.amp.autocast`, `from torch.cuda.amp import ...`, `cuda.amp.GradScaler`
    # after `from torch import cuda`, or `from torch.cuda import amp` (also in parentheses). A file
    # that only uses `torch.autocast` is not parsed for this rule.
    context_words = ("cuda.amp", "torch.cuda import")

    def check(self) -> None:
        torch_name = self._torch_binding()
        for call in self.model.calls_named(GRAD_SCALER, AUTOCAST):
            assert call.name is not None
            written = f"{call.dotted or call.name}(...)"
            if call.dotted != call.name:
                written += f" (that is {call.name})"  # an alias such as `from torch.cuda.amp import autocast`
            replacement = f"torch.{REPLACEMENT[call.name]}"
            shown = f'{replacement}("cuda", ...)'
            self.report(
                call.node,
                f"{written} is deprecated (a FutureWarning since PyTorch 2.4) and CUDA-only; use "
                f"{shown}.",
                fix=self._fix(call, torch_name, shown),
            )

    def _torch_binding(self) -> Optional[str]:
        """The name the module binds to the `torch` package itself (`import torch` / `import torch as th`)."""
        if self.model.imports.get("torch") == "torch":
            return "torch"
        for local, target in self.model.imports.items():
            if target == "torch":
                return local
        return None

    def _fix(self, call: Call, torch_name: Optional[str], shown: str) -> Fix:
        """Text edits that keep the user's layout: the callee is replaced, `"cuda"` is inserted
        before the first argument, and autocast's positional arguments get their keywords."""
        assert call.name is not None
        node = call.node
        # `**kwargs` keep their names (GradScaler's and autocast's keywords are unchanged), and
        # GradScaler's positional order is unchanged too; only `*args` into autocast could shift.
        positional_star = any(a.star == "*" for a in node.args)
        applicable = torch_name is not None and not (positional_star and call.name == AUTOCAST)
        callee = f"{torch_name or 'torch'}.{REPLACEMENT[call.name]}"
        description = f"Replace with {shown}"
        if torch_name is None:
            description += " (needs `import torch`)"
        args = list(node.args)
        if not args:
            # `GradScaler()`: nothing to keep inside the parentheses, regenerate the whole call.
            new_call = node.with_changes(func=cst.parse_expression(callee), args=[cst.Arg(cst.SimpleString('"cuda"'))])
            return Fix(description, applicable, (self.replace(node, self.model.module.code_for_node(new_call)),))

        insertions: dict[tuple[int, int], str] = {}
        first = self.model.position(args[0]).start
        if isinstance(node.whitespace_before_args, cst.ParenthesizedWhitespace):
            # One argument per line: give "cuda" its own line at the same indentation.
            device_text = '"cuda",\n' + " " * first.column
        else:
            device_text = '"cuda", '
        insertions[(first.line, first.column + 1)] = device_text
        if call.name == AUTOCAST:
            positional = [a for a in args if a.keyword is None and not a.star]
            if len(positional) > len(AUTOCAST_POSITIONAL):
                applicable = False
            for keyword, arg in zip(AUTOCAST_POSITIONAL, positional):
                start = self.model.position(arg).start
                key = (start.line, start.column + 1)
                insertions[key] = insertions.get(key, "") + f"{keyword}="
        edits = [self.replace(node.func, callee)]
        for (line, column), text in sorted(insertions.items()):
            edits.append(Edit(line, column, line, column, text))
        return Fix(description, applicable, tuple(edits))
