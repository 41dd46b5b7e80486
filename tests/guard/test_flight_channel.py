"""The Flight Recorder between a rank and the guard, without processes: what a rank switches on and sends (a fake
`_dump_fr_trace` hands it torch's pickled shape), what the side channel accepts, and how the diagnosis asks for
records, waits for them and prefers their account, with a clock the test moves."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from fr_synthetic import SITE, dump, entry
from test_guard_doctor import Harness

from ddpdoctor.guard import schema
from ddpdoctor.guard.doctor import INCOMPLETE_AFTER_S
from ddpdoctor.guard.flight import live
from ddpdoctor.guard.flight.desk import FLIGHT_WAIT_S

DEEP = [{"name": "all_reduce", "filename": f"{SITE}/distributed/distributed_c10d.py", "line": 3245},
        {"name": "wrapper", "filename": f"{SITE}/distributed/c10d_logger.py", "line": 83},
        *({"name": f"f{i}", "filename": "/job/train.py", "line": 100 + i} for i in range(10))]


def test_the_recorder_is_sized_unless_the_user_sized_it() -> None:
    environ: dict[str, str] = {}
    live.turn_on(environ)
    assert environ == {"TORCH_FR_BUFFER_SIZE": str(live.ENTRIES)}
    for mine in ({"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}):
        environ = dict(mine)
        live.turn_on(environ)
        assert environ == mine


@pytest.mark.parametrize("size, has_dumper, group_up, expected", [
    ("100", True, True, True), ("0", True, True, False), ("junk", True, True, False), ("100", False, True, False),
    (None, True, True, False), ("100", True, False, False)])
def test_recording_needs_a_buffer_torchs_dump_and_a_torch_process_group(
        monkeypatch: pytest.MonkeyPatch, size: Optional[str], has_dumper: bool, group_up: bool, expected: bool) -> None:
    """A Horovod rank has torch's recorder and the guard's buffer size, but no torch process group: nothing of
    its collectives is recorded, so it must not say it records (the guard would wait for it at a mismatch)."""
    monkeypatch.setattr(live, "_dumper", lambda: (lambda: b"") if has_dumper else None)
    monkeypatch.setattr(live, "_process_group_up", lambda: group_up)
    assert live.recording({} if size is None else {"TORCH_FR_BUFFER_SIZE": size}) is expected


def test_a_torch_process_group_is_up_only_once_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    monkeypatch.setitem(sys.modules, "torch.distributed", types.SimpleNamespace(is_initialized=lambda: False))
    assert not live._process_group_up()
    monkeypatch.setitem(sys.modules, "torch.distributed", types.SimpleNamespace(is_initialized=lambda: True))
    assert live._process_group_up()
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    assert not live._process_group_up()


def test_a_snapshot_is_torchs_record_pruned_to_what_is_quoted_and_what_the_guard_accepts() -> None:
    raw = dump([entry(1, frames=DEEP), entry(2, line=12)])
    snap = live.snapshot(lambda: pickle.dumps(raw))
    assert snap is not None
    first = snap["entries"][0]
    # torch's frames down to the user's, then USER_FRAMES of the user's; the fields torch adds for itself are left.
    assert [f["line"] for f in first["frames"]] == [3245, 83, 100, 101, 102, 103]
    assert "time_created_ns" not in first and first["profiling_name"] == "gloo:all_reduce"
    checked = schema.message(json.loads(json.dumps({"t": "fr", "on": True, "dump": snap})), 2)
    assert [e.seq for e in checked["dump"].entries] == [1, 2] and checked["on"] is True


def test_a_snapshot_keeps_the_newest_entries_within_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = dump([entry(seq) for seq in range(1, 9)])
    whole = live.snapshot(lambda: pickle.dumps(raw))
    assert whole is not None and len(whole["entries"]) == 8
    size = len(json.dumps(whole, separators=(",", ":")))
    monkeypatch.setattr(live, "MAX_SENT_BYTES", size)
    assert len(live.snapshot(lambda: pickle.dumps(raw))["entries"]) == 8  # type: ignore[index]  # just inside
    monkeypatch.setattr(live, "MAX_SENT_BYTES", size - 1)
    half = live.snapshot(lambda: pickle.dumps(raw))
    assert half is not None and [e["collective_seq_id"] for e in half["entries"]] == [5, 6, 7, 8]


def test_a_snapshot_sends_the_newest_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "SENT_ENTRIES", 3)
    raw = dump([entry(seq) for seq in range(1, 6)])
    assert [e["collective_seq_id"] for e in live.snapshot(lambda: pickle.dumps(raw))["entries"]] == [3, 4, 5]  # type: ignore[index]


def _raise() -> bytes:
    raise RuntimeError("no process group")


@pytest.mark.parametrize("dumper", [
    _raise,
    lambda: pickle.dumps(dump([])),  # on, but nothing recorded yet
    lambda: pickle.dumps(dump([entry(1)]) | {"x": Path("/")}),  # a class: the restricted reader refuses it
    lambda: pickle.dumps(dump([{"process_group": ["0", "default_pg"], "collective_seq_id": "one"}])),
])
def test_a_snapshot_that_cannot_be_read_is_none_never_an_error(dumper: Any) -> None:
    assert live.snapshot(dumper) is None


@pytest.mark.parametrize("message, error", [
    ({"t": "fr", "on": 1, "dump": None}, "on is not true or false"),
    ({"t": "fr", "on": True, "dump": None, "exit": "yes"}, "exit is not true or false"),
    ({"t": "fr", "on": True, "dump": {"entries": [1]}}, "a Flight Recorder dump that has an entry that is not a dict"),
    ({"t": "fr", "on": True, "dump": {"entries": "x"}}, "a Flight Recorder dump that has no list of entries"),
    ({"t": "fr", "on": True, "dump": [1]}, "a Flight Recorder dump that has no list of entries"),
])
def test_the_side_channel_refuses_a_bad_record(message: dict[str, Any], error: str) -> None:
    with pytest.raises(schema.BadMessage, match=f"^{error}"):
        schema.message(message, 2)


def test_the_side_channel_bounds_the_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schema, "MAX_FLIGHT_ENTRIES", 2)
    schema.message({"t": "fr", "on": True, "dump": dump([entry(1), entry(2)])}, 2)  # just inside
    with pytest.raises(schema.BadMessage, match="has 3 entries, more than 2"):
        schema.message({"t": "fr", "on": True, "dump": dump([entry(1), entry(2), entry(3)])}, 2)


def record(h: Harness, rank: int, entries: Optional[list[dict[str, Any]]], on: bool = True,
           exit: bool = False) -> None:
    h.ingest(rank, {"t": "fr", "on": on, "dump": None if entries is None else dump(entries), "exit": exit})


def live_mismatch(h: Harness) -> None:
    h.call(0, 0, "all_reduce", "float32[3]", 12)
    h.call(1, 0, "all_reduce", "float32[4]", 12)
    h.clock.now += INCOMPLETE_AFTER_S  # a tie: judged once neither side's next call can tell an extra one
    h.doctor.tick()


def test_a_mismatch_seen_live_waits_for_the_records_and_tells_theirs() -> None:
    h = Harness(2)
    for rank in (0, 1):
        record(h, rank, None)  # the announcement once the process group is up
    live_mismatch(h)
    assert h.printed == [] and sorted(h.sent) == [(0, {"t": "fr"}), (1, {"t": "fr"})]
    record(h, 0, [entry(1), entry(2, sizes=((3,),), line=12)])
    h.doctor.tick()
    assert h.printed == []  # rank 1 has not answered yet
    record(h, 1, [entry(1), entry(2, sizes=((4,),), line=12)])
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.code == "GRD001" and finding.message.startswith(
        "at collective #2 of the world group, from the Flight Recorder, rank 0 called all_reduce(float32[3])")
    # Told once: the end of the run does not repeat it.
    h.doctor.tick(final=True)
    assert h.codes() == ["GRD001"]


@pytest.mark.parametrize("waited, told", [(FLIGHT_WAIT_S - 0.1, False), (FLIGHT_WAIT_S, True)])
def test_without_an_answer_the_live_account_is_told_after_a_short_wait(waited: float, told: bool) -> None:
    h = Harness(2)
    for rank in (0, 1):
        record(h, rank, None)
    live_mismatch(h)
    h.clock.now += waited
    h.doctor.tick()
    assert [f.message.startswith("at collective #1, rank 0 called all_reduce(float32[3])") for f in h.printed] == (
        [True] if told else [])


def test_records_that_agree_leave_the_live_account() -> None:
    h = Harness(2)
    for rank in (0, 1):
        record(h, rank, None)
    live_mismatch(h)
    for rank in (0, 1):
        record(h, rank, [entry(1)])
    h.doctor.tick()
    assert [f.code for f in h.printed] == ["GRD001"] and "Flight Recorder" not in h.printed[0].message


def test_ranks_without_a_recorder_are_not_waited_for() -> None:
    h = Harness(2)
    for rank in (0, 1):
        record(h, rank, None, on=False)
    live_mismatch(h)
    assert h.sent == [] and [f.code for f in h.printed] == ["GRD001"]


def ended(h: Harness, rank0: list[dict[str, Any]], rank1: list[dict[str, Any]], joins: int = 0) -> list[str]:
    for rank, entries in ((0, rank0), (1, rank1)):
        record(h, rank, entries)
        h.state(rank, counts=[0, 0, 0, 0, 0, 0, joins, 0], final=True)
    h.doctor.tick(final=True)
    return h.codes()


def test_at_the_end_a_skipped_call_is_grd002_and_a_step_short_is_left_to_grd005() -> None:
    steps = [entry(1, line=14), entry(2, line=14)]
    assert ended(Harness(2), [*steps, entry(3, op="barrier", sizes=(), line=20)], steps) == ["GRD002"]
    assert ended(Harness(2), [*steps, entry(3, line=14)], steps) == []
    # Under Join the ranks rightly run other calls: nothing is said.
    assert ended(Harness(2), [*steps, entry(3, op="barrier", sizes=(), line=20)], steps, joins=1) == []


@pytest.mark.parametrize("how", ["its last record", "its connection closing"])
def test_the_first_rank_to_end_has_the_others_records_asked_for_at_once(how: str) -> None:
    h = Harness(3)
    for rank in (0, 1, 2):
        record(h, rank, None)
    if how == "its last record":
        record(h, 2, [entry(1)], exit=True)  # still connected while it exits, but not asked
    else:
        h.doctor.disconnected(2)
    assert h.sent == [(0, {"t": "fr"}), (1, {"t": "fr"})]
    h.doctor.disconnected(1)  # once a run: the ranks that end next send theirs as they exit
    record(h, 0, [entry(1)], exit=True)
    assert len(h.sent) == 2


def test_without_a_recorder_nothing_is_asked_when_a_rank_ends() -> None:
    h = Harness(2)
    for rank in (0, 1):
        record(h, rank, None, on=False)
    h.doctor.disconnected(1)
    assert h.sent == []
