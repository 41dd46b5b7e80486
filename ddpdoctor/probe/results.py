"""The probe's result types, shared by the ranks (which produce them), the parent (which merges
them) and the report -- and importable without torch, so that `ddpdoctor guard` can reuse them.

Entries and records are TypedDicts rather than classes because they cross process boundaries as
JSON (through the c10d store and the per-rank files) and are the `--format json` contract:

    RankEntry:    {"rank": int, "status": str, "message": str, "detail": {...}}
    CheckRecord:  {"name": str, "status": str, "summary": str, "advice": str, "ranks": [RankEntry, ...]}
                  (+ "detail" for checks with a record-level result, e.g. bandwidth's sweep)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, TypedDict

PASS, FAIL, SKIP, ERROR = "pass", "fail", "skip", "error"
STATUSES = (PASS, FAIL, SKIP, ERROR)

# Exit statuses of `ddpdoctor probe`. 130 and 143 are the shell's convention for "ended by SIGINT"
# and "ended by SIGTERM" (128 + the signal's number).
EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class RankEntry(TypedDict):
    """One rank's result for one check."""

    rank: int
    status: str
    message: str
    detail: dict[str, Any]


class _CheckRecordKeys(TypedDict):
    name: str
    status: str
    summary: str
    advice: str
    ranks: list[RankEntry]


class CheckRecord(_CheckRecordKeys, total=False):
    """One check's verdict over all ranks; `detail` only for checks with a record-level result."""

    detail: dict[str, Any]


def entry(rank: int, status: str, message: str = "", **detail: Any) -> RankEntry:
    assert status in STATUSES, status
    return {"rank": int(rank), "status": status, "message": message, "detail": detail}


def aggregate_status(entries: Iterable[RankEntry]) -> str:
    """fail beats error beats pass beats skip: one bad rank makes the check bad."""
    statuses = {e["status"] for e in entries}
    for status in (FAIL, ERROR, PASS):
        if status in statuses:
            return status
    return SKIP


def record(
    name: str,
    entries: Iterable[RankEntry],
    summary: str = "",
    advice: str = "",
    status: Optional[str] = None,
) -> CheckRecord:
    ranks = sorted(entries, key=lambda e: e["rank"])
    return {
        "name": name,
        "status": status or aggregate_status(ranks),
        "summary": summary,
        "advice": advice,
        "ranks": ranks,
    }


def skipped(name: str, world_size: int, reason: str) -> CheckRecord:
    """A check no rank ran, for the reason given."""
    return record(name, [entry(r, SKIP, reason) for r in range(world_size)], summary=reason, status=SKIP)


def ranks_with(rec: CheckRecord, *statuses: str) -> list[int]:
    return [e["rank"] for e in rec["ranks"] if e["status"] in statuses]


def format_ranks(ranks: Iterable[int]) -> str:
    ordered = sorted(set(ranks))
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(str(r) for r in ordered)


def blame_line(ranks: Iterable[int], message: str) -> str:
    """"rank 1: <message>", without saying "rank 1" twice when the message already starts with it."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1 and message.startswith(f"rank {ordered[0]} "):
        return message
    return f"{format_ranks(ordered)}: {message}"


def blame_failures(rec: CheckRecord, advice: str = "") -> bool:
    """If any rank failed or errored, name them with the first one's message (and the advice) in
    the record's summary and return True; else leave the record alone and return False."""
    bad = ranks_with(rec, FAIL, ERROR)
    if not bad:
        return False
    first = next(e for e in rec["ranks"] if e["rank"] in bad)
    rec["summary"] = blame_line(bad, first["message"])
    rec["advice"] = rec.get("advice") or advice
    return True


# A traceback is shown whole; only a pathological one (deep recursion) is cut, in the middle and at
# line boundaries, so that both where it started and where it ended stay readable.
TRACEBACK_LIMIT = 16000
_TRACEBACK_HEAD_LINES = 12


def clip_traceback(text: str, limit: int = TRACEBACK_LIMIT) -> str:
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    head = lines[:_TRACEBACK_HEAD_LINES]
    budget = limit - sum(len(line) + 1 for line in head) - 64
    tail: list[str] = []
    for line in reversed(lines[_TRACEBACK_HEAD_LINES:]):
        if budget - len(line) - 1 < 0:
            break
        budget -= len(line) + 1
        tail.append(line)
    tail.reverse()
    omitted = len(lines) - len(head) - len(tail)
    return "\n".join([*head, f"  ... ({omitted} lines omitted) ...", *tail]) + "\n"


def exit_code(checks: Iterable[CheckRecord]) -> int:
    return EXIT_FAILED if any(c["status"] in (FAIL, ERROR) for c in checks) else EXIT_OK


def verdict(checks: list[CheckRecord], world_size: int) -> str:
    bad = [c for c in checks if c["status"] in (FAIL, ERROR)]
    if not bad:
        ran = sum(1 for c in checks if c["status"] == PASS)
        skipped_count = len(checks) - ran
        return f"all {ran} checks passed on {world_size} ranks" + (f" ({skipped_count} skipped)" if skipped_count else "")
    ranks = sorted({e["rank"] for c in bad for e in c["ranks"] if e["status"] in (FAIL, ERROR)})
    return f"{len(bad)} check(s) failed ({', '.join(c['name'] for c in bad)}) on {format_ranks(ranks)}"


@dataclass
class LaunchOutcome:
    """What a launch (torch elastic or Horovod's runner) brought back to the parent."""

    out_dir: str
    rank_files: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Global rank -> {"exitcode", "signal", "message", "traceback", "local_rank", "pid"}.
    failures: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Set when the launch itself failed (rendezvous, bad address): the probe could not run.
    launch_error: Optional[str] = None
    # Set when the user interrupted the run (SIGINT) or it was told to stop (SIGTERM, by the
    # signal's name): not a verdict on any rank.
    interrupted: bool = False
    stop_signal: str = "SIGINT"
    killed_hung_pids: set[int] = field(default_factory=set)
    # Of those, the ones killed because no rank of this node made progress any more (nobody was left
    # to report them): pid -> the seconds without progress it was allowed in its phase.
    stalled_pids: dict[int, float] = field(default_factory=dict)
    deadline_hit: bool = False
    elapsed_s: float = 0.0
    started_at: float = 0.0
