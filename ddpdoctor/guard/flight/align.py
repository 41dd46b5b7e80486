"""Line the Flight Recorder entries of all ranks up by process group and sequence id, and judge them.

Within a process group every rank numbers its collectives 1, 2, 3, ... (`collective_seq_id`); entry n of
one rank must be the same operation, on tensors of the same shapes and dtypes, as entry n of every other
member. Walking the ids upwards, the first one where they differ is GRD001; the first one some members
recorded and others never reached is GRD002 (the others wait there). Point-to-point entries (send/recv)
pair a send with a recv on another rank and are not compared. Only ids every member could still hold are
judged: torch keeps the last TORCH_FR_BUFFER_SIZE entries, so older ones may be gone from one rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from ddpdoctor.findings import Finding
from ddpdoctor.guard.doctor import Doctor, Fingerprint, _name_and_severity, ranks_text
from ddpdoctor.guard.flight.dumps import Dump, Entry, Frame
from ddpdoctor.guard.flight.userframes import AUTOGRAD as _AUTOGRAD
from ddpdoctor.guard.flight.userframes import DDP_FILE as _DDP_FILE
from ddpdoctor.guard.flight.userframes import NOT_USER as _NOT_USER
from ddpdoctor.guard.frames import display_path

# c10's ScalarType names, as the recorder writes them, in torch's own spelling.
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
           "ComplexFloat": "complex64", "ComplexDouble": "complex128", "ComplexHalf": "complex32"}
# Operations whose tensors may legitimately differ in shape between ranks (uneven splits, a root's list):
# only the operation and the dtypes are compared for them, as the live guard does.
_SHAPES_MAY_DIFFER = frozenset({
    "all_gather", "_allgather_base", "all_gather_v", "allgather_coalesced", "all_gather_into_tensor_coalesced",
    "ALLGATHER_coalesced", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base",
    "gather", "scatter", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_v",
    "reduce_scatter_tensor_coalesced", "REDUCE_SCATTER_coalesced"})
# Operations with a root whose tensors only the root passes (gather's outputs, scatter's inputs): the others
# record none there, so only which dtypes take part is compared.
_ROOTED = frozenset({"gather", "scatter"})
STACK_DEPTH = 3  # user frames quoted per rank in a message (all of them go into the JSON evidence)


def operation(entry: Entry) -> str:
    """`all_reduce` from `gloo:all_reduce`."""
    return entry.operation.split(":", 1)[-1].strip() or "?"


def tensors(entry: Entry) -> str:
    """`float32[2, 3], int64[4]`: the inputs as the live guard writes a call's signature."""
    parts = []
    for index, shape in enumerate(entry.input_sizes):
        dtype = entry.input_dtypes[index] if index < len(entry.input_dtypes) else "?"
        parts.append(f"{_DTYPES.get(dtype, dtype.lower())}[{', '.join(map(str, shape))}]")
    if not parts:
        parts = [_DTYPES.get(d, d.lower()) for d in entry.input_dtypes]
    return ", ".join(parts)


def key(entry: Entry) -> tuple[Any, ...]:
    """What must agree between ranks at one sequence id."""
    op = operation(entry)
    if op in _ROOTED:
        return (op, tuple(sorted(set(entry.input_dtypes) | set(entry.output_dtypes))))
    if op in _SHAPES_MAY_DIFFER:
        return (op, entry.input_dtypes, entry.output_dtypes)
    return (op, entry.input_sizes, entry.input_dtypes, entry.output_sizes, entry.output_dtypes)


def user_frames(entry: Entry) -> list[Frame]:
    return [f for f in entry.frames if not _NOT_USER.search(f.path)]


def via(entry: Entry) -> str:
    """Where inside torch the call came from, when it was not the user's own call: DDP's constructor or forward,
    or the autograd engine (DDP's gradient bucket all-reduce is launched from a backward hook)."""
    inner = [f for f in entry.frames if _NOT_USER.search(f.path) and not f.path.startswith("<")]
    for frame in inner:
        if _DDP_FILE.search(frame.path):
            return f" inside DDP ({frame.function})"
    if inner and not any("distributed_c10d" in f.path for f in inner[:1]) and any(_AUTOGRAD.search(f.path)
                                                                                  for f in inner):
        return " during backward() (a gradient hook: DDP's bucket all-reduce)"
    return ""


def where(entry: Entry) -> tuple[str, int]:
    frames = user_frames(entry)
    return (display_path(frames[0].path), frames[0].line) if frames else ("<unknown>", 0)


def describe(entry: Entry) -> str:
    path, line = where(entry)
    return f"{operation(entry)}({tensors(entry)}) at {path}:{line}{via(entry)}"


