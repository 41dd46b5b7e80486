"""DP003 dataparallel-inside-rank: `nn.DataParallel` inside a process that is already one rank."""

from __future__ import annotations

from ddpdoctor.lint.analysis import Call, Runs, launch, who_runs
from ddpdoctor.lint.rules.base import Rule

DATA_PARALLEL = "torch.nn.DataParallel"
DDP_CLASS = launch.DDP_CLASS
# Any answer but these puts the wrap inside a rank: a single-process branch, or undecidable.
SILENT = (Runs.SINGLE, Runs.UNKNOWN)


class DataParallelInsideRank(Rule):
    """
    Valid:
        if args.distributed:
            dist.init_process_group("nccl")
            model = DDP(model.cuda(local_rank), device_ids=[local_rank])
        else:
            model = nn.DataParallel(model).cuda()
    Invalid:
        dist.init_process_group("nccl")
        model = DDP(nn.DataParallel(model).cuda(), device_ids=[local_rank])
    """

    code = "DP003"
    trigger_words = ("DataParallel",)
    context_words = ("init_process_group", "horovod", "deepspeed")
    # Unit tests build DataParallel models on purpose (to test loading their checkpoints).
    checks_test_suites = False

    def check(self) -> None:
        wraps = self.model.calls_named(DATA_PARALLEL)
        if not wraps:
            return
        setup = launch.process_group_setup(self.model)
        if setup is None:
            return
        what = {"torch.distributed.init_process_group": "init_process_group"}.get(
            setup.name or "", "hvd.init()" if (setup.name or "").startswith("horovod.") else "DeepSpeed"
        )
        for wrap in wraps:
            if who_runs(self.model, wrap).runs in SILENT or self._other_branch_wraps_in_ddp(wrap):
                continue
            self.report(
                wrap.node,
                f"nn.DataParallel on the multi-process path of a script that starts a process group "
                f"({what} at line {self.line(setup.node)}): each rank replicates the model over every "
                f"visible GPU, so the ranks fight over the same devices. Give each process one GPU "
                f"(DistributedDataParallel alone), or keep DataParallel for the single-process branch "
                f"(`if not args.distributed:`).",
            )

    def _other_branch_wraps_in_ddp(self, wrap: Call) -> bool:
        """`if args.dataparallel: DataParallel(m) else: DDP(m)`: the two wraps are alternatives, and
        the DataParallel one is the script's single-process mode, chosen by the user."""
        for ddp in self.model.calls_named(DDP_CLASS):
            for theirs in ddp.ctx.guards:
                if any(ours.test is theirs.test and ours.negated != theirs.negated for ours in wrap.ctx.guards):
                    return True
        return False

