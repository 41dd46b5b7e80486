"""DDP019 rank-local-metric-schedule: a learning-rate schedule or early stop driven by a metric
computed on this rank's shard and not reduced."""

from __future__ import annotations

from ddpdoctor.lint.analysis import Call, evaluation, launch
from ddpdoctor.lint.rules.base import Rule


class RankLocalMetricSchedule(Rule):
    """
    Valid:
        dist.init_process_group("nccl")
        val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))

        @torch.no_grad()
        def validate(model):
            total = torch.zeros(1)
            for x, y in val_loader:
                total += loss_fn(model(x), y)
            dist.all_reduce(total)
            return total.item()

        scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        scheduler.step(validate(model))
    Invalid:
        dist.init_process_group("nccl")
        val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))

        @torch.no_grad()
        def validate(model):
            total = 0.0
            for x, y in val_loader:
                total += loss_fn(model(x), y).item()
            return total

        scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        val_loss = validate(model)
        scheduler.step(val_loss)
    """

    code = "DDP019"
    checks_test_suites = False
    trigger_words = ("ReduceLROnPlateau", "early", "Early", "patience", "\"lr\"", "'lr'")
    context_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        model = self.model
        if launch.multiprocess_evidence(model) is None or not evaluation.unreduced_evaluations(model):
            return
        for call, what in evaluation.metric_schedule_calls(model):
            for arg in call.args:
                found = evaluation.shard_local_score(model, arg.value, call.order, call.function)
                if found is None:
                    continue
                self.report(
                    call.node,
                    f"{what} is driven by `{model.code_of(arg.value)}`, computed by the evaluation at line "
                    f"{self.line(found.loop.node)} on this rank's shard of the validation data and never "
                    f"reduced: each rank sees a different value, so the ranks' learning rates (or their decision "
                    f"to stop) drift apart, and a rank that stops alone leaves the others hanging in the next "
                    f"collective. All-reduce the metric across ranks (dist.all_reduce(metric); metric /= "
                    f"world_size) before the schedule reads it.",
                )
                break
        for store, guard, found in evaluation.metric_driven_lr_changes(model):
            self.report(
                store.target,
                f"the learning rate is changed under `{model.code_of(guard.test)}`, a test of a metric computed by "
                f"the evaluation at line {self.line(found.loop.node)} on this rank's shard of the validation data "
                f"and never reduced: the ranks decide differently, and their learning rates drift apart. "
                f"All-reduce the metric across ranks before the test.",
            )
