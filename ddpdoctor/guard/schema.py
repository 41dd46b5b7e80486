"""What the guard accepts on its side channel: every message checked before the doctor sees it.

Types, ranges (a rank below the world size, a world size fixed by the first rank that proved the
run's secret), list lengths and string sizes are bounded; text is returned with control characters
escaped, so that nothing a peer sends can reach a terminal or a report raw. Anything else raises
BadMessage, and the server drops that connection.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.guard.flight.dumps import Dump, DumpError, dump_of, plain_dump
from ddpdoctor.terminal import escape_controls

MAX_WORLD = 1 << 20
MAX_INT = 1 << 53
MAX_HASH = 1 << 64
MAX_SECONDS = 1e9
MAX_TEXT = 4096
MAX_MESSAGE_TEXT = 16384
MAX_EVENTS = 100_000
MAX_ITEMS = 1024  # steps, hashes, local findings, loaders per message
MAX_TENSORS = 1_000_000  # parameter and buffer names in one hash report
MAX_FRAMES = 64
MAX_FLIGHT_ENTRIES = 4000  # a rank's Flight Recorder entries in one message (flight/live.py sends at most these)
GUARD_CODES = frozenset(f"GRD00{n}" for n in range(1, 8))
# A rank's counts (doctor.COUNT_NAMES): batches drawn, DDP forwards, backwards, optimizer steps,
# collectives, epochs, Join entries, collectives of the whole world.
COUNTS = 8
# Replica hashes: before the forward after every --every steps (parameters and buffers), or after
# the last step of an epoch or of the run (parameters only), or right after every --every steps under
# Horovod (parameters only).
HASH_KINDS = ("forward", "end", "step")
_GROUP = re.compile(r"[0-9]+(,[0-9]+)*")


class BadMessage(ValueError):
    """One line for the guard's warning: what was wrong (never the peer's raw text)."""


@dataclass(frozen=True)
class Hello:
    rank: int
    world_size: int
    local_rank: Optional[int]
    host: str
    proof: str  # wire.prove(secret, "rank", the guard's challenge)
    nonce: str  # the rank's challenge to the guard


@dataclass(frozen=True)
class FollowerHello:
    """Another node's guard of the same job. With a shared secret it proves it (`proof`, on the
    server's challenge) and sends none; without, `secret` is the one its own ranks will prove."""

    secret: str
    job: str
    proof: str


def _int(value: Any, what: str, low: int = 0, high: int = MAX_INT) -> int:
    if type(value) is not int or not low <= value <= high:
        raise BadMessage(f"{what} is not an integer in [{low}, {high}]")
    return value


