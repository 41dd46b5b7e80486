"""Rendering the probe's report: a rich table of checks x ranks on a terminal, plain aligned lines
in a pipe or file (nothing wrapped, no box drawing), or one JSON object (`--format json`).
No torch here."""

from __future__ import annotations

import io
import json
import sys
from typing import IO, Any, Optional

from ddpdoctor.probe import results as R
from ddpdoctor.probe.registry import TORCH, CHECKS
from ddpdoctor.probe.views import DetailTable
from ddpdoctor.terminal import plain_table, rich_output

_STYLE = {R.PASS: ("ok", "green"), R.FAIL: ("FAIL", "bold red"), R.SKIP: ("skip", "dim"), R.ERROR: ("ERR", "bold yellow")}
# Beyond this many ranks, one column per rank is unreadable: show counts instead.
MAX_RANK_COLUMNS = 16


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str)


def _header(report: dict[str, Any]) -> list[str]:
    env = report.get("environment", {})
    framework = "" if report.get("framework", TORCH) == TORCH else "Horovod, "
    lines = [
        f"ddpdoctor probe: {report['world_size']} rank(s), {framework}{report['backend']} on {report['device']} "
        f"-- torch {env.get('torch')}, CUDA {env.get('cuda') or 'n/a'}, host {env.get('host')}"
    ]
    if env.get("selection"):
        lines.append(f"  backend: {env['selection']}")
    lines.extend(f"  {line}" for line in env.get("summary_lines", []))
    if env.get("env_unavailable"):
        lines.append(f"  env: {env['env_unavailable']}")
    return lines


def _rank_cells(check: R.CheckRecord, world: int) -> list[tuple[str, str]]:
    """(label, style) per rank column, or one "N pass M fail" cell beyond MAX_RANK_COLUMNS."""
    if world > MAX_RANK_COLUMNS:
        counts = {s: sum(1 for e in check["ranks"] if e["status"] == s) for s in R.STATUSES}
        return [(" ".join(f"{counts[s]} {s}" for s in R.STATUSES if counts[s]), "")]
    by_rank = {e["rank"]: e for e in check["ranks"]}
    cells = []
    for r in range(world):
        e = by_rank.get(r)
        cells.append(("?", "dim") if e is None else _STYLE[e["status"]])
    return cells


def _rank_headers(world: int) -> list[str]:
    return [f"r{r}" for r in range(world)] if world <= MAX_RANK_COLUMNS else ["ranks"]


def _detail_tables(report: dict[str, Any]) -> list[DetailTable]:
    framework = report.get("framework", TORCH)
    renderers = {spec.name: spec.render for spec in CHECKS if spec.framework == framework and spec.render}
    tables = []
    for check in report["checks"]:
        render = renderers.get(check["name"])
        table = render(check) if render else None
        if table is not None:
            tables.append(table)
    return tables


