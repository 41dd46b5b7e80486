"""DDP015 eval-on-shards: an evaluation over a DistributedSampler shard whose score is never
combined across ranks."""

from __future__ import annotations

from ddpdoctor.lint.analysis import evaluation, launch
from ddpdoctor.lint.rules.base import Rule


class EvalOnShards(Rule):
    """
    Valid:
        dist.init_process_group("nccl")
        val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))

        @torch.no_grad()
        def validate(model):
            counts = torch.zeros(2)
            for images, labels in val_loader:
                counts[0] += (model(images).argmax(1) == labels).sum()
                counts[1] += labels.numel()
            dist.all_reduce(counts)
            return counts[0] / counts[1]
    Invalid:
        dist.init_process_group("nccl")
        val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))

        @torch.no_grad()
        def validate(model):
            correct = total = 0
            for images, labels in val_loader:
                correct += (model(images).argmax(1) == labels).sum()
                total += labels.numel()
            return correct / total
    """

    code = "DDP015"
    checks_test_suites = False
    # The shard comes from a distributed sampler, or a dataset that takes its own share by rank.
    trigger_words = ("Distributed", "sampler", "shard", "rank")
    context_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        model = self.model
        if launch.multiprocess_evidence(model) is None:
            return
        for found in evaluation.unreduced_evaluations(model):
            if launch.dead_in_script(model, found.function):
                continue
            used = "returns" if found.returned else "reports"
            where = f"{found.loader.dotted or 'DataLoader'} at line {self.line(found.loader.node)}"
            if found.main_process_only:
                what = (
                    f"only the main process runs this evaluation, but its loader ({where}) gives it only its own "
                    f"1/world_size share of the data: the score it {used} is one shard's, not the validation "
                    f"set's, and the logged result or the checkpoint chosen by it is that shard's."
                )
                fix = "Evaluate on a loader without the DistributedSampler there, or evaluate on every rank and "
            else:
                what = (
                    f"each rank evaluates only its own shard here ({where}, a 1/world_size share of the data), and "
                    f"the score {'this function' if found.function is not None else 'the script'} {used} is never "
                    f"combined across ranks: every rank gets a different "
                    f"number, and the logged result, a best-checkpoint choice or a scheduler driven by it is one "
                    f"shard's, not the validation set's."
                )
                fix = ""
            self.report(
                found.loop.node,
                f"evaluation over data split across ranks: {what} {fix}"
                f"{'a' if fix else 'A'}ll-reduce the sums and counts (dist.all_reduce) before computing the score, "
                f"or gather the predictions (all_gather, accelerator.gather_for_metrics, a torchmetrics metric).",
            )
