"""DDP011 missing-set-device: an NCCL process group in a script that never pins its GPU."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.findings import Fix
from ddpdoctor.lint.analysis import Call, devices, harness, launch, ranks, summaries
from ddpdoctor.lint.rules.base import Rule


class MissingSetDevice(Rule):
    """
    Valid:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl")
        model = DDP(model.cuda(), device_ids=[local_rank])
    Invalid:
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group(backend="nccl")
        model = DDP(model.cuda(), device_ids=[local_rank])
    """

    code = "DDP011"
    checks_test_suites = False
    # Or a DDP script whose NCCL group a project helper creates (`init_distributed()`).
    trigger_words = ("nccl", "NCCL", "DistributedDataParallel")
    # The rule needs an init_process_group call or a DDP wrap in this file (check() below): a file
    # that only mentions NCCL (an environment report, a CUDA-to-HIP name table) is not parsed for it.
    context_words = ("init_process_group", "DistributedDataParallel")

    def check(self) -> None:
        model = self.model
        # An init in a helper this module never calls belongs to a library module (a `utils.setup()`):
        # the script that calls it may pin the device itself.
        inits = [
            call for call in model.calls_named(launch.INIT_PROCESS_GROUP)
            if launch.may_create_nccl_group(model, call) and launch.runs_in_module(model, call.function) and not harness.in_test_case(call)
        ]
        if devices.device_pin_calls(model) or devices.visible_devices_writes(model):
            return
        # Issue 10: a script that names cuda:LOCAL_RANK everywhere never falls back to GPU 0; only
        # what relies on the current device (bare .cuda(), barrier(), object collectives) does.
        uses = devices.current_device_uses(model)
        if not uses:
            return
        where = self.uses_text(uses)
        if not inits and not model.calls_named(launch.DDP_CLASS):
            return  # a group created by a project helper matters in a script that then wraps in DDP
        helpers = self.project_helpers()
        if not inits and not helpers:
            return
        if summaries.PINS_GPU in summaries.module_effects(model):
            return  # a project function called here pins it (a helper module's, a base class's method)
        # Last, because it reads every project module this one imports: a pin run on import.
        if devices.pinned_on_import(model):
            return
        # One missing pin, one finding: a script that creates its group in two places (a tutorial
        # with two snippets, a retry) is reported at the first, where the fix goes.
        first_helper = min(helpers, key=lambda pair: pair[0].order, default=None)
        first_init = min(inits, key=lambda call: call.order, default=None)
        if first_helper is not None and (first_init is None or first_helper[0].order < first_init.order):
            call, created = first_helper
            self.report(
                call.node,
                f"{call.dotted}() initialises an NCCL process group ({created}) but neither it nor this script "
                f"pins the GPU (no torch.cuda.set_device, torch.cuda.device or device_id=), and this script uses "
                f"the current CUDA device ({where}): that is GPU 0 in every rank, which fills GPU 0 with every "
                "rank's work and can hang NCCL. Call torch.cuda.set_device(local_rank) before it.",
            )
        elif first_init is not None:
            self.report(
                first_init.node,
                "NCCL process group initialised but this script never pins its GPU (no "
                "torch.cuda.set_device, torch.cuda.device or device_id=), and it uses the current CUDA "
                f"device ({where}): that is GPU 0 in every rank, which fills GPU 0 with every rank's work "
                "and can hang NCCL. Call torch.cuda.set_device(local_rank) before init_process_group, or "
                "pass device_id=torch.device(\"cuda\", local_rank).",
                fix=self.fix(first_init),
            )

    def uses_text(self, uses: list[devices.CurrentDeviceUse]) -> str:
        """`line 31: dist.barrier() without device_ids; line 40: bare .cuda()` (the first three)."""
        shown = "; ".join(f"line {self.line(use.call.node)}: {use.what}" for use in uses[:3])
        return shown + (f"; and {len(uses) - 3} more" if len(uses) > 3 else "")

    def fix(self, init: Call) -> Optional[Fix]:
        """Insert `torch.cuda.set_device(<local rank>)` on the line after the group is created, at
        its indentation (so on the same path), when the script holds its local rank there."""
        pin = self.model.spelling("torch.cuda.set_device")
        local_rank = ranks.local_rank_expression(self.model, init.order, init.ctx)
        if pin is None or local_rank is None:
            return None
        statement = f"{pin}({local_rank})"
        edit = self.insert_line(init, statement, after=True)
        if edit is None:
            return None
        return Fix(f"call `{statement}` right after init_process_group", applicable=True, edits=(edit,))

    def project_helpers(self) -> list[tuple[Call, str]]:
        """Calls here of another project module's functions that create an NCCL group without
        pinning the GPU (each with where the group is created)."""
        helpers: list[tuple[Call, str]] = []
        for call in self.model.calls:
            # Cheap tests first: linking reads and parses the other module.
            if not self.model.may_link(call) or not launch.runs_in_module(self.model, call.function):
                continue
            found = summaries.called_unpinned_group(self.model, call)
            if found is not None:
                other, init = found
                helpers.append((call, f"{other.shown_path} line {other.line_of(init.node)}"))
        return helpers