def _failure_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(text, style) lines explaining what failed, then the verdict.

    Each failure is said once: the table's verdict column already carries the summary (the first
    failing rank's message), so below it come only what the table could not hold -- the other
    failing ranks' messages, whole tracebacks, the advice -- and the launcher's account only of
    ranks no check has named."""
    out: list[tuple[str, str]] = []
    named: set[int] = set()
    for check in report["checks"]:
        if check["status"] not in (R.FAIL, R.ERROR):
            continue
        summary = check.get("summary", "")
        body: list[tuple[str, str]] = []
        for e in check["ranks"]:
            if e["status"] not in (R.FAIL, R.ERROR):
                continue
            named.add(e["rank"])
            if e["message"] and e["message"] not in summary:
                body.append((f"  {R.blame_line([e['rank']], e['message'])}", ""))
            tb = (e["detail"].get("traceback") or "").strip()
            if tb:
                body.append((f"  rank {e['rank']} traceback:", ""))
                body.extend((f"    {line}", "dim") for line in tb.splitlines())
        if check.get("advice"):
            body.append((f"  next: {check['advice']}", ""))
        if body:
            out.append((f"{check['name']}:", "bold red"))
            out.extend(body)
    failures = [f for f in report.get("failures") or [] if f["rank"] not in named]
    if failures:
        out.append(("launcher: processes that ended badly", "bold"))
        for f in failures:
            how = f"signal {f['signal']}" if f.get("signal") else f"exit code {f['exitcode']}"
            first = (f.get("message") or "").strip().splitlines()
            out.append((f"  rank {f['rank']} (pid {f['pid']}): {how}" + (f": {first[0]}" if first and first[0] != "<NONE>" else ""), ""))
    if report.get("launch_error"):
        out.append((f"launcher: {report['launch_error']}", "yellow"))
    out.append((f"verdict: {report['verdict']}", "bold green" if report["exit_code"] == R.EXIT_OK else "bold red"))
    if report["exit_code"] != R.EXIT_OK and report.get("logs"):
        out.append((f"rank logs: {report['logs']}", "dim"))
    return out


def render_plain(report: dict[str, Any], stream: Optional[IO[str]] = None) -> None:
    out = stream or sys.stdout
    lines = _header(report)
    lines.extend(f"  {f.get('severity', 'info')} {f.get('code', '')} {f.get('message', '')}"
                 for f in report.get("environment_findings", []))
    if report.get("faults_injected"):
        lines.append(f"  injected faults: {', '.join(report['faults_injected'])}")
    world = report["world_size"]
    rows = [[c["name"], *(label for label, _ in _rank_cells(c, world)), c.get("summary", "")] for c in report["checks"]]
    lines.extend(plain_table(["check", *_rank_headers(world), "verdict"], rows))
    for table in _detail_tables(report):
        lines.append(table.title)
        lines.extend("  " + line for line in plain_table(table.headers, table.rows))
    lines.extend(text for text, _ in _failure_lines(report))
    out.write("\n".join(lines) + "\n")
    out.flush()


def plain_text(report: dict[str, Any]) -> str:
    """The plain report as one string (`--output-file`)."""
    buffer = io.StringIO()
    render_plain(report, buffer)
    return buffer.getvalue()


def render_rich(report: dict[str, Any], console: Optional[Any] = None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    header = _header(report)
    console.print(Text(header[0], style="bold"))
    for line in header[1:]:
        console.print(line, markup=False, highlight=False)
    for finding in report.get("environment_findings", []):
        console.print(Text(f"  {finding.get('severity', 'info')} {finding.get('code', '')} {finding.get('message', '')}",
                           style="yellow"))
    if report.get("faults_injected"):
        console.print(Text(f"  injected faults: {', '.join(report['faults_injected'])}", style="magenta"))
    world = report["world_size"]
    table = Table(show_lines=False)
    table.add_column("check")
    for name in _rank_headers(world):
        table.add_column(name, justify="center")
    table.add_column("verdict", overflow="fold")
    for check in report["checks"]:
        _, style = _STYLE[check["status"]]
        cells = [Text(label, style=sty) for label, sty in _rank_cells(check, world)]
        table.add_row(Text(check["name"], style=style if check["status"] != R.PASS else ""), *cells, check.get("summary", ""))
    console.print(table)
    for detail in _detail_tables(report):
        rich_table = Table(title=detail.title)
        for col in detail.headers:
            rich_table.add_column(col, justify="right")
        for row in detail.rows:
            rich_table.add_row(*row)
        console.print(rich_table)
    for text, style in _failure_lines(report):
        console.print(Text(text, style=style))


def render_text(report: dict[str, Any]) -> None:
    """Rich on a terminal, plain lines everywhere else."""
    if rich_output():
        render_rich(report)
    else:
        render_plain(report)


def emit_worker_report(checks: list[R.CheckRecord], backend: str, device: str, world: int, output_format: str,
                       framework: str = TORCH) -> int:
    """Rank 0's report under an external launcher (there is no parent of ours to merge files)."""
    from ddpdoctor.probe.envinfo import probe_environment

    code = R.exit_code(checks)
    env = probe_environment()
    env.update(framework=framework, backend=backend, device=device, world_size=world, selection="external launcher")
    report = {
        "tool": "ddpdoctor probe", "exit_code": code, "verdict": R.verdict(checks, world), "framework": framework,
        "backend": backend, "device": device, "world_size": world, "faults_injected": [], "environment": env,
        "environment_findings": [], "checks": checks, "failures": [], "launch_error": None, "logs": None,
    }
    if output_format == "json":
        sys.stdout.write(to_json(report) + "\n")
        sys.stdout.flush()
    else:
        render_text(report)
    return code
