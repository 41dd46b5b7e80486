"""The probe's result model, shared by the ranks (which produce it) and the parent (which merges it).

Plain dicts, because they cross process boundaries as JSON (through the c10d store and temp files):

    rank entry:   {"rank": int, "status": str, "message": str, "detail": {...}}
    check record: {"name": str, "status": str, "summary": str, "advice": str, "ranks": [entry, ...]}

No torch here.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

PASS, FAIL, SKIP, ERROR = "pass", "fail", "skip", "error"
STATUSES = (PASS, FAIL, SKIP, ERROR)

# Exit statuses of `ddpdoctor probe`.
EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2


def entry(rank: int, status: str, message: str = "", **detail: Any) -> dict[str, Any]:
    assert status in STATUSES, status
    return {"rank": int(rank), "status": status, "message": message, "detail": detail}


def aggregate_status(entries: Iterable[dict[str, Any]]) -> str:
    """fail beats error beats pass beats skip: one bad rank makes the check bad."""
    statuses = {e["status"] for e in entries}
    for status in (FAIL, ERROR, PASS):
        if status in statuses:
            return status
    return SKIP


def record(
    name: str,
    entries: Iterable[dict[str, Any]],
    summary: str = "",
    advice: str = "",
    status: Optional[str] = None,
) -> dict[str, Any]:
    ranks = sorted(entries, key=lambda e: e["rank"])
    return {
        "name": name,
        "status": status or aggregate_status(ranks),
        "summary": summary,
        "advice": advice,
        "ranks": ranks,
    }


def ranks_with(rec: dict[str, Any], *statuses: str) -> list[int]:
    return [e["rank"] for e in rec["ranks"] if e["status"] in statuses]


def format_ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def exit_code(checks: Iterable[dict[str, Any]]) -> int:
    return EXIT_FAILED if any(c["status"] in (FAIL, ERROR) for c in checks) else EXIT_OK
