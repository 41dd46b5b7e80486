"""DDP012 load-without-map-location: every rank loads a GPU checkpoint onto the device it was saved from."""

from __future__ import annotations

import os
from typing import Optional

import libcst as cst

from ddpdoctor.findings import Edit, Fix
from ddpdoctor.lint.analysis import MAX_DEPTH, Call, Function, Runs, checkpoint_loads, devices, dotted_name, launch, who_runs
from ddpdoctor.lint.rules.base import Rule

LOAD = "torch.load"
# Objects whose state is restored from a checkpoint: a model, optimizer, scheduler, scaler, EMA...
# all spell it `load_state_dict`, so the method name is the evidence, not the receiver's type.
RESTORE_METHODS = ("load_state_dict",)
# Reading a part of a loaded checkpoint: `ckpt["model"]`, `ckpt.get("model")`, `ckpt["a"]["b"]`.
# `ckpt["model"].float().state_dict()`: a checkpoint that pickled the module itself (YOLO-style) is
# restored through the module's own state_dict, after a dtype cast.
PART_METHODS = frozenset({"get", "pop", "items", "copy", "state_dict", "float", "half"})
NUMBERS_ONLY_PREFIXES = ("torch.optim.lr_scheduler.", "torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.amp.grad_scaler.")


class LoadWithoutMapLocation(Rule):
    """
    Valid:
        dist.init_process_group("nccl")
        model = DDP(model.cuda())
        ckpt = torch.load(path, map_location="cpu")
        model.load_state_dict(ckpt["model"])
    Invalid:
        dist.init_process_group("nccl")
        model = DDP(model.cuda())
        ckpt = torch.load(path)
        model.load_state_dict(ckpt["model"])
    """

    code = "DDP012"
    trigger_words = ("load(",)
    context_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        self._check_helpers()
        model = self.model
        loads = [c for c in model.calls_named(LOAD) if not self._has_map_location(c)]
        if not loads:
            return
        if launch.multiprocess_evidence(model) is None or not devices.uses_cuda(model):
            return
        if devices.one_visible_gpu_per_process(model):
            return  # every process's cuda:0 is its own GPU: nothing piles up on one device
        restored = self._restored_loads()
        for load in loads:
            restores = restored.get(id(load), [])
            if not restores:
                continue  # data (a features cache, a vocabulary), not a checkpoint
            if all(self._holds_no_tensors(r) for r in restores):
                continue  # a scheduler's or a scaler's state is plain numbers: nothing lands on a GPU
            if self._mapped_elsewhere(load, loads):
                continue  # `if args.gpu is None: torch.load(p) else: torch.load(p, map_location=loc)`
            if who_runs(model, load).runs is not Runs.ALL:
                continue  # rank 0 loads and broadcasts, a single-process branch, or undecidable
            restore = restores[0]
            where = "" if self.line(restore.node) == self.line(load.node) else (
                f" (restored by {restore.attr} at line {self.line(restore.node)})"
            )
            self.report(
                load.node,
                f"torch.load without map_location in a multi-process CUDA script{where}: every process "
                f"deserialises this checkpoint onto the GPU it was saved from (usually cuda:0), so GPU 0 "
                f"holds a copy per process and can run out of memory on resume. Pass map_location "
                f"(\"cpu\", or this process's own device).",
                fix=self._fix(load),
            )

    def _check_helpers(self) -> None:
        """Every rank calls a function of another project module that restores a checkpoint it
        loaded without map_location: reported at the call (the helper's module cannot know)."""
        model = self.model
        if launch.multiprocess_evidence(model) is None or devices.one_visible_gpu_per_process(model):
            return
        for found in checkpoint_loads.helper_loads(model):
            if not (devices.uses_cuda(model) or devices.uses_cuda(found.module)):
                continue
            where = f"{os.path.basename(found.module.path)} line {found.module.line_of(found.load.node)}"
            self.report(
                found.site.node,
                f"{found.helper.name}() runs on every rank of this multi-process CUDA script and restores a "
                f"checkpoint loaded by torch.load without map_location ({where}): every process deserialises it "
                f"onto the GPU it was saved from (usually cuda:0), so GPU 0 holds a copy per process and can run "
                f"out of memory on resume. Pass map_location (\"cpu\", or this process's own device) there.",
            )

    @staticmethod
    def _has_map_location(load: Call) -> bool:
        """`map_location` given in any form: positional, keyword, or in a `**kwargs` the model read
        whole; a `*args` or a `**kwargs` it could not read may carry it, so it counts as given."""
        return load.arg(1, "map_location") is not None or load.has_star_args()

    def _restored_loads(self) -> dict[int, list[Call]]:
        """For each load whose result reaches `load_state_dict` (directly, through a key or a
        helper), the restores it reaches."""
        out: dict[int, list[Call]] = {}
        for restore in self.model.method_calls(*RESTORE_METHODS):
            state = restore.arg(0, "state_dict")
            for load in self._loads_behind(state, restore.order, restore.function, 0):
                out.setdefault(id(load), []).append(restore)
        return out

    def _holds_no_tensors(self, restore: Call) -> bool:
        """`scheduler.load_state_dict(...)` / `scaler.load_state_dict(...)`: LR schedulers and
        gradient scalers keep only Python numbers in their state, so their file maps nowhere."""
        receiver = restore.receiver
        if receiver is None:
            return False
        names = self.model.origin_names(receiver, restore.order, restore.function)
        if any(n.startswith(NUMBERS_ONLY_PREFIXES) or "schedule" in n.rsplit(".", 1)[-1] for n in names):
            return True
        last = (dotted_name(receiver) or "").rsplit(".", 1)[-1].lower()
        return not names and ("sched" in last or "scaler" in last)

    def _mapped_elsewhere(self, load: Call, loads_without: list[Call]) -> bool:
        """Another `torch.load` of the same file in the same function passes map_location: the bare
        one is the branch with no GPU of its own (the ImageNet-style `if args.gpu is None:`)."""
        first = load.arg(0, "f")
        if first is None:
            return False
        text = self.model.code_of(first)
        return any(
            other.function is load.function and other not in loads_without
            and (arg := other.arg(0, "f")) is not None and self.model.code_of(arg) == text
            for other in self.model.calls_named(LOAD)
        )

    def _loads_behind(
        self, expr: Optional[cst.BaseExpression], order: int, function: Optional[Function], depth: int
    ) -> list[Call]:
        """The `torch.load` calls a state value may come from: through variables, keys of the
        loaded dict, a key-renaming comprehension, helper returns and helper parameters."""
        root = _checkpoint_root(expr)
        if root is None or depth > MAX_DEPTH:
            return []
        if isinstance(root, cst.Call):
            call = self.model.call_of(root)
            if call is None:
                return []
            if call.name == LOAD:
                return [call]
            out: list[Call] = []
            for helper in self.model.resolve_local_function(call):
                for returned, at, inside in self.model.return_sites(helper):
                    out.extend(self._loads_behind(returned, at, inside, depth + 1))
            return out
        if dotted_name(root) is None:
            return []
        out = []
        for value, v_order, v_function in self.model.leaf_values(root, order, function):
            if value is not root:
                out.extend(self._loads_behind(value, v_order, v_function, depth + 1))
        return out

    def _fix(self, load: Call) -> Optional[Fix]:
        """Add `map_location=` after the last argument: the script's own device variable when one
        certainly holds it where the load runs, else "cpu" (always correct: load_state_dict copies
        onto the parameters' devices)."""
        if not load.args:
            return None
        device = devices.local_device_expression(self.model, load) or '"cpu"'
        last = load.args[-1]
        end = self.model.position(last.value).end
        edit = Edit(end.line, end.column + 1, end.line, end.column + 1, f", map_location={device}")
        return Fix(f"pass map_location={device}", applicable=False, edits=(edit,))


def _checkpoint_root(expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """`ckpt["model"]["ema"]`, `ckpt.get("model")`, `{k[7:]: v for k, v in ckpt["model"].items()}`
    -> `ckpt`: the expression that holds the loaded object."""
    while expr is not None:
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.DictComp):
            expr = expr.for_in.iter
        elif (
            isinstance(expr, cst.Call)
            and isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value in PART_METHODS
        ):
            expr = expr.func.value
        else:
            return expr
    return None