def stack_text(entry: Entry) -> str:
    return " ← ".join(f"{display_path(f.path)}:{f.line} in {f.function}" for f in user_frames(entry)[:STACK_DEPTH])


def _evidence(group: str, seq: int, calls: dict[int, Entry]) -> dict[str, Any]:
    return {"source": "flight_recorder", "group": group, "seq": seq, "ranks": {
        str(r): {"operation": e.operation, "input_sizes": [list(s) for s in e.input_sizes],
                 "input_dtypes": list(e.input_dtypes), "output_sizes": [list(s) for s in e.output_sizes],
                 "output_dtypes": list(e.output_dtypes), "state": e.state,
                 "frames": [f"{display_path(f.path)}:{f.line} in {f.function}" for f in user_frames(e)]}
        for r, e in sorted(calls.items())}}


def _finding(code: str, ranks: "list[int]", message: str, at: Entry, evidence: dict[str, Any]) -> Finding:
    name, severity = _name_and_severity(code)
    path, line = where(at)
    return Finding(code=code, name=name, severity=severity, message=message, path=path, line=line, source="guard",
                   details={"ranks": sorted(ranks), "step": None, "epoch": None, "evidence": evidence})


@dataclass
class _Group:
    name: str
    desc: str
    members: list[int]
    calls: dict[int, dict[int, Entry]]  # rank -> seq -> its (first) entry at that id


def _group_label(group: _Group) -> str:
    if group.desc == "default_pg":
        return "the world group"
    return f"group {group.name}" + (f" ({group.desc})" if group.desc and group.desc != "undefined" else "")


def groups(dumps: list[Dump]) -> list[_Group]:
    """Each process group with its members that left a usable dump, and every member's entries by sequence id."""
    usable = [d for d in dumps if d.entries]
    result: dict[str, _Group] = {}
    for dump in usable:
        for entry in dump.entries:
            if entry.is_p2p or entry.seq <= 0:
                continue
            group = result.setdefault(entry.group, _Group(entry.group, entry.group_desc, [], {}))
            # Coalesced operations share one id: the first stands for them (fr_trace matches them as a unit too).
            group.calls.setdefault(dump.rank, {}).setdefault(entry.seq, entry)
    have = {d.rank for d in usable}
    for group in result.values():
        listed = next((d.group_ranks[group.name] for d in usable if group.name in d.group_ranks), None)
        if listed is not None:
            members = set(listed) & have
        elif group.desc == "default_pg":
            members = have
        else:  # a subgroup the dumps do not describe: those that used it
            members = set(group.calls)
        # A member without a single entry of the group may have had them pushed out of its ring buffer: it is
        # judged only if nothing was ever dropped from its buffer.
        group.members = sorted(r for r in members if r in group.calls
                               or next(d for d in usable if d.rank == r).complete)
    return sorted(result.values(), key=lambda g: (len(g.name), g.name))


def _fingerprint(entry: Entry) -> Fingerprint:
    return (operation(entry), repr(key(entry)), *where(entry))


def _mismatch(group: _Group, seq: int, calls: dict[int, Entry], following: dict[int, Entry]) -> Finding:
    sides: dict[tuple[Any, ...], list[int]] = {}
    for r, entry in sorted(calls.items()):
        sides.setdefault(key(entry), []).append(r)
    ranked = sorted(sides.values(), key=lambda rs: (-len(rs), rs))
    # The live guard's judgment: a majority names the odd ranks; in a tie, the side whose next call is what the
    # other side called here made an extra call; else all are named.
    extra_side = Doctor._extra_side({r: _fingerprint(e) for r, e in calls.items()},
                                    {r: _fingerprint(e) for r, e in following.items()})
    odd: Optional[list[int]] = None
    if extra_side is None:
        odd = [r for rs in ranked[1:] for r in rs]
    elif isinstance(extra_side, list):
        odd = extra_side
    label = f"collective #{seq} of {_group_label(group)}, from the Flight Recorder"
    stacks = "; ".join(f"rank {r}: {stack_text(e) or 'no frame of your code'}" for r, e in sorted(calls.items()))
    if odd is not None:
        rest = [r for r in sorted(calls) if r not in odd]
        extra = " an extra" if isinstance(extra_side, list) else ""
        message = (f"{ranks_text(odd)} called{extra} {describe(calls[odd[0]])} while {ranks_text(rest)} called "
                   f"{describe(calls[rest[0]])} ({label}): the job hangs or mixes up data here. Stacks: {stacks}")
        return _finding("GRD001", odd, message, calls[odd[0]], _evidence(group.name, seq, calls))
    parts = [f"{ranks_text(rs)} called {describe(calls[rs[0]])}" for rs in ranked]
    message = (f"at {label}, " + " while ".join(parts) + f": the job hangs or mixes up data here. Stacks: {stacks}")
    return _finding("GRD001", sorted(calls), message, calls[ranked[0][0]], _evidence(group.name, seq, calls))


