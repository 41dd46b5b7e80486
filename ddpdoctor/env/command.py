"""The `ddpdoctor env` click command; the lead attaches it with `main.add_command(env)`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import click

from ddpdoctor.findings import Severity, worst_severity
from ddpdoctor.terminal import use_color
from ddpdoctor.usage import Bounded, OneLineErrors, check_writable, usage_error

EXIT_CLEAN, EXIT_FINDINGS = 0, 1
# More ranks than any node runs: a typo, not a plan (the checks compare it with the GPU count).
MAX_NPROC = 4096


@click.command(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
)
@click.option(
    "--nproc",
    type=Bounded(1, MAX_NPROC, integer=True),
    default=None,
    help="Ranks you will start on this node (checks GPU count, compute mode, OMP_NUM_THREADS).",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "nccl", "gloo", "mpi"]),
    default="auto",
    show_default=True,
    help="The torch.distributed backend the job will ask for.",
)
@click.option("--failing", is_flag=True, help="The job is failing: add debugging hints.")
@click.option("--output-file", type=click.Path(dir_okay=False), help="Write the report here.")
def env(
    output_format: str,
    nproc: Optional[int],
    backend: str,
    failing: bool,
    output_file: Optional[str],
) -> None:
    """The environment doctor: torch/NCCL/horovod builds, GPUs and their health, GPU topology,
    launch variables and network interfaces, with findings (ENV codes).

    Exit status: 0 when nothing at warning or above, 1 otherwise, 2 on a usage error.
    """
    if output_file:
        check_writable(output_file, "--output-file")
    from ddpdoctor.env import collect_env, diagnose
    from ddpdoctor.env.render import PLAIN_WIDTH, to_json, to_text

    report = collect_env()
    findings = diagnose(report, nproc=nproc, backend=backend, failing=failing)
    if output_format == "json":
        text = to_json(report, findings)
    else:
        color = use_color(output_file)
        # The report is rendered into a string first, so rich cannot see the terminal itself.
        width = shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns if color else None
        text = to_text(report, findings, color=color, width=width)
    if output_file:
        try:
            Path(output_file).write_text(text + "\n", encoding="utf-8")
        except OSError as error:
            raise usage_error(f"cannot write {output_file}: {error.strerror or error}") from None
    else:
        click.echo(text)
    worst = worst_severity(findings)
    if worst is not None and worst.rank >= Severity.WARNING.rank:
        raise click.exceptions.Exit(EXIT_FINDINGS)
