"""The diagnosis on its own: messages as ranks send them, a clock the test moves, no processes."""

from __future__ import annotations

from typing import Any

import pytest

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.guard import schema
from ddpdoctor.guard import doctor as doctor_module
from ddpdoctor.guard.doctor import Doctor
from ddpdoctor.guard.options import GuardOptions


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, world: int, joined: "range | tuple[int, ...] | None" = None, **options: Any) -> None:
        self.clock = Clock()
        self.sent: list[tuple[int, dict[str, Any]]] = []
        self.printed: list[Finding] = []
        self.doctor = Doctor(GuardOptions(**options), lambda r, m: self.sent.append((r, m)), self.printed.append,
                             clock=self.clock)
        self.world = world
        for rank in range(world) if joined is None else joined:
            self.doctor.join(schema.hello({"t": "hello", "rank": rank, "world_size": world, "local_rank": rank,
                                           "proof": "p",
                                           "nonce": "n"}))

    def ingest(self, rank: int, message: dict[str, Any]) -> None:
        """As the server passes it on: checked by the schema first."""
        self.doctor.ingest(rank, schema.message(message, self.world))

    def state(self, rank: int, **fields: Any) -> None:
        self.ingest(rank, {"t": "state", "inflight": None, **fields})

    def call(self, rank: int, seq: int, op: str, signature: str, line: int, group: str = "W") -> None:
        self.state(rank, ev=[[group, seq, op, signature, "train.py", line]])

    def codes(self) -> list[str]:
        return [f.code for f in self.doctor.findings]


def test_matching_collectives_are_silent_and_forgotten() -> None:
    h = Harness(3)
    for seq in range(5):
        for rank in range(3):
            h.call(rank, seq, "all_reduce", "float32[4]", 10)
    h.doctor.tick()
    assert h.codes() == [] and h.doctor.sequence["W"] == {}


def test_mismatch_names_the_minority_with_its_line() -> None:
    h = Harness(4)
    for rank in (0, 2, 3):
        h.call(rank, 0, "barrier", "", 95)
    h.call(1, 0, "all_reduce", "float32[1]", 88)
    h.doctor.tick()
    (finding,) = h.printed
    assert (finding.code, finding.name, finding.severity) == ("GRD001", "collective-mismatch", Severity.ERROR)
    assert finding.details["ranks"] == [1] and (finding.path, finding.line) == ("train.py", 88)
    assert finding.message.startswith("rank 1 called all_reduce(float32[1]) at train.py:88 while ranks 0, 2, 3 "
                                      "called barrier() at train.py:95")


def test_a_tie_is_resolved_by_what_each_side_calls_next() -> None:
    h = Harness(2)
    h.call(0, 0, "barrier", "", 20)
    h.call(1, 0, "all_reduce", "float32[1]", 19)
    h.doctor.tick()
    assert h.codes() == []  # waits: what rank 1 calls next tells which side made the extra call
    h.call(1, 1, "barrier", "", 20)
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.details["ranks"] == [1] and finding.line == 19
    assert "rank 1 called an extra all_reduce(float32[1])" in finding.message


def test_an_unresolvable_tie_names_both_ranks_after_a_moment() -> None:
    h = Harness(2)
    h.call(0, 0, "barrier", "", 20)
    h.call(1, 0, "all_reduce", "float32[1]", 19)
    h.clock.now += 1.5
    h.doctor.tick()
    assert h.printed[0].details["ranks"] == [0, 1]


def test_different_shapes_mismatch_and_later_positions_are_not_reported_again() -> None:
    h = Harness(3)
    for rank in range(3):
        h.call(rank, 0, "all_reduce", "float32[4]" if rank else "float32[5]", 7)
    for rank in range(3):
        h.call(rank, 1, "broadcast", "int64[1]" if rank else "float32[9]", 8)
    h.doctor.tick()
    assert h.codes() == ["GRD001"] and h.printed[0].details["ranks"] == [0]


