"""Rendering: a rich table of checks x ranks with a one-line verdict and what to do next, or one
JSON object (`--format json`)."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

from ddpdoctor.probe import results as R

_STYLE = {R.PASS: ("ok", "green"), R.FAIL: ("FAIL", "bold red"), R.SKIP: ("skip", "dim"), R.ERROR: ("ERR", "bold yellow")}
# Beyond this many ranks, one column per rank is unreadable: show counts instead.
MAX_RANK_COLUMNS = 16


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str)


def render_text(report: dict[str, Any], console: Optional[Any] = None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    env = report.get("environment", {})
    header = (
        f"ddpdoctor probe: {report['world_size']} rank(s), {report['backend']} on {report['device']} "
        f"-- torch {env.get('torch')}, CUDA {env.get('cuda') or 'n/a'}, host {env.get('host')}"
    )
    console.print(Text(header, style="bold"))
    if env.get("selection"):
        console.print(f"  backend: {env['selection']}")
    for line in env.get("summary_lines", []):
        console.print(f"  {line}", markup=False, highlight=False)
    if env.get("env_unavailable"):
        console.print(f"  [dim]env: {env['env_unavailable']}[/dim]")
    for finding in report.get("environment_findings", []):
        console.print(f"  [yellow]{finding.get('severity', 'info')}[/yellow] {finding.get('code', '')} {finding.get('message', '')}")
    if report.get("faults_injected"):
        console.print(f"  [magenta]injected faults: {', '.join(report['faults_injected'])}[/magenta]")

    world = report["world_size"]
    table = Table(show_lines=False)
    table.add_column("check")
    per_rank = world <= MAX_RANK_COLUMNS
    if per_rank:
        for r in range(world):
            table.add_column(f"r{r}", justify="center")
    else:
        table.add_column("ranks", justify="center")
    table.add_column("verdict", overflow="fold")
    for check in report["checks"]:
        label, style = _STYLE[check["status"]]
        row: list[Any] = [Text(check["name"], style=style if check["status"] != R.PASS else "")]
        if per_rank:
            by_rank = {e["rank"]: e for e in check["ranks"]}
            for r in range(world):
                e = by_rank.get(r)
                if e is None:
                    row.append(Text("?", style="dim"))
                else:
                    lab, sty = _STYLE[e["status"]]
                    row.append(Text(lab, style=sty))
        else:
            counts = {s: sum(1 for e in check["ranks"] if e["status"] == s) for s in R.STATUSES}
            row.append(" ".join(f"{counts[s]} {s}" for s in R.STATUSES if counts[s]))
        row.append(check.get("summary", ""))
        table.add_row(*row)
    console.print(table)

    bandwidth = next((c for c in report["checks"] if c["name"] == "bandwidth" and c.get("detail")), None)
    if bandwidth:
        bw = Table(title="all-reduce bandwidth (slowest rank; busbw = algbw x 2(n-1)/n)")
        for col in ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
            bw.add_column(col, justify="right")
        for row in bandwidth["detail"]["sweep"]:
            bw.add_row(_size(row["bytes"]), f"{row['time_us']:.1f}", f"{row['algbw_GBps']:.3f}", f"{row['busbw_GBps']:.3f}")
        console.print(bw)

    for check in report["checks"]:
        if check["status"] in (R.FAIL, R.ERROR):
            console.print(f"[bold red]{check['name']}[/bold red]: {check.get('summary', '')}")
            for e in check["ranks"]:
                if e["status"] in (R.FAIL, R.ERROR):
                    console.print(f"  rank {e['rank']}: {e['message']}", markup=False, highlight=False)
                    tb = e["detail"].get("traceback")
                    if tb:
                        console.print("    " + "\n    ".join(tb.strip().splitlines()[-6:]), markup=False, highlight=False, style="dim")
            if check.get("advice"):
                console.print(f"  [bold]next:[/bold] {check['advice']}")
    failures = report.get("failures") or []
    if failures:
        console.print("[bold]launcher:[/bold] processes that ended badly")
        for f in failures:
            how = f"signal {f['signal']}" if f.get("signal") else f"exit code {f['exitcode']}"
            first = (f.get("message") or "").strip().splitlines()
            console.print(f"  rank {f['rank']} (pid {f['pid']}): {how}" + (f": {first[0]}" if first and first[0] != "<NONE>" else ""),
                          markup=False, highlight=False)
    if report.get("launch_error"):
        console.print(f"[yellow]launcher: {report['launch_error']}[/yellow]")
    style = "bold green" if report["exit_code"] == R.EXIT_OK else "bold red"
    console.print(Text(f"verdict: {report['verdict']}", style=style))
    if report["exit_code"] != R.EXIT_OK and report.get("logs"):
        console.print(f"[dim]rank logs: {report['logs']}[/dim]")


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def emit_worker_report(records: dict[str, Any], backend: str, device: str, output_format: str) -> int:
    """Rank 0's report under an external launcher (there is no parent of ours to merge files)."""
    import os

    from ddpdoctor.probe.envinfo import probe_environment
    from ddpdoctor.probe.runner import _verdict

    checks = list(records.values())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    code = R.exit_code(checks)
    env = probe_environment()
    env.update(backend=backend, device=device, world_size=world, selection="external launcher")
    report = {
        "tool": "ddpdoctor probe", "exit_code": code, "verdict": _verdict(checks, world), "backend": backend,
        "device": device, "world_size": world, "faults_injected": [], "environment": env,
        "environment_findings": [], "checks": checks, "failures": [], "launch_error": None, "logs": None,
    }
    if output_format == "json":
        sys.stdout.write(to_json(report) + "\n")
    else:
        render_text(report)
    return code