def _seconds(value: Any, what: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
        raise BadMessage(f"{what} is not a finite number of seconds")
    return float(value)


def _text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if type(value) is not str or len(value) > limit:
        raise BadMessage(f"{what} is not a string of at most {limit} characters")
    return escape_controls(value)


def _list(value: Any, what: str, limit: int, length: Optional[int] = None) -> list[Any]:
    if type(value) is not list or len(value) > limit or (length is not None and len(value) != length):
        raise BadMessage(f"{what} is not a list of {length if length is not None else f'at most {limit}'} items")
    return value


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise BadMessage(f"{what} is not true or false")
    return value


def _optional_int(value: Any, what: str) -> Optional[int]:
    return None if value is None else _int(value, what)


def hello(message: dict[str, Any]) -> "Hello | FollowerHello":
    """A connection's first message; its secret is checked by the caller."""
    kind = message.get("t")
    if kind == "follower":
        return FollowerHello(secret=_text(message.get("secret", ""), "secret", 256), job=_text(message.get("job"), "job"),
                             proof=_text(message.get("proof", ""), "proof", 64))
    if kind != "hello":
        raise BadMessage("the first message is not a hello")
    world_size = _int(message.get("world_size"), "world_size", 1, MAX_WORLD)
    return Hello(rank=_int(message.get("rank"), "rank", 0, world_size - 1), world_size=world_size,
                 local_rank=_optional_int(message.get("local_rank"), "local_rank"),
                 host=_text(message.get("host", ""), "host", 256), proof=_text(message.get("proof"), "proof", 64),
                 nonce=_text(message.get("nonce"), "nonce", 64))


def group(value: Any, world_size: int) -> str:
    text = _text(value, "group", 16 * MAX_WORLD)
    if text in ("W", "init"):
        return text
    if not _GROUP.fullmatch(text) or any(int(r) >= world_size for r in text.split(",")):
        raise BadMessage("group is not 'W' or a list of ranks of the job")
    return text


def _event(value: Any, world_size: int) -> tuple[str, int, str, str, str, int]:
    g, seq, op, signature, path, line = _list(value, "an event", 6, 6)
    return (group(g, world_size), _int(seq, "seq"), _text(op, "op", 128), _text(signature, "signature"),
            _text(path, "path"), _int(line, "line"))


def _hashes(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise BadMessage("a hash report is not an object")
    names = [_text(n, "a tensor name") for n in _list(value.get("names"), "names", MAX_TENSORS)]
    values = [_int(v, "a digest", -MAX_HASH, MAX_HASH) for v in _list(value.get("values"), "values", MAX_TENSORS)]
    kind = value.get("kind", "forward")
    if kind not in HASH_KINDS:
        raise BadMessage("a hash report's kind is not 'forward', 'end' or 'step'")
    return {"step": _int(value.get("step"), "step"), "kind": kind, "names": names, "values": values,
            "path": _text(value.get("path", "<unknown>"), "path"), "line": _int(value.get("line", 0), "line")}


def _counts(value: Any) -> list[int]:
    return [_int(n, "a count") for n in _list(value, "counts", COUNTS, COUNTS)]


def _mark(value: Any) -> list[Any]:
    ordinal, epoch, counts, joined, loader_path, loader_line, path, line = _list(value, "an epoch mark", 8, 8)
    return [_int(ordinal, "ordinal"), _int(epoch, "epoch"), _counts(counts), _bool(joined, "joined"),
            _text(loader_path, "path"), _int(loader_line, "line"), _text(path, "path"), _int(line, "line")]


def _loader(value: Any) -> list[Any]:
    path, line, epoch, count, done, syncing, joined = _list(value, "a loader", 7, 7)
    return [_text(path, "path"), _int(line, "line"), _int(epoch, "epoch"), _int(count, "count"),
            _bool(done, "done"), _bool(syncing, "syncing"), _bool(joined, "joined")]


def _local(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise BadMessage("a local finding is not an object")
    code = value.get("code")
    if code not in GUARD_CODES:
        raise BadMessage("a local finding's code is not a GRD code")
    return {"code": code, "message": _text(value.get("message"), "message", MAX_MESSAGE_TEXT),
            "path": _text(value.get("path"), "path"), "line": _int(value.get("line"), "line"),
            "step": _optional_int(value.get("step"), "step"), "epoch": _optional_int(value.get("epoch"), "epoch")}


def _frame(value: Any) -> tuple[str, int, str]:
    path, line, function = _list(value, "a frame", 3, 3)
    return _text(path, "path"), _int(line, "line"), _text(function, "function", 256)


def _flight(value: Any) -> Optional[Dump]:
    """A rank's Flight Recorder as JSON (None: it has none), checked as a dump file is (flight/dumps.py): plain
    data only, bounded, every entry's fields typed, text made printable. It never arrives pickled."""
    if value is None:
        return None
    try:
        return dump_of(plain_dump(value), -1, "the side channel", MAX_FLIGHT_ENTRIES)
    except DumpError as error:
        raise BadMessage(f"a Flight Recorder dump that {error}") from None


def message(value: dict[str, Any], world_size: int) -> dict[str, Any]:
    """A rank's message after its hello, checked and with its text escaped."""
    kind = value.get("t")
    if kind == "stack":
        return {"t": "stack", "frames": [_frame(f) for f in _list(value.get("frames", []), "frames", MAX_FRAMES)]}
    if kind == "fr":
        return {"t": "fr", "on": _bool(value.get("on", False), "on"), "dump": _flight(value.get("dump")),
                "exit": _bool(value.get("exit", False), "exit")}
    if kind != "state":
        raise BadMessage("a message that is neither state, stack nor fr")
    checked: dict[str, Any] = {"t": "state", "progress": _int(value.get("progress", 0), "progress")}
    if "ev" in value:
        checked["ev"] = [_event(e, world_size) for e in _list(value["ev"], "ev", MAX_EVENTS)]
    inflight = value.get("inflight")
    if inflight is not None:
        g, seq, seconds = _list(inflight, "inflight", 3, 3)
        checked["inflight"] = (group(g, world_size), _int(seq, "seq"), _seconds(seconds, "inflight seconds"))
    else:
        checked["inflight"] = None
    if "steps" in value:
        checked["steps"] = [(_int(s[0], "step"), _seconds(s[1], "step seconds"))
                            for s in (_list(item, "a step", 2, 2) for item in _list(value["steps"], "steps", MAX_ITEMS))]
    if "hashes" in value:
        checked["hashes"] = [_hashes(h) for h in _list(value["hashes"], "hashes", MAX_ITEMS)]
    if "loaders" in value:
        loaders = value["loaders"]
        if type(loaders) is not dict or len(loaders) > MAX_ITEMS:
            raise BadMessage(f"loaders is not an object of at most {MAX_ITEMS} entries")
        checked["loaders"] = {_text(k, "a loader key"): _loader(v) for k, v in loaders.items()}
    if "counts" in value:
        checked["counts"] = _counts(value["counts"])
    if "marks" in value:
        checked["marks"] = [_mark(m) for m in _list(value["marks"], "marks", MAX_ITEMS)]
    if "local" in value:
        checked["local"] = [_local(item) for item in _list(value["local"], "local", MAX_ITEMS)]
    if "final" in value:
        checked["final"] = _bool(value["final"], "final")
    return checked
