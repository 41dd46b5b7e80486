"""`ddpdoctor guard [OPTIONS] -- COMMAND [ARGS]...`: the doctor inside the user's own job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import click

from ddpdoctor.guard.options import GuardOptions
from ddpdoctor.guard.report import Printer, report_dict
from ddpdoctor.usage import Bounded, OneLineErrors, check_writable, usage_error


# Bounds: past them a value is a typo (a week's stall timeout is already no timeout at all).
MAX_STALL_S = 7 * 24 * 3600.0
MAX_EVERY = 10 ** 9
MAX_WINDOW = 100_000


@click.command(cls=OneLineErrors,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("--stall-timeout", type=Bounded(0.5, MAX_STALL_S), default=60.0, show_default=True,
              help="Seconds some ranks may wait in a collective for the others before GRD002.")
@click.option("--every", type=Bounded(1, MAX_EVERY, integer=True), default=100, show_default=True,
              help="Compare parameter and buffer hashes every N optimizer steps (GRD003).")
@click.option("--straggler-window", type=Bounded(3, MAX_WINDOW, integer=True), default=20, show_default=True,
              help="Optimizer steps over which step times are compared (GRD006).")
@click.option("--on-stall", type=click.Choice(["stop", "report"]), default="stop", show_default=True,
              help="Stop the job after a stall is diagnosed, or only report it.")
@click.option("--store", metavar="HOST:PORT",
              help="Where the side channel listens (default: loopback, or next to a multi-node rendezvous port).")
@click.option("--report", "report_file", type=click.Path(dir_okay=False),
              help="Write the JSON report to this file.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write a self-contained HTML page of the run (step time per rank, the collectives around a "
                   "finding, the findings) to this file.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: print the report on stdout (the command's own stdout goes to stderr).")
@click.option("--fail-on", type=click.Choice(["error", "warning", "info", "never"]), default="warning",
              show_default=True,
              help="The least severe finding that turns a successful job's exit status into 1 (never: only the "
                   "job's own failure or a stop by the guard does).")
@click.option("--analyze", "analyze_dumps", metavar="DIR",
              help="Run nothing: judge the Flight Recorder dumps torch wrote in DIR (or DIR/PREFIX, as given to "
                   "TORCH_FR_DUMP_TEMP_FILE).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def guard(stall_timeout: float, every: int, straggler_window: int, on_stall: str, store: Optional[str],
          report_file: Optional[str], html_file: Optional[str], output_format: str, fail_on: str,
          analyze_dumps: Optional[str], command: Sequence[str]) -> None:
    """Run a training job with the guard in every rank: ddpdoctor guard -- torchrun ... train.py

    Names the rank whose collectives do not match the others' (GRD001), that stalls the job
    (GRD002), whose replica diverged (GRD003), that repeats an epoch's order (GRD004), that draws
    more batches (GRD005), that is a straggler (GRD006) or uses the wrong GPU (GRD007). Exit status:
    the command's own when it failed, else 1 when the guard stopped the job or found something at
    least as severe as --fail-on (default: an error or a warning), else 0; 2 for a usage error.
    """
    if report_file:
        check_writable(report_file, "--report")  # before the job runs, not after
    if html_file:
        check_writable(html_file, "--html")
    if analyze_dumps is not None:
        if command:
            raise usage_error("--analyze reads dumps and runs no command: drop the command or --analyze")
        if html_file:
            raise usage_error("--html draws a guarded run; with --analyze there is none: drop --html or --analyze")
        from ddpdoctor.guard.flight.analyze import main as analyze

        raise click.exceptions.Exit(analyze(analyze_dumps, output_format, report_file))
    from ddpdoctor.guard.run import UsageError, run

    options = GuardOptions(stall_timeout=stall_timeout, every=every, straggler_window=straggler_window,
                           on_stall=on_stall)
    printer = Printer()
    try:
        outcome = run(command, options, printer, store=store, stdout_to_stderr=output_format == "json",
                      fail_on=fail_on)
    except UsageError as error:
        raise usage_error(str(error)) from None
    payload = report_dict(outcome.command, outcome.exit_code, outcome.world_size, outcome.findings, outcome.summary)
    if outcome.role == "follower":
        payload["diagnosed_by"] = outcome.store
    if report_file:
        try:
            Path(report_file).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        except OSError as error:
            usage_error(f"cannot write {report_file}: {error.strerror or error}")
            # The job's own failure still says what happened to the job.
            raise click.exceptions.Exit(outcome.exit_code or 2) from None
    if html_file:
        from ddpdoctor.guard import html

        try:
            html.write(html_file, html.render(payload, outcome.timeline))
        except OSError as error:
            usage_error(f"cannot write {html_file}: {error.strerror or error}")
            raise click.exceptions.Exit(outcome.exit_code or 2) from None
    if output_format == "json":
        click.echo(json.dumps(payload, indent=2))
    else:
        printer.summary(outcome.findings, outcome.summary, outcome.exit_code)
    raise click.exceptions.Exit(outcome.exit_code)
