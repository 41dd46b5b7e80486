"""The `ddpdoctor` command. Thin: options in, call the engine/probe/env, report out.

Exit status everywhere: 0 nothing found, 1 findings (or a failed check), 2 usage error, unreadable
path or internal error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, TypeVar

import click

from ddpdoctor import __version__
from ddpdoctor.catalog import CatalogError, RuleInfo, find_rule, load_catalog
from ddpdoctor.terminal import plain_table, rich_output, use_color

if TYPE_CHECKING:
    from ddpdoctor.lint.engine import FileResult

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def fail(message: str) -> "click.exceptions.Exit":
    click.echo(f"ddpdoctor: error: {message}", err=True)
    return click.exceptions.Exit(EXIT_ERROR)


# Commands whose modules are imported on first use: name -> module (the command is its `name`).
OPTIONAL_COMMANDS = {"probe": "ddpdoctor.probe.command", "env": "ddpdoctor.env.command", "guard": "ddpdoctor.guard.command"}


class DoctorGroup(click.Group):
    """A click group that turns any unexpected exception into a one-line error and exit 2, and
    imports the optional commands only when they are asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        optional = [name for name in OPTIONAL_COMMANDS if self.get_command(ctx, name) is not None]
        return sorted({*super().list_commands(ctx), *optional})

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in OPTIONAL_COMMANDS:
            command = _optional_command(cmd_name)
            if command is not None:
                self.add_command(command, cmd_name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("ddpdoctor: interrupted", err=True)
            raise click.exceptions.Exit(130) from None
        except BrokenPipeError:
            # The reader went away (`ddpdoctor rules | head`): stop quietly, as a tool killed by
            # SIGPIPE would, and keep Python from failing again when it flushes stdout at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise click.exceptions.Exit(141) from None
        except CatalogError as error:
            raise fail(f"broken rule catalog: {error}") from None
        except Exception as error:  # noqa: BLE001 - the last line of defence against tracebacks
            if os.environ.get("DDPDOCTOR_DEBUG"):
                raise
            raise fail(
                f"internal error: {type(error).__name__}: {error} (set DDPDOCTOR_DEBUG=1 for a traceback)"
            ) from None


@contextlib.contextmanager
def _writing_standard_output() -> Iterator[None]:
    """Around a command's writes to standard output: a write that fails (a full disk, /dev/full, a
    device error) is a one-line error and exit 2. The unwritten bytes are dropped, so that the
    interpreter's own flush at exit does not fail a second time with a traceback. A reader that
    went away (BrokenPipeError) is left to the group, which stops quietly."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        if sys.stdout is not None:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        raise fail(f"cannot write to standard output: {error.strerror or error}") from None


@click.group(cls=DoctorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="ddpdoctor", message="%(prog)s %(version)s")
def main() -> None:
    """A linter and doctor for distributed PyTorch training (DDP, Horovod, DataParallel, SyncBatchNorm, AMP).

    \b
      ddpdoctor lint train.py        static checks, never runs your code
      ddpdoctor probe --nproc 4      launch real ranks and prove they agree
      ddpdoctor env                  the environment doctor (GPUs, NCCL, launch variables)
      ddpdoctor guard -- CMD ...     run your job with the doctor inside every rank
      ddpdoctor rules / explain CODE the rule catalog
      ddpdoctor server               the Language Server for editors
    """


# --------------------------------------------------------------------------------------------- lint


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--select", help="Comma-separated codes or prefixes to enable instead of the defaults (ALL for every rule).")
@click.option("--ignore", help="Comma-separated codes or prefixes to disable.")
@click.option("--extend-select", help="Comma-separated codes or prefixes to enable on top of the selection.")
@click.option("--format", "output_format", type=click.Choice(["text", "json", "sarif", "github"]), default="text", show_default=True)
@click.option("--output-file", "-o", type=click.Path(dir_okay=False, writable=True), help="Write the report to a file.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when findings are reported.")
@click.option("--statistics", is_flag=True, help="Show a count per rule.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Worker processes (default: all cores).")
@click.option("--no-cache", is_flag=True, help="Do not read or write the result cache.")
@click.option("--world-size", type=click.IntRange(min=1), default=None, help="Processes/GPUs the script runs with (for rules that need it).")
@click.option("--fix", is_flag=True, help="Apply safe fixes in place.")
@click.option("--diff", is_flag=True, help="Show the fixes as a diff instead of writing them.")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix/--diff, also apply fixes that may change behaviour beyond the finding.")
@click.option("--stdin-filename", help="The name to report for '-' (standard input), also used for per-file-ignores.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False), help="Use this ddpdoctor.toml/pyproject.toml.")
@click.option("-q", "--quiet", is_flag=True, help="Print findings only; nothing when clean.")
def lint(
    paths: Sequence[str],
    select: Optional[str],
    ignore: Optional[str],
    extend_select: Optional[str],
    output_format: str,
    output_file: Optional[str],
    exit_zero: bool,
    statistics: bool,
    jobs: Optional[int],
    no_cache: bool,
    world_size: Optional[int],
    fix: bool,
    diff: bool,
    unsafe_fixes: bool,
    stdin_filename: Optional[str],
    config_file: Optional[str],
    quiet: bool,
) -> None:
    """Lint training scripts (files, folders, or '-' for standard input)."""
    from ddpdoctor.config import ConfigError, find_config, load_settings, split_codes
    from ddpdoctor.lint.engine import RunResult, lint_paths, lint_stdin, read_text_for_frames
    from ddpdoctor.lint.files import PathError
    from ddpdoctor.report import ReportContext, render

    paths = list(paths) or ["."]
    use_stdin = "-" in paths
    if use_stdin and len(paths) > 1:
        raise fail("'-' (standard input) cannot be combined with other paths")
    try:
        if config_file:
            settings = load_settings(Path(config_file))
        else:
            start = Path(stdin_filename) if (use_stdin and stdin_filename) else Path(paths[0] if not use_stdin else ".")
            if not start.exists():
                start = Path(".")
            settings = load_settings(find_config(start.resolve()))
        if select is not None:
            if not split_codes(select):
                # An empty selection would turn every rule off and report a clean run.
                raise ConfigError("--select needs at least one rule code or prefix (ALL for every rule)")
            # Like ruff: a command-line --select starts the selection afresh, so the
            # configuration's ignore/extend-select no longer apply.
            settings = settings.merged(select=split_codes(select), ignore=(), extend_select=())
        settings = settings.merged(world_size=world_size)
        if ignore is not None:
            settings = settings.merged(ignore=settings.ignore + (split_codes(ignore) or ()))
        if extend_select is not None:
            settings = settings.merged(extend_select=settings.extend_select + (split_codes(extend_select) or ()))
        enabled = settings.enabled_codes()  # validates every code
    except ConfigError as error:
        raise fail(str(error)) from None

    if statistics and output_format not in ("text", "json"):
        raise fail(f"--statistics counts findings per code in text or json, not {output_format}")
    do_fix = fix or diff
    run = RunResult()
    empty_dirs: list[str] = []
    if use_stdin:
        try:
            if sys.stdin is None:  # descriptor 0 closed: Python gives no stream at all
                raise OSError(errno.EBADF, "it is closed")
            data = sys.stdin.buffer.read()
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else "it is closed"
            raise fail(f"cannot read standard input: {reason}") from None
        run.files = [lint_stdin(data, stdin_filename, settings, do_fix, unsafe_fixes)]
    else:
        try:
            run, empty_dirs = lint_paths(
                paths, settings, jobs=jobs, use_cache=not no_cache, fix=do_fix, unsafe_fixes=unsafe_fixes
            )
        except PathError as error:
            raise fail(str(error)) from None
    for directory in empty_dirs:
        click.echo(f"ddpdoctor: warning: no Python files found in {directory}", err=True)
    for warning in run.warnings:
        click.echo(f"ddpdoctor: warning: {warning}", err=True)

    diffs: list[str] = []
    for result in run.files:
        if result.fixed_source is None:
            continue
        assert result.source is not None
        if diff:
            from ddpdoctor.lint.fixes import unified_diff

            diffs.append(unified_diff(result.path, result.source, result.fixed_source))
        elif use_stdin:
            with _writing_standard_output():
                _write_text(sys.stdout, result.fixed_source)
        else:
            _write_fix(result)

    findings = run.findings
    if diff:
        if diffs:
            with _writing_standard_output():
                click.echo("".join(diffs), nl=False)
            fixable = sum(r.fixed for r in run.files)
            click.echo(f"Would fix {fixable} problem{'s' if fixable != 1 else ''}.", err=True)
        for message in run.errors:
            click.echo(f"ddpdoctor: error: {message}", err=True)
        raise click.exceptions.Exit(EXIT_ERROR if run.errors else (EXIT_FINDINGS if diffs and not exit_zero else EXIT_CLEAN))

    color = output_format == "text" and use_color(output_file)
    sources: dict[str, str] = {}
    if color:
        for result in run.files:
            if result.findings:
                text = result.source if result.source is not None else read_text_for_frames(result.path)
                if text is not None:
                    sources[result.path] = text
    context = ReportContext(
        files_checked=len(run.files),
        color=color,
        show_source=color,
        statistics=statistics,
        sources=sources,
        fixed=run.fixed,
        # A run whose only news is an error (an unreadable file, a malformed notebook) must not
        # end in "All checks passed!": the error lines say it all.
        quiet=quiet or (use_stdin and fix) or (bool(run.errors) and not findings),
    )
    report = _undecodable_names_escaped(render(findings, output_format, context), output_format)
    if output_file:
        try:
            Path(output_file).write_bytes(report.encode("utf-8", "surrogateescape"))
        except OSError as error:
            raise fail(f"cannot write the report to {output_file}: {error.strerror or error}") from None
        if not context.quiet:
            # The file holds the report as stdout would have (a text report ends with its summary;
            # JSON/SARIF stay pure data); the terminal still says what was found, on stderr.
            from ddpdoctor.report.text import summary

            click.echo(f"{summary(findings, context).plain} Report written to {output_file}.", err=True)
    elif report:
        stream = sys.stderr if (use_stdin and fix) else sys.stdout
        with _writing_standard_output():
            _write_text(stream, report if report.endswith("\n") else report + "\n")
    for message in run.errors:
        click.echo(f"ddpdoctor: error: {message}", err=True)
    if run.errors:
        raise click.exceptions.Exit(EXIT_ERROR)
    if findings and not exit_zero:
        raise click.exceptions.Exit(EXIT_FINDINGS)


def _undecodable_names_escaped(report: str, output_format: str) -> str:
    """File names that are not valid UTF-8 reach us with their bytes as lone surrogates (PEP 383).
    JSON and SARIF must stay valid UTF-8: there they become `\\udcXX` escapes (which json.loads
    and os.fsencode turn back into the name's bytes); text and GitHub output get the raw bytes, as
    `ls` prints them."""
    if output_format in ("json", "sarif"):
        return re.sub("[\udc80-\udcff]", lambda match: f"\\u{ord(match.group()):04x}", report)
    return report


def _write_text(stream: Any, text: str) -> None:
    if stream is None:  # descriptor 1 or 2 closed: nowhere to write, as click.echo does
        return
    buffer = getattr(stream, "buffer", None)
    if buffer is None:  # a test runner's text stream
        stream.write(text)
        return
    stream.flush()
    buffer.write(text.encode(stream.encoding or "utf-8", "surrogateescape"))
    buffer.flush()


def _write_fix(result: "FileResult") -> None:
    """Write one fixed file; a file that cannot be written safely is an error for that file alone
    (its findings stay reported as not fixed), never the end of the run."""
    from ddpdoctor.lint.engine import decode
    from ddpdoctor.lint.safe_write import WriteError, encode_like, write_fixed

    assert result.source is not None and result.fixed_source is not None
    fixed_source, linted = result.fixed_source, result.source
    try:
        write_fixed(
            result.path,
            still_current=lambda data: decode(data, result.path) == linted,
            render=lambda original: encode_like(original, fixed_source),
        )
    except WriteError as error:
        result.error = str(error)
        result.findings = result.findings_before_fix
        result.fixed = 0


# ------------------------------------------------------------------------------------ rules/explain

# The six-column `rules` table needs this many columns to leave its summaries room.
WIDE_RULES_TABLE = 120


@main.command()
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--all", "show_all", is_flag=True, help="Include the env and guard checks (ENV and GRD codes) too.")
def rules(output_format: str, show_all: bool) -> None:
    """List the rules: code, name, severity, default on/off, fixable."""
    with _writing_standard_output():
        _list_rules(output_format, show_all)


def _list_rules(output_format: str, show_all: bool) -> None:
    catalog = [i for i in load_catalog().values() if show_all or i.kind == "lint"]
    if output_format == "json":
        payload = [{k: v for k, v in info.to_dict().items() if k != "body"} for info in catalog]
        click.echo(json.dumps(payload, indent=2))
        return
    headers = ("code", "name", "severity", "default", "fixable", "summary")
    rows = [
        (info.code, info.name, info.severity.value, "on" if info.default_on else "off",
         {"auto": "yes", "suggested": "suggested"}.get(info.fix_kind, ""), info.summary)
        for info in catalog
    ]
    if not rich_output():
        # A pipe gets one rule a line, whole: `ddpdoctor rules | grep DDP` or `| less` see every summary.
        for line in plain_table(headers, rows):
            click.echo(line)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False)
    table = Table(box=None, header_style="bold", pad_edge=False)
    if console.width >= WIDE_RULES_TABLE:
        for column in headers:
            table.add_column(column, overflow="fold" if column == "summary" else "ellipsis", no_wrap=column != "summary")
        for row in rows:
            table.add_row(*row)
    else:
        # Too narrow for six columns (80 columns left the summary 12 characters): each rule is its
        # code beside its name, facts and summary, which wraps in what is left of the window.
        table.add_column("code", no_wrap=True)
        table.add_column("rule", overflow="fold")
        for code, name, severity, default, fixable, summary in rows:
            facts = ", ".join(part for part in (severity, f"{default} by default", fixable and f"fix: {fixable}") if part)
            table.add_row(code, Text.assemble((name, "bold"), (f" ({facts})", "dim"), "\n", summary))
    console.print(table)


@main.command()
@click.argument("code")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def explain(code: str, output_format: str) -> None:
    """Show a rule's page (by code or name: DDP001 or missing-set-epoch): what it catches, why it
    matters, a bad and a fixed example."""
    info = find_rule(code.strip())
    if info is None:
        raise fail(f"unknown rule code or name {code!r} (see 'ddpdoctor rules')")
    with _writing_standard_output():
        _show_page(info, output_format)


def _show_page(info: RuleInfo, output_format: str) -> None:
    if output_format == "json":
        click.echo(json.dumps(info.to_dict(), indent=2))
        return
    header = (
        f"severity: {info.severity.value} · default: {'on' if info.default_on else 'off'}"
        f" · fixable: {'yes' if info.fixable else 'no'}"
    )
    piped = not (sys.stdout is not None and sys.stdout.isatty()) and not os.environ.get("FORCE_COLOR")
    if piped:  # decided without importing rich (a tenth of a second), as rich itself would decide
        click.echo(info.body.rstrip("\n"))
        click.echo(f"\n{header}")
        return
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console(highlight=False)
    if console.is_terminal:
        console.print(Markdown(info.body))
        console.print(f"[dim]{header}[/dim]")
    else:
        # Piped: the page's own Markdown, which is readable as plain text and greppable.
        click.echo(info.body.rstrip("\n"))
        click.echo(f"\n{header}")


# ------------------------------------------------------------------------------------- server


@main.command()
@click.option("--stdio", is_flag=True, help="Speak over standard input and output (the default and only transport).")
def server(stdio: bool) -> None:
    """Run the Language Server (LSP over stdio) for editors: diagnostics as you type, fixes as code
    actions, the rule's page on hover. Needs the 'server' extra: pip install 'ddpdoctor[server]'."""
    try:
        from ddpdoctor.lsp.server import serve
    except ImportError as error:
        raise fail(f"the server needs pygls and lsprotocol ({(error.name or 'a module').split('.')[0]} is missing): pip install 'ddpdoctor[server]'") from None
    serve()


# ---------------------------------------------------------------------------------- probe and env


def run() -> None:
    """The process's entry point (the `ddpdoctor` script, `python -m ddpdoctor`): `main`, and then,
    as the process ends, its objects are frozen out of the garbage collector's last walk over every
    object at interpreter exit (about 10 ms of linting one file; the exit frees them either way).
    Not in `main` itself, which tests and other programs call in a process that goes on."""
    try:
        main()
    finally:
        gc.freeze()


def _optional_command(name: str) -> Optional[click.Command]:
    """`probe`, `env` and `guard` live in their own packages (their modules import torch lazily),
    imported only when the command runs or `--help` lists it: `ddpdoctor lint` never pays for them.
    A package that cannot be imported leaves its command out."""
    try:
        module = __import__(OPTIONAL_COMMANDS[name], fromlist=[name])
    except ImportError:
        return None
    command = getattr(module, name, None)
    return command if isinstance(command, click.Command) else None
