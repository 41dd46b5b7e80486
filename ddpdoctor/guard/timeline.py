"""What the guard keeps for the picture of a run (`--html`): each rank's step times, bounded, and the
collectives each rank had recorded when a finding about collectives was made.

Fed by the doctor under its lock; nothing here grows with the length of the run: a rank's series
holds at most `MAX_POINTS` buckets (adjacent buckets merge, two into one, when it would hold more;
fewer in a job so large that all ranks together would hold more than `MAX_POINTS_IN_ALL`), and only
the first `MAX_MOMENTS` findings about collectives keep their snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ddpdoctor.findings import Finding
    from ddpdoctor.guard.doctor import RankState

MAX_POINTS = 2000
# All ranks together: a job of thousands of ranks keeps fewer points per rank (at least MIN_POINTS).
MAX_POINTS_IN_ALL = 200_000
MIN_POINTS = 64
# The last collectives quoted per rank (the doctor's RankState.recent keeps as many).
MAX_COLLECTIVES = 16
MAX_MOMENTS = 4
MAX_RANKS = 1 << 20
# The findings whose cause lies in the order of the collectives.
COLLECTIVE_CODES = ("GRD001", "GRD002", "GRD005")


class StepSeries:
    """One rank's step times, as buckets of `width` consecutive optimizer steps each (mean and
    maximum, so that a single slow step still shows after downsampling)."""

    __slots__ = ("bound", "width", "buckets")

    def __init__(self, bound: int = MAX_POINTS) -> None:
        self.bound = max(2, bound)
        self.width = 1
        # [bucket index, sum of seconds, count, max seconds]; bucket i holds steps i*width+1 .. (i+1)*width.
        self.buckets: list[list[float]] = []

    def add(self, step: int, seconds: float) -> None:
        index = (max(step, 1) - 1) // self.width
        last = self.buckets[-1] if self.buckets else None
        if last is not None and last[0] == index:
            last[1] += seconds
            last[2] += 1
            last[3] = max(last[3], seconds)
            return
        self.buckets.append([index, seconds, 1, seconds])
        if len(self.buckets) > self.bound:
            self._halve()

    def _halve(self) -> None:
        self.width *= 2
        merged: list[list[float]] = []
        for index, total, count, most in self.buckets:
            index //= 2
            if merged and merged[-1][0] == index:
                previous = merged[-1]
                previous[1] += total
                previous[2] += count
                previous[3] = max(previous[3], most)
            else:
                merged.append([index, total, count, most])
        self.buckets = merged

    def points(self) -> list[tuple[int, float, float]]:
        """(last step of the bucket, mean seconds, max seconds), in step order."""
        return [(int(index + 1) * self.width, total / count, most) for index, total, count, most in self.buckets]


@dataclass
class Call:
    """One collective as one rank recorded it."""

    group: str
    seq: int
    op: str
    signature: str
    path: str
    line: int
    # "done", or "waiting": the rank was blocked in it.
    state: str
    waited: float = 0.0


@dataclass
class Moment:
    """Each rank's last collectives when a finding about collectives was made."""

    code: str
    ranks: list[int]
    message: str
    calls: dict[int, list[Call]]
    # Each rank's state then: "running", "finished" or "exited" (gone without its final message).
    status: dict[int, str]


@dataclass
class Timeline:
    series: dict[int, StepSeries] = field(default_factory=dict)
    moments: list[Moment] = field(default_factory=list)
    # The ranks' last collectives when the run ended (shown when no finding took a snapshot).
    end: Optional[Moment] = None
    bound: int = MAX_POINTS

    def step(self, rank: int, step: int, seconds: float, world_size: int) -> None:
        series = self.series.get(rank)
        if series is None:
            if len(self.series) >= MAX_RANKS:
                return
            bound = min(self.bound, max(MIN_POINTS, MAX_POINTS_IN_ALL // max(world_size, 1)))
            series = self.series[rank] = StepSeries(bound)
        series.add(step, seconds)

    def capture(self, finding: "Finding", ranks: "dict[int, RankState]", now: float) -> None:
        if finding.code in COLLECTIVE_CODES and len(self.moments) < MAX_MOMENTS:
            self.moments.append(Moment(finding.code, list(finding.details.get("ranks", [])), finding.message,
                                       snapshot(ranks, now), statuses(ranks)))

    def ended(self, ranks: "dict[int, RankState]", now: float) -> None:
        calls = snapshot(ranks, now)
        if any(calls.values()):
            self.end = Moment("", [], "", calls, statuses(ranks))


def snapshot(ranks: "dict[int, RankState]", now: float) -> dict[int, list[Call]]:
    taken: dict[int, list[Call]] = {}
    for rank, state in sorted(ranks.items()):
        inflight = state.inflight[:2] if state.inflight is not None else None
        calls = []
        for (group, seq), (op, signature, path, line) in list(state.recent.items())[-MAX_COLLECTIVES:]:
            waiting = inflight == (group, seq)
            waited = now - state.inflight[2] if waiting and state.inflight is not None else 0.0
            calls.append(Call(group, seq, op, signature, path, line, "waiting" if waiting else "done", waited))
        taken[rank] = calls
    return taken


def statuses(ranks: "dict[int, RankState]") -> dict[int, str]:
    return {r: "finished" if s.finished else "running" if s.connected else "exited" for r, s in ranks.items()}