def test_stall_names_the_missing_rank_with_its_stack_and_asks_to_stop() -> None:
    h = Harness(3, stall_timeout=5.0)
    for rank in range(3):
        h.call(rank, 0, "all_reduce", "float32[4]", 10)
    for rank in (0, 2):
        h.state(rank, ev=[["W", 1, "barrier", "", "train.py", 30]], inflight=["W", 1, 0.0])
    h.clock.now += 4.9
    for rank in (0, 2):
        h.state(rank, inflight=["W", 1, 4.9])
    h.doctor.tick()
    assert h.codes() == [] and h.sent == []
    h.clock.now += 0.2
    h.doctor.tick()
    assert h.sent == [(1, {"t": "stack"})]
    frames = {"t": "stack", "frames": [["train.py", 27, "load"], ["train.py", 40, "main"]]}
    h.ingest(1, frames)
    h.doctor.tick()
    assert h.printed == []  # a second sample, a second later, tells stuck from busy
    h.clock.now += 1.0
    h.doctor.tick()
    assert h.sent == [(1, {"t": "stack"})] * 2
    h.ingest(1, frames)
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.code == "GRD002" and finding.details["ranks"] == [1]
    assert (finding.path, finding.line) == ("train.py", 27)
    assert "ranks 0, 2 waited 6.1 s in barrier() at train.py:30" in finding.message
    assert "rank 1 is at train.py:27 in load ← train.py:40 in main" in finding.message
    assert h.doctor.stop_requested == "GRD002"


def test_a_busy_rank_is_not_stalled_until_it_stops_moving() -> None:
    h = Harness(2, stall_timeout=5.0)
    h.state(0, ev=[["W", 0, "barrier", "", "train.py", 9]], inflight=["W", 0, 6.0])
    h.state(1, progress=10)
    h.doctor.tick()
    h.ingest(1, {"t": "stack", "frames": [["eval.py", 3, "evaluate"]]})
    h.clock.now += 1.0
    h.state(1, progress=11)  # rank 1 drew another evaluation batch
    h.doctor.tick()
    h.ingest(1, {"t": "stack", "frames": [["eval.py", 3, "evaluate"]]})
    h.doctor.tick()
    assert h.printed == [] and h.doctor.stop_requested is None
    h.clock.now += 3.0  # quiet for half the stall timeout, then checked again: now it is stuck
    h.state(0, inflight=["W", 0, 10.0])
    for _ in range(2):
        h.doctor.tick()
        h.ingest(1, {"t": "stack", "frames": [["eval.py", 7, "evaluate"]]})
        h.clock.now += 1.0
    h.doctor.tick()
    assert [f.code for f in h.printed] == ["GRD002"] and "rank 1 is at eval.py:7" in h.printed[0].message


def test_everyone_waiting_in_the_same_collective_is_not_a_stall() -> None:
    h = Harness(2, stall_timeout=5.0)
    for rank in range(2):
        h.state(rank, ev=[["W", 0, "all_reduce", "float32[1000000]", "train.py", 3]], inflight=["W", 0, 60.0])
    h.doctor.tick()
    assert h.codes() == []


def test_report_only_does_not_stop() -> None:
    h = Harness(2, stall_timeout=1.0, on_stall="report")
    h.state(0, ev=[["W", 0, "barrier", "", "train.py", 3]], inflight=["W", 0, 2.0])
    h.doctor.disconnected(1)
    h.doctor.tick()
    h.doctor.tick(final=True)
    assert h.codes() == ["GRD002"] and h.doctor.stop_requested is None
    assert "rank 1 has exited" in h.printed[0].message


def hashes(step: int, values: list[int]) -> dict[str, Any]:
    return {"hashes": [{"step": step, "names": ["fc.weight", "fc.bias", "bn.running_mean"], "values": values,
                        "path": "train.py", "line": 50}]}


