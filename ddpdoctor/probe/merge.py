"""Turn what the ranks left behind into one verdict, in the parent.

Sources, best first: the check records rank 0 published (every rank keeps a copy in its rank file),
records a rank built itself when rank 0 went silent, each rank's own entries, and the launcher's
account of dead ranks (exit code, signal, traceback). A rank that died or was killed as hung is
attributed to the check it was running.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ddpdoctor.probe import results as R
from ddpdoctor.probe.exchange import missing_advice, missing_message
from ddpdoctor.probe.results import CheckRecord, LaunchOutcome


def _best_record(name: str, files: dict[int, dict[str, Any]]) -> Optional[CheckRecord]:
    candidates = [f["records"][name] for _, f in sorted(files.items()) if name in f.get("records", {})]
    if not candidates:
        return None
    # Rank 0's published record is the same everywhere; a self-built one knows less. Prefer the
    # record with the fewest ranks reported missing.
    return min(candidates, key=lambda rec: sum(1 for e in rec["ranks"] if e["detail"].get("missing")))


def _death_text(info: dict[str, Any]) -> str:
    if info.get("signal"):
        return f"killed by {info['signal']}"
    return f"exited with code {info['exitcode']}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def merge(outcome: LaunchOutcome, checks: tuple[str, ...], world_size: int,
          advice_for: Callable[[str], str]) -> list[CheckRecord]:
    files = outcome.rank_files
    records: dict[str, CheckRecord] = {}
    for name in checks:
        rec = _best_record(name, files)
        if rec is not None:
            records[name] = rec
    # Which rank was where when it stopped.
    hung_ranks = {r for r, f in files.items() if f.get("pid") in outcome.killed_hung_pids and not f.get("finished")}
    dead: dict[int, dict[str, Any]] = {}
    for rank, info in outcome.failures.items():
        f = files.get(rank, {})
        if f.get("finished"):
            continue  # it had reported everything; how it ended does not change a verdict
        dead[rank] = info
    root = _root_causes(dead, hung_ranks)
    for rank in sorted(set(dead) | hung_ranks):
        f = files.get(rank, {})
        where = f.get("running") or "startup"
        name = where if where in checks else checks[0]
        info = dead.get(rank, {})
        rec = records.get(name)
        if rec is None:
            rec = _synthesize(name, files, world_size)
            records[name] = rec
        entry = next((e for e in rec["ranks"] if e["rank"] == rank), None)
        if entry is None:
            entry = R.entry(rank, R.FAIL)
            rec["ranks"].append(entry)
            rec["ranks"].sort(key=lambda e: e["rank"])
        if rank in hung_ranks:
            stalled_s = outcome.stalled_pids.get(f.get("pid", -1))
            if not entry["detail"].get("missing"):
                # No peer's exchange named it: say what that exchange would have said.
                entry["message"] = (f"rank {rank} hung during {where}" if stalled_s is None else
                                    missing_message(rank, where if where in checks else "its start-up", stalled_s))
            entry["status"] = R.FAIL
            entry["detail"].update(missing=True, killed_by_probe=True)
            entry["message"] += ("; killed by the probe after the other ranks finished" if stalled_s is None else
                                 f"; killed by the probe after no rank made progress for {stalled_s:g}s")
            if stalled_s is not None:  # as the worker advises when its exchange names a rank missing
                rec["advice"] = missing_advice(sorted(e["rank"] for e in rec["ranks"] if e["detail"].get("missing"))) or ""
        elif rank in root:
            tb = info.get("traceback") or f.get("crashed") or entry["detail"].get("traceback", "")
            last = _last_line(info.get("message", "")) or _last_line(tb)
            entry["status"] = R.FAIL
            entry["message"] = f"rank {rank} {_death_text(info)} during {where}" + (f": {last}" if last else "")
            entry["detail"].update(crashed=True, exitcode=info.get("exitcode"), signal=info.get("signal"), traceback=tb)
        elif entry["status"] in (R.PASS, R.SKIP) or entry["detail"].get("missing"):
            entry["status"] = R.SKIP
            entry["message"] = f"terminated by the launcher after {R.format_ranks(root)} failed" if root else f"rank {rank} {_death_text(info)}"
            entry["detail"].update(exitcode=info.get("exitcode"), signal=info.get("signal"))
        _rejudge(rec, advice_for)
        for later in checks[checks.index(name) + 1:]:
            if later not in records:
                what = "stopped responding" if rank in hung_ranks else "died"
                reason = f"not run: {R.format_ranks((root | hung_ranks) or {rank})} {what} during {name}"
                records[later] = R.skipped(later, world_size, reason)
    died = root - hung_ranks
    if died:
        # Checks the survivors skipped because someone stopped answering: name the real cause.
        reason = f"not run: {R.format_ranks(died)} died"
        for rec in records.values():
            if rec["status"] == R.SKIP and "stopped responding" in rec.get("summary", ""):
                rec["summary"] = reason
                for e in rec["ranks"]:
                    e["message"] = reason
    out = []
    for name in checks:
        rec = records.get(name)
        if rec is None:
            reason = "not run: no rank reached this check" if not files else "not run: no result came back"
            rec = R.skipped(name, world_size, reason)
        out.append(rec)
    return out


def _root_causes(dead: dict[int, dict[str, Any]], hung: set[int]) -> set[int]:
    """The ranks that failed on their own, as opposed to being stopped by the launcher afterwards
    (which sends SIGTERM to the survivors when one rank fails)."""
    own = {r for r, info in dead.items() if info.get("signal") not in ("SIGTERM",)}
    return own or set(dead)


def _synthesize(name: str, files: dict[int, dict[str, Any]], world_size: int) -> CheckRecord:
    entries = []
    for r in range(world_size):
        own = files.get(r, {}).get("own", {}).get(name)
        entries.append(own if own else R.entry(r, R.SKIP, "no result from this rank (on another node, or stopped)"))
    return R.record(name, entries)


def _rejudge(rec: CheckRecord, advice_for: Callable[[str], str]) -> None:
    rec["status"] = R.aggregate_status(rec["ranks"])
    R.blame_failures(rec, advice_for(rec["name"]))
