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
            if found.main_process_only:
                scope = (
                    "only the main process runs this evaluation, and its loader is split across ranks, so the "
                    "score it "
                )
            else:
                scope = "each rank evaluates only its own shard here, and the score this function "
            self.report(
                found.loop.node,
                f"evaluation over data split across ranks ({found.loader.dotted or 'DataLoader'} at line "
                f"{self.line(found.loader.node)}, one 1/world_size share per rank): {scope}{used} is one "
                f"shard's, not the validation set's; it is never combined across ranks, so the logged score, "
                f"a best-checkpoint choice or a scheduler driven by it differ from rank to rank. All-reduce the "
                f"sums and counts (dist.all_reduce) before computing the score, or gather the predictions "
                f"(all_gather, accelerator.gather_for_metrics, a torchmetrics metric).",
            )
