"""Every check the probe runs, declared once: its name, the framework it runs under, what it
needs, where its rank-side code and judge live, how its extra detail renders, what to do when it
fails, and the fault that proves it can fail.

Options (`--checks`, `--inject-fault`), the ranks' loop, the parent's merge and the report all read
this table; nothing else lists checks. Importing it does not import torch (the implementations are
named by module and loaded in the ranks).

A check's module provides

    run(ctx: Context) -> RankEntry                 on every rank
    judge(entries: list[RankEntry]) -> CheckRecord  optional; once all entries are in (rank 0)

and a check whose `faults` is empty has its judge pinned by unit tests instead.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ddpdoctor.probe.results import CheckRecord, RankEntry, blame_failures, record, SKIP
from ddpdoctor.probe.views import DetailTable, bandwidth_table, link_table

TORCH, HOROVOD = "torch", "horovod"
FRAMEWORKS = (TORCH, HOROVOD)

Judge = Callable[[list[RankEntry]], CheckRecord]


@dataclass(frozen=True)
class CheckSpec:
    name: str
    framework: str
    module: str  # under ddpdoctor.probe.checks
    proves: str  # one line: what a pass means
    advice: str  # what to do next when it fails
    faults: tuple[str, ...] = ()  # --inject-fault kinds planted in this check, which it must catch
    # False for checks that must run before the process group exists (so that a rank that never
    # gets that far is named by them instead of surfacing as its peers' timeouts).
    needs_process_group: bool = True
    # Modules the parent imports once before forking, so that N ranks do not each pay for them.
    preimport: tuple[str, ...] = ()
    render: Optional[Callable[[CheckRecord], Optional[DetailTable]]] = None
    # Run only when asked for (`--links`, or by name in --checks): it costs a round per rank.
    on_request: bool = False

    def implementation(self) -> "Implementation":
        module = importlib.import_module(f"ddpdoctor.probe.checks.{self.module}")
        judge = getattr(module, "judge", None) or plain_judge(self.name)
        return Implementation(run=module.run, judge=judge)


@dataclass(frozen=True)
class Implementation:
    run: Callable[[Any], RankEntry]
    judge: Judge


def plain_judge(name: str, describe: Optional[Callable[[list[RankEntry]], str]] = None) -> Judge:
    """The usual verdict: fail names the failing ranks; pass says what was verified."""

    def judge(entries: list[RankEntry]) -> CheckRecord:
        rec = record(name, entries)
        if blame_failures(rec):
            return rec
        if rec["status"] == SKIP:
            rec["summary"] = rec["ranks"][0]["message"] if rec["ranks"] else "skipped"
        else:
            rec["summary"] = describe(rec["ranks"]) if describe else (rec["ranks"][0]["message"] if rec["ranks"] else "")
        return rec

    return judge


_DDP = ("torch._dynamo", "torch.nn.parallel")
_LIVENESS_ADVICE = (
    "A rank that hangs or dies here will hang or kill real training. Read the named rank's traceback; "
    "for a hang, dump its stacks (py-spy dump --pid PID) and check that every node can reach "
    "MASTER_ADDR:MASTER_PORT and the other nodes (firewalls, NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME)."
)
_ALLREDUCE_ADVICE = (
    "Wrong collective results on the named rank point at its hardware or transport: run nccl-tests "
    "(all_reduce_perf -c 1) on that node, check `nvidia-smi -q` for ECC/Xid errors, try "
    "NCCL_P2P_DISABLE=1 / NCCL_IB_DISABLE=1 to isolate the link, and drain the node if it persists."
)

CHECKS: tuple[CheckSpec, ...] = (
    # -- torch.distributed (DDP), launched through torch's elastic launcher.
    CheckSpec(
        "world", TORCH, "world",
        "every rank reports the same torch/CUDA/NCCL/Python versions and its own GPU",
        "Install the same torch/CUDA/NCCL build on every node (same container image), and give each local "
        "rank its own GPU: torch.cuda.set_device(LOCAL_RANK) before creating tensors or the process group.",
        needs_process_group=False,
    ),
    CheckSpec(
        "liveness", TORCH, "liveness",
        "every rank reaches a store heartbeat and a backend barrier within the timeout",
        _LIVENESS_ADVICE, faults=("hang", "crash"),
    ),
    CheckSpec(
        "allreduce", TORCH, "allreduce",
        "all-reduce SUM/AVG, broadcast and all-gather give exactly known results, within the dtype's rounding bound",
        _ALLREDUCE_ADVICE, faults=("allreduce-corrupt",),
    ),
    CheckSpec(
        "param-sync", TORCH, "param_sync",
        "every parameter and buffer hashes the same on all ranks after DDP construction and one step",
        "Parameters drift apart between ranks: do not modify parameters or load checkpoints on one rank "
        "after wrapping in DDP (load before wrapping, or on all ranks), keep per-rank code paths identical, "
        "and see lint rules about rank-conditional code. Re-run with TORCH_DISTRIBUTED_DEBUG=DETAIL.",
        faults=("param-desync",), preimport=_DDP,
    ),
    CheckSpec(
        "ddp-parity", TORCH, "ddp_parity",
        "one DDP step over N shards equals one single-process step over the whole batch",
        "A DDP step does not match the single-process step: check that each rank gets a distinct equal "
        "shard (DistributedSampler), that the loss is a mean, that no parameter is updated outside DDP, and "
        "that gradients are not scaled twice (e.g. manual division by world size on top of DDP's average).",
        preimport=_DDP,
    ),
    CheckSpec(
        "syncbn", TORCH, "syncbn",
        "SyncBatchNorm (or, on CPU, its statistic exchange) equals BatchNorm over the global batch",
        "SyncBatchNorm statistics disagree with the global batch: convert with "
        "nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP, run it on CUDA, and check "
        "that all ranks call forward the same number of times (a rank skipping a batch desyncs the stats).",
    ),
    CheckSpec(
        "sampler", TORCH, "sampler",
        "DistributedSampler shards are disjoint, cover the data and change with set_epoch",
        "DistributedSampler shards overlap or miss samples: pass num_replicas=world_size and rank=global "
        "rank (not local rank), use the same seed and dataset length on every rank, and call "
        "sampler.set_epoch(epoch) at the start of every epoch (lint rule DDP001 missing-set-epoch).",
    ),
    CheckSpec(
        "bandwidth", TORCH, "bandwidth",
        "an all-reduce sweep (nccl-tests busbw) and a straggler check on local compute",
        "", render=bandwidth_table,
    ),
    CheckSpec(
        "links", TORCH, "link_map",
        "point-to-point bandwidth and latency of every rank pair, both ways (the link map), none far "
        "slower than the typical link",
        "A slow pair points at its link (a cable, a switch port, NVLink fallen back to PCIe: nvidia-smi topo -m, "
        "nvidia-smi nvlink -s, ibstat); a rank slow with every peer at its own GPU or NIC (nvidia-smi -q -d "
        "PERFORMANCE,CLOCK for throttling, the NIC's link speed) or its host's load.",
        faults=("slow-link", "slow-rank"), render=link_table, on_request=True,
    ),
    # -- Horovod, launched through horovod.runner.run (gloo controller) or an external horovodrun.
    CheckSpec(
        "world", HOROVOD, "horovod_world",
        "every rank reports the same Horovod/torch/Python versions and a consistent rank layout",
        "Install the same Horovod build (scripts/install-horovod) and torch on every node, and start "
        "one process per slot (horovodrun -np N -H host1:n1,host2:n2).",
        needs_process_group=False,
    ),
    CheckSpec(
        "liveness", HOROVOD, "horovod_liveness",
        "every rank reaches a store heartbeat within the timeout (Horovod's collectives have none)",
        _LIVENESS_ADVICE, faults=("hang", "crash"),
    ),
    CheckSpec(
        "allreduce", HOROVOD, "horovod_allreduce",
        "hvd.allreduce (Sum and Average, every dtype Horovod takes on CPU, odd sizes), broadcast and "
        "allgather give exactly known results, within the dtype's rounding bound",
        _ALLREDUCE_ADVICE, faults=("allreduce-corrupt",),
    ),
    CheckSpec(
        "broadcast-parameters", HOROVOD, "horovod_broadcast",
        "hvd.broadcast_parameters leaves every rank with rank 0's weights, bit for bit",
        "Parameters differ after hvd.broadcast_parameters: call it on every rank, after the model is built "
        "and before the first step (lint rule HVD002), and do not load checkpoints on one rank afterwards.",
        faults=("param-desync",),
    ),
    CheckSpec(
        "optimizer-step", HOROVOD, "horovod_optimizer",
        "one hvd.DistributedOptimizer step over N shards, learning rate scaled by hvd.size(), equals one "
        "single-process step over the whole batch",
        "The DistributedOptimizer step does not match the single-process step: wrap the optimizer with "
        "hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters()), scale the learning rate by "
        "hvd.size() (lint rule HVD001), and give each rank a distinct equal shard.",
    ),
    CheckSpec(
        "optimizer-state", HOROVOD, "horovod_optimizer_state",
        "hvd.broadcast_optimizer_state leaves every rank with rank 0's optimizer state",
        "Optimizer state differs after hvd.broadcast_optimizer_state: call it on every rank after the "
        "optimizer exists (lint rule HVD002) and after loading any checkpoint.",
    ),
    CheckSpec(
        "lr-scaling", HOROVOD, "horovod_lr_scaling",
        "every rank agrees on hvd.size(), so the learning rate scaled by it is the same everywhere",
        "Ranks disagree on hvd.size() or on the layout: start every rank with the same horovodrun "
        "command and host list, and scale the learning rate by hvd.size() (lint rule HVD001).",
    ),
)


def checks_for(framework: str) -> tuple[CheckSpec, ...]:
    """The framework's checks in the order they run. Liveness comes early so that a dead or hung
    rank is named before the heavier checks spend their timeouts waiting for it."""
    return tuple(spec for spec in CHECKS if spec.framework == framework)


def names_for(framework: str) -> tuple[str, ...]:
    return tuple(spec.name for spec in checks_for(framework))


def default_names_for(framework: str) -> tuple[str, ...]:
    """The checks a run without --checks runs: all but those run only on request."""
    return tuple(spec.name for spec in checks_for(framework) if not spec.on_request)


def spec(framework: str, name: str) -> CheckSpec:
    for candidate in CHECKS:
        if candidate.framework == framework and candidate.name == name:
            return candidate
    raise KeyError(f"no check {name!r} for {framework}")


def detector(framework: str, fault_kind: str) -> CheckSpec:
    """The check a fault kind is planted in, which must therefore catch it."""
    for candidate in checks_for(framework):
        if fault_kind in candidate.faults:
            return candidate
    raise KeyError(f"no {framework} check catches {fault_kind!r}")


def advice_for(framework: str, name: str) -> str:
    try:
        return spec(framework, name).advice
    except KeyError:
        return ""
