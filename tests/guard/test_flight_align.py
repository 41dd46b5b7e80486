"""The Flight Recorder aligner on small synthetic dumps: each judgment just inside and just past its edge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fr_synthetic import SITE, dump, entry, write

from ddpdoctor.findings import Finding
from ddpdoctor.guard.flight.analyze import analyze


def judge(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], **config: Any) -> list[Finding]:
    return analyze(str(write(tmp_path / "d", {r: dump(es, **config) for r, es in per_rank.items()}))).findings


def one(findings: list[Finding], code: str) -> Finding:
    assert [f.code for f in findings] == [code], [f.message for f in findings]
    return findings[0]


def test_equal_calls_are_clean_and_one_dimension_more_is_grd001(tmp_path: Path) -> None:
    same = [entry(1), entry(2, sizes=((3, 4),), line=12)]
    assert judge(tmp_path / "a", {0: same, 1: same}) == []
    finding = one(judge(tmp_path / "b", {0: same, 1: [entry(1), entry(2, sizes=((3, 4, 1),), line=12)]}), "GRD001")
    assert finding.details["ranks"] == [0, 1]  # two ranks, no majority, no extra call: both named
    assert (finding.path, finding.line) == ("/job/train.py", 12)
    assert "all_reduce(float32[3, 4]) at /job/train.py:12" in finding.message
    assert "all_reduce(float32[3, 4, 1]) at /job/train.py:12" in finding.message
    assert "collective #2 of the world group" in finding.message
    assert finding.details["evidence"]["seq"] == 2
    assert finding.details["evidence"]["ranks"]["1"]["input_sizes"] == [[3, 4, 1]]


def test_dtype_and_operation_differences_are_grd001(tmp_path: Path) -> None:
    finding = one(judge(tmp_path / "a", {0: [entry(1)], 1: [entry(1, dtype="Double")]}), "GRD001")
    assert "float64[2]" in finding.message and "float32[2]" in finding.message
    finding = one(judge(tmp_path / "b", {0: [entry(1)], 1: [entry(1, op="broadcast")]}), "GRD001")
    assert "broadcast(float32[2])" in finding.message


def test_majority_names_the_odd_rank_and_its_line(tmp_path: Path) -> None:
    calls = {r: [entry(1), entry(2, line=20)] for r in (0, 1)}
    calls[2] = [entry(1), entry(2, sizes=((5,),), line=21)]
    finding = one(judge(tmp_path, calls), "GRD001")
    assert finding.details["ranks"] == [2]
    assert (finding.path, finding.line) == ("/job/train.py", 21)
    assert finding.message.startswith("rank 2 called all_reduce(float32[5]) at /job/train.py:21 while ranks 0, 1")


def test_a_tie_names_the_rank_that_made_an_extra_call(tmp_path: Path) -> None:
    rank0 = [entry(1), entry(2, op="barrier", sizes=(), line=30)]
    rank1 = [entry(1), entry(2, sizes=((1,),), line=29), entry(3, op="barrier", sizes=(), line=30)]
    finding = one(judge(tmp_path / "a", {0: rank0, 1: rank1}), "GRD001")
    assert finding.details["ranks"] == [1] and "rank 1 called an extra all_reduce(float32[1])" in finding.message
    # Just past: what rank 1 calls next is not what rank 0 called here, so neither is the extra one.
    rank1[2] = entry(3, op="broadcast", line=30)
    assert one(judge(tmp_path / "b", {0: rank0, 1: rank1}), "GRD001").details["ranks"] == [0, 1]


def test_one_extra_entry_at_the_end_is_a_rank_that_never_entered(tmp_path: Path) -> None:
    base = [entry(1), entry(2, line=14)]
    assert judge(tmp_path / "a", {0: base, 1: base}) == []
    finding = one(judge(tmp_path / "b", {0: base, 1: [*base, entry(3, op="barrier", sizes=(), line=15)]}), "GRD002")
    assert finding.details["ranks"] == [0]
    assert (finding.path, finding.line) == ("/job/train.py", 15)
    assert finding.message.startswith("rank 1 entered barrier() at /job/train.py:15 (collective #3 of the world group")
    assert "rank 0 never did, so rank 1 waits there: rank 0's last was #2 all_reduce(float32[2]) at /job/train.py:14" \
        in finding.message


def test_a_rank_behind_by_a_repeated_call_is_told_apart_from_one_that_skipped_a_call(tmp_path: Path) -> None:
    # Rank 1 stopped one step short: its last call is the very call it never entered again (uneven batches).
    steps = [entry(1, line=14), entry(2, line=14), entry(3, line=14)]
    behind = one(judge(tmp_path / "a", {0: steps, 1: steps[:2]}), "GRD002")
    assert behind.details["evidence"]["repeats"] is True
    # Just past: the same operation and shape from another line is a call skipped, not a step short.
    other_line = [entry(1, line=14), entry(2, line=14), entry(3, line=15)]
    assert one(judge(tmp_path / "b", {0: other_line, 1: steps[:2]}), "GRD002").details["evidence"]["repeats"] is False
    other_shape = [*steps[:2], entry(3, sizes=((3,),), line=14)]
    assert one(judge(tmp_path / "c", {0: other_shape, 1: steps[:2]}), "GRD002").details["evidence"]["repeats"] is False


def test_a_mismatch_before_the_end_wins_over_the_missing_entry(tmp_path: Path) -> None:
    findings = judge(tmp_path, {0: [entry(1), entry(2, dtype="Half")], 1: [entry(1), entry(2), entry(3)]})
    assert one(findings, "GRD001").details["evidence"]["seq"] == 2


def test_shapes_may_differ_where_the_operation_allows_it(tmp_path: Path) -> None:
    rank0 = [entry(1, op="all_to_all_single", sizes=((4,),), out_sizes=((6,),))]
    rank1 = [entry(1, op="all_to_all_single", sizes=((8,),), out_sizes=((6,),))]
    assert judge(tmp_path / "a", {0: rank0, 1: rank1}) == []
    rank1 = [entry(1, op="all_to_all_single", sizes=((8,),), dtype="Long")]
    assert one(judge(tmp_path / "b", {0: rank0, 1: rank1}), "GRD001")


def test_only_the_root_passes_gathers_outputs_and_scatters_inputs(tmp_path: Path) -> None:
    # As torch 2.13 records gather on gloo: the root lists one output per rank, the others none (seen in a clean run).
    root = entry(1, op="gather", sizes=((2,),), out_sizes=((2,), (2,)))
    other = entry(1, op="gather", sizes=((2,),)) | {"output_sizes": [], "output_dtypes": []}
    assert judge(tmp_path / "a", {0: [root], 1: [other]}) == []
    scatter_root = entry(1, op="scatter", sizes=((2,), (2,)), out_sizes=((2,),))
    scatter_other = entry(1, op="scatter", sizes=((2,),)) | {"input_sizes": [], "input_dtypes": []}
    assert judge(tmp_path / "b", {0: [scatter_root], 1: [scatter_other]}) == []
    # Just past: the non-root gathers another dtype.
    other_long = other | {"input_dtypes": ["Long"]}
    assert one(judge(tmp_path / "c", {0: [root], 1: [other_long]}), "GRD001").details["evidence"]["seq"] == 1


def test_ids_a_ring_buffer_dropped_are_not_judged(tmp_path: Path) -> None:
    # Rank 0 kept ids 3..4 only (its buffer dropped 1..2); rank 1 still has a different #2: not comparable.
    rank0 = [entry(3, record_id=7), entry(4, record_id=8)]
    rank1 = [entry(1), entry(2, sizes=((9,),)), entry(3), entry(4)]
    assert judge(tmp_path / "a", {0: rank0, 1: rank1}) == []
    rank1[2] = entry(3, sizes=((9,),))  # just past: #3 is in both buffers
    assert one(judge(tmp_path / "b", {0: rank0, 1: rank1}), "GRD001").details["evidence"]["seq"] == 3
    # Even where the ranks that still hold an id disagree on it, it is not judged without every member's entry.
    rank1[2] = entry(3)
    assert judge(tmp_path / "c", {0: rank0, 1: rank1, 2: [entry(1), entry(2), entry(3), entry(4)]}) == []


def test_a_gap_in_a_ranks_ids_is_not_a_crash(tmp_path: Path) -> None:
    # Not what torch writes, but a dump is untrusted: rank 0 skips id 2, rank 1 stops at 1.
    finding = one(judge(tmp_path, {0: [entry(1), entry(3, line=33)], 1: [entry(1)]}), "GRD002")
    assert finding.details["ranks"] == [1] and finding.line == 33


def test_a_member_with_no_entry_of_a_group(tmp_path: Path) -> None:
    sub = ("1", "undefined")
    config = {"pg_config": {"1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}}}
    rank0 = [entry(1), entry(1, group=sub, line=40, record_id=1)]
    # Rank 1 recorded from its first entry on and never used group 1: it never entered its #1.
    finding = one(judge(tmp_path / "a", {0: rank0, 1: [entry(1)]}, **config), "GRD002")
    assert finding.details["ranks"] == [1] and "collective #1 of group 1" in finding.message
    assert "rank 1 recorded none in this group" in finding.message
    # Its buffer dropped entries: group 1's may be among them, so nothing is said.
    assert judge(tmp_path / "b", {0: rank0, 1: [entry(1, record_id=5)]}, **config) == []
    # Not a member by pg_config: nothing is said either.
    other = {"pg_config": {"1": {"name": "1", "desc": "undefined", "ranks": "[0, 2]"}}}
    assert judge(tmp_path / "c", {0: rank0, 1: [entry(1)]}, **other) == []


def test_a_huge_sequence_id_is_judged_without_walking_up_to_it(tmp_path: Path) -> None:
    # What a rank sends over the side channel is judged as a file is: an id near 2**63 must not mean 2**63 steps.
    far = 2**62
    finding = one(judge(tmp_path, {0: [entry(1), entry(far, record_id=1)], 1: [entry(1)]}), "GRD002")
    assert finding.details["evidence"]["seq"] == far


def test_point_to_point_entries_are_not_compared(tmp_path: Path) -> None:
    rank0 = [entry(1), entry(5, op="send", is_p2p=True, record_id=1)]
    rank1 = [entry(1), entry(5, op="recv", is_p2p=True, record_id=1, sizes=((7,),))]
    assert judge(tmp_path, {0: rank0, 1: rank1}) == []


def test_never_completed_only_where_the_recorder_tracks_completion(tmp_path: Path) -> None:
    done = [entry(1, state="completed"), entry(2, state="completed", line=50)]
    started = [entry(1, state="completed"), entry(2, state="started", line=50)]
    finding = one(judge(tmp_path / "a", {0: done, 1: started}), "GRD002")
    assert finding.details["ranks"] == [1] and "rank 1 never completed all_reduce" in finding.message
    assert judge(tmp_path / "b", {0: done, 1: done}) == []
    # Both still in it: the collective itself is slow or stuck, no rank is behind the others.
    assert judge(tmp_path / "d", {0: started, 1: started}) == []
    # gloo in torch 2.13 leaves every entry "scheduled": no completion is known, nothing is said.
    scheduled = [entry(1), entry(2, line=50)]
    assert judge(tmp_path / "c", {0: done, 1: scheduled}) == []


def test_frames_point_at_the_users_code_and_name_ddp(tmp_path: Path) -> None:
    ddp = [{"name": "_pre_forward", "filename": f"{SITE}/nn/parallel/distributed.py", "line": 1775},
           {"name": "_call_impl", "filename": f"{SITE}/nn/modules/module.py", "line": 1789},
           {"name": "step", "filename": "/job/loop.py", "line": 7},
           {"name": "main", "filename": "/job/train.py", "line": 60}]
    backward = [{"name": "_engine_run_backward", "filename": f"{SITE}/autograd/graph.py", "line": 979},
                {"name": "backward", "filename": f"{SITE}/_tensor.py", "line": 623},
                {"name": "step", "filename": "/job/loop.py", "line": 8}]
    guarded = [{"name": "collective", "filename": "/src/ddpdoctor/guard/patches.py", "line": 111}, *backward]
    rank0 = [entry(1, op="broadcast", frames=ddp), entry(2, sizes=((30,),), frames=guarded)]
    rank1 = [entry(1, op="broadcast", frames=ddp)]
    finding = one(judge(tmp_path, {0: rank0, 1: rank1}), "GRD002")
    assert (finding.path, finding.line) == ("/job/loop.py", 8)
    assert "all_reduce(float32[30]) at /job/loop.py:8 during backward() (a gradient hook: DDP's bucket all-reduce)" \
        in finding.message
    assert "broadcast(float32[2]) at /job/loop.py:7 inside DDP (_pre_forward)" in finding.message
    assert "(stack: /job/loop.py:7 in step ← /job/train.py:60 in main)" in finding.message