def test_divergence_majority_vote_and_first_tensor() -> None:
    h = Harness(3)
    h.state(0, **hashes(100, [1, 2, 3]))
    h.state(1, **hashes(100, [1, 9, 8]))
    h.doctor.tick()
    assert h.codes() == []  # rank 2 has not reported step 100 yet
    h.state(2, **hashes(100, [1, 2, 3]))
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.details == {"ranks": [1], "step": 100, "epoch": None}
    assert "'fc.bias' on rank 1 differs from ranks 0, 2 (2 of 3 parameters and buffers differ" in finding.message


def test_divergence_with_two_ranks_names_both_once() -> None:
    h = Harness(2)
    for step in (100, 200):
        h.state(0, **hashes(step, [1, 2, 3]))
        h.state(1, **hashes(step, [1, 2, 4]))
    h.doctor.tick()
    assert h.codes() == ["GRD003"] and h.printed[0].details["ranks"] == [0, 1]
    assert "differs from each other" in h.printed[0].message


def loader(count: int, done: bool, syncing: bool = True, joined: bool = False, epoch: int = 0) -> dict[str, Any]:
    return {"loaders": {"train.py:40#0": ["train.py", 40, epoch, count, done, syncing, joined]}}


def test_uneven_batches_named_when_one_rank_draws_past_anothers_end() -> None:
    h = Harness(2)
    h.state(0, **loader(2, False))
    h.state(1, **loader(2, True))
    h.doctor.tick()
    assert h.codes() == []
    h.state(0, **loader(3, False))
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.details == {"ranks": [0], "step": None, "epoch": 0}
    assert "(rank 0: 3+, rank 1: 2)" in finding.message and finding.line == 40


@pytest.mark.parametrize("syncing, joined", [(False, False), (True, True)])
def test_uneven_batches_without_collectives_or_under_join_are_fine(syncing: bool, joined: bool) -> None:
    h = Harness(2)
    h.state(0, **loader(5, True, syncing, joined))
    h.state(1, **loader(4, True, syncing, joined))
    h.doctor.tick(final=True)
    assert h.codes() == []


def test_straggler_needs_a_full_window_and_a_consistent_gap() -> None:
    h = Harness(3, straggler_window=5)
    for step in range(1, 5):
        for rank in range(3):
            h.state(rank, steps=[[step, 0.30 if rank == 2 else 0.01]])
    h.doctor.tick()
    assert h.codes() == [] and h.sent == []
    for rank in range(3):
        h.state(rank, steps=[[5, 0.30 if rank == 2 else 0.01]])
    h.doctor.tick()
    assert (2, {"t": "stack"}) in h.sent
    for _ in range(4):
        h.ingest(2, {"t": "stack", "frames": [["train.py", 61, "log_histograms"]]})
    h.clock.now += 1
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.details["ranks"] == [2] and finding.line == 61
    assert "is 300.0 ms against 10.0 ms for the other ranks" in finding.message


def test_noise_is_not_a_straggler() -> None:
    h = Harness(2, straggler_window=4)
    for step, (a, b) in enumerate([(0.010, 0.011), (0.012, 0.010), (0.011, 0.013), (0.010, 0.012)], 1):
        h.state(0, steps=[[step, a]])
        h.state(1, steps=[[step, b]])
    h.doctor.tick(final=True)
    assert h.codes() == []


def test_rank_local_findings_are_merged_across_ranks() -> None:
    h = Harness(3)
    item = {"code": "GRD004", "message": "repeats", "path": "train.py", "line": 12, "step": 8, "epoch": 1}
    h.state(2, local=[item])
    h.state(0, local=[item])
    h.doctor.tick()
    assert h.printed == []  # collects the other ranks' reports for a moment
    h.clock.now += 1.0
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.details == {"ranks": [0, 2], "step": 8, "epoch": 1, "epochs": [1]}
    assert (finding.code, finding.name, finding.severity) == ("GRD004", "epoch-order-repeated", Severity.WARNING)
    # The same cause in later epochs: the same finding, covering them (not one more per epoch).
    h.state(0, local=[{**item, "epoch": 3}])
    h.state(1, local=[{**item, "epoch": 2}])
    h.clock.now += 2.0
    h.doctor.tick()
    assert h.printed == [finding] and finding.details["epochs"] == [1, 2, 3]
    assert finding.details["ranks"] == [0, 1, 2] and finding.details["epoch"] == 1


