"""The `ddpdoctor probe` click command. Importing this module must not import torch: the linter is
installed without it, and `ddpdoctor --help` must stay fast."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import click

from ddpdoctor.probe.faults import FAULT_KINDS
from ddpdoctor.probe.options import OptionError, ProbeOptions, parse_checks, parse_faults_option, resolve_local_address
from ddpdoctor.probe.registry import FRAMEWORKS, TORCH, names_for
from ddpdoctor.probe.results import EXIT_COULD_NOT_RUN, EXIT_INTERRUPTED


def _fail(message: str) -> None:
    click.echo(f"ddpdoctor probe: error: {message}", err=True)
    sys.exit(EXIT_COULD_NOT_RUN)


@click.command("probe")
@click.option("--nproc", type=int, default=None, help="Ranks on this node (default: one per GPU, or 2 on CPU).")
@click.option("--nnodes", type=int, default=1, show_default=True, help="Number of nodes (each runs `ddpdoctor probe`).")
@click.option("--node-rank", type=int, default=0, show_default=True, help="This node's rank (0 hosts the rendezvous).")
@click.option("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="c10d rendezvous endpoint, the same on every node (multi-node).")
@click.option("--master-addr", default="127.0.0.1", show_default=True, help="Address the single-node rendezvous binds to.")
@click.option("--master-port", type=int, default=0, show_default=True, help="Port for the single-node rendezvous (0: a free one).")
@click.option("--framework", type=click.Choice(list(FRAMEWORKS)), default=TORCH, show_default=True,
              help="torch: DDP ranks through torch's elastic launcher; horovod: Horovod ranks through its runner (gloo).")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True)
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Seconds each check (and each collective) may take.")
@click.option("--join-timeout", type=float, default=60.0, show_default=True, help="Seconds to wait for all nodes to join.")
@click.option("--checks", "checks_text", default=None, metavar="LIST", help=f"Comma-separated subset of: {', '.join(names_for(TORCH))} (Horovod: {', '.join(names_for('horovod'))}).")
@click.option("--inject-fault", "faults_text", multiple=True, metavar="KIND:RANK",
              help=f"Make RANK misbehave on purpose to prove the detectors work; KIND: {', '.join(FAULT_KINDS)}.")
@click.option("--run-id", default=None, help="Rendezvous run id (multi-node default: derived from the endpoint).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def probe(
    nproc: Optional[int], nnodes: int, node_rank: int, rdzv_endpoint: Optional[str], master_addr: str,
    master_port: int, framework: str, backend: str, device: str, timeout: float, join_timeout: float, checks_text: Optional[str],
    faults_text: tuple[str, ...], run_id: Optional[str], output_format: str,
) -> None:
    """Launch real ranks and prove they agree with a single-process reference.

    Runs small real collectives, DDP steps, SyncBatchNorm and sampler checks on every rank and names
    the rank that disagrees, hangs or dies. Exit status: 0 all passed, 1 a check failed, 2 could not
    run, 130 interrupted (Ctrl-C).
    """
    try:
        options = ProbeOptions(
            nproc=nproc, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, master_addr=master_addr,
            master_port=master_port, framework=framework, backend=backend, device=device, timeout=timeout,
            join_timeout=join_timeout, faults=parse_faults_option(faults_text),
            checks=parse_checks(checks_text, framework), output_format=output_format, run_id=run_id,
        )
        options.validate()
        if options.nnodes == 1:
            resolve_local_address(options.master_addr)
    except OptionError as exc:
        _fail(str(exc))
        return
    try:
        import torch  # noqa: F401 -- only to give a clear message when the extra is missing
    except ImportError:
        _fail("the probe needs torch: pip install 'ddpdoctor[probe]'")
        return
    from ddpdoctor.probe.report import render_text, to_json
    from ddpdoctor.probe.runner import CouldNotRun, Interrupted, run_probe

    spinner = _Progress() if output_format == "text" else _Progress(enabled=False)
    try:
        with spinner:
            report = run_probe(options, progress=spinner.update, warn=_warn)
    except (OptionError, CouldNotRun) as exc:
        _fail(str(exc))
        return
    except (Interrupted, KeyboardInterrupt):
        click.echo("ddpdoctor probe: interrupted", err=True)
        _exit(EXIT_INTERRUPTED)
        return
    if output_format == "json":
        click.echo(to_json(report))
    else:
        render_text(report)
    _exit(report["exit_code"])


def _warn(message: str) -> None:
    click.echo(f"ddpdoctor probe: warning: {message}", err=True)


def _exit(code: int) -> None:
    """Exit without the interpreter's teardown when we own the process.

    With torch._dynamo (and sympy) loaded -- DDP imports them -- module teardown alone takes ~0.7 s,
    a third of the probe's own run time. By now the report is written, every rank has been reaped and
    the temp dir handled, so there is nothing left to clean up. Under an in-process runner (tests,
    click's CliRunner swap sys.stdout) exit normally so the caller keeps control.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__:
        os._exit(code)
    sys.exit(code)


class _Progress:
    """A spinner on stderr while ranks start and run -- only on a TTY, never in pipes or CI logs."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._status: Optional[Any] = None

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status("ddpdoctor probe: starting ranks...")
            self._status.__enter__()
        return self

    def update(self, text: str) -> None:
        if self._status is not None:
            self._status.update(f"ddpdoctor probe: {text}")

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)
