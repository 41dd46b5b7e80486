"""The guard's diagnosis: what the ranks reported, turned into GRD findings.

Fed by the side-channel server (`ingest`, one message at a time, under one lock) and asked every
few hundred milliseconds (`tick`) what is new. It never talks to torch; it may ask a rank for its
stack or tell every rank to stop through the `send` callback it is given.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from ddpdoctor.catalog import rule_info
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.guard.notices import Notices
from ddpdoctor.guard.options import GuardOptions
from ddpdoctor.guard.timeline import Timeline

if TYPE_CHECKING:
    from ddpdoctor.guard.schema import Hello

Send = Callable[[int, dict[str, Any]], None]
Fingerprint = tuple[str, str, str, int]  # op, signature, path, line

GUARD_CODES = ("GRD001", "GRD002", "GRD003", "GRD004", "GRD005", "GRD006", "GRD007")
# How long an incomplete position in the sequence may wait for the other ranks before it is judged.
INCOMPLETE_AFTER_S = 1.0
STACK_WAIT_S = 1.5
STRAGGLER_SAMPLES = 4
# How much longer than the stall timeout ranks may wait in init_process_group for one that has not
# even said hello: on a loaded machine, starting Python and importing torch takes a while.
STARTUP_GRACE_S = 20.0
# What each rank counts from its start (schema.COUNTS of them). The collectives of the whole world (every
# rank runs them) are what must agree; those of subgroups may rightly differ from rank to rank.
COUNT_NAMES = ("batches", "DDP forwards", "backwards", "optimizer steps", "collectives in all", "epochs",
               "Join entries", "collectives")
BATCHES, FORWARDS, BACKWARDS, STEPS, COLLECTIVES, EPOCHS, JOINS, WORLD = range(len(COUNT_NAMES))
# Replica checks waiting for the other ranks' hashes (a rank that never gets there leaves them).
MAX_PENDING_HASHES = 64
MAX_EPOCHS_LISTED = 1000


def _name_and_severity(code: str) -> tuple[str, Severity]:
    # The catalog page (rules/GRDnnn.md) is where a code's name and severity are written down.
    info = rule_info(code)
    return (info.name, info.severity) if info is not None else (code.lower(), Severity.ERROR)


def ranks_text(ranks: "list[int] | set[int]") -> str:
    ordered = sorted(ranks)
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(map(str, ordered))


_EVEN_ADVICE = ("Give every rank the same batches and the same forward and backward for each (DistributedSampler "
                "with drop_last=True), or wrap the loop in torch.distributed.algorithms.Join([model])")
_HOROVOD_EVEN_ADVICE = ("Give every rank the same batches and the same backward and optimizer step for each "
                        "(DistributedSampler with drop_last=True), or call hvd.join() when a rank's data runs out")


def _fewer(counts: dict[int, list[int]]) -> list[int]:
    """The ranks whose collectives fall short of the most any rank ran; none when all agree."""
    ran = {r: c[WORLD] for r, c in counts.items()}
    most = max(ran.values(), default=0)
    return sorted(r for r, n in ran.items() if n < most)


def _counted(counts: dict[int, list[int]], horovod: bool = False) -> str:
    shown = (BATCHES, BACKWARDS, STEPS, WORLD) if horovod else (BATCHES, FORWARDS, BACKWARDS, STEPS, WORLD)
    return "; ".join(f"rank {r}: " + ", ".join(f"{c[i]} {COUNT_NAMES[i]}" for i in shown)
                     for r, c in sorted(counts.items()))


def _realign(positions: dict[int, dict[int, Fingerprint]], members: list[int]) -> list[int]:
    """Where every rank has called hvd.join() (a new stretch of sequence numbers on each, see
    guard/horovod.py), the calls before it that some ranks never made were shadowed by the ranks that
    had joined: nothing before it is compared any more."""
    joined = [seq for seq, calls in positions.items()
              if calls and all(r in calls for r in members) and all(fp[0] == "hvd.join" for fp in calls.values())]
    dropped = [s for s in positions if joined and s < max(joined)]
    for seq in dropped:
        del positions[seq]
    return dropped


def describe(fingerprint: Fingerprint) -> str:
    op, signature, path, line = fingerprint
    return f"{op}({signature}) at {path}:{line}"


@dataclass
class RankState:
    rank: int
    world_size: int
    local_rank: Optional[int] = None
    host: str = ""
    connected: bool = True
    finished: bool = False
    next_seq: dict[str, int] = field(default_factory=dict)
    inflight: Optional[tuple[str, int, float]] = None  # group, seq, since (this process's monotonic clock)
    loaders: dict[str, list[Any]] = field(default_factory=dict)
    # The last few calls by (group, seq), to say what a waiting rank waits in.
    recent: dict[tuple[str, int], Fingerprint] = field(default_factory=dict)
    # Grows with every collective, batch and optimizer step the rank reports: a busy rank is not stuck.
    progress: int = 0
    stacks: list[list[tuple[str, int, str]]] = field(default_factory=list)
    # As COUNT_NAMES says.
    counts: list[int] = field(default_factory=lambda: [0] * len(COUNT_NAMES))
    # The script's epochs as they started (set_epoch): ordinal -> [epoch, counts, joined, loader path,
    # loader line, set_epoch path, set_epoch line].
    marks: dict[int, list[Any]] = field(default_factory=dict)


@dataclass
class _Pending:
    """A diagnosis waiting for the stack samples it will quote (or that will call it off)."""

    ranks: set[int]
    asked_at: float
    samples_wanted: int
    interval: float
    build: Callable[[dict[int, list[list[tuple[str, int, str]]]]], Optional[Finding]]
    since: dict[int, int] = field(default_factory=dict)
    next_ask: float = 0.0
    asked: int = 0


class Doctor:
    def __init__(self, options: GuardOptions, send: Send, on_finding: Callable[[Finding], None],
                 clock: Callable[[], float] = time.monotonic, notices: Optional[Notices] = None) -> None:
        self.options = options
        self.notices = notices or Notices()
        # Set when the diagnosis itself failed: the job goes on, undiagnosed from then on.
        self.broken = False
        self.send = send
        self.on_finding = on_finding
        self.clock = clock
        self.lock = threading.RLock()
        self.ranks: dict[int, RankState] = {}
        self.world_size = 0
        self.sequence: dict[str, dict[int, dict[int, Fingerprint]]] = {}
        self.first_seen: dict[tuple[str, int], float] = {}
        self.desynced: set[str] = set()
        self.hashes: dict[tuple[int, str], dict[int, dict[str, Any]]] = {}
        self.replica_checks = 0
        # The script's epoch that the ranks last began together (set_epoch), for GRD005's message.
        self.epoch_begun: Optional[int] = None
        self.marks_disagree = False
        # Set by the runner when the user's Ctrl-C or SIGTERM ended the job: ranks stopped mid-step.
        self.interrupted = False
        self.steps: dict[int, dict[int, float]] = {}
        self.windows: dict[int, deque[float]] = {}
        self.slowest: deque[int] = deque(maxlen=options.straggler_window)
        self.local: dict[tuple[str, str, int, str], Finding] = {}
        self.local_seen: dict[tuple[str, str, int, str], float] = {}
        self.findings: list[Finding] = []
        self.reported: set[Any] = set()
        self.pending: list[_Pending] = []
        self.stop_requested: Optional[str] = None
        self.stall_quiet_until = 0.0
        # Bounded: each rank's step times, and the collectives around the findings (for --html).
        self.timeline = Timeline()
        # The ranks' Flight Recorders (imported here: its aligner quotes this module's helpers).
        from ddpdoctor.guard.flight.desk import FlightDesk

        self.flight = FlightDesk()

    # ------------------------------------------------------------------ input

    def join(self, hello: "Hello") -> None:
        """A rank that proved the run's secret (the server fixed the world size and checked the rank)."""
        with self.lock:
            self.ranks[hello.rank] = RankState(hello.rank, hello.world_size, hello.local_rank, hello.host)
            self.world_size = hello.world_size

    def ingest(self, rank: int, message: dict[str, Any]) -> None:
        """One message from a joined rank, as schema.message checked it."""
        with self.lock:
            state = self.ranks.get(rank)
            if state is None:
                return
            if message["t"] == "stack":
                state.stacks.append(message["frames"])
                del state.stacks[:-8]
                return
            if message["t"] == "fr":
                self.flight.receive(rank, message["on"], message["dump"])
                if message["exit"]:
                    self._flight_leaving(rank)
                return
            now = self.clock()
            for group, seq, op, signature, path, line in message.get("ev", ()):
                fingerprint = (op, signature, path, line)
                self.sequence.setdefault(group, {}).setdefault(seq, {})[rank] = fingerprint
                self.first_seen.setdefault((group, seq), now)
                state.next_seq[group] = max(state.next_seq.get(group, 0), seq + 1)
                state.recent[(group, seq)] = fingerprint
                if len(state.recent) > 16:
                    del state.recent[next(iter(state.recent))]
            inflight = message["inflight"]
            state.inflight = None if inflight is None else (inflight[0], inflight[1], now - inflight[2])
            for step, seconds in message.get("steps", ()):
                self.steps.setdefault(step, {})[rank] = seconds
                self.timeline.step(rank, step, seconds, self.world_size)
            for entry in message.get("hashes", ()):
                self.hashes.setdefault((entry["step"], entry["kind"]), {})[rank] = entry
            for key in sorted(self.hashes)[:-MAX_PENDING_HASHES]:
                del self.hashes[key]
            if "counts" in message:
                state.counts = message["counts"]
            for ordinal, *mark in message.get("marks", ()):
                if len(state.marks) < MAX_PENDING_HASHES * 16:
                    state.marks[ordinal] = mark
            state.loaders.update(message.get("loaders", {}))
            for item in message.get("local", ()):
                self._local(rank, item, now)
            state.progress = message["progress"]
            if message.get("final"):
                state.finished = True

    def fail(self, error: BaseException) -> None:
        """The diagnosis raised: say so once, and leave the job alone from then on."""
        self.broken = True
        self.stop_requested = None
        self.notices.warn("internal", f"internal error in the guard's diagnosis ({type(error).__name__}: {error}); "
                                      "the job goes on undiagnosed")

    def disconnected(self, rank: int) -> None:
        with self.lock:
            if rank in self.ranks:
                self.ranks[rank].connected = False
                self.ranks[rank].inflight = None
                self._flight_leaving(rank)

    # ------------------------------------------------------------------ diagnosis

    def tick(self, final: bool = False) -> None:
        if self.broken:
            return
        try:
            self._tick(final)
        except Exception as error:  # noqa: BLE001 - the guard's own bug must not end the user's job
            self.fail(error)

    def _tick(self, final: bool) -> None:
        with self.lock:
            self.flight.tick(self.clock(), final)
            self._uneven_batches(final)
            self._uneven_epochs()
            if final:
                self._flight_end()
                self._uneven_end()
            self._mismatches(final)
            self._divergence()
            self._stragglers()
            self._locals(final)
            if not final:
                self._stalls()
            self._pending_stacks(final)

    def _emit(self, code: str, ranks: "list[int] | set[int]", message: str, path: str, line: int,
              step: Optional[int] = None, epoch: Optional[int] = None) -> Finding:
        name, severity = _name_and_severity(code)
        finding = Finding(code=code, name=name, severity=severity, message=message, path=path, line=line,
                          source="guard", details={"ranks": sorted(ranks), "step": step, "epoch": epoch})
        self._emit_finding(finding)
        return finding

    def _group_ranks(self, group: str) -> list[int]:
        if group in ("W", "init"):
            return list(range(self.world_size))
        return [int(r) for r in group.split(",") if r]

    def _mismatches(self, final: bool) -> None:
        now = self.clock()
        if any(f.code == "GRD005" for f in self.findings):
            return  # uneven batches already explain every misaligned collective that follows
        for group, positions in self.sequence.items():
            members = self._group_ranks(group)
            for seq in _realign(positions, members):
                self.first_seen.pop((group, seq), None)
            for seq in sorted(positions):
                calls = positions[seq]
                complete = all(r in calls for r in members)
                if group in self.desynced:
                    del positions[seq]
                    continue
                distinct = set((fp[0], fp[1]) for fp in calls.values())
                if len(distinct) <= 1:
                    if complete:
                        del positions[seq]
                        self.first_seen.pop((group, seq), None)
                        continue
                    break  # keep order: judge later positions only after this one
                young = not final and now - self.first_seen.get((group, seq), now) < INCOMPLETE_AFTER_S
                if young and (not complete or self._extra_side(calls, positions.get(seq + 1, {})) is False):
                    break  # wait for the others and, in a tie, for what each calls next (it tells an extra call)
                self._flight_or(functools.partial(self._report_mismatch, group, seq, dict(calls),
                                                  dict(positions.get(seq + 1, {}))))
                self.desynced.add(group)
                del positions[seq]

    @staticmethod
    def _extra_side(calls: dict[int, Fingerprint], following: dict[int, Fingerprint]) -> "list[int] | bool | None":
        """The ranks that made an extra call; None when a majority decides instead; False: not known yet.

        In a tie, a side whose next call is what the other side called here made the extra call.
        """
        sides: dict[tuple[str, str], list[int]] = {}
        for r, fp in sorted(calls.items()):
            sides.setdefault((fp[0], fp[1]), []).append(r)
        sizes = sorted((len(rs) for rs in sides.values()), reverse=True)
        if len(sizes) < 2 or sizes[0] > sizes[1]:
            return None
        for call, rs in sides.items():
            others = {c for c in sides if c != call}
            if len(others) == 1 and all(r in following and (following[r][0], following[r][1]) in others for r in rs):
                return rs
        return False

    def _report_mismatch(self, group: str, seq: int, calls: dict[int, Fingerprint], following: dict[int, Fingerprint]) -> None:
        by_call: dict[tuple[str, str], list[int]] = {}
        for r, fp in sorted(calls.items()):
            by_call.setdefault((fp[0], fp[1]), []).append(r)
        ranked = sorted(by_call.items(), key=lambda item: (-len(item[1]), item[1]))
        extra_side = self._extra_side(calls, following)
        odd: Optional[list[int]] = extra_side if isinstance(extra_side, list) else None
        if extra_side is None:
            odd = [r for _, rs in ranked[1:] for r in rs]
        if odd is not None:
            first = calls[odd[0]]
            rest = sorted(r for r in calls if r not in odd)
            extra = " an extra" if isinstance(extra_side, list) else ""
            message = (f"{ranks_text(odd)} called{extra} {describe(first)} while {ranks_text(rest)} called "
                       f"{describe(calls[rest[0]])} (collective #{seq + 1} of "
                       f"{'the world group' if group == 'W' else 'group ' + group}): the job hangs or mixes up data here")
            self._emit("GRD001", odd, message, first[2], first[3])
            return
        parts = [f"{ranks_text(rs)} called {describe(calls[rs[0]])}" for _, rs in ranked]
        first = calls[ranked[0][1][0]]
        self._emit("GRD001", sorted(calls), f"at collective #{seq + 1}, " + " while ".join(parts)
                   + ": the job hangs or mixes up data here", first[2], first[3])

    def _stalls(self) -> None:
        now = self.clock()
        timeout = self.options.stall_timeout
        if "GRD002" in self.reported:
            return
        for state in list(self.ranks.values()):
            if state.inflight is None or now - state.inflight[2] < timeout:
                continue
            group, seq, since = state.inflight
            members = self._group_ranks(group)
            if self._passed_by_another(group, seq, members):
                # A member is already in (or past) a later call of this group, which it could not have reached
                # without this rank in this one: this report is stale (a rank that stopped reporting mid-call,
                # holding the GIL), and the stall is where that member waits.
                continue
            waiting = {r for r in members if self.ranks.get(r) and self.ranks[r].inflight
                       and self.ranks[r].inflight[:2] == (group, seq)}  # type: ignore[index]
            calls = {r: self.ranks[r].recent[(group, seq)] for r in waiting if (group, seq) in self.ranks[r].recent}
            # Not waiting in this collective: not there yet, or stuck before it (in a forward, a
            # sleep, a loader), or gone.
            missing = set(members) - waiting
            kinds = {(calls[r][0], calls[r][1]) for r in waiting if r in calls}
            if not missing and len(kinds) <= 1:
                continue  # everyone is in the same collective: slow, not stalled
            if group == "init" and now - since < timeout + STARTUP_GRACE_S and missing - set(self.ranks):
                continue  # a rank that has not said hello yet may still be starting (importing torch)
            if now < self.stall_quiet_until:
                return
            self.reported.add("GRD002")
            self.flight.ask(self.send, self._connected(), now)  # read by the time the stacks are in
            live_missing = {r for r in missing if r in self.ranks and self.ranks[r].connected}
            progress = {r: self.ranks[r].progress for r in live_missing}
            # Two stack samples a second apart: a rank that moves on, or draws batches, is busy
            # (rank 0 evaluating while the others wait at a barrier), not stalled.
            self._ask(live_missing, 2 if live_missing else 0, 1.0, functools.partial(
                self._stall_finding, group, seq, waiting, missing, calls, since, progress))
            return

    def _passed_by_another(self, group: str, seq: int, members: list[int]) -> bool:
        for r in members:
            other = self.ranks.get(r)
            if other is None:
                continue
            if other.inflight is not None and other.inflight[0] == group and other.inflight[1] > seq:
                return True
            if any(key[0] == group and key[1] > seq for key in other.recent):
                return True
        return False

    def _ask(self, ranks: set[int], samples: int, interval: float,
             build: Callable[[dict[int, list[list[tuple[str, int, str]]]]], Optional[Finding]]) -> None:
        now = self.clock()
        pending = _Pending(ranks, now, samples, interval, build, since={r: len(self.ranks[r].stacks) for r in ranks},
                           next_ask=now + interval, asked=1 if samples else 0)
        if samples:
            for r in ranks:
                self.send(r, {"t": "stack"})
        self.pending.append(pending)

    def _stall_finding(self, group: str, seq: int, waiting: set[int], missing: set[int],
                       calls: dict[int, Fingerprint], since: float, progress: dict[int, int],
                       stacks: dict[int, list[list[tuple[str, int, str]]]]) -> Optional[Finding]:
        busy = [r for r, before in progress.items() if r in self.ranks and self.ranks[r].connected and (
            self.ranks[r].progress != before or len({tuple(s[:1]) for s in stacks.get(r, [])}) > 1)]
        if busy:
            self.reported.discard("GRD002")
            self.stall_quiet_until = self.clock() + self.options.stall_timeout / 2
            return None
        # A rank that has gone, or whose script has returned (no frame left in the file of its last
        # collective), having run fewer collectives than those waiting for it, left the training loop
        # early (a `break`, a skipped batch): that is the cause, the stall its effect. A rank blocked
        # inside its script is a stall of its own (GRD002 only). Where the Flight Recorder shows the rank skipped
        # one particular call (not one more of a repeated one), that call is the cause instead.
        causes = self.flight.accounts("GRD001")
        accounts = self.flight.accounts("GRD002")
        if not any(not account.details["evidence"]["repeats"] for account in accounts):
            self._left_early({r for r in missing if r in self.ranks and self._outside_script(r, stacks.get(r, []))})
        waited = self.clock() - since
        by_call: dict[Fingerprint, list[int]] = {}
        for r in sorted(waiting):
            if r in calls:
                by_call.setdefault(calls[r], []).append(r)
        waits = "; ".join(f"{ranks_text(rs)} waited {waited:.1f} s in {describe(fp)}" for fp, rs in by_call.items())
        path, line = "<unknown>", 0
        if missing:
            doing = []
            for r in sorted(missing):
                state = self.ranks.get(r)
                frames = (stacks.get(r) or [[]])[-1]
                if state is None:
                    doing.append(f"rank {r} never connected")
                elif not state.connected:
                    doing.append(f"rank {r} has {'finished' if state.finished else 'exited'}")
                elif frames:
                    where = " ← ".join(f"{p}:{ln} in {fn}" for p, ln, fn in frames[:3])
                    doing.append(f"rank {r} is at {where}")
                    if path == "<unknown>":
                        path, line = frames[0][0], frames[0][1]
                else:
                    doing.append(f"rank {r} did not answer")
            blamed = sorted(missing)
            message = f"{waits}, and {ranks_text(blamed)} never arrived: " + "; ".join(doing)
        else:
            blamed = sorted(waiting)
            message = f"{waits}: these collectives cannot match, so none of them will ever complete"
            first = calls[blamed[0]]
            path, line = first[2], first[3]
        for cause in causes:  # the record shows calls that disagree: said first
            self._emit_finding(cause)
        if accounts:
            message += f". The Flight Recorder: {accounts[0].message}"
            if path == "<unknown>" or all(self._outside_script(r, stacks.get(r, [])) for r in blamed if r in self.ranks):
                path, line = accounts[0].path, accounts[0].line  # the missing rank left: where it went astray
        if self.options.on_stall == "stop":
            message += "; the job was stopped"
            self.stop_requested = "GRD002"
        finding = self._emit("GRD002", blamed, message, path, line)
        if accounts:
            finding.details["evidence"] = accounts[0].details["evidence"]
        return finding

    # ------------------------------------------------------------------ the Flight Recorder

    def _connected(self) -> list[int]:
        return sorted(r for r, state in self.ranks.items() if state.connected)

    def _emit_finding(self, finding: Finding) -> None:
        self.findings.append(finding)
        self.timeline.capture(finding, self.ranks, self.clock())
        self.on_finding(finding)

    def _flight_leaving(self, rank: int) -> None:
        """The first rank to end (its last record came, or its connection closed): the others' records now, while
        they are there to send them. A launcher stops the rest of a job within a moment of one rank's failure, and
        a rank stopped by a signal while blocked in a collective sends nothing. Once a run: at a clean end this
        costs each rank one more read of its buffer."""
        self.flight.exited.add(rank)
        others = [r for r in self._connected() if r not in self.flight.exited]
        if others and not self.flight.asked_at_leave:
            self.flight.asked_at_leave = True
            self.flight.ask(self.send, others, self.clock())

    def _flight_or(self, live: Callable[[], None]) -> None:
        """A mismatch seen live: the ranks' Flight Recorders tell it with every rank's shapes and stack, DDP's
        own collectives included (which may disagree before the call seen here); without them, `live` does."""
        def then() -> None:
            accounts = self.flight.accounts("GRD001")
            for finding in accounts:
                self._emit_finding(finding)
            if not accounts:
                live()

        self.flight.ask(self.send, self._connected(), self.clock(), then)

    def _flight_end(self) -> None:
        """At the end of the run: what the ranks' last records (sent as they exited) say that the live diagnosis
        has not. A rank that stopped short of a call the others entered is GRD002 there, unless it is behind
        in a repeated call (a step's all-reduce): uneven batches, which GRD005 tells with every rank's counts."""
        if (self.interrupted or self.stop_requested or any(f.code == "GRD005" for f in self.findings)
                or any(state.counts[JOINS] for state in self.ranks.values())):
            return  # stopped mid-call, already explained, or under Join (whose shadow calls rightly differ)
        for finding in self.flight.accounts("GRD001"):
            if not any(f.code == "GRD001" for f in self.findings):
                self._emit_finding(finding)
        for finding in self.flight.accounts("GRD002"):
            if not finding.details["evidence"]["repeats"] and not any(f.code in ("GRD001", "GRD002")
                                                                     for f in self.findings):
                self._emit_finding(finding)

    def _outside_script(self, r: int, stacks: list[list[tuple[str, int, str]]]) -> bool:
        state = self.ranks[r]
        if not state.connected:
            return True
        if not stacks or not state.recent:
            return False
        script = list(state.recent.values())[-1][2]
        return all(path != script for frames in stacks for path, _, _ in frames)

    def _pending_stacks(self, final: bool) -> None:
        now = self.clock()
        for pending in list(self.pending):
            stacks = {r: self.ranks[r].stacks[pending.since.get(r, 0):] for r in pending.ranks if r in self.ranks}
            if pending.asked < pending.samples_wanted and now >= pending.next_ask:
                for r in pending.ranks:
                    self.send(r, {"t": "stack"})
                pending.asked += 1
                pending.next_ask = now + pending.interval
            have = all(len(stacks.get(r, [])) >= pending.samples_wanted for r in pending.ranks)
            if have or final or now - pending.asked_at > STACK_WAIT_S + pending.interval * pending.samples_wanted:
                self.pending.remove(pending)
                pending.build(stacks)

    def _divergence(self) -> None:
        for step, kind in sorted(self.hashes):
            reports = self.hashes[(step, kind)]
            if len(reports) < self.world_size:
                continue
            del self.hashes[(step, kind)]
            self.replica_checks += 1
            first_rank = min(reports)
            names = reports[first_rank]["names"]
            for index, name in enumerate(names):
                values = {r: entry["values"][index] for r, entry in reports.items() if index < len(entry["values"])}
                counts = Counter(values.values())
                if len(counts) <= 1:
                    continue
                (majority, top), *rest = counts.most_common()
                tie = rest and rest[0][1] == top
                odd = sorted(values) if tie else sorted(r for r, v in values.items() if v != majority)
                others = sorted(r for r in values if r not in odd)
                if ("GRD003", tuple(odd)) in self.reported:
                    continue  # one finding per set of odd ranks: its first differing tensor
                self.reported.add(("GRD003", tuple(odd)))
                differing = sum(1 for i in range(len(names)) if len({e["values"][i] for e in reports.values()
                                                                     if i < len(e["values"])}) > 1)
                versus = f"from {ranks_text(others)}" if others else "from each other"
                synced = "Horovod's gradient allreduce" if kind == "step" else "DDP's all-reduce"
                entry = reports[odd[0]]
                what, where = {"forward": ("parameters and buffers", "checked before the forward here"),
                               "step": ("parameters", "checked right after the optimizer step called here")}.get(
                    kind, ("parameters", "checked after the last step of an epoch or of the run; its last forward "
                           "was here"))
                self._emit("GRD003", odd,
                           f"after optimizer step {step}, {name!r} on {ranks_text(odd)} differs {versus} "
                           f"({differing} of {len(names)} {what} differ; {name!r} is the first): "
                           "the replicas no longer train the same model; something updated a parameter or buffer "
                           f"on some ranks only, after {synced} ({where})",
                           entry.get("path", "<unknown>"), int(entry.get("line", 0)), step=step)

    def _horovod(self) -> bool:
        """A Horovod job (guard/horovod.py records its collectives as hvd.*)."""
        return any(fp[0].startswith("hvd.") for state in self.ranks.values() for fp in state.recent.values())

    def _even_advice(self) -> str:
        return _HOROVOD_EVEN_ADVICE if self._horovod() else _EVEN_ADVICE

    def _uneven_batches(self, final: bool = False) -> None:
        # Under Horovod a rank whose data ran out may call hvd.join() right after its loop, and its
        # allreduces then stand in for the others': there, uneven counts are judged only once a longer
        # rank has waited in a collective (or left, or the job ended) and no rank has joined.
        horovod = self._horovod()
        if horovod and any(state.counts[JOINS] for state in self.ranks.values()):
            return
        now = self.clock()
        passes: dict[tuple[str, int], dict[int, list[Any]]] = {}
        for r, state in self.ranks.items():
            for key, snapshot in state.loaders.items():
                passes.setdefault((key, int(snapshot[2])), {})[r] = snapshot
        for (key, epoch), by_rank in passes.items():
            if len(by_rank) < 2 or ("GRD005", key, epoch) in self.reported:
                continue
            if any(s[6] for s in by_rank.values()):
                continue  # under Join, uneven inputs are handled
            done = [s[3] for s in by_rank.values() if s[4]]
            if not done or max(s[3] for s in by_rank.values()) <= min(done):
                continue
            if not all(s[5] or s[3] <= 1 for s in by_rank.values()):
                continue  # no collective between batches: uneven counts do not hang anything
            counts = {r: int(s[3]) for r, s in by_rank.items()}
            shortest = min(done)
            longer = sorted(r for r, c in counts.items() if c > shortest)
            if horovod and not final and not any(self._stuck(r, now) for r in longer):
                continue
            self.reported.add(("GRD005", key, epoch))
            finished = sorted(r for r, s in by_rank.items() if s[4] and s[3] == shortest)
            path, line = by_rank[longer[0]][0], int(by_rank[longer[0]][1])
            counted = ", ".join(f"rank {r}: {c}{'' if by_rank[r][4] else '+'}" for r, c in sorted(counts.items()))
            self._emit("GRD005", longer,
                       f"in pass {epoch} over the loader iterated here, the ranks drew different numbers of batches "
                       f"({counted}); {ranks_text(finished)} {'has' if len(finished) == 1 else 'have'} finished, so "
                       f"the next collective of {ranks_text(longer)} has no partner and the job hangs there. Give "
                       "every rank the same number of batches (DistributedSampler pads the shards; drop_last=True "
                       "drops the uneven tail) or " + ("call hvd.join() when a rank's data runs out" if horovod else
                                                       "wrap the loop in torch.distributed.algorithms.Join([model])")
                       + ", which lets the finished ranks shadow the others' collectives",
                       path, line, epoch=epoch)

    def _stuck(self, r: int, now: float) -> bool:
        state = self.ranks[r]
        return not state.connected or (state.inflight is not None and now - state.inflight[2] >= INCOMPLETE_AFTER_S)

    def _uneven_epochs(self) -> None:
        """At the start of each of the script's epochs, every rank must have run as many collectives
        (DDP's gradient all-reduces included) as the others: a rank that skipped a batch (`continue`)
        or stopped one early (`break`) is behind from then on, and the job ends in a hang or in
        "Connection closed by peer"."""
        if any(f.code == "GRD005" for f in self.findings) or self.marks_disagree:
            for state in self.ranks.values():
                state.marks.clear()  # nothing will compare them
            return
        if len(self.ranks) < self.world_size or self.world_size < 2:
            return
        ordinals = set.intersection(*(set(state.marks) for state in self.ranks.values()))
        for ordinal in sorted(ordinals):
            marks = {r: state.marks.pop(ordinal) for r, state in self.ranks.items()}
            if len({mark[0] for mark in marks.values()}) > 1:
                # The ranks' n-th set_epoch gave different epochs (a sampler only some ranks use):
                # their marks are not the same points of the script, and nothing more is compared.
                for state in self.ranks.values():
                    state.marks.clear()
                self.marks_disagree = True
                return
            if any(mark[2] for mark in marks.values()):
                continue  # under Join, uneven inputs are handled
            counts = {r: mark[1] for r, mark in marks.items()}
            odd = _fewer(counts)
            begun, self.epoch_begun = self.epoch_begun, marks[min(marks)][0]
            if odd:
                mark = marks[odd[0]]
                path, line = (mark[3], mark[4]) if mark[4] else (mark[5], mark[6])
                during = f"in epoch {begun}" if begun is not None else "before the first epoch"
                self._emit("GRD005", odd,
                           f"{during}, {ranks_text(odd)} ran fewer collectives than the others (counted when "
                           f"set_epoch({mark[0]}) at {mark[5]}:{mark[6]} began the next): {_counted(counts, self._horovod())}. "
                           f"{ranks_text(odd).capitalize()} skipped a batch's forward and backward (a `continue`) or "
                           f"stopped drawing batches early (a `break`) in the loop here: from "
                           f"then on its gradient all-reduces pair with the wrong ones, and the job ends in a hang "
                           f"or in \"Connection closed by peer\" when the first rank leaves. {self._even_advice()}",
                           path, line, epoch=begun)
                return

    def _uneven_end(self) -> None:
        """At the end: a rank that left (finished, or died) having run fewer collectives than the others,
        who then waited for it in vain."""
        if self.stop_requested or self.interrupted or any(f.code in ("GRD001", "GRD002") for f in self.findings):
            return
        # Only a rank that said its last word (its final message, sent at exit) is known to have run
        # no more: a process that ends without running atexit (a multiprocessing child) may have run
        # collectives its reporter never sent.
        self._left_early({r for r, state in self.ranks.items() if state.finished})

    def _left_early(self, suspects: set[int]) -> bool:
        """GRD005 for the suspects that ran fewer world collectives than the others (they left, or
        sit idle after their last one, while the others wait); True when it was reported."""
        if (self.world_size < 2 or len(self.ranks) < self.world_size
                or any(f.code == "GRD005" for f in self.findings)):
            return False
        if any(state.counts[JOINS] for state in self.ranks.values()):
            return False  # under Join, the ranks that run out of inputs shadow the others' collectives
        counts = {r: state.counts for r, state in self.ranks.items()}
        odd = [r for r in _fewer(counts) if r in suspects]
        if not odd:
            return False
        state = self.ranks[odd[0]]
        last = list(state.recent.values())[-1] if state.recent else None
        gone = ("finished" if state.finished else "exited") if not state.connected else "left the training loop"
        after = f"; its last collective was {describe(last)}" if last else ""
        path, line = (last[2], last[3]) if last else ("<unknown>", 0)
        self._emit("GRD005", odd,
                   f"{ranks_text(odd)} {gone} after fewer collectives than the others, who waited for "
                   f"{'it' if len(odd) == 1 else 'them'} in vain: {_counted(counts, self._horovod())}{after}. A rank that skips a "
                   f"batch (`continue`) or stops one early (`break`) ends like this, in a hang or in \"Connection "
                   f"closed by peer\" (a rank that raised ends like this too: then its traceback is the cause). "
                   f"{self._even_advice()}", path, line)
        return True

    def summary(self) -> dict[str, int]:
        """What the guard watched: the counts of the busiest rank (in a clean run, every rank's)."""
        def most(index: int) -> int:
            return max((state.counts[index] for state in self.ranks.values()), default=0)

        return {"ranks": self.world_size, "epochs": most(EPOCHS), "steps": most(STEPS),
                "collectives": most(COLLECTIVES), "replica_checks": self.replica_checks}

    def _stragglers(self) -> None:
        window = self.options.straggler_window
        for step in sorted(self.steps):
            times = self.steps[step]
            if len(times) < self.world_size:
                continue
            del self.steps[step]
            for r, seconds in times.items():
                self.windows.setdefault(r, deque(maxlen=window)).append(seconds)
            self.slowest.append(max(times, key=lambda r: times[r]))
        # A rank that never steps an optimizer leaves the others' steps incomplete: keep a bounded tail.
        for step in sorted(self.steps)[:-4 * window]:
            del self.steps[step]
        if self.world_size < 2 or len(self.slowest) < window:
            return
        medians = {r: statistics.median(w) for r, w in self.windows.items() if len(w) == window}
        for r, median in medians.items():
            if ("GRD006", r) in self.reported:
                continue
            others = statistics.median(m for q, m in medians.items() if q != r)
            slowest_share = sum(1 for s in self.slowest if s == r) / window
            if (median >= self.options.straggler_ratio * others and median - others >= self.options.straggler_min_excess
                    and slowest_share >= 0.75):
                self.reported.add(("GRD006", r))
                self._ask({r}, STRAGGLER_SAMPLES, 0.2, functools.partial(
                    self._straggler_finding, r, median, others, slowest_share))

    def _straggler_finding(self, r: int, median: float, others: float, share: float,
                           stacks: dict[int, list[list[tuple[str, int, str]]]]) -> Finding:
        # Where the rank spends its extra time: the most common top frame among a few samples.
        tops = Counter((s[0][0], s[0][1], s[0][2]) for s in stacks.get(r, []) if s)
        path, line, where = "<unknown>", 0, ""
        if tops:
            (path, line, function), seen = tops.most_common(1)[0]
            where = f"; it was at {path}:{line} in {function} in {seen} of {sum(tops.values())} samples"
        window = self.options.straggler_window
        return self._emit("GRD006", [r],
                          f"rank {r}'s median step time outside collectives over the last {window} optimizer steps "
                          f"is {median * 1000:.1f} ms against {others * 1000:.1f} ms for the other ranks; it was the "
                          f"slowest in {share:.0%} of them, and every step waits for it{where}", path, line)

    def _local(self, rank: int, item: dict[str, Any], now: float) -> None:
        key = (str(item["code"]), str(item["path"]), int(item["line"]), str(item["message"]))
        existing = self.local.get(key)
        epoch = item.get("epoch")
        if existing is not None:
            if rank not in existing.details["ranks"]:
                existing.details["ranks"].append(rank)
                existing.details["ranks"].sort()
            # The same cause in a later epoch: one finding, with every epoch it covers (a bounded list).
            epochs = existing.details["epochs"]
            if epoch is not None and epoch not in epochs and len(epochs) < MAX_EPOCHS_LISTED:
                epochs.append(epoch)
                epochs.sort()
            return
        name, severity = _name_and_severity(key[0])
        self.local[key] = Finding(code=key[0], name=name, severity=severity, message=str(item["message"]),
                                  path=key[1], line=key[2], source="guard",
                                  details={"ranks": [rank], "step": item.get("step"), "epoch": epoch,
                                           "epochs": [] if epoch is None else [epoch]})
        self.local_seen[key] = now

    def _locals(self, final: bool) -> None:
        # Collect the ranks that report the same thing for a moment, then print it once.
        now = self.clock()
        for key, seen in list(self.local_seen.items()):
            if final or now - seen >= INCOMPLETE_AFTER_S:
                del self.local_seen[key]
                finding = self.local[key]
                self.findings.append(finding)
                self.on_finding(finding)
