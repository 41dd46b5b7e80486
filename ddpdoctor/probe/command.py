"""The `ddpdoctor probe` click command. Importing this module must not import torch: the linter is
installed without it, and `ddpdoctor --help` must stay fast."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Optional

import click

from ddpdoctor.probe.faults import FAULT_KINDS
from ddpdoctor.probe.options import (OptionError, ProbeOptions, parse_checks, parse_faults_option, parse_size,
                                     resolve_local_address)
from ddpdoctor.probe.plot import plot_problem
from ddpdoctor.probe.registry import FRAMEWORKS, TORCH, names_for
from ddpdoctor.probe.results import EXIT_COULD_NOT_RUN, EXIT_INTERRUPTED, EXIT_TERMINATED


def _fail(message: str) -> None:
    click.echo(f"ddpdoctor probe: error: {message}", err=True)
    sys.exit(EXIT_COULD_NOT_RUN)


@click.command("probe")
@click.option("--nproc", "--nproc-per-node", "--nproc_per_node", "nproc", type=int, default=None,
              help="Ranks on this node (default: one per GPU, or 2 on CPU); at most 8 per CPU core without --force.")
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
              help=f"Make RANK misbehave on purpose to prove the detectors work; KIND: {', '.join(FAULT_KINDS)} "
                   "(slow-link:A,B names two ranks).")
@click.option("--run-id", default=None, help="Rendezvous run id (multi-node default: derived from the endpoint).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--output-file", "-o", type=click.Path(dir_okay=False), default=None, help="Write the report to a file.")
@click.option("--links", is_flag=True, help="Also map every rank pair's bandwidth and latency, both ways, and name slow links and ranks.")
@click.option("--link-size", default=None, metavar="SIZE", help="The link map's message size, e.g. 64K, 1M (default: 1M on CPU, 64M on GPUs).")
@click.option("--plot", default=None, metavar="FILE", help="Draw the link map to FILE.png or FILE.svg (needs the 'plot' extra: matplotlib).")
@click.option("--force", is_flag=True, help="Start more than 8 ranks per CPU core.")
@click.option("--verbose", "-v", is_flag=True, help="Let torch's own launcher log (and the rendezvous's retries) through.")
def probe(
    nproc: Optional[int], nnodes: int, node_rank: int, rdzv_endpoint: Optional[str], master_addr: str,
    master_port: int, framework: str, backend: str, device: str, timeout: float, join_timeout: float, checks_text: Optional[str],
    faults_text: tuple[str, ...], run_id: Optional[str], output_format: str, output_file: Optional[str], links: bool,
    link_size: Optional[str], plot: Optional[str], force: bool, verbose: bool,
) -> None:
    """Launch real ranks and prove they agree with a single-process reference.

    Runs small real collectives, DDP steps, SyncBatchNorm and sampler checks on every rank and names
    the rank that disagrees, hangs or dies. Exit status: 0 all passed, 1 a check failed, 2 could not
    run, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
    """
    try:
        options = ProbeOptions(
            nproc=nproc, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, master_addr=master_addr,
            master_port=master_port, framework=framework, backend=backend, device=device, timeout=timeout,
            join_timeout=join_timeout, faults=parse_faults_option(faults_text),
            checks=parse_checks(checks_text, framework, extra=("links",) if links else ()), output_format=output_format,
            run_id=run_id, force=force, link_bytes=parse_size("--link-size", link_size) if link_size else 0,
        )
        options.validate()
        if options.nnodes == 1:
            resolve_local_address(options.master_addr)
        if output_file:
            writable_path("--output-file", output_file)
        if plot:
            if "links" not in options.checks:
                raise OptionError("--plot draws the link map: add --links")
            problem = plot_problem(plot)
            if problem:
                raise OptionError(problem)
            writable_path("--plot", plot)
    except OptionError as exc:
        _fail(str(exc))
        return
    if importlib.util.find_spec("torch") is None:  # found, not imported: run_probe imports it when needed
        _fail("the probe needs torch: pip install 'ddpdoctor[probe]'")
        return
    from ddpdoctor.probe.report import plain_text, render_text, to_json
    from ddpdoctor.probe.runner import CouldNotRun, Interrupted, run_probe

    spinner = _Progress() if output_format == "text" and not output_file else _Progress(enabled=False)
    # Signal handlers belong to the main thread; elsewhere (an embedding caller) SIGTERM keeps its own.
    main = threading.current_thread() is threading.main_thread()
    _terminated.clear()
    saved_sigterm = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
    try:
        with spinner:
            report = run_probe(options, progress=spinner.update, warn=_warn, verbose=verbose)
        if _terminated.is_set():
            # The exception the handler raised was swallowed where it landed (a broad `except
            # Exception` in an import torch runs, say): the run went on, but it was told to stop.
            raise Interrupted("SIGTERM")
    except (OptionError, CouldNotRun) as exc:
        _fail(str(exc))
        return
    except Interrupted as exc:
        _stopped(exc.signal_name)
        return
    except KeyboardInterrupt:
        _stopped("SIGINT")
        return
    finally:
        if main:
            signal.signal(signal.SIGTERM, saved_sigterm)
    if output_file:
        try:
            Path(output_file).write_text(to_json(report) + "\n" if output_format == "json" else plain_text(report),
                                         encoding="utf-8")
        except OSError as exc:
            _fail(f"cannot write the report to {output_file}: {exc.strerror or exc}")
            return
    elif output_format == "json":
        click.echo(to_json(report))
    else:
        render_text(report)
    if plot:
        _draw(report, plot)
    _exit(report["exit_code"])


def _draw(report: dict[str, Any], path: str) -> None:
    from ddpdoctor.probe.plot import draw_link_map

    record = next((c for c in report["checks"] if c["name"] == "links"), None)
    detail = (record or {}).get("detail") or {}
    if not detail.get("bandwidth_GBps"):
        _warn(f"no link map to draw in {path}: the link map did not run to the end")
        return
    title = f"ddpdoctor link map: {report['world_size']} ranks, {report['backend']} on {report['device']}"
    try:
        draw_link_map(detail, path, title)
    except OSError as exc:
        _warn(f"cannot write {path}: {exc.strerror or exc}")


def writable_path(option: str, path: str) -> None:
    """Say now, before any rank starts, when a file could not be written at the end."""
    target = Path(path)
    if target.is_dir():
        raise OptionError(f"{option} {path}: is a directory")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise OptionError(f"{option} {path}: no directory {parent}")
    if not os.access(target if target.exists() else parent, os.W_OK):
        raise OptionError(f"{option} {path}: not writable")


_terminated = threading.Event()


def _on_sigterm(signum: int, frame: Optional[FrameType]) -> None:
    """SIGTERM outside the launch (which has its own handler): stop as the launch would. Also
    remembered, because the exception lands wherever the main thread is, and code there (torch's
    own imports) may catch and drop it."""
    from ddpdoctor.probe.runner import Interrupted

    _terminated.set()
    raise Interrupted("SIGTERM")


def _stopped(signal_name: str) -> None:
    """Interrupted (SIGINT, 130) or terminated (SIGTERM, 143): no verdict, only which."""
    terminated = signal_name == "SIGTERM"
    click.echo(f"ddpdoctor probe: {'terminated' if terminated else 'interrupted'}", err=True)
    _exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


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
