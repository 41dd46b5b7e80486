"""HVD003 horovod-missing-set-device: a Horovod job that uses CUDA without pinning its GPU."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import devices, harness, launch, summaries
from ddpdoctor.lint.analysis import Call
from ddpdoctor.lint.rules.base import Rule

HOROVOD_TORCH_INIT = "horovod.torch.init"


class HorovodMissingSetDevice(Rule):
    """
    Valid:
        hvd.init()
        torch.cuda.set_device(hvd.local_rank())
        model.cuda()
    Invalid:
        hvd.init()
        model.cuda()
    """

    code = "HVD003"
    checks_test_suites = False
    trigger_words = ("horovod",)

    def check(self) -> None:
        model = self.model
        inits = [
            call for call in model.calls_named(HOROVOD_TORCH_INIT)
            if launch.runs_in_module(model, call.function) and not harness.in_test_case(call)
        ]
        if not inits:
            return
        use = self.first_cuda_use()
        if use is None:
            return  # a CPU-only Horovod job has nothing to pin
        if devices.device_pin_calls(model) or devices.visible_devices_writes(model):
            return
        if summaries.PINS_GPU in summaries.module_effects(model):
            return  # a project function called here pins it (`setup_worker()` in dist.py, a base class's method)
        self.report(
            inits[0].node,
            f"Horovod job uses CUDA (line {self.line(use)}) but never pins its GPU: every process on a "
            f"node runs on GPU 0 (out of memory, or NCCL's \"Duplicate GPU detected\" error). Call "
            f"torch.cuda.set_device(hvd.local_rank()) right after hvd.init().",
            fix=self.fix(inits[0]),
        )

    def fix(self, init: Call) -> Optional[Fix]:
        """Insert `torch.cuda.set_device(hvd.local_rank())` on the line after `hvd.init()`, at its
        indentation (so under the same conditions), spelled with the module's top-level imports."""
        pin = self.model.spelling("torch.cuda.set_device")
        local_rank = self.model.spelling("horovod.torch.local_rank")
        if pin is None or local_rank is None:
            return None
        statement = f"{pin}({local_rank}())"
        edit = self.insert_line(init, statement, after=True)
        if edit is None:
            return None
        return Fix(f"call `{statement}` right after hvd.init()", applicable=True, edits=(edit,))

    def first_cuda_use(self) -> Optional[cst.CSTNode]:
        """The first place the script puts work on the *current* GPU: `.cuda()` without an index, or
        a device argument that is plain "cuda" (`.to("cuda")`, `torch.device("cuda")`,
        `device="cuda"`). An explicit index (`.cuda(hvd.local_rank())`) does not depend on pinning."""
        model = self.model
        uses: list[Call] = []
        for call in model.method_calls("cuda"):
            # `model.cuda()`, not a function of the torch.cuda module
            if call.name is None and call.arg(0, "device") is None:
                uses.append(call)
        for argument in devices.device_arguments(model):
            call = argument.call
            if argument.where == "torch.device()" and call.arg(1, "index") is not None:
                continue
            for value, _, _ in model.leaf_values(argument.expr, call.order, call.function):
                if isinstance(value, cst.SimpleString) and value.evaluated_value == "cuda":
                    uses.append(call)
                    break
        if not uses:
            return None
        return min(uses, key=lambda c: c.order).node
