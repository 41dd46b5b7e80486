"""Extra tables a check's record carries beyond its one-line summary (bandwidth's sweep), as plain
rows: the report draws them as a rich table on a terminal and as plain lines in a pipe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddpdoctor.probe.results import CheckRecord


@dataclass(frozen=True)
class DetailTable:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def size_text(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def bandwidth_table(rec: CheckRecord) -> Optional[DetailTable]:
    sweep = rec.get("detail", {}).get("sweep")
    if not sweep:
        return None
    return DetailTable(
        title="all-reduce bandwidth (slowest rank; busbw = algbw x 2(n-1)/n)",
        headers=("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)"),
        rows=tuple(
            (size_text(row["bytes"]), f"{row['time_us']:.1f}", f"{row['algbw_GBps']:.3f}", f"{row['busbw_GBps']:.3f}")
            for row in sweep
        ),
    )


def link_table(rec: CheckRecord) -> Optional[DetailTable]:
    """The link map as a matrix: the row's rank sends to the column's; * marks a slow pair."""
    from ddpdoctor.probe.linkmap import cell, slow_cells

    detail = rec.get("detail", {})
    bandwidth, latency = detail.get("bandwidth_GBps"), detail.get("latency_us")
    if not bandwidth or not latency:
        return None
    n = len(bandwidth)
    slow = slow_cells(detail)
    rows = tuple(
        (f"r{a}", *(("*" if (a, b) in slow else "") + cell(bandwidth[a][b], latency[a][b]) for b in range(n)))
        for a in range(n)
    )
    return DetailTable(
        title=f"link map, {size_text(int(detail.get('bytes', 0)))} messages (row sends to column; * slow)",
        headers=("from\\to", *(f"r{b}" for b in range(n))),
        rows=rows,
    )
