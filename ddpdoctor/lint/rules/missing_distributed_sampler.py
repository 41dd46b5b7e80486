"""DDP006 missing-distributed-sampler: a shuffling training DataLoader without a sampler in a distributed script."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from ddpdoctor.lint.analysis import Call, Runs, dotted_name, launch, names_in, who_runs
from ddpdoctor.lint.rules.base import Rule

DATA_LOADER = "torch.utils.data.DataLoader"
# Loaders for evaluation: iterating the whole set on each rank wastes time but trains nothing wrong.
EVAL_WORDS = ("val", "test", "eval", "dev")
# Words in a dataset's construction that mean it is already split per rank (`shard(rank)`,
# `Subset(ds, indices[rank::world_size])`, webdataset's `split_by_node`).
SHARD_WORDS = ("rank", "world_size", "num_replicas", "shard", "split_by_node", "num_shards")


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
        for loader in self.model.calls_named(DATA_LOADER):
            if not self._shuffles_without_sampler(loader):
                continue
            if who_runs(self.model, loader).runs not in (Runs.ALL, Runs.UNKNOWN):
                continue
            if self._is_eval_loader(loader) or self._already_sharded(loader):
                continue
            what = launch.describe(start)
            self.report(
                loader.node,
                f"This DataLoader shuffles the whole dataset on every rank (shuffle=True, no sampler) in a "
                f"distributed script ({what} at line {self.line(start.node)}): the ranks do not split the data, "
                f"each trains on all of it. Pass `sampler=DistributedSampler(dataset)` instead of shuffle=True "
                f"and call `sampler.set_epoch(epoch)` every epoch.",
            )

    def _shuffles_without_sampler(self, loader: Call) -> bool:
        if loader.has_star_args():
            return False  # `**loader_kwargs` may carry a sampler
        if loader.arg(3, "sampler") is not None or loader.arg(4, "batch_sampler") is not None:
            return False
        shuffle = loader.arg(2, "shuffle")
        if shuffle is None:
            return False
        # Only a shuffle that is True for sure: `shuffle=(train_sampler is None)` is UNKNOWN.
        return self.model.const_value(shuffle, loader.order, loader.function) is True

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
        dataset = loader.arg(0, "dataset")
        if dataset is None:
            return True  # cannot tell what is loaded: stay silent
        exprs: list[cst.BaseExpression] = [dataset]
        exprs.extend(c.node for c in self.model.origin_calls(dataset, loader.order, loader.function))
        for expr in exprs:
            for name in names_in(expr):
                last = name.rsplit(".", 1)[-1].lower()
                if any(word in last for word in SHARD_WORDS):
                    return True
            if isinstance(expr, cst.Call) and self._mentions_shard(dotted_name(expr.func)):
                return True
        return False

    @staticmethod
    def _mentions_shard(name: Optional[str]) -> bool:
        return name is not None and any(word in name.lower() for word in ("shard", "split_by_node"))