def test_a_rank_that_never_reaches_the_rendezvous_is_named_with_its_stack() -> None:
    h = Harness(2, stall_timeout=5.0)
    h.state(0, ev=[["init", 0, "init_process_group", "", "train.py", 12]], inflight=["init", 0, 4.9])
    h.doctor.tick()
    assert h.sent == []
    h.state(0, inflight=["init", 0, 5.0])
    h.doctor.tick()
    assert h.sent == [(1, {"t": "stack"})]
    for _ in range(2):
        h.ingest(1, {"t": "stack", "frames": [["train.py", 8, "<module>"]]})
        h.clock.now += 1.0
        h.doctor.tick()
    (finding,) = h.printed
    assert finding.code == "GRD002" and finding.details["ranks"] == [1]
    assert finding.message.startswith("rank 0 waited 7.0 s in init_process_group() at train.py:12, and rank 1 "
                                      "never arrived: rank 1 is at train.py:8 in <module>")


def test_a_rank_that_has_not_said_hello_gets_a_grace_to_start() -> None:
    h = Harness(3, joined=(0, 2), stall_timeout=5.0)
    for rank in (0, 2):
        h.state(rank, ev=[["init", 0, "init_process_group", "", "train.py", 12]], inflight=["init", 0, 0.0])
    h.clock.now += 5.0 + doctor_module.STARTUP_GRACE_S - 0.1
    h.doctor.tick()
    assert h.printed == []  # importing torch on a loaded machine: not yet
    h.clock.now += 0.2
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.details["ranks"] == [1] and "rank 1 never connected" in finding.message
    assert finding.message.startswith("ranks 0, 2 waited 25.1 s in init_process_group() at train.py:12")


def test_everyone_in_the_rendezvous_is_not_a_stall() -> None:
    h = Harness(2, stall_timeout=5.0)
    for rank in (0, 1):
        h.state(rank, ev=[["init", 0, "init_process_group", "", "train.py", 12]], inflight=["init", 0, 60.0])
    h.doctor.tick()
    assert h.printed == [] and h.sent == []


def counts(collectives: int, joins: int = 0, batches: int = 8) -> list[int]:
    """A rank's counts (doctor.COUNT_NAMES): batches, DDP forwards, backwards, steps, all collectives,
    epochs, Join entries, world collectives; forwards, backwards and steps follow the collectives."""
    return [batches, collectives, collectives, collectives, collectives + 1, 1, joins, collectives]


def mark(ordinal: int, epoch: int, collectives: int, joined: bool = False) -> dict[str, Any]:
    return {"marks": [[ordinal, epoch, counts(collectives), joined, "train.py", 30, "train.py", 28]]}


def test_a_rank_behind_when_an_epoch_begins_is_named_with_the_epoch_it_fell_behind_in() -> None:
    h = Harness(3)
    for r in range(3):
        h.state(r, **mark(0, 0, 1))
    h.doctor.tick()
    assert h.codes() == []
    h.state(0, **mark(1, 1, 9))
    h.state(1, **mark(1, 1, 8))
    h.doctor.tick()
    assert h.codes() == []  # rank 2 has not begun epoch 1 yet
    h.state(2, **mark(1, 1, 9))
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.code == "GRD005" and finding.details == {"ranks": [1], "step": None, "epoch": 0}
    assert (finding.path, finding.line) == ("train.py", 30)  # the loop that drew the epoch's batches
    assert "in epoch 0, rank 1 ran fewer collectives than the others (counted when set_epoch(1)" in finding.message
    assert "rank 1: 8 batches, 8 DDP forwards, 8 backwards, 8 optimizer steps, 8 collectives" in finding.message
    h.state(0, **mark(2, 2, 17))
    h.state(1, **mark(2, 2, 16))
    h.state(2, **mark(2, 2, 17))
    h.doctor.tick()
    assert h.codes() == ["GRD005"]  # one finding for one cause


