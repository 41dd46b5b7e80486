"""The Flight Recorder at the guard's end: the records the ranks send, asked for when a diagnosis needs them,
judged by `align` as `ddpdoctor guard --analyze` judges dump files.

Ranks send their record when asked (a mismatch seen live, a stall) and once as they exit (flight/live.py). `ask`
sends the request and calls back once every asked rank has answered or FLIGHT_WAIT_S has passed; `accounts`
judges what arrived and gives each account (a process group's first disagreement) once. Each rank says once its
process group is up whether it records at all; where none does (an older torch, Horovod, TORCH_FR_BUFFER_SIZE=0),
nothing is asked or awaited, and the guard diagnoses as it does without a recorder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Optional

from ddpdoctor.findings import Finding
from ddpdoctor.guard.flight.align import judge
from ddpdoctor.guard.flight.dumps import Dump

# How long a diagnosis waits for the records it asked for: a rank reads its buffer in milliseconds, on its
# reporter thread, even while its main thread is blocked in a collective.
FLIGHT_WAIT_S = 2.0


@dataclass
class _Wait:
    at: float
    ranks: set[int]
    then: Callable[[], None]


def _told_key(finding: Finding) -> tuple[Any, ...]:
    evidence = finding.details["evidence"]
    return (evidence["group"], evidence["seq"])


class FlightDesk:
    def __init__(self) -> None:
        self.dumps: dict[int, Dump] = {}
        self.recording: set[int] = set()  # the ranks that said they have a recorder
        self.waits: list[_Wait] = []
        self.told: set[tuple[Any, ...]] = set()
        self.asked_at_leave = False
        self.exited: set[int] = set()  # the ranks that sent their last record or closed their connection

    def receive(self, rank: int, on: bool, dump: Optional[Dump]) -> None:
        if on:
            self.recording.add(rank)
        else:
            self.recording.discard(rank)
        if dump is not None and dump.entries:
            self.dumps[rank] = replace(dump, rank=rank, path=f"rank {rank}'s Flight Recorder")
        for wait in self.waits:
            wait.ranks.discard(rank)

    @property
    def off(self) -> bool:
        return not self.recording

    def ask(self, send: Callable[[int, dict[str, Any]], None], ranks: Iterable[int], now: float,
            then: Optional[Callable[[], None]] = None) -> None:
        if self.off:
            if then is not None:
                then()
            return
        asked = set(ranks)
        for rank in sorted(asked):
            send(rank, {"t": "fr"})
        if then is not None:
            self.waits.append(_Wait(now, asked, then))

    def tick(self, now: float, final: bool) -> None:
        for wait in list(self.waits):
            if not wait.ranks or final or now - wait.at >= FLIGHT_WAIT_S:
                self.waits.remove(wait)
                wait.then()

    def accounts(self, code: str) -> list[Finding]:
        """The records' findings of this code not given yet (at most one per process group); each is given once."""
        if len(self.dumps) < 2:
            return []
        fresh = [f for f in judge(list(self.dumps.values())) if f.code == code and _told_key(f) not in self.told]
        self.told.update(_told_key(f) for f in fresh)
        return fresh
