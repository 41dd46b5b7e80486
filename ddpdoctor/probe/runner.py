"""`ddpdoctor probe` end to end in the parent: options -> selection -> launch -> merged report."""

from __future__ import annotations

import shutil
import time
from typing import Any, Optional

from ddpdoctor.probe import results as R
from ddpdoctor.probe.options import OptionError, ProbeOptions


class CouldNotRun(Exception):
    """The probe could not run at all (exit status 2)."""


def _advice_for(name: str) -> str:
    from ddpdoctor.probe import checks

    return getattr(checks.load(name), "ADVICE", "")


def run_probe(options: ProbeOptions, progress: Optional[Any] = None) -> dict[str, Any]:
    """Returns the report dict (the JSON contract). Raises OptionError / CouldNotRun."""
    import torch
    import torch.distributed as dist

    from ddpdoctor.probe.devices import select
    from ddpdoctor.probe.envinfo import env_doctor, probe_environment
    from ddpdoctor.probe.launch import launch
    from ddpdoctor.probe.merge import merge

    started = time.monotonic()
    if not dist.is_available():
        raise CouldNotRun("this torch build has no torch.distributed support")
    selection = select(
        options.backend, options.device, options.nproc,
        torch_has_cuda=torch.version.cuda is not None, nccl_available=dist.is_nccl_available(),
    )
    if options.nproc is None:
        options.nproc = selection.nproc
    options.validate()  # rank-dependent checks (fault ranks) need the world size
    world_size = selection.nproc * options.nnodes
    environment = probe_environment()
    environment.update(backend=selection.backend, device=selection.device, selection=selection.reason,
                       nproc_per_node=selection.nproc, nnodes=options.nnodes, node_rank=options.node_rank,
                       world_size=world_size)
    doctor = env_doctor(selection.nproc, selection.backend)
    if doctor["summary"] is not None:
        environment["env"] = doctor["summary"]
    if doctor.get("lines"):
        environment["summary_lines"] = doctor["lines"]
    if doctor["error"]:
        environment["env_unavailable"] = doctor["error"]
    if progress is not None:
        progress(f"starting {world_size} rank(s): {selection.reason}")
    outcome = launch(options, selection.backend, selection.device, selection.nproc)
    if outcome.launch_error and not outcome.rank_files:
        raise CouldNotRun(f"launch failed: {outcome.launch_error}")
    checks = merge(outcome, options.checks, world_size, _advice_for)
    hosts = sorted({f.get("host") for f in outcome.rank_files.values() if f.get("host")})
    if hosts:
        environment["hosts"] = hosts
    failures = [
        {"rank": rank, **{k: v for k, v in info.items() if k != "traceback"}, "traceback": info.get("traceback", "")}
        for rank, info in sorted(outcome.failures.items())
    ]
    code = R.exit_code(checks)
    if outcome.launch_error and code == R.EXIT_OK:
        code = R.EXIT_FAILED
    logs: Optional[str] = outcome.out_dir + "/logs"
    if code == R.EXIT_OK:
        # Nothing to look at after a clean run; keep the ranks' logs only when something failed.
        shutil.rmtree(outcome.out_dir, ignore_errors=True)
        logs = None
    report = {
        "tool": "ddpdoctor probe",
        "exit_code": code,
        "verdict": _verdict(checks, world_size),
        "backend": selection.backend,
        "device": selection.device,
        "world_size": world_size,
        "faults_injected": [str(f) for f in options.faults],
        "elapsed_s": round(time.monotonic() - started, 3),
        "launch_s": round(outcome.elapsed_s, 3),
        "environment": environment,
        "environment_findings": doctor["findings"],
        "checks": checks,
        "failures": failures,
        "launch_error": outcome.launch_error,
        "logs": logs,
    }
    return report


def _verdict(checks: list[dict[str, Any]], world_size: int) -> str:
    bad = [c for c in checks if c["status"] in (R.FAIL, R.ERROR)]
    if not bad:
        ran = sum(1 for c in checks if c["status"] == R.PASS)
        skipped = len(checks) - ran
        return f"all {ran} checks passed on {world_size} ranks" + (f" ({skipped} skipped)" if skipped else "")
    ranks = sorted({e["rank"] for c in bad for e in c["ranks"] if e["status"] in (R.FAIL, R.ERROR)})
    return f"{len(bad)} check(s) failed ({', '.join(c['name'] for c in bad)}) on {R.format_ranks(ranks)}"


__all__ = ["run_probe", "CouldNotRun", "OptionError"]