@pytest.mark.parametrize("joined, behind", [(True, 8), (False, 9)])
def test_epochs_under_join_or_in_step_are_silent(joined: bool, behind: int) -> None:
    h = Harness(2)
    for ordinal in (0, 1):
        h.state(0, **mark(ordinal, ordinal, 9 * ordinal, joined))
        h.state(1, **mark(ordinal, ordinal, behind * ordinal, joined))
    h.doctor.tick(final=True)
    assert h.codes() == []


def test_a_rank_that_left_after_fewer_collectives_is_named_at_the_end_with_its_last_line() -> None:
    h = Harness(2)
    h.call(0, 0, "all_reduce", "float32[1]", 12)
    h.call(1, 0, "all_reduce", "float32[1]", 12)
    h.call(0, 1, "DDP gradient all-reduce", "2 params", 20)
    h.state(0, counts=counts(2))
    h.state(1, counts=counts(1), final=True)
    h.doctor.disconnected(1)
    h.doctor.tick()
    assert h.codes() == []  # judged at the end (a rank may still be on its way)
    h.doctor.tick(final=True)
    assert h.codes() == ["GRD005"]
    finding = h.printed[0]
    assert finding.details["ranks"] == [1] and (finding.path, finding.line) == ("train.py", 12)
    assert finding.message.startswith("rank 1 finished after fewer collectives than the others")
    assert "its last collective was all_reduce(float32[1]) at train.py:12" in finding.message


@pytest.mark.parametrize("joins, same", [(1, False), (0, True)])
def test_ends_under_join_or_even_are_silent(joins: int, same: bool) -> None:
    h = Harness(2)
    h.state(0, counts=counts(5, joins))
    h.state(1, counts=counts(5 if same else 4, joins), final=True)
    h.doctor.tick(final=True)
    assert h.codes() == []


def test_a_rank_idle_after_fewer_collectives_is_named_before_the_stall() -> None:
    h = Harness(2, stall_timeout=5.0)
    h.call(0, 0, "DDP gradient all-reduce", "2 params", 20)
    h.call(1, 0, "DDP gradient all-reduce", "2 params", 20)
    h.call(0, 1, "DDP gradient all-reduce", "2 params", 20)
    h.state(0, counts=counts(2), inflight=["W", 1, 0.0])
    h.state(1, counts=counts(1))
    h.clock.now += 6
    h.state(0, counts=counts(2), inflight=["W", 1, 6.0])
    h.doctor.tick()
    for _ in range(2):  # the stacks it asked for: the same frame twice, nothing moves
        h.ingest(1, {"t": "stack", "frames": [["<string>", 1, "<module>"]]})
        h.clock.now += 1.1
        h.doctor.tick()
    assert h.codes() == ["GRD005", "GRD002"]
    assert h.printed[0].message.startswith("rank 1 left the training loop after fewer collectives")


def test_a_rank_blocked_inside_its_script_with_fewer_collectives_is_a_stall_only() -> None:
    h = Harness(2, stall_timeout=5.0)
    h.call(0, 0, "DDP gradient all-reduce", "2 params", 20)
    h.call(1, 0, "DDP gradient all-reduce", "2 params", 20)
    h.call(0, 1, "DDP gradient all-reduce", "2 params", 20)
    h.state(0, counts=counts(2), inflight=["W", 1, 0.0])
    h.state(1, counts=counts(1))
    h.clock.now += 6
    h.state(0, counts=counts(2), inflight=["W", 1, 6.0])
    h.doctor.tick()
    for _ in range(2):
        h.ingest(1, {"t": "stack", "frames": [["train.py", 24, "<module>"]]})
        h.clock.now += 1.1
        h.doctor.tick()
    assert h.codes() == ["GRD002"]


