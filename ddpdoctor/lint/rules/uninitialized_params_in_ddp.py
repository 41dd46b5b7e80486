"""DDP018 uninitialized-params-in-ddp: a model holding `nn.Lazy*` layers wrapped in DDP before a
forward pass has given them their shapes."""

from __future__ import annotations

from ddpdoctor.lint.analysis import lazy
from ddpdoctor.lint.rules.base import Rule

DDP = "torch.nn.parallel.DistributedDataParallel"


class UninitializedParamsInDDP(Rule):
    """
    Valid:
        model = nn.Sequential(nn.Flatten(), nn.LazyLinear(10)).cuda()
        model(torch.zeros(1, 3, 32, 32, device="cuda"))
        model = DDP(model, device_ids=[0])
    Invalid:
        model = nn.Sequential(nn.Flatten(), nn.LazyLinear(10)).cuda()
        model = DDP(model, device_ids=[0])
    """

    code = "DDP018"
    # The wrap is in this file; the lazy layer may be in another module of the project.
    trigger_words = ("DistributedDataParallel",)

    def check(self) -> None:
        for wrap in self.model.calls_named(DDP):
            target = wrap.arg(0, "module")
            if target is None:
                continue
            layers = lazy.lazy_layers(self.model, target, wrap.order, wrap.function)
            if not layers or lazy.materialised_before(self.model, target, wrap):
                continue
            owner, layer = layers[0]
            where = f"line {owner.line_of(layer.node)}" if owner is self.model else f"{owner.shown_path} line {owner.line_of(layer.node)}"
            kind = (layer.name or "").rsplit(".", 1)[-1]
            self.report(
                wrap.node,
                f"The model wrapped in DistributedDataParallel here holds a lazy layer ({kind} at {where}) whose "
                f"parameters have no shape until a first forward pass: DDP refuses it at construction (\"Modules "
                f"with uninitialized parameters can't be used with DistributedDataParallel\"). Run one forward "
                f"pass on a sample batch before wrapping (`model(sample)`), or give the layer its input size "
                f"(nn.Linear(in_features, ...)).",
            )