def _never_entered(group: _Group, seq: int, calls: dict[int, Entry], missing: list[int]) -> Finding:
    first = calls[min(calls)]
    lasts = []
    repeats = True  # every missing rank's last call is the very call it never entered again
    for r in missing:
        mine = group.calls.get(r, {})
        repeats = repeats and bool(mine) and key(mine[max(mine)]) == key(first) and where(mine[max(mine)]) == where(first)
        if mine:
            last = mine[max(mine)]
            lasts.append(f"rank {r}'s last was #{max(mine)} {describe(last)}"
                         + (f" (stack: {stack_text(last)})" if stack_text(last) else ""))
        else:
            lasts.append(f"rank {r} recorded none in this group")
    message = (f"{ranks_text(sorted(calls))} entered {describe(first)} (collective #{seq} of {_group_label(group)}, "
               f"from the Flight Recorder) and {ranks_text(missing)} never did, so {ranks_text(sorted(calls))} "
               f"{'waits' if len(calls) == 1 else 'wait'} there: " + "; ".join(lasts))
    # A rank behind by one or more of the same repeated call (a training step's all-reduce) drew fewer batches:
    # the live guard's per-rank counts tell that better (GRD005), and it reads `repeats` to leave it to them.
    return _finding("GRD002", missing, message, first, {**_evidence(group.name, seq, calls), "repeats": repeats})


def _never_completed(group: _Group, seq: int, calls: dict[int, Entry], stuck: list[int],
                     done: list[int]) -> Finding:
    message = (f"{ranks_text(stuck)} never completed {describe(calls[stuck[0]])} (collective #{seq} of "
               f"{_group_label(group)}, from the Flight Recorder), which {ranks_text(done)} completed: "
               f"{'its' if len(stuck) == 1 else 'their'} collective hangs there")
    return _finding("GRD002", stuck, message, calls[stuck[0]], _evidence(group.name, seq, calls))


def _tracks_completion(entries: dict[int, Entry]) -> bool:
    """Whether a rank's recorder marks entries completed at all: gloo's in torch 2.13 leaves every entry
    'scheduled', so there a missing 'completed' says nothing."""
    return any(e.state == "completed" for e in entries.values())


def judge_group(group: _Group) -> Optional[Finding]:
    present = [r for r in group.members if group.calls.get(r)]
    if len(group.members) < 2 or not present:
        return None
    low = max(min(group.calls[r]) for r in present)  # below it, some rank's buffer may have dropped entries
    # The ids some rank holds, not every integer up to the highest: an id is any 64-bit number in what a rank sends.
    ids = sorted({seq for r in present for seq in group.calls[r] if seq >= low})
    for seq in ids:
        calls = {r: group.calls[r][seq] for r in group.members if seq in group.calls.get(r, {})}
        if len({key(e) for e in calls.values()}) > 1:
            following = {r: group.calls[r][seq + 1] for r in calls if seq + 1 in group.calls[r]}
            return _mismatch(group, seq, calls, following)
        # Behind: every id of a rank up to its last one is in its buffer, so a member without this id whose
        # last id is lower never reached it.
        missing = [r for r in group.members if r not in calls and max(group.calls.get(r, {0: None})) < seq]
        if missing and calls:
            return _never_entered(group, seq, calls, missing)
    # Everyone reached every id: did some never complete one the others completed?
    for seq in ids:
        calls = {r: group.calls[r][seq] for r in group.members if seq in group.calls.get(r, {})}
        done = [r for r, e in calls.items() if e.state == "completed"]
        stuck = [r for r, e in calls.items() if e.state != "completed" and _tracks_completion(group.calls[r])]
        if done and stuck:
            return _never_completed(group, seq, calls, sorted(stuck), sorted(done))
    return None


def judge(dumps: list[Dump]) -> list[Finding]:
    """GRD001/GRD002 findings, at most one per process group: after the first disagreement the later ids no
    longer pair the calls that belong together."""
    found = [judge_group(g) for g in groups(dumps)]
    return [f for f in found if f is not None]


def counts(dumps: list[Dump]) -> Counter[str]:
    """How much the dumps held, for the summary line."""
    tally: Counter[str] = Counter()
    for group in groups(dumps):
        tally["groups"] += 1
        tally["collectives"] += max((len(c) for c in group.calls.values()), default=0)
    return tally
