"""DDP006 missing-distributed-sampler: a shuffling training DataLoader without a sampler in a distributed script."""

from __future__ import annotations

from typing import Optional

from ddpdoctor.lint.analysis import Call, Runs, launch, ranks, sharding, who_runs
from ddpdoctor.lint.rules.base import Rule

DATA_LOADER = "torch.utils.data.DataLoader"
SAMPLER = "torch.utils.data.DistributedSampler"
# Loaders for evaluation: iterating the whole set on each rank wastes time but trains nothing wrong.
EVAL_WORDS = ("val", "test", "eval", "dev")


class MissingDistributedSampler(Rule):
    """
    Valid:
        dist.init_process_group("nccl")
        sampler = DistributedSampler(train_set)
        loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    Invalid:
        dist.init_process_group("nccl")
        loader = DataLoader(train_set, batch_size=32, shuffle=True)
    """

    code = "DDP006"
    trigger_words = ("DataLoader",)
    context_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        start = launch.multiprocess_evidence(self.model)
        if start is None:
            return
        loaders = self.model.calls_named(DATA_LOADER)
        for loader in loaders:
            if not self._without_sampler(loader):
                continue
            shuffles = self._shuffles(loader)
            forgotten = None if shuffles else self._forgotten_sampler(loader, loaders)
            if not shuffles and forgotten is None:
                continue
            if who_runs(self.model, loader).runs not in (Runs.ALL, Runs.UNKNOWN):
                continue
            if ranks.who_reads(self.model, loader).runs not in (Runs.ALL, Runs.UNKNOWN):
                continue  # built everywhere, drawn from on rank 0 only: a preview, not the training data
            if self._is_eval_loader(loader) or self._already_sharded(loader):
                continue
            what = launch.describe(start)
            if forgotten is not None:
                name = self._name_of(forgotten)
                self.report(
                    loader.node,
                    f"This DataLoader takes no sampler, although the DistributedSampler `{name}` (line "
                    f"{self.line(forgotten.node)}) is built for its dataset and never used, in a distributed "
                    f"script ({what} at line {self.line(start.node)}): every rank iterates the whole dataset, "
                    f"so the ranks do not split the data. Pass `sampler={name}` and call "
                    f"`{name}.set_epoch(epoch)` every epoch.",
                )
                continue
            self.report(
                loader.node,
                f"This DataLoader shuffles the whole dataset on every rank (shuffle=True, no sampler) in a "
                f"distributed script ({what} at line {self.line(start.node)}): the ranks do not split the data, "
                f"each trains on all of it. Pass `sampler=DistributedSampler(dataset)` instead of shuffle=True "
                f"and call `sampler.set_epoch(epoch)` every epoch.",
            )

    @staticmethod
    def _without_sampler(loader: Call) -> bool:
        if loader.has_star_args():
            return False  # `**loader_kwargs` may carry a sampler
        return loader.arg(3, "sampler") is None and loader.arg(4, "batch_sampler") is None

    def _shuffles(self, loader: Call) -> bool:
        shuffle = loader.arg(2, "shuffle")
        if shuffle is None:
            return False
        # Only a shuffle that is True for sure: `shuffle=(train_sampler is None)` is UNKNOWN.
        return self.model.const_value(shuffle, loader.order, loader.function) is True

    def _forgotten_sampler(self, loader: Call, loaders: list[Call]) -> Optional[Call]:
        """A DistributedSampler built in the loader's function over the same dataset expression,
        that no loader draws from and nothing else is handed: it was meant for this loader and left
        out. Without it a loader that does not shuffle may be an evaluation or a deliberate
        full-dataset pass, so it stays silent."""
        dataset = loader.arg(0, "dataset")
        if dataset is None:
            return None
        for sampler in self.model.calls_named(SAMPLER):
            if sampler.function is not loader.function or sampler.order > loader.order:
                continue
            over = sampler.arg(0, "dataset")
            if over is None or self.model.code_of(over) != self.model.code_of(dataset):
                continue
            if any(sampler in self.model.loader_samplers(other) for other in loaders):
                continue
            if self._handed_on(sampler):
                continue
            return sampler
        return None

    def _handed_on(self, sampler: Call) -> bool:
        """The sampler's value is passed to some call (a custom loader, a helper, a wrapper): it
        may be used there."""
        return any(
            sampler in self.model.origin_calls(arg.value, call.order, call.function)
            for call in self.model.calls
            if call is not sampler
            for arg in call.args
        )

    def _name_of(self, sampler: Call) -> str:
        return self.model.name_bound_to(sampler) or "sampler"

    def _is_eval_loader(self, loader: Call) -> bool:
        names = [a.target for a in self.model.assignments if a.value is loader.node]
        if loader.function is not None:
            names.append(loader.function.name)
        for name in names:
            last = name.rsplit(".", 1)[-1].lower()
            if any(part.startswith(EVAL_WORDS) for part in last.split("_")):
                return True
        return False

    def _already_sharded(self, loader: Call) -> bool:
        """The dataset is this rank's share already (a Subset by rank, a class that slices its rows
        by rank, a generator that yields this rank's slice): shuffling it shuffles only the shard."""
        dataset = loader.arg(0, "dataset")
        if dataset is None:
            return True  # cannot tell what is loaded: stay silent
        return sharding.split_by_rank(self.model, dataset, loader.order, loader.function)
