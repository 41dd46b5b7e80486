"""AMP002 clip-without-unscale: gradient clipping on GradScaler-scaled gradients."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import Call, Function, ModuleModel, conditions, dotted_name, names_in, summaries
from ddpdoctor.lint.rules.base import Rule

CLIPS = tuple(sorted(summaries.CLIPS))
SCALERS = frozenset({"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.GradScaler",
                     "torch.amp.grad_scaler.GradScaler"})


def scaled_backward_scaler(model: ModuleModel, call: Call) -> Optional[str]:
    """For `scaler.scale(loss).backward()` (or `scaled = scaler.scale(loss); scaled.backward()` with
    `scaler` a GradScaler) return the scaler as written, else None."""
    if call.attr != "backward" or call.receiver is None:
        return None
    receiver = call.receiver
    if isinstance(receiver, cst.Call):
        scale = model.call_of(receiver)
        if scale is not None and scale.attr == "scale" and scale.receiver is not None:
            return dotted_name(scale.receiver) or model.code_of(scale.receiver)
        return None
    for origin in model.origin_calls(receiver, call.order, call.function):
        if origin.attr == "scale" and origin.receiver is not None:
            if model.origin_names(origin.receiver, origin.order, origin.function) & SCALERS:
                return dotted_name(origin.receiver) or model.code_of(origin.receiver)
    return None


# Words in a flag that selects the precision mode (`if not args.amp:`, `if use_fp16:`).
PRECISION_WORDS = ("amp", "fp16", "float16", "half", "scaler", "precision", "bf16", "dtype", "mixed")


def precision_dependent(model: ModuleModel, clip: Call, backward: Optional[Call]) -> bool:
    """The clip sits under a condition the backward does not share that reads a precision flag or the
    scaler itself, e.g. `if not args.amp: clip(...)` after `if scaler is not None: scaler.scale(...)`:
    the two may well be exclusive at run time, which we cannot prove, so the rule stays silent.
    Without a backward (a clip inside a helper), any such condition counts."""
    shared = backward.ctx.guards if backward is not None else ()
    for guard in clip.ctx.guards:
        if any(conditions.agreement(model, guard, other) for other in shared):
            continue
        for name in names_in(guard.test):
            if any(word in name.rsplit(".", 1)[-1].lower() for word in PRECISION_WORDS):
                return True
    return False


class ClipWithoutUnscale(Rule):
    """
    Valid:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
    Invalid:
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
    """

    code = "AMP002"
    # `.scale(`: a script whose clip is in a helper (maybe of another module) still scales its loss.
    trigger_words = ("clip_grad_", ".scale(")

    def check(self) -> None:
        for clip in self.model.calls_named(*CLIPS):
            calls = self._calls_around(clip)
            backward, scaler = self._scaled_backward_before(clip, calls)
            if backward is None or scaler is None or precision_dependent(self.model, clip, backward):
                continue
            written = f"{clip.dotted or clip.name}()"
            if clip.dotted != clip.name and clip.dotted is not None and not (clip.name or "").endswith("." + clip.dotted):
                written += f" ({clip.name})"
            between = [c for c in calls if backward.order < c.order < clip.order and not conditions.exclusive(self.model, c, clip)]
            stepped = [c for c in between if c.attr == "step" and c.receiver is not None
                       and (dotted_name(c.receiver) or self.model.code_of(c.receiver)) == scaler]
            if stepped:
                # `scaler.step()` unscales on its own, so these gradients are unscaled — but the
                # update has already been applied with unclipped gradients.
                self.report(
                    clip.node,
                    f"{written} runs after `{scaler}.step(optimizer)` at line {self.line(stepped[0].node)}: "
                    f"the optimizer already stepped with unclipped gradients, so clipping has no effect on "
                    f"this update. Call `{scaler}.unscale_(optimizer)` and clip before `{scaler}.step`.",
                )
                continue
            if any(summaries.call_unscales(self.model, c) for c in between):
                continue
            self.report(
                clip.node,
                f"{written} clips gradients that are still multiplied by the GradScaler's scale "
                f"(`{scaler}.scale(loss).backward()` at line {self.line(backward.node)}): the threshold is "
                f"compared against scaled norms, so clipping is far too aggressive or has no effect. "
                f"Call `{scaler}.unscale_(optimizer)` before clipping.",
                fix=self._fix(clip, backward, scaler, calls) if scaler is not None else None,
            )

        self._check_clipping_helpers()

    def _calls_around(self, call: Call) -> list[Call]:
        """The calls of the function (or module level) `call` is in, in order."""
        function = call.function
        return list(function.calls) if function is not None else [c for c in self.model.calls if c.function is None]

    def _scaled_backward_before(self, at: Call, calls: list[Call]) -> tuple[Optional[Call], Optional[str]]:
        """The last `scaler.scale(loss).backward()` before `at` in the same function that can run on
        the same path, with its scaler as written."""
        backward: Optional[Call] = None
        scaler: Optional[str] = None
        for call in calls:
            if call.order >= at.order:
                break
            found = scaled_backward_scaler(self.model, call)
            if found is not None and not conditions.exclusive(self.model, call, at):
                backward, scaler = call, found
        return backward, scaler

    def _check_clipping_helpers(self) -> None:
        """A helper (of this module or another project module) whose body clips gradients before any
        `unscale_`, called after `scaler.scale(loss).backward()` with no `unscale_` in between:
        reported at the call, where the scaled backward is known."""
        # Only a function (or module level) with a scaled backward can report, and finding the callee
        # may parse another module: the local precondition is asked first, so a file without AMP never
        # reads its imports for this rule.
        scaled_in = {id(c.function) for c in self.model.calls if scaled_backward_scaler(self.model, c) is not None}
        for call in self.model.calls:
            if id(call.function) not in scaled_in:
                continue
            if call.name in summaries.CLIPS or (call.name or "").startswith("torch."):
                continue
            calls = self._calls_around(call)
            backward, scaler = self._scaled_backward_before(call, calls)
            if backward is None or scaler is None or precision_dependent(self.model, call, backward):
                continue
            found = self._clipping_callee(call)
            if found is None:
                continue
            other, helper, clipping = found
            between = [c for c in calls if backward.order < c.order < call.order and not conditions.exclusive(self.model, c, call)]
            if any(summaries.call_unscales(self.model, c) for c in between) or any(self._steps(c, scaler) for c in between):
                continue  # unscaled already, or the step (which unscales) has been taken: another story
            where = "" if other is self.model else f" of {other.shown_path}"
            clip = clipping.clip
            self.report(
                call.node,
                f"{call.dotted or helper.name}() clips gradients ({clip.dotted or clip.name}() at line "
                f"{other.line_of(clip.node)}{where}) that are still multiplied by the GradScaler's scale "
                f"(`{scaler}.scale(loss).backward()` at line {self.line(backward.node)}), and nothing "
                f"unscales them first: the threshold is compared against scaled norms, so clipping is far "
                f"too aggressive or has no effect. Call `{scaler}.unscale_(optimizer)` before it.",
                fix=self._fix(call, backward, scaler, calls),
            )

    def _clipping_callee(self, call: Call) -> Optional[tuple[ModuleModel, Function, summaries.Clipping]]:
        """The function `call` invokes (here or in another project module) when its body clips
        gradients before any `unscale_`, outside any precision-mode condition of its own."""
        for other, function, clipping in summaries.clipping_callees(self.model, call):
            if precision_dependent(other, clipping.clip, None):
                continue  # `if not use_amp: clip(...)` inside the helper
            return other, function, clipping
        return None

    def _steps(self, call: Call, scaler: str) -> bool:
        return call.attr == "step" and call.receiver is not None and (
            dotted_name(call.receiver) or self.model.code_of(call.receiver)
        ) == scaler

    def _fix(self, clip: Call, backward: Call, scaler: str, calls: list[Call]) -> Optional[Fix]:
        """Insert `scaler.unscale_(optimizer)` on the line before the clip, with the optimizer that
        this scaler steps after it (one, written as a plain name or attribute). Applied only when
        it certainly runs once per step where the scaler exists: the clip runs under every
        condition the scaled backward runs under (`if scaler is not None:` around the backward
        and not the clip could meet a None scaler), in the same loops as the step (a clip in an
        accumulation loop would unscale twice per step, which GradScaler refuses)."""
        steps = [
            c for c in calls
            if c.order > clip.order and c.attr == "step" and c.receiver is not None
            and (dotted_name(c.receiver) or self.model.code_of(c.receiver)) == scaler
            and not conditions.exclusive(self.model, c, clip)
        ]
        optimizers = {dotted_name(c.arg(0, "optimizer")) for c in steps}
        if len(optimizers) != 1 or None in optimizers:
            return None
        optimizer = optimizers.pop()
        statement = f"{scaler}.unscale_({optimizer})"
        edit = self.insert_line(clip, statement, after=False)
        if edit is None:
            return None
        clip_guards = {(id(g.test), g.negated) for g in clip.ctx.guards}
        certain = all((id(g.test), g.negated) in clip_guards for g in backward.ctx.guards) and all(
            s.ctx.loops == clip.ctx.loops for s in steps
        )
        return Fix(f"call `{statement}` before clipping", applicable=certain, edits=(edit,))

