"""The Flight Recorder in a guarded rank: switched on before the process group exists, read when the guard asks.

torch records every collective of every process group in a per-rank ring buffer once TORCH_FR_BUFFER_SIZE (or
the older TORCH_NCCL_TRACE_BUFFER_SIZE) is above 0; in torch 2.13 that includes gloo's, DDP's own broadcasts and
bucket all-reduces among them. Recording is C++ work torch does per collective anyway (a few entries per
training step); the guard adds no Python work per step. A rank reads its buffer only when the guard asks (a
stall, a mismatch) and once as it exits, and sends it as JSON: the pickled dump torch hands out is read with
the same restricted reader as a dump file, pruned to what the diagnosis quotes, checked with the same rules the
guard applies when it arrives, and bounded to one side-channel line. Where torch has no recorder (an older torch,
a job without a torch process group such as Horovod's) or the user switched it off (TORCH_FR_BUFFER_SIZE=0),
the rank answers None and the guard diagnoses as it does without one.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, MutableMapping, Optional

from ddpdoctor.guard.flight.dumps import MAX_FRAMES, dump_of, unpickle_plain
from ddpdoctor.guard.flight.userframes import is_user
from ddpdoctor.guard.schema import MAX_FLIGHT_ENTRIES as MAX_SENT_ENTRIES
from ddpdoctor.guard.wire import MAX_LINE

BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
# Entries each rank keeps: a few hundred training steps of a small model, several of a large one (DDP's 25 MiB
# buckets make a 1B-parameter model about 160 all-reduces a step); recording costs the same whatever the size, and
# a dump torch writes itself (TORCH_FR_DUMP_TEMP_FILE, for `--analyze`) holds them all.
ENTRIES = 1000
# The newest entries a rank sends: where ranks part is within the last few calls of the rank that stopped there
# (a rank blocks at its first unmatched collective; a mismatch further back was seen live when it happened).
# Reading, pruning and checking cost about 0.1-0.3 ms an entry on each side, so fewer keep a rank's exit and the
# guard's end short.
SENT_ENTRIES = 256
# What one message may carry: within a side-channel line, and no more entries than the guard accepts.
MAX_SENT_BYTES = MAX_LINE - (64 << 10)
# Frames kept per entry, innermost first: torch's own down to the user's (they say whether DDP or a backward
# launched the call), and this many of the user's.
USER_FRAMES = 4
_KEYS = ("process_group", "collective_seq_id", "p2p_seq_id", "is_p2p", "op_id", "record_id", "profiling_name",
         "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state")


def turn_on(environ: "MutableMapping[str, str]" = os.environ) -> None:
    """Size the recorder for the job, unless the user sized it (0 switches it off): before init_process_group,
    which is when torch reads it."""
    if not any(name in environ for name in BUFFER_ENV):
        environ["TORCH_FR_BUFFER_SIZE"] = str(ENTRIES)


def recording(environ: "MutableMapping[str, str]" = os.environ) -> bool:
    """Whether torch records this rank's collectives: it has a recorder, a buffer above 0 entries, and a torch
    process group to record (a Horovod job has none: its collectives never reach the recorder, and a rank that
    said it records would have the guard wait for an empty record at every mismatch)."""
    size = next((environ[name] for name in BUFFER_ENV if name in environ), "0")
    try:
        return int(size) > 0 and _dumper() is not None and _process_group_up()
    except ValueError:
        return False


def _process_group_up() -> bool:
    distributed = sys.modules.get("torch.distributed")
    is_initialized = getattr(distributed, "is_initialized", None)
    try:
        return callable(is_initialized) and bool(is_initialized())
    except Exception:  # noqa: BLE001 - a torch without the distributed package built: nothing to record
        return False


def _dumper() -> Optional[Callable[[], bytes]]:
    torch = sys.modules.get("torch")
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):  # torch >= 2.7; the NCCL-only name before
        dump = getattr(c10d, name, None)
        if callable(dump):
            return dump  # type: ignore[no-any-return]
    return None


def _frames(frames: Any) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    users = 0
    for frame in frames[:MAX_FRAMES] if isinstance(frames, list) else ():
        if not isinstance(frame, dict):
            break
        kept.append({key: frame[key] for key in ("name", "filename", "line") if key in frame})
        users += is_user(str(frame.get("filename", "")))
        if users >= USER_FRAMES:
            break
    return kept


def _compact(entry: dict[str, Any]) -> dict[str, Any]:
    kept = {key: entry[key] for key in _KEYS if key in entry}
    kept["frames"] = _frames(entry.get("frames"))
    return kept


def snapshot(dump: Optional[Callable[[], bytes]] = None) -> Optional[dict[str, Any]]:
    """This rank's recorder as JSON-ready data of at most one side-channel line; None where there is no recorder,
    it is off or empty, or reading it fails (never an exception: the user's job goes on)."""
    dump = dump or _dumper()
    if dump is None:
        return None
    try:
        # torch's own bytes, still read with the reader that builds nothing but data; what is sent is checked below
        raw = unpickle_plain(dump())
        entries = [_compact(e) for e in raw["entries"][-SENT_ENTRIES:] if isinstance(e, dict)]
        config = raw.get("pg_config")
        result = {"version": raw.get("version", ""), "entries": entries,
                  "pg_config": dict(list(config.items())[:256]) if isinstance(config, dict) else {}}
        while entries and len(json.dumps(result, separators=(",", ":"))) > MAX_SENT_BYTES:
            entries = result["entries"] = entries[len(entries) // 2:]  # the newest half: where it stopped
        if not entries:
            return None
        dump_of(result, -1, "this rank", MAX_SENT_ENTRIES)  # what the guard would refuse is not sent
        return result
    except Exception:  # noqa: BLE001 - never break the user's job
        return None
