"""DDP002 syncbn-after-ddp: `convert_sync_batchnorm` applied to a model already wrapped in DDP."""

from __future__ import annotations

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
            wrappers = [
                call
                for call in self.model.origin_calls(target, convert.order, convert.function)
                if call.name == DDP
            ]
            if not wrappers:
                continue
            wrap = min(wrappers, key=lambda c: c.order)
            self.report(
                convert.node,
                f"SyncBatchNorm conversion runs on a model already wrapped in DistributedDataParallel "
                f"(wrapped at line {self.line(wrap.node)}): DDP has already registered the original "
                f"BatchNorm layers, so batch statistics are never synchronised. Call "
                f"convert_sync_batchnorm before wrapping the model in DDP.",
            )
