"""DDP016 local-rank-as-global-rank: the local rank given where the global rank is meant."""

from __future__ import annotations

from ddpdoctor.lint.analysis import launch, launchfiles, rank_arguments
from ddpdoctor.lint.rules.base import Rule


class LocalRankAsGlobalRank(Rule):
    """
    Valid:
        dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        sampler = DistributedSampler(dataset, rank=dist.get_rank())
    Invalid:
        dist.init_process_group("nccl", rank=int(os.environ["LOCAL_RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    Invalid:
        hvd.init()
        sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.local_rank())
    """

    code = "DDP016"
    checks_test_suites = False
    trigger_words = ("rank",)
    context_words = launch.LAUNCH_WORDS

    def check(self) -> None:
        model = self.model
        for argument in rank_arguments.local_rank_arguments(model):
            call = argument.call
            if launch.dead_in_script(model, call.function):
                continue
            if rank_arguments.single_node_by_construction(model, argument):
                continue
            shown = model.code_of(argument.rank)
            if len(shown) > 40:
                shown = shown[:37] + "..."
            where = "init_process_group" if call.name == launch.INIT_PROCESS_GROUP else "DistributedSampler"
            what = "the local rank" if argument.kind == "local" else "the mp.spawn process index (a local rank)"
            evidence = launch.multinode_evidence(model)
            nodes, launched = launch.launch_file_nodes(model)
            if evidence is not None:
                span = f"this script runs on several nodes (line {self.line(evidence)})"
            elif nodes == launchfiles.MULTI_NODE and launched is not None:
                span = f"its launch at {launched.where()} spans several nodes"
            else:
                span = "nothing keeps this job on one node"
            consequence = (
                "the processes of the second node claim the ranks the first node's already hold, and the "
                "rendezvous waits for ranks that never join (or fails on duplicates)"
                if where == "init_process_group"
                else "the processes of every node draw the same shards, and the other nodes' shares are never "
                "trained on"
            )
            self.report(
                argument.rank,
                f"{where}(rank=`{shown}`) passes {what} where the global rank is meant, and {span}: "
                f"{consequence}. Pass the global rank: int(os.environ[\"RANK\"]), dist.get_rank(), hvd.rank(), "
                f"or node_rank * gpus_per_node + local_rank.",
            )
