"""DP002 dataparallel-instead-of-ddp: `nn.DataParallel` used to train on several GPUs."""

from __future__ import annotations

from ddpdoctor.lint.rules.base import Rule

DATA_PARALLEL = "torch.nn.DataParallel"


class DataParallelInsteadOfDDP(Rule):
    """
    Valid:
        dist.init_process_group("nccl")
        model = DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])
    Invalid:
        model = torch.nn.DataParallel(model).cuda()
    """

    code = "DP002"
    # A unit test builds DataParallel to test what users save from it (`module.` prefixes in
    # checkpoints), not to train with it.
    checks_test_suites = False
    trigger_words = ("DataParallel",)

    def check(self) -> None:
        # `calls_named` resolves aliases: `nn.DataParallel`, `from torch.nn import DataParallel as DP`,
        # `torch.nn.parallel.DataParallel` all canonicalise to torch.nn.DataParallel.
        for call in self.model.calls_named(DATA_PARALLEL):
            self.report(
                call.node,
                "nn.DataParallel replicates the model in one process with one thread per GPU: it re-copies "
                "the weights to every GPU each step and is bound by the GIL, so it is usually slower than "
                "DistributedDataParallel even on one machine. Use DistributedDataParallel with one process "
                "per GPU (torchrun).",
            )
