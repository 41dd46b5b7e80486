"""`ddpdoctor probe` end to end in the parent: options -> selection -> launch -> merged report."""

from __future__ import annotations

import shutil
import time
from typing import Any, Callable, Optional

from ddpdoctor.probe import results as R
from ddpdoctor.probe.config import RankConfig
from ddpdoctor.probe.options import OptionError, ProbeOptions, cpu_count
from ddpdoctor.probe.procs import GRACE_S
from ddpdoctor.probe.registry import HOROVOD, advice_for

HOROVOD_MISSING = (
    "--framework horovod needs Horovod built against this torch: run scripts/install-horovod "
    "(builds Horovod 0.28.1 with gloo; see the README)"
)


class CouldNotRun(Exception):
    """The probe could not run at all (exit status 2)."""


class Interrupted(Exception):
    """The user interrupted the run (SIGINT) or it was told to stop (SIGTERM): no verdict on any
    rank. `signal_name` says which."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def horovod_problem() -> Optional[str]:
    """Why Horovod cannot be used here, or None."""
    try:
        import horovod.torch  # noqa: F401
    except ModuleNotFoundError as exc:
        return f"Horovod is not installed (no module {exc.name or 'horovod'}). {HOROVOD_MISSING}"
    except Exception as exc:  # noqa: BLE001 -- built against another torch, a broken extension
        return f"Horovod is installed but `import horovod.torch` fails ({type(exc).__name__}: {str(exc)[:200]}). {HOROVOD_MISSING}"
    return None


def scaled_timeouts(options: ProbeOptions) -> tuple[float, float, float]:
    """(check timeout, join timeout, hang grace), stretched by the ranks per core when the ranks
    outnumber the cores: they then share time slices, and a healthy rank is slow, not hung."""
    factor = options.oversubscription()
    return options.timeout * factor, options.join_timeout * factor, GRACE_S * factor


def run_probe(options: ProbeOptions, progress: Optional[Callable[[str], None]] = None,
              warn: Optional[Callable[[str], None]] = None, verbose: bool = False) -> dict[str, Any]:
    """Returns the report dict (the JSON contract). Raises OptionError / CouldNotRun / Interrupted."""
    if options.nnodes > 1 and options.node_rank > 0:
        # First of all, before torch is imported: a follower whose rendezvous never answers is told
        # so within its join timeout.
        from ddpdoctor.probe.rendezvous import Unreachable, wait_for_endpoint

        try:
            wait_for_endpoint(str(options.rdzv_endpoint), options.join_timeout, note=warn if verbose else None)
        except Unreachable as exc:
            raise CouldNotRun(str(exc)) from None
    import torch
    import torch.distributed as dist

    from ddpdoctor.probe.devices import Selection, select
    from ddpdoctor.probe.envinfo import env_doctor, probe_environment
    from ddpdoctor.probe.merge import merge

    started = time.monotonic()
    if not dist.is_available():
        raise CouldNotRun("this torch build has no torch.distributed support")
    if options.framework == HOROVOD:
        problem = horovod_problem()
        if problem:
            raise CouldNotRun(problem)
        nproc = options.nproc or 2
        selection = Selection(backend="horovod-gloo", device="cpu", nproc=nproc, gpus=0,
                              reason="Horovod's runner with the gloo controller on CPU")
    else:
        selection = select(
            options.backend, options.device, options.nproc,
            torch_has_cuda=torch.version.cuda is not None, nccl_available=dist.is_nccl_available(),
        )
    if options.nproc is None:
        options.nproc = selection.nproc
    options.validate()  # rank-dependent checks (fault ranks) need the world size
    world_size = selection.nproc * options.nnodes
    timeout, join_timeout, grace_s = scaled_timeouts(options)
    cores = cpu_count()
    if options.oversubscription() > 1 and warn is not None:
        warn(f"{selection.nproc} ranks on {cores} CPU core(s): timeouts scaled x{options.oversubscription():.3g} "
             f"(--timeout {options.timeout:g}s -> {timeout:.3g}s); ranks that share cores are slow, not hung")
    environment = probe_environment()
    environment.update(framework=options.framework, backend=selection.backend, device=selection.device,
                       selection=selection.reason, nproc_per_node=selection.nproc, nnodes=options.nnodes,
                       node_rank=options.node_rank, world_size=world_size, cpu_cores=cores,
                       timeout_s=round(timeout, 3))
    doctor = env_doctor(selection.nproc, "gloo" if options.framework == HOROVOD else selection.backend)
    if doctor["summary"] is not None:
        environment["env"] = doctor["summary"]
    if doctor.get("lines"):
        environment["summary_lines"] = doctor["lines"]
    if doctor["error"]:
        environment["env_unavailable"] = doctor["error"]
    if progress is not None:
        progress(f"starting {world_size} rank(s): {selection.reason}")
    from ddpdoctor.probe.launch import run_id_for

    config = RankConfig(
        framework=options.framework, backend=selection.backend, device=selection.device, timeout=timeout,
        join_timeout=join_timeout, faults=options.faults, checks=options.checks,
        run_id=run_id_for(options.run_id, options.nnodes, options.rdzv_endpoint), report=False,
        output_format=options.output_format, link_bytes=options.link_bytes,
    )
    if options.framework == HOROVOD:
        from ddpdoctor.probe.hvd_launch import launch_horovod

        outcome = launch_horovod(config, selection.nproc, grace_s)
    else:
        from ddpdoctor.probe.launch import launch
        from ddpdoctor.probe.rendezvous import bind_address

        if options.nnodes > 1:
            endpoint, local_addr = str(options.rdzv_endpoint), None
        else:
            # Port 0: the agent picks a free one.
            endpoint, local_addr = f"{options.master_addr}:{options.master_port}", options.master_addr
        outcome = launch(config, selection.nproc, options.nnodes, options.node_rank, endpoint, local_addr, grace_s,
                         bind_addr=bind_address(options.master_addr, options.nnodes, options.rdzv_endpoint),
                         verbose=verbose)
    if outcome.interrupted:
        shutil.rmtree(outcome.out_dir, ignore_errors=True)
        raise Interrupted(outcome.stop_signal)
    if outcome.launch_error and not outcome.rank_files:
        raise CouldNotRun(f"launch failed: {outcome.launch_error}")
    checks = merge(outcome, options.checks, world_size, lambda name: advice_for(options.framework, name))
    hosts = sorted({str(f["host"]) for f in outcome.rank_files.values() if f.get("host")})
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
    return {
        "tool": "ddpdoctor probe",
        "exit_code": code,
        "verdict": R.verdict(checks, world_size),
        "framework": options.framework,
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


__all__ = ["run_probe", "CouldNotRun", "Interrupted", "OptionError", "horovod_problem"]
