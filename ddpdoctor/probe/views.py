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