def test_end_checks_are_compared_apart_from_the_forward_checks_of_the_same_step() -> None:
    h = Harness(3)
    for r in range(3):
        h.state(r, **hashes(8, [1, 2, 3]))
        h.state(r, hashes=[{"step": 8, "kind": "end", "names": ["w", "b"], "values": [5, 6 if r != 1 else 7]}])
    h.doctor.tick()
    (finding,) = h.printed
    assert finding.details["ranks"] == [1] and "after optimizer step 8, 'b' on rank 1 differs" in finding.message
    assert "(1 of 2 parameters differ" in finding.message and "checked after the last step" in finding.message
    assert h.doctor.replica_checks == 2


def test_the_summary_counts_what_the_busiest_rank_did() -> None:
    h = Harness(2)
    h.state(0, counts=[40, 30, 30, 30, 35, 3, 0, 35])
    h.state(1, counts=[40, 30, 30, 29, 35, 3, 0, 35])
    for r in range(2):
        h.state(r, **hashes(10, [1, 2, 3]))
    h.doctor.tick()
    assert h.doctor.summary() == {"ranks": 2, "epochs": 3, "steps": 30, "collectives": 35, "replica_checks": 1}


def test_marks_of_different_epochs_are_not_compared() -> None:
    # Rank 0 also sets the epoch of a sampler only it uses: its second mark is not rank 1's second.
    h = Harness(2)
    h.state(0, **mark(0, 0, 0))
    h.state(1, **mark(0, 0, 0))
    h.state(0, **mark(1, 7, 4))
    h.state(1, **mark(1, 1, 9))
    h.state(0, **mark(2, 1, 9))
    h.doctor.tick()
    assert h.codes() == [] and all(not state.marks for state in h.doctor.ranks.values())


def test_a_rank_whose_last_counts_may_be_stale_is_not_judged_at_the_end() -> None:
    # Its process ended without a final message (no atexit in a multiprocessing child).
    h = Harness(2)
    h.state(0, counts=counts(5), final=True)
    h.state(1, counts=counts(3))
    h.doctor.disconnected(1)
    h.doctor.tick(final=True)
    assert h.codes() == []


def test_an_interrupted_job_is_not_judged_for_uneven_ends() -> None:
    h = Harness(2)
    h.state(0, counts=counts(5))
    h.state(1, counts=counts(3), final=True)
    h.doctor.interrupted = True
    h.doctor.tick(final=True)
    assert h.codes() == []


def test_a_rank_whose_last_report_is_a_call_the_others_have_passed_is_the_missing_one() -> None:
    """Rank 1 reported itself inside collective #1 and then fell silent (it holds the GIL in C code: its
    reporter never runs again); rank 0 has passed #1, which it could not have done alone, and waits in #2.
    The stall is at #2, where rank 1 never arrived, not at rank 1's stale #1 (which named rank 0)."""
    h = Harness(2, stall_timeout=3.0)
    for rank in range(2):
        h.call(rank, 0, "all_reduce", "float32[4]", 10)
    h.state(1, ev=[["W", 1, "all_reduce", "float32[4]", "train.py", 10]], inflight=["W", 1, 0.0])
    h.state(0, ev=[["W", 1, "all_reduce", "float32[4]", "train.py", 10]], inflight=None)
    h.clock.now += 0.5
    h.state(0, ev=[["W", 2, "all_reduce", "float32[4]", "train.py", 10]], inflight=["W", 2, 0.0])
    h.clock.now += 2.6  # rank 1's stale #1 is past the stall timeout; rank 0's wait in #2 is not yet
    h.state(0, inflight=["W", 2, 2.6])
    h.doctor.tick()
    assert h.sent == [] and h.codes() == []
    h.clock.now += 0.5
    h.state(0, inflight=["W", 2, 3.1])
    h.doctor.tick()
    assert h.sent == [(1, {"t": "stack"})]  # rank 1 is asked where it is; rank 0 is where the job waits
