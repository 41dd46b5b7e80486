"""Reading Flight Recorder dumps: torch writes one file per rank, `<TORCH_FR_DUMP_TEMP_FILE><rank>`, holding a
pickled dict (or, from `_dump_fr_trace_json`, the same dict as JSON):

    {"version": "2.10", "pg_config": {name: {"name", "desc", "ranks": "[0, 1]"}}, "pg_status": {...},
     "entries": [{"process_group": (name, desc), "collective_seq_id", "p2p_seq_id", "is_p2p", "op_id",
                  "record_id", "profiling_name": "gloo:all_reduce", "input_sizes": [[2]], "input_dtypes":
                  ["Float"], "output_sizes", "output_dtypes", "state": "scheduled|started|completed",
                  "frames": [{"name", "filename", "line"}, ...innermost first], ...}, ...]}

A dump may come from anywhere (a shared file system, a bug report), so unpickling never builds anything but
plain containers, strings and numbers: no class is ever looked up, so no code can run. Sizes are bounded, and
whatever does not have the shape above is refused with one line naming the file.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Any, Optional

MAX_DUMP_BYTES = 256 * 1024 * 1024  # torch's default ring buffer of 2,000 entries with stacks is a few MiB
MAX_ENTRIES = 200_000
MAX_FRAMES = 64  # per entry: the innermost ones, where the user's call is
MAX_TENSORS = 256  # per entry, inputs or outputs
MAX_DIMS = 16
MAX_TEXT = 4096
MAX_NODES = 50_000_000  # containers and scalars in one dump, shared references counted each time they are met
_TRAILING_RANK = re.compile(r"^(.*?)(\d+)$")


class DumpError(Exception):
    """A file that is not a Flight Recorder dump we can trust; the message is one line."""


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str


@dataclass(frozen=True)
class Entry:
    group: str  # the process group's name ("0" is the default group)
    group_desc: str
    seq: int  # collective_seq_id (p2p_seq_id for point-to-point entries)
    is_p2p: bool
    op_id: int
    record_id: int  # the position in the rank's ring buffer since it started: 0 for its first entry
    operation: str  # "gloo:all_reduce", "nccl:broadcast", ...
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    state: str
    frames: tuple[Frame, ...]


@dataclass
class Dump:
    rank: int
    path: str
    version: str
    entries: list[Entry]
    # Group name -> its global ranks, where the dump says (torch 2.13's gloo dumps leave this empty).
    group_ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Nothing was dropped from the ring buffer: the first entry the rank recorded is still there."""
        return bool(self.entries) and min(e.record_id for e in self.entries) == 0


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, str, bytes, int, float, bool and None, and nothing else: every
    opcode that would reach a class or a function (GLOBAL, STACK_GLOBAL, EXT*, INST, OBJ, REDUCE of a
    looked-up callable) needs `find_class` first, and it refuses."""

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(f"refers to {module[:80]}.{name[:80]}, which a Flight Recorder dump never does")

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError("uses a persistent id, which a Flight Recorder dump never does")


_PLAIN_SCALARS = (str, bytes, int, float, bool, type(None))


def _check_plain(value: Any) -> None:
    """Only plain data, bounded: what the unpickler built is walked once, iteratively."""
    budget = MAX_NODES
    stack = [value]
    while stack:
        item = stack.pop()
        budget -= 1
        if budget < 0:
            raise DumpError("is too large (too many values)")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif not isinstance(item, _PLAIN_SCALARS):
            raise DumpError(f"holds a {type(item).__name__}, which a Flight Recorder dump never does")


def unpickle_plain(data: bytes) -> Any:
    """What a pickle holds, built by the reader that builds nothing but plain data (not yet walked and bounded:
    `plain_dump` does that; a rank reading its own torch's bytes needs only this)."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except DumpError:
        raise
    except RecursionError:
        raise DumpError("is nested too deeply") from None
    except Exception as error:  # noqa: BLE001 - junk makes the unpickler raise almost anything
        raise DumpError(f"is not a readable pickle ({type(error).__name__})") from None


def decode(data: bytes) -> dict[str, Any]:
    """The dump's top-level dict from the file's bytes (pickle or JSON); DumpError on anything else."""
    stripped = data.lstrip()
    if stripped.startswith(b"{"):
        try:
            value: Any = json.loads(data)
        except (ValueError, RecursionError) as error:
            raise DumpError(f"is not valid JSON ({str(error).splitlines()[0][:120]})") from None
    elif data[:1] == b"\x80":
        value = unpickle_plain(data)
    else:
        raise DumpError("is neither a pickled nor a JSON Flight Recorder dump")
    return plain_dump(value)


def plain_dump(value: Any) -> dict[str, Any]:
    """`value` if it is plain data (bounded) shaped like a dump's top-level dict; DumpError otherwise."""
    _check_plain(value)
    if not isinstance(value, dict) or not isinstance(value.get("entries"), list):
        raise DumpError("has no list of entries: not a Flight Recorder dump")
    return value


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise DumpError(f"has a {what} that is not text")
    # Printed on terminals later: no control characters from a file.
    value = value[:MAX_TEXT]
    return value if value.isprintable() else "".join(c if c.isprintable() else "?" for c in value)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise DumpError(f"has a {what} that is not an integer")
    return value


def _sizes(value: Any, what: str) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_TENSORS:
        raise DumpError(f"has {what} that are not a list of shapes")
    shapes = []
    for shape in value:
        if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
            raise DumpError(f"has {what} that are not a list of shapes")
        shapes.append(tuple(_int(d, what) for d in shape))
    return tuple(shapes)


def _dtypes(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_TENSORS:
        raise DumpError(f"has {what} that are not a list of names")
    return tuple(_text(v, what)[:64] for v in value)


def _frames(value: Any) -> tuple[Frame, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise DumpError("has frames that are not a list")
    frames = []
    for item in value[:MAX_FRAMES]:
        if not isinstance(item, dict):
            raise DumpError("has a frame that is not a dict")
        frames.append(Frame(_text(item.get("filename", "?"), "frame file"), _int(item.get("line", 0), "frame line"),
                            _text(item.get("name", "?"), "frame name")))
    return tuple(frames)


def _entry(raw: Any) -> Entry:
    if not isinstance(raw, dict):
        raise DumpError("has an entry that is not a dict")
    group = raw.get("process_group")
    if not isinstance(group, (list, tuple)) or len(group) != 2:
        raise DumpError("has an entry without a (name, description) process group")
    is_p2p = raw.get("is_p2p", False)
    if not isinstance(is_p2p, bool):
        raise DumpError("has an entry whose is_p2p is not a boolean")
    seq = _int(raw.get("p2p_seq_id" if is_p2p else "collective_seq_id"), "sequence id")
    state = raw.get("state", "")
    return Entry(
        group=_text(group[0], "process group name"), group_desc=_text(group[1], "process group description"),
        seq=seq, is_p2p=is_p2p, op_id=_int(raw.get("op_id", 0), "op id"),
        record_id=_int(raw.get("record_id", 0), "record id"),
        operation=_text(raw.get("profiling_name"), "profiling name"),
        input_sizes=_sizes(raw.get("input_sizes", ()), "input sizes"),
        input_dtypes=_dtypes(raw.get("input_dtypes", ()), "input dtypes"),
        output_sizes=_sizes(raw.get("output_sizes", ()), "output sizes"),
        output_dtypes=_dtypes(raw.get("output_dtypes", ()), "output dtypes"),
        state=_text(state, "state") if state is not None else "",
        frames=_frames(raw.get("frames")),
    )


def _group_ranks(pg_config: Any) -> dict[str, tuple[int, ...]]:
    """Group name -> ranks, from `pg_config` where it names them ("[0, 1]"); entries it cannot read are left
    out (the aligner then takes the members from the dumps themselves)."""
    ranks: dict[str, tuple[int, ...]] = {}
    if not isinstance(pg_config, dict):
        return ranks
    for name, config in list(pg_config.items())[:10_000]:
        if not isinstance(name, str) or not name or not isinstance(config, dict):
            continue
        listed = config.get("ranks")
        if isinstance(listed, str) and re.fullmatch(r"\s*\[[\d,\s]*\]\s*", listed[:MAX_TEXT]):
            members = tuple(int(r) for r in re.findall(r"\d+", listed))
        elif isinstance(listed, (list, tuple)) and all(isinstance(r, int) and not isinstance(r, bool) for r in listed):
            members = tuple(listed)
        else:
            continue
        if members:
            ranks[name] = members
    return ranks


def read_dump(path: str, rank: int) -> Dump:
    try:
        size = os.path.getsize(path)
        if size > MAX_DUMP_BYTES:
            raise DumpError(f"is {size} bytes, more than the {MAX_DUMP_BYTES} a dump may have")
        with open(path, "rb") as handle:
            data = handle.read(MAX_DUMP_BYTES + 1)
    except OSError as error:
        raise DumpError(f"cannot be read: {error.strerror or error}") from None
    return dump_of(decode(data), rank, path)


def dump_of(raw: dict[str, Any], rank: int, path: str, max_entries: Optional[int] = None) -> Dump:
    """The Dump in a top-level dict that `plain_dump` accepted: the same checks whether it came from a file or, as
    JSON, over the live guard's side channel (which sets a lower `max_entries`)."""
    entries = raw["entries"]
    max_entries = MAX_ENTRIES if max_entries is None else max_entries
    if len(entries) > max_entries:
        raise DumpError(f"has {len(entries)} entries, more than {max_entries}")
    version = raw.get("version", "")
    return Dump(rank=rank, path=path, version=_text(version, "version") if version is not None else "",
                entries=[_entry(e) for e in entries], group_ranks=_group_ranks(raw.get("pg_config")))


def dump_files(where: str) -> dict[int, str]:
    """Rank -> file of one set of dumps: `where` is a directory holding one set (files named PREFIX<rank>), or the
    prefix itself, as given to TORCH_FR_DUMP_TEMP_FILE (`/tmp/fr/trace_` for /tmp/fr/trace_0, trace_1, ...)."""
    if os.path.isdir(where):
        directory, prefix = where, None
    else:
        directory, prefix = os.path.dirname(where) or ".", os.path.basename(where)
        if not os.path.isdir(directory):
            raise DumpError(f"{where}: no such directory or dump prefix")
    sets: dict[str, dict[int, str]] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise DumpError(f"{directory}: cannot be listed: {error.strerror or error}") from None
    for name in names:
        match = _TRAILING_RANK.match(name)
        path = os.path.join(directory, name)
        if not match or not os.path.isfile(path) or (prefix is not None and match.group(1) != prefix):
            continue
        sets.setdefault(match.group(1), {})[int(match.group(2))] = path
    if not sets:
        raise DumpError(f"{where}: no Flight Recorder dumps (files named PREFIX<rank>, as TORCH_FR_DUMP_TEMP_FILE "
                        "makes them)")
    if len(sets) > 1:
        raise DumpError(f"{where}: several sets of dumps ({', '.join(repr(p) for p in sorted(sets))}): "
                        "name one by its prefix, e.g. DIR/PREFIX")
    return next(iter(sets.values()))
